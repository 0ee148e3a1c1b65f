"""``orthoplex submit|status|events|cancel|data``: the REST API from the command line.

They talk to ``ORTHOPLEX_API_URL`` with ``ORTHOPLEX_API_TOKEN`` (or ``--url`` / ``--token``).
``submit`` sends an ``Idempotency-Key`` (random per invocation, or ``--key``) so its retries after a
network error can never create a second job. Exit codes: 0 done; 1 the API refused (4xx: the
message names the field); 2 bad input (file, arguments); 3 the service is unreachable or failing.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import typer

RETRIES = 4


class ApiError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _fail(message: str, code: int) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _client(url: str | None, token: str | None) -> Any:
    import httpx

    from service.settings import get_settings

    settings = get_settings()
    token = token or settings.api_token
    if not token:
        _fail("no API token: set ORTHOPLEX_API_TOKEN or pass --token", 2)
    return httpx.Client(base_url=url or settings.api_url, headers={"Authorization": f"Bearer {token}"},
                        timeout=httpx.Timeout(30.0, connect=5.0))


def _message(resp: Any) -> str:
    try:
        detail = resp.json().get("detail")
    except ValueError:
        return resp.text[:300] or resp.reason_phrase
    if isinstance(detail, list):
        return "; ".join(f"{'.'.join(str(p) for p in e.get('loc', [])[1:]) or 'body'}: {e.get('msg')}"
                         for e in detail)
    return str(detail)


def _request(client: Any, method: str, path: str, *, retry: bool = True, **kw: Any) -> Any:
    """One API call; retries connection errors and 502/503/504 (only safe calls); raises ApiError."""
    import httpx

    last = ""
    for attempt in range(RETRIES if retry else 1):
        try:
            resp = client.request(method, path, **kw)
        except httpx.TransportError as exc:
            last = f"cannot reach {client.base_url}: {type(exc).__name__}"
        else:
            if resp.status_code < 400:
                return resp
            if resp.status_code not in (502, 503, 504):
                code = 3 if resp.status_code >= 500 else 1
                raise ApiError(code, f"{resp.status_code} {_message(resp)}")
            last = f"{resp.status_code} {_message(resp)}"
        time.sleep(min(0.25 * 2**attempt, 2.0))
    raise ApiError(3, last)


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
                              ("CANCELLED", "FAILED", "SUCCEEDED") else "")
        table.add_row(str(j["id"]), j["name"], state, str(j["gpus_allocated"]), f"{j['min_gpus']}..{j['max_gpus']}",
                      str(j["attempt"]), loss, j["created_at"][:19].replace("T", " "), j.get("reason", "")[:60])
    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze the table into 80 columns
        console = Console(width=200)
    console.print(table)


def _run(fn: Any) -> None:
    try:
        fn()
    except ApiError as exc:
        _fail(str(exc), exc.code)


UrlOpt = typer.Option(None, "--url", help="API base URL (default: ORTHOPLEX_API_URL).")
TokenOpt = typer.Option(None, "--token", help="Bearer token (default: ORTHOPLEX_API_TOKEN).")
JsonOpt = typer.Option(False, "--json", help="Print JSON instead of a table.")


def submit(
    spec_file: Path = typer.Argument(..., help="Job spec, YAML or JSON."),
    key: str | None = typer.Option(None, "--key", help="Idempotency-Key (default: random per invocation)."),
    as_json: bool = JsonOpt, url: str | None = UrlOpt, token: str | None = TokenOpt,
) -> None:
    """Submit a job; prints its id and state."""
    spec = _load(spec_file)
    headers = {"Idempotency-Key": key or uuid.uuid4().hex}

    def go() -> None:
        with _client(url, token) as c:
            job = _request(c, "POST", "/v1/jobs", json=spec, headers=headers).json()
        if as_json:
            typer.echo(json.dumps(job, indent=2))
        else:
            typer.echo(f"job {job['id']} {job['name']}: {job['state']}")

    _run(go)


def status(
    job: int | None = typer.Argument(None, help="A job id; omit to list jobs."),
    state: str | None = typer.Option(None, "--state", help="Only jobs in this state."),
    limit: int = typer.Option(20, "--limit", min=1, max=100),
    as_json: bool = JsonOpt, url: str | None = UrlOpt, token: str | None = TokenOpt,
) -> None:
    """Show one job, or list the newest jobs."""

    def go() -> None:
        with _client(url, token) as c:
            if job is not None:
                data = _request(c, "GET", f"/v1/jobs/{job}").json()
                items = [data]
            else:
                params: dict[str, Any] = {"limit": limit, **({"state": state.upper()} if state else {})}
                data = _request(c, "GET", "/v1/jobs", params=params).json()
                items = data["items"]
        if as_json:
            typer.echo(json.dumps(data, indent=2))
        else:
            _job_table(items, f"job {job}" if job is not None else f"{len(items)} job(s)")

    _run(go)


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


def _follow(c: Any, job: int, since: int, as_json: bool) -> None:
    """Follow the server-sent event stream, reconnecting from the last id after a network error."""
    import httpx

    failures = 0
    while True:
        try:
            with c.stream("GET", f"/v1/jobs/{job}/events", params={"since": since},
                          headers={"Accept": "text/event-stream"}, timeout=httpx.Timeout(60.0, connect=5.0)) as r:
                if r.status_code >= 400:
                    r.read()
                    raise ApiError(1 if r.status_code < 500 else 3, f"{r.status_code} {_message(r)}")
                event, data = "", ""
                for line in r.iter_lines():
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: "):
                        data = line[6:]
                    elif line == "" and data:
                        payload = json.loads(data)
                        if event == "end":
                            if not as_json:
                                typer.echo(f"job {job} ended: {payload.get('state')}")
                            return
                        since = payload["id"]
                        _print_event(payload, as_json)
                        event, data = "", ""
                        failures = 0
        except httpx.TransportError as exc:
            failures += 1
            if failures > RETRIES:
                raise ApiError(3, f"event stream lost: {type(exc).__name__}") from None
            time.sleep(min(0.5 * failures, 2.0))


def events(
    job: int = typer.Argument(..., help="Job id."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Stream new events until the job ends."),
    since: int = typer.Option(0, "--since", min=0, help="Only events after this event id."),
    as_json: bool = JsonOpt, url: str | None = UrlOpt, token: str | None = TokenOpt,
) -> None:
    """Print a job's events (state changes with reasons, and the runtime's events)."""

    def go() -> None:
        with _client(url, token) as c:
            if follow:
                _follow(c, job, since, as_json)
                return
            cursor = since
            while True:
                page = _request(c, "GET", f"/v1/jobs/{job}/events", params={"since": cursor, "limit": 1000}).json()
                for ev in page:
                    _print_event(ev, as_json)
                if len(page) < 1000:
                    return
                cursor = page[-1]["id"]

    _run(go)


def cancel(
    job: int = typer.Argument(..., help="Job id."),
    url: str | None = UrlOpt, token: str | None = TokenOpt,
) -> None:
    """Cancel a job (a running one stops at the controller's next step)."""

    def go() -> None:
        with _client(url, token) as c:
            data = _request(c, "POST", f"/v1/jobs/{job}/cancel").json()
        note = " (cancel requested; the controller stops it)" if data["state"] != "CANCELLED" else ""
        typer.echo(f"job {data['id']}: {data['state']}{note}")

    _run(go)


def register(app: typer.Typer) -> None:
    """Add ``submit``, ``status``, ``events`` and ``cancel`` to ``app``."""
    app.command("submit")(submit)
    app.command("status")(status)
    app.command("events")(events)
    app.command("cancel")(cancel)
    app.add_typer(data_app, name="data")


data_app = typer.Typer(help="Your data area: upload files for jobs' data.paths, list, download, remove.",
                       no_args_is_help=True)


@data_app.command("upload")
def data_upload(
    file: Path = typer.Argument(..., help="Local file to upload."),
    dest: str | None = typer.Argument(None, help="Path inside your data area (default: the file's name)."),
    url: str | None = UrlOpt, token: str | None = TokenOpt,
) -> None:
    """Upload a file (streamed, with a progress bar) into your data area."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    from workers.data_area import DataArea, DataPathError, split_path

    if not file.is_file():
        _fail(f"{file}: not a file", 2)
    target = dest or file.name
    try:  # the server's rule, checked here too: a URL would lose its '..' before reaching it
        split_path(target, DataArea(root=Path(".")))
    except DataPathError as exc:
        _fail(f"dest: {exc.msg}", 2)
    size = file.stat().st_size

    def go() -> None:
        with _client(url, token) as c, Progress("[progress.description]{task.description}", BarColumn(),
                                                DownloadColumn(), TransferSpeedColumn(), transient=True) as bar:
            task = bar.add_task(target, total=size)

            def chunks() -> Any:
                with open(file, "rb") as f:
                    while chunk := f.read(1 << 20):
                        bar.advance(task, len(chunk))
                        yield chunk

            out = _request(c, "PUT", f"/v1/data/{target}", retry=False, content=chunks(),
                           headers={"Content-Length": str(size)}).json()
        typer.echo(f"uploaded {out['path']} ({out['bytes']} bytes)")

    _run(go)


@data_app.command("list")
def data_list(as_json: bool = JsonOpt, url: str | None = UrlOpt, token: str | None = TokenOpt) -> None:
    """List the files of your data area."""

    def go() -> None:
        with _client(url, token) as c:
            data = _request(c, "GET", "/v1/data").json()
        if as_json:
            typer.echo(json.dumps(data, indent=2))
            return
        for f in data["items"]:
            typer.echo(f"{f['bytes']:>14,}  {f['path']}")
        typer.echo(f"{data['used_bytes']:,} of {data['quota_bytes']:,} bytes used")

    _run(go)


@data_app.command("download")
def data_download(
    path: str = typer.Argument(..., help="Path inside your data area."),
    out: Path = typer.Argument(..., help="Local file to write."),
    url: str | None = UrlOpt, token: str | None = TokenOpt,
) -> None:
    """Download a file of your data area (e.g. a job's exported results)."""

    def go() -> None:
        with _client(url, token) as c:
            data = _request(c, "GET", f"/v1/data/{path}").content
        out.write_bytes(data)
        typer.echo(f"wrote {out} ({len(data)} bytes)")

    _run(go)


@data_app.command("rm")
def data_rm(path: str = typer.Argument(..., help="Path inside your data area."),
            url: str | None = UrlOpt, token: str | None = TokenOpt) -> None:
    """Remove a file from your data area."""

    def go() -> None:
        with _client(url, token) as c:
            _request(c, "DELETE", f"/v1/data/{path}")
        typer.echo(f"removed {path}")

    _run(go)
