"""``orthoplex submit|status|events|cancel|artifacts|data|cluster drain``: the REST API from the command line.

Every call goes through the Python SDK (``orthoplex.Client``): one place for auth, retries, the
event stream's cursor and error mapping; this module only reads arguments and prints. They talk
to ``ORTHOPLEX_API_URL`` with ``ORTHOPLEX_API_TOKEN`` (or ``--url`` / ``--token``). ``submit``
sends an ``Idempotency-Key`` (random per invocation, or ``--key``) so its retries after a network
error can never create a second job. Exit codes: 0 done; 1 the API refused (4xx: the message names
the field); 2 bad input (file, arguments); 3 the service is unreachable or failing; 4 (``events
--follow`` only) the job ended without succeeding (FAILED or CANCELLED).
Every command takes ``--json`` for scripts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from workers.states import TERMINAL, JobState

if TYPE_CHECKING:
    from orthoplex import Client

#: ``events --follow`` keeps reconnecting (with its cursor) this long while the service is down.
FOLLOW_RECONNECT_S = 300.0
#: Exit code of ``events --follow`` when the job ended in a state other than SUCCEEDED.
EXIT_JOB_UNSUCCESSFUL = 4


def _fail(message: str, code: int) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _client(url: str | None, token: str | None) -> Client:
    from orthoplex import Client
    from service.settings import get_settings

    settings = get_settings()
    token = token or settings.api_token
    if not token:
        _fail("no API token: set ORTHOPLEX_API_TOKEN or pass --token", 2)
    return Client(url or settings.api_url, token)


def exit_code(exc: Exception) -> int:
    """The CLI's exit code for an SDK error: 2 found before sending (bad input), 3 the service
    unreachable or failing, 1 refused by the API."""
    from orthoplex import ServerError, ServiceUnavailable

    if isinstance(exc, ServiceUnavailable | ServerError):
        return 3
    return 2 if getattr(exc, "status", None) is None else 1


def _load(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        _fail(f"cannot read {path}: {exc.strerror or exc}", 2)
    except yaml.YAMLError as exc:
        _fail(f"{path} is not valid YAML/JSON: {exc}", 2)
    if not isinstance(data, dict):
        _fail(f"{path}: expected a mapping (the job spec)", 2)
    return data


def _job_table(jobs: list[dict[str, Any]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("id", "name", "state", "gpus", "min..max", "attempt", "final loss", "created", "reason"):
        table.add_column(col, justify="right" if col in ("id", "gpus", "attempt", "final loss") else "left")
    for j in jobs:
        loss = f"{j['final_loss']:.4f}" if j.get("final_loss") is not None else ""
        state = j["state"] + (" (cancel requested)" if j.get("cancel_requested") and j["state"] not in
                              TERMINAL else "")
        table.add_row(str(j["id"]), j["name"], state, str(j["gpus_allocated"]), f"{j['min_gpus']}..{j['max_gpus']}",
                      str(j["attempt"]), loss, j["created_at"][:19].replace("T", " "), j.get("reason", "")[:60])
    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze the table into 80 columns
        console = Console(width=200)
    console.print(table)


def _say(as_json: bool, data: dict[str, Any], text: str) -> None:
    """One result line: ``data`` as JSON for scripts (``--json``), else ``text`` for people."""
    typer.echo(json.dumps(data) if as_json else text)


def _run(url: str | None, token: str | None, fn: Callable[[Client], None]) -> None:
    """``fn`` with a client; an SDK error becomes ``error: ...`` and its exit code."""
    from orthoplex import OrthoplexError

    with _client(url, token) as c:
        try:
            fn(c)
        except OrthoplexError as exc:
            _fail(str(exc), exit_code(exc))


UrlOpt = typer.Option(None, "--url", help="API base URL (default: ORTHOPLEX_API_URL).")
TokenOpt = typer.Option(None, "--token", help="Bearer token (default: ORTHOPLEX_API_TOKEN).")
JsonOpt = typer.Option(False, "--json", help="Print JSON instead of a table.")


def check_spec(spec: dict[str, Any]) -> list[str]:
    """``field: message`` for each problem the API's schema and cross-field rules find in ``spec``
    (``service.api.schemas.JobSpec``, ``service.api.routes.jobs.validate_spec``: the one home of
    those rules), checked as the API checks the JSON body; empty when it passes."""
    from fastapi.exceptions import RequestValidationError
    from pydantic import ValidationError

    from orthoplex._transport import field_name
    from service.api.routes.jobs import validate_spec
    from service.api.schemas import JobSpec

    def where(loc: Any, tagged: bool = False) -> str:
        return field_name(loc, tagged) or "spec"

    try:
        parsed = JobSpec.model_validate_json(json.dumps(spec, default=str))
        validate_spec(parsed)
    except ValidationError as exc:
        return [f"{where(e['loc'], tagged=True)}: {e['msg']}" for e in exc.errors()]
    except RequestValidationError as exc:
        return [f"{where(e['loc'])}: {e['msg']}" for e in exc.errors()]
    return []


def submit(
    spec_file: Path = typer.Argument(..., help="Job spec, YAML or JSON."),
    key: str | None = typer.Option(None, "--key", help="Idempotency-Key (default: random per invocation)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the job id (for scripts)."),
    as_json: bool = JsonOpt, url: str | None = UrlOpt, token: str | None = TokenOpt,
) -> None:
    """Submit a job; prints its id and state. The spec is checked here first, by the API's own
    rules (exit 2 naming the field); what needs the tenant's data area (paths resolving inside it,
    an HF model's config, a tokenizer's vocabulary) the API checks (exit 1 naming the field)."""
    spec = _load(spec_file)
    problems = check_spec(spec)
    if problems:
        _fail(f"{spec_file}: " + "; ".join(problems), 2)

    def go(c: Client) -> None:
        job = c.submit(spec, idempotency_key=key)
        if as_json:
            typer.echo(json.dumps(job.model_dump(mode="json"), indent=2))
        elif quiet:
            typer.echo(str(job.id))
        else:
            typer.echo(f"job {job.id} {job.name}: {job.state}")

    _run(url, token, go)


def _job_detail(job: dict[str, Any], prog: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    from service.cli.progress import format_eta

    t = Table(title=f"job {job['id']} {job['name']}", show_header=False)
    t.add_column("field", style="bold")
    t.add_column("value")
    state = job["state"] + (" (cancel requested)" if job.get("cancel_requested") and job["state"] not in
                            TERMINAL else "")
    t.add_row("state", f"{state}  {job.get('reason', '')}".strip())
    done = f"{prog.step}/{prog.steps}" if prog.step is not None else f"0/{prog.steps}"
    pct = f" ({100 * (prog.step or 0) / prog.steps:.0f} %)" if prog.steps else ""
    t.add_row("progress", done + pct)
    t.add_row("loss", f"{prog.loss:.4f}" if prog.loss is not None else "-")
    t.add_row("tokens/s", f"{prog.tokens_per_s:,.0f}" if prog.tokens_per_s else "-")
    t.add_row("ETA", format_eta(prog.eta_s))
    t.add_row("plan", f"{prog.layout or '-'} on {prog.gpus or 0} GPU(s)")
    t.add_row("GPUs", f"{job['gpus_allocated']} allocated ({job['min_gpus']}..{job['max_gpus']})")
    if job.get("recovery"):
        from service.cli.plan import recovery_line

        t.add_row("recovery", recovery_line(job["recovery"], str(job["spec"].get("recovery", {}).get("policy", "auto"))))
    if prog.last_event:
        ev = prog.last_event
        t.add_row("last event", f"{str(ev['ts'])[:19].replace('T', ' ')}  {ev['type']}  {ev['summary']}"[:200])
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    console.print(t)


def status(
    job: int | None = typer.Argument(None, help="A job id; omit to list jobs."),
    state: str | None = typer.Option(None, "--state", help="Only jobs in this state."),
    limit: int = typer.Option(20, "--limit", min=1, max=100),
    as_json: bool = JsonOpt, url: str | None = UrlOpt, token: str | None = TokenOpt,
) -> None:
    """Show one job (progress: step / steps, loss, tokens/s, ETA; the plan in force; the last event),
    or list the newest jobs."""
    from service.cli.progress import progress

    def go(c: Client) -> None:
        if job is not None:
            found = c.get(job)
            data = found.model_dump(mode="json")
            metrics = [m.model_dump(mode="json") for m in c.recent_metrics(found)]
            prog = progress(data, metrics, [e.model_dump(mode="json") for e in c.events(job, follow=False)])
            if as_json:
                typer.echo(json.dumps({**data, "progress": prog.to_dict()}, indent=2))
            else:
                _job_detail(data, prog)
            return
        listed = c.list(state=state, limit=limit).model_dump(mode="json")
        if as_json:
            typer.echo(json.dumps(listed, indent=2))
        else:
            _job_table(listed["items"], f"{len(listed['items'])} job(s)")

    _run(url, token, go)


def _print_event(ev: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(ev))
        return
    p = ev.get("payload") or {}
    if ev["type"] in ("transition", "attempt_started"):
        what = f"{p.get('from')} -> {p.get('to')}  {p.get('reason', '')}"
    else:
        what = " ".join(f"{k}={v}" for k, v in p.items())[:160]
    typer.echo(f"{ev['ts'][:19].replace('T', ' ')}  #{ev['id']:<6} {ev['type']:<16} {what}")


def events(
    job: int = typer.Argument(..., help="Job id."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Stream new events until the job ends."),
    since: int = typer.Option(0, "--since", min=0, help="Only events after this event id."),
    as_json: bool = JsonOpt, url: str | None = UrlOpt, token: str | None = TokenOpt,
) -> None:
    """Print a job's events (state changes with reasons, and the runtime's events).

    With ``--follow`` it prints events as they arrive and ends when the job ends: exit 0 if it
    SUCCEEDED, 4 if it ended otherwise; it reconnects with its cursor while the service restarts."""

    def go(c: Client) -> None:
        stream = c.events(job, follow=follow, since=since, reconnect_s=FOLLOW_RECONNECT_S)
        for ev in stream:
            _print_event(ev.model_dump(mode="json"), as_json)
        if not follow:
            return
        if as_json:
            typer.echo(json.dumps({"type": "end", "job": job, "state": stream.state}))
        else:
            typer.echo(f"job {job} ended: {stream.state}")
        if stream.state != JobState.SUCCEEDED:
            raise typer.Exit(EXIT_JOB_UNSUCCESSFUL)

    _run(url, token, go)


def cancel(
    job: int = typer.Argument(..., help="Job id."),
    as_json: bool = JsonOpt, url: str | None = UrlOpt, token: str | None = TokenOpt,
) -> None:
    """Cancel a job (a running one stops at the controller's next step)."""

    def go(c: Client) -> None:
        data = c.cancel(job)
        if as_json:
            typer.echo(json.dumps(data.model_dump(mode="json"), indent=2))
            return
        note = " (cancel requested; the controller stops it)" if data.state != JobState.CANCELLED else ""
        typer.echo(f"job {data.id}: {data.state}{note}")

    _run(url, token, go)


def artifacts(
    job: int = typer.Argument(..., help="Job id."),
    get: str | None = typer.Option(None, "--get", help="Download this artifact file, or every file under this "
                                   "folder (e.g. 'export' for the HF export), into --out."),
    out: Path = typer.Option(Path("."), "--out", help="Where --get writes (a folder; created)."),
    as_json: bool = JsonOpt, url: str | None = UrlOpt, token: str | None = TokenOpt,
) -> None:
    """List a job's artifacts (checkpoints, HF export, TensorBoard files), or download some (--get)."""

    def go(c: Client) -> None:
        from orthoplex import NotFound

        if get is None:
            listing = c.artifacts(job)
            if as_json:
                typer.echo(json.dumps(listing.model_dump(mode="json"), indent=2))
                return
            typer.echo(f"checkpoints: {', '.join(listing.checkpoints) or '-'}")
            typer.echo(f"export: {listing.export or '-'}    tensorboard: {listing.tensorboard or '-'}")
            for f in listing.items:
                typer.echo(f"{f.bytes:>14,}  {f.kind:<11}  {f.path}")
            return
        try:
            written = c.download_artifacts(job, get, out)
        except NotFound as exc:
            if exc.status is not None:  # the API's 404 (no such job): exit 1
                raise
            _fail(f"--get {get}: no artifact of job {job} is or lies under it", 2)
        _say(as_json, {"job": job, "files": [str(p) for p in written]}, f"wrote {len(written)} file(s) into {out}")

    _run(url, token, go)


def _drain_line(d: Any) -> str:
    when = f", deadline {d.deadline_at:%H:%M:%S} UTC ({d.deadline_s:g} s)" if d.deadline_at is not None else ""
    return f"node {d.node_id}: {d.state} ({d.gpus_held} GPU(s) still held){when}"


def cluster_drain(
    node: str = typer.Argument(..., help="Ray node id (`orthoplex` GET /v1/cluster lists them; admin token)."),
    deadline: float = typer.Option(60.0, "--deadline", help="Seconds every job on the node has to move off it."),
    as_json: bool = JsonOpt, url: str | None = UrlOpt, token: str | None = TokenOpt,
) -> None:
    """Drain a node (admin): no new work goes there, every job on it moves off before the deadline with
    no step redone (a replica job's group is replaced from a peer, a one-gang job re-plans from memory)."""
    if not deadline > 0 or deadline > 7 * 86_400:
        _fail(f"--deadline: must be > 0 and at most 7 days of seconds, got {deadline:g}", 2)

    def go(c: Client) -> None:
        d = c.admin.drain_node(node, deadline)
        _say(as_json, d.model_dump(mode="json"), _drain_line(d))

    _run(url, token, go)


def cluster_undrain(
    node: str = typer.Argument(..., help="Ray node id."),
    as_json: bool = JsonOpt, url: str | None = UrlOpt, token: str | None = TokenOpt,
) -> None:
    """Undrain a node (admin): it takes new work again."""

    def go(c: Client) -> None:
        d = c.admin.undrain_node(node)
        _say(as_json, d.model_dump(mode="json"), _drain_line(d))

    _run(url, token, go)


def cluster_group(app: typer.Typer) -> typer.Typer:
    """The one ``orthoplex cluster`` group of ``app`` (``cluster up|down``: ``service.cli.runtime``;
    ``drain|undrain``: here), added once."""
    for g in app.registered_groups:
        if g.name == "cluster" and g.typer_instance is not None:
            return g.typer_instance
    group = typer.Typer(help="The Ray cluster: local multi-node clusters with declared GPUs (up, down), and "
                             "draining nodes of the service's cluster (drain, undrain).", no_args_is_help=True)
    app.add_typer(group, name="cluster")
    return group


def register(app: typer.Typer) -> None:
    """Add ``submit``, ``status``, ``events``, ``cancel``, ``artifacts``, ``data ...`` and ``cluster
    drain|undrain`` to ``app``."""
    app.command("submit")(submit)
    app.command("status")(status)
    app.command("events")(events)
    app.command("cancel")(cancel)
    app.command("artifacts")(artifacts)
    data_group(app)
    group = cluster_group(app)
    group.command("drain")(cluster_drain)
    group.command("undrain")(cluster_undrain)


data_app = typer.Typer(help="Data: your data area on the service (upload files for jobs' data.paths, list, "
                            "download, remove) and local tokenization (prepare).", no_args_is_help=True)


def data_group(app: typer.Typer) -> typer.Typer:
    """The one ``orthoplex data`` group, added to ``app`` once: the client's data-area commands and
    ``data prepare`` (``service.cli.data``) both live in it (two groups of one name hide each other)."""
    if not any(g.name == "data" for g in app.registered_groups):
        app.add_typer(data_app, name="data")
    return data_app


@data_app.command("upload")
def data_upload(
    file: Path = typer.Argument(..., help="Local file to upload."),
    dest: str | None = typer.Argument(None, help="Path inside your data area (default: the file's name)."),
    as_json: bool = JsonOpt, url: str | None = UrlOpt, token: str | None = TokenOpt,
) -> None:
    """Upload a file (streamed, with a progress bar) into your data area."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    from orthoplex import Invalid

    if not file.is_file():
        _fail(f"{file}: not a file", 2)
    target = dest or file.name

    def go(c: Client) -> None:
        with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                      TransferSpeedColumn(), transient=True) as bar:
            task = bar.add_task(target, total=file.stat().st_size)
            try:
                out = c.data.upload(file, target, progress=lambda done, total: bar.update(task, completed=done))
            except Invalid as exc:
                if exc.status is not None:
                    raise
                # the server's rule, checked before sending: a URL would lose its '..' on the way
                _fail(f"dest: {exc.message}", 2)
        _say(as_json, out.model_dump(mode="json"), f"uploaded {out.path} ({out.bytes} bytes)")

    _run(url, token, go)


@data_app.command("list")
def data_list(
    cursor: str | None = typer.Option(None, "--cursor", help="Start after this path (a page's next_cursor)."),
    limit: int | None = typer.Option(None, "--limit", min=1, max=1000, help="Files per page (default 1000)."),
    all_pages: bool = typer.Option(False, "--all", help="Follow every page to the end."),
    as_json: bool = JsonOpt, url: str | None = UrlOpt, token: str | None = TokenOpt,
) -> None:
    """List the files of your data area, a page at a time (``--all`` follows every page)."""

    def go(c: Client) -> None:
        data = c.data.list(cursor, limit)
        items = list(data.items)
        while all_pages and data.next_cursor:
            data = c.data.list(data.next_cursor, limit)
            items += data.items
        if as_json:
            out = data.model_dump(mode="json")
            out["items"] = [f.model_dump(mode="json") for f in items]
            typer.echo(json.dumps(out, indent=2))
            return
        for f in items:
            typer.echo(f"{f.bytes:>14,}  {f.path}")
        typer.echo(f"{data.used_bytes:,} of {data.quota_bytes:,} bytes used, "
                   f"{data.used_entries:,} of {data.quota_entries:,} entries")
        if data.next_cursor:
            typer.echo(f"more: --cursor {data.next_cursor} (or --all)")

    _run(url, token, go)


@data_app.command("download")
def data_download(
    path: str = typer.Argument(..., help="Path inside your data area."),
    out: Path = typer.Argument(..., help="Local file to write."),
    as_json: bool = JsonOpt, url: str | None = UrlOpt, token: str | None = TokenOpt,
) -> None:
    """Download a file of your data area (e.g. a job's exported results)."""

    def go(c: Client) -> None:
        size = c.data.download(path, out).stat().st_size
        _say(as_json, {"path": path, "out": str(out), "bytes": size}, f"wrote {out} ({size} bytes)")

    _run(url, token, go)


@data_app.command("rm")
def data_rm(path: str = typer.Argument(..., help="Path inside your data area."),
            as_json: bool = JsonOpt, url: str | None = UrlOpt, token: str | None = TokenOpt) -> None:
    """Remove a file from your data area."""

    def go(c: Client) -> None:
        c.data.rm(path)
        _say(as_json, {"removed": path}, f"removed {path}")

    _run(url, token, go)
