"""``orthoplex status JOB``'s progress: step rate, ETA, the plan in force and the last event."""

from __future__ import annotations

import pytest

from service.cli.progress import format_eta, progress, step_rate, summarize_event

pytestmark = pytest.mark.unit


def _m(step: int, ts: float, loss: float = 3.0, tps: float = 1000.0) -> dict:
    return {"step": step, "attempt": 1, "loss": loss, "tokens_per_s": tps, "ts": ts}


def test_step_rate_and_eta_from_newest_rows() -> None:
    rows = [_m(s, 100.0 + 2.0 * s) for s in range(1, 31)]  # 0.5 steps/s
    assert step_rate(rows) == pytest.approx(0.5)
    job = {"state": "RUNNING", "spec": {"steps": 50}, "gpus_allocated": 4}
    p = progress(job, rows, [])
    assert p.step == 30 and p.steps == 50 and p.eta_s == pytest.approx(40.0)
    assert p.gpus == 4 and p.layout is None and p.last_event is None


def test_rate_unknown_with_one_row_or_ended_job() -> None:
    assert step_rate([_m(1, 5.0)]) is None
    job = {"state": "SUCCEEDED", "spec": {"steps": 2}, "gpus_allocated": 0}
    assert progress(job, [_m(1, 1.0), _m(2, 2.0)], []).eta_s is None


def test_iso_timestamps_and_a_redone_step() -> None:
    rows = [_m(1, "2026-12-01T10:00:00Z"), _m(2, "2026-12-01T10:00:10Z"),  # type: ignore[arg-type]
            _m(2, "2026-12-01T10:00:30Z"), _m(3, "2026-12-01T10:00:40Z")]  # type: ignore[arg-type]
    assert step_rate(rows) == pytest.approx(2 / 40)


def test_plan_in_force_is_the_newest_event_naming_a_layout() -> None:
    events = [
        {"type": "placed", "ts": "t1", "payload": {"layout": {"tp": 2, "pp": 2, "cp": 1, "dp": 1}, "world_size": 4}},
        {"type": "resumed", "ts": "t2", "payload": {"layout_short": "tp2·dp1", "world_size": 2}},
        {"type": "transition", "ts": "t3", "payload": {"from": "RECOVERING", "to": "RUNNING", "reason": "resumed"}},
    ]
    p = progress({"state": "RUNNING", "spec": {"steps": 10}, "gpus_allocated": 4}, [], events)
    assert p.layout == "tp2·dp1" and p.gpus == 2
    assert p.last_event == {"type": "transition", "ts": "t3", "summary": "RECOVERING -> RUNNING  resumed"}
    assert summarize_event(events[0]).startswith("layout=")


@pytest.mark.parametrize(("s", "text"), [(None, "-"), (5, "5s"), (65, "1m05s"), (3720, "1h02m")])
def test_format_eta(s: float | None, text: str) -> None:
    assert format_eta(s) == text
