import uuid, schemathesis
from schemathesis.engine import events
from tests.service.test_api_schemathesis import _schema
from service.api.security import new_token
def test_del(pg_url, pg_sessions):
    schema = _schema(pg_url, "x").include(method="DELETE")
    for ev in schemathesis.engine.from_schema(schema).execute():
        if isinstance(ev, events.ScenarioFinished):
            print(ev.phase.name, ev.status, len(ev.recorder.cases), ev.skip_reason)
        elif isinstance(ev, (events.NonFatalError,)):
            print("ERR", ev.info.format()[:500])
        elif isinstance(ev, events.PhaseFinished):
            print("PHASE", ev.phase.name, ev.status, getattr(ev, 'payload', None))
