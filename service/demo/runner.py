"""``orthoplex demo``: the whole product on one machine, shown live.

1. a local Ray cluster of several nodes with declared GPUs (CPU torch underneath);
2. the service (API + controller) as a real ``orthoplex serve`` process on SQLite (or the
   ``ORTHOPLEX_DATABASE_URL`` given);
3. two tenants and their tokens, created over REST with the admin token;
4. a job per tenant submitted over REST at the same time, so the scheduler's sharing shows;
5. live progress from the API (events and metrics), then a node holding the bigger job's ranks is
   killed: detection, the re-plan (old → new layout with predicted throughput), the resume step and
   the recovery time by phase appear as they happen;
6. a summary: loss curve as a PNG and in the terminal, plans used, GPU time lost.
7. the path that does not stop the world: the same model as two replica groups under torchft on
   this cluster, submitted over REST (`recovery.policy: replica_groups`), one group's node killed;
   the timeline shows the other group stepping on, the replacement healing from it over the network
   and joining, and no ``resumed``.

Every process the demo starts is stopped at the end, also on Ctrl-C, unless ``--keep``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from service.api.process import free_port
from service.api.scrub import scrub_text
from service.demo.report import JobReport, save_loss_png, terminal_loss_chart
from workers.states import TERMINAL, JobState

REPLICA_STEPS = 100  # the replica-groups part's job (a tp=1 step takes ~0.1-0.2 s here)
SHOWN_EVENTS = {"plan", "placed", "ranks_mapped", "checkpoint", "node_lost", "rank_failed", "hang", "straggler", "peer_unreachable",
                "replan", "resumed", "recovery", "finished", "failed", "cancelled", "preempted", "transition",
                "attempt_started", "decision"}


@dataclass
class DemoConfig:
    """What the demo runs; the defaults end in a few minutes on a 2-core machine."""

    nodes: int = 3
    gpus_per_node: int = 4
    model: str = "tiny"
    steps: int = 30
    global_batch: int = 8
    kill_at_step: int = 10
    keep: bool = False
    json_out: Path | None = None
    workdir: Path | None = None
    timeout_s: float = 900.0
    replica_phase: bool = True  # then the same model as replica groups: survivors train through a kill


@dataclass
class TenantJob:
    tenant: str
    token: str
    spec: dict[str, Any]
    job: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    last_seq: int = 0
    task: Any = None


class DemoError(RuntimeError):
    """The demo could not go on (the message says why)."""


def _port_was_taken(log_path: Path, port: int) -> bool:
    """Did the service's last start fail to bind ``port`` (uvicorn: "address already in use")?"""
    tail = log_path.read_bytes()[-4000:].decode(errors="replace")
    return "address already in use" in tail and str(port) in tail


class Demo:
    def __init__(self, cfg: DemoConfig, console: Console | None = None) -> None:
        self.cfg = cfg
        self.console = console or Console()
        self.workdir = cfg.workdir or Path(tempfile.mkdtemp(prefix="orthoplex-demo-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cluster: Any = None
        self.service: subprocess.Popen[bytes] | None = None
        self.admin_token = secrets.token_urlsafe(24)
        self.port = 0  # chosen when the service starts (Ray's processes take ports of their own)
        self.base = ""
        self.killed_node: str | None = None
        self.jobs: list[TenantJob] = []

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> int:
        """Run the demo; returns the process exit code (0 when every job succeeded)."""
        for noisy in ("httpx", "httpcore"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
        t0 = time.monotonic()
        try:
            self._start_cluster()
            self._start_service()
            self._create_tenants_and_submit()
            self._watch()
            code = self._summary(time.monotonic() - t0)
            if code == 0 and self.cfg.replica_phase:
                code = self._replica_groups_phase()
            if self.cfg.json_out is not None:
                self._write_json(self.cfg.json_out)
            if self.cfg.keep:
                self._keep()
            return code
        finally:
            if not self.cfg.keep:
                self.stop()

    def stop(self) -> None:
        """Stop the service and the cluster (idempotent; also used on Ctrl-C)."""
        if self.service is not None and self.service.poll() is None:
            self.service.send_signal(signal.SIGINT)
            try:
                self.service.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.service.kill()
                self.service.wait(timeout=10)
        self.service = None
        if self.cluster is not None:
            with contextlib.suppress(Exception):
                self._kill_supervisors()
            self.cluster.shutdown()
            self.cluster = None

    def _kill_supervisors(self) -> None:
        """Detached supervisors outlive their driver: end them before the cluster goes."""
        import ray

        from workers.runtime.supervision.launch import find_supervisor

        if not ray.is_initialized():
            ray.init(address=self.cluster.address, namespace="orthoplex", log_to_driver=False,
                     logging_level=logging.WARNING)

        for tj in self.jobs:
            jid, attempt = tj.job.get("id"), int(tj.job.get("attempt") or 0)
            for a in range(1, attempt + 1):
                handle = find_supervisor(str(jid), a)
                if handle is not None:
                    ray.kill(handle, no_restart=True)

    def connection_info(self) -> dict[str, Any]:
        """What ``--json-out`` writes: the API and dashboard URLs, the admin token, each tenant's token
        and job ids."""
        tenants: dict[str, dict[str, Any]] = {}
        for tj in self.jobs:
            t = tenants.setdefault(tj.tenant, {"name": tj.tenant, "token": tj.token, "job_ids": []})
            if tj.job.get("id") is not None:
                t["job_ids"].append(int(tj.job["id"]))
        return {"api_url": self.base, "dashboard_url": f"{self.base}/ui/", "admin_token": self.admin_token,
                "tenants": list(tenants.values())}

    def _write_json(self, path: Path) -> None:
        """Write :meth:`connection_info` to ``path`` atomically (a reader never sees half a file)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.connection_info(), indent=2))
        os.chmod(tmp, 0o600)  # it holds tokens
        tmp.replace(path)
        self.console.print(f"[green]✓[/] connection details written to {path}")

    def _keep(self) -> None:
        c = self.console
        c.rule("[bold]--keep: the service and cluster stay up")
        c.print(f"dashboard:    [bold]{self.base}/ui/[/]   (sign in with a token below)")
        c.print(f"API:          {self.base}   (OpenAPI at {self.base}/docs)")
        c.print(f"admin token:  {self.admin_token}")
        for tj in self.jobs:
            c.print(f"tenant {tj.tenant!r} token: {tj.token}")
        c.print(f"Ray address:  {self.cluster.address}")
        c.print("try: ORTHOPLEX_API_URL=... ORTHOPLEX_API_TOKEN=... orthoplex status")
        c.print("[bold]Ctrl-C stops everything.")
        # Ctrl-C and a plain `kill` both stop everything, also when the demo was started from a script
        # in the background, which leaves SIGINT ignored in its children (POSIX shells do)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _interrupt)
        try:
            while self.service is not None and self.service.poll() is None:
                time.sleep(1.0)
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()

    # ------------------------------------------------------------------ steps
    def _start_cluster(self) -> None:
        from workers.testbed.local_cluster import InProcessCluster

        cfg = self.cfg
        with self.console.status(f"starting a local Ray cluster: {cfg.nodes} nodes x {cfg.gpus_per_node} GPUs"):
            t = time.monotonic()
            self.cluster = InProcessCluster(nodes=cfg.nodes, gpus_per_node=cfg.gpus_per_node).start()
        # The demo talks to the cluster through the service only. A connected driver would also get
        # Ray's error feed printed over the demo's output (20 raylet log lines when it kills a node).
        import ray

        ray.shutdown()
        self.console.print(
            f"[green]✓[/] Ray cluster up in {time.monotonic() - t:.1f}s at {self.cluster.address}: "
            f"{cfg.nodes} nodes x {cfg.gpus_per_node} declared GPUs (CPU torch underneath)"
        )

    def _service_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("ORTHOPLEX_DATABASE_URL", f"sqlite:///{self.workdir / 'orthoplex.db'}")
        env["ORTHOPLEX_RAY_ADDRESS"] = self.cluster.address
        env["ORTHOPLEX_ADMIN_TOKEN"] = self.admin_token
        env["ORTHOPLEX_STORAGE_PATH"] = str(self.workdir / "storage")
        env["ORTHOPLEX_HOST"] = "127.0.0.1"
        env["ORTHOPLEX_PORT"] = str(self.port)
        env["ORTHOPLEX_LOG_FORMAT"] = "json"
        env["ORTHOPLEX_GPUS_PER_NODE"] = str(self.cfg.gpus_per_node)
        # the demo's cluster takes token auth (its own token, 0600): the service connects with it
        env["ORTHOPLEX_RAY_TOKEN_FILE"] = str(self.cluster.token_file)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _start_service(self, attempts: int = 3) -> None:
        """Start ``orthoplex serve`` on a free port and wait until it is ready. A free port can be
        taken by another process (Ray starts many) between choosing it and binding it: then the
        service exits at once saying so, and it is started again on another port."""
        log_path = self.workdir / "service.log"
        with self.console.status("starting the service (API + controller)"):
            t = time.monotonic()
            for attempt in range(1, attempts + 1):
                self.port = free_port()
                self.base = f"http://127.0.0.1:{self.port}"
                env = self._service_env()
                with open(log_path, "ab") as log:
                    self.service = subprocess.Popen(
                        [sys.executable, "-m", "service.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port)],
                        env=env, stdout=log, stderr=subprocess.STDOUT,
                    )
                if self._wait_ready(log_path):
                    break
                if attempt == attempts or not _port_was_taken(log_path, self.port):
                    raise DemoError(f"the service exited with {self.service.returncode}; see {log_path}")
                self.console.print(f"[yellow]port {self.port} was taken before the service bound it; "
                                   "starting it again on another port[/]")
        db = env["ORTHOPLEX_DATABASE_URL"]
        shown = db if not db.startswith("postgresql") else db.split("@")[-1]
        self.console.print(f"[green]✓[/] service ready in {time.monotonic() - t:.1f}s at {self.base} (database {shown})")

    def _wait_ready(self, log_path: Path) -> bool:
        """True once ``/readyz`` answers 200; False if the service exited first."""
        assert self.service is not None
        deadline = time.monotonic() + 120
        while True:
            if self.service.poll() is not None:
                return False
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base}/readyz", timeout=2).status_code == 200:
                    return True
            if time.monotonic() > deadline:
                raise DemoError(f"the service did not become ready; see {log_path}")
            time.sleep(0.5)

    def _admin(self, method: str, path: str, json: dict[str, Any] | None = None) -> dict[str, Any]:
        r = httpx.request(method, self.base + path, json=json, timeout=30,
                          headers={"Authorization": f"Bearer {self.admin_token}"})
        if r.status_code >= 400:
            raise DemoError(f"{method} {path} -> {r.status_code}: {r.text}")
        return r.json()

    def _create_tenants_and_submit(self) -> None:
        cfg = self.cfg
        total = cfg.nodes * cfg.gpus_per_node
        big_quota = total - cfg.gpus_per_node  # the big job spans all nodes but one
        small_quota = cfg.gpus_per_node
        tenants = [("research", big_quota, 2.0), ("product", small_quota, 1.0)]
        for name, quota, weight in tenants:
            t = self._admin("POST", "/v1/tenants", {"name": name, "gpu_quota": quota, "weight": weight})
            tok = self._admin("POST", f"/v1/tenants/{t['id']}/tokens", {"name": f"{name}-demo"})
            spec: dict[str, Any] = {
                "name": f"{name}-llama-{cfg.model}",
                "model": cfg.model,
                "steps": cfg.steps,
                "global_batch": cfg.global_batch,
                "min_gpus": 2,
                "max_gpus": quota,
                "priority": 0,
                "seed": 1234,
                "lr": 3e-3,
                "warmup_steps": 3,
                "checkpoint": {"min_every_steps": 2, "max_every_steps": 5},
            }
            if name == "research":  # show TP, PP and DP together on the big job, and the re-plan path:
                spec["layout_hint"] = {"tp": 2, "pp": 2}  # (auto would pick replica groups for its dp=2;
                spec["recovery"] = {"policy": "replan"}   # the demo's last part shows those)
            self.jobs.append(TenantJob(tenant=name, token=tok["token"], spec=spec))
            self.console.print(f"[green]✓[/] tenant [bold]{name}[/]: quota {quota} GPUs, weight {weight}, token "
                               f"{tok['token'][:10]}… (shown once)")
        # Both tenants submit at the same moment.
        from concurrent.futures import ThreadPoolExecutor

        def submit(tj: TenantJob) -> dict[str, Any]:
            r = httpx.post(f"{self.base}/v1/jobs", json=tj.spec, timeout=60,
                           headers={"Authorization": f"Bearer {tj.token}", "Idempotency-Key": f"demo-{tj.tenant}"})
            if r.status_code != 201:
                raise DemoError(f"submit for {tj.tenant} -> {r.status_code}: {r.text}")
            return r.json()

        with ThreadPoolExecutor(2) as pool:
            for tj, job in zip(self.jobs, pool.map(submit, self.jobs), strict=True):
                tj.job = job
                self.console.print(f"[green]✓[/] {tj.tenant} submitted job {job['id']} over REST "
                                   f"({tj.spec['min_gpus']}..{tj.spec['max_gpus']} GPUs, {cfg.steps} steps): {job['state']}")

    # ------------------------------------------------------------------ watching
    def _get(self, tj: TenantJob, path: str, **params: Any) -> Any:
        r = httpx.get(self.base + path, params=params, timeout=30, headers={"Authorization": f"Bearer {tj.token}"})
        r.raise_for_status()
        return r.json()

    def _poll(self, tj: TenantJob) -> list[dict[str, Any]]:
        jid = tj.job["id"]
        tj.job = self._get(tj, f"/v1/jobs/{jid}")
        new = self._get(tj, f"/v1/jobs/{jid}/events", since=tj.last_seq)
        items = new["items"] if isinstance(new, dict) else new
        if items:
            tj.last_seq = max(int(e["id"]) for e in items)
            tj.events.extend(items)
        tj.metrics = self._get(tj, f"/v1/jobs/{jid}/metrics", limit=1000) or []
        return items

    def _watch(self) -> None:
        c = self.console
        progress = Progress(
            TextColumn("[bold]{task.fields[label]:<22}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[state]:<10} loss {task.fields[loss]:>7} tok/s {task.fields[tps]:>8} "
                       "{task.fields[layout]}"),
            TimeElapsedColumn(), console=c,
        )
        deadline = time.monotonic() + self.cfg.timeout_s
        with progress:
            for tj in self.jobs:
                tj.task = progress.add_task("", total=self.cfg.steps, label=f"job {tj.job['id']} {tj.tenant}",
                                            state=tj.job["state"], loss="-", tps="-", layout="")
            while True:
                for tj in self.jobs:
                    for ev in self._poll(tj):
                        self._print_event(progress, tj, ev)
                    self._update(progress, tj)
                self._maybe_kill_node(progress)
                if all(tj.job["state"] in TERMINAL for tj in self.jobs):
                    break
                if time.monotonic() > deadline:
                    raise DemoError(f"the jobs did not finish within {self.cfg.timeout_s:.0f}s")
                if self.service is not None and self.service.poll() is not None:
                    raise DemoError(f"the service died; see {self.workdir}/service.log")
                time.sleep(0.5)

    def _update(self, progress: Progress, tj: TenantJob) -> None:
        last = max(tj.metrics, key=lambda m: int(m["step"])) if tj.metrics else None
        layout = next((_payload(e).get("short") for e in reversed(tj.events)
                       if e["type"] in ("resumed", "ranks_mapped", "plan") and _payload(e).get("short")), "")
        progress.update(
            tj.task, completed=int(last["step"]) if last else 0, state=tj.job["state"],
            loss=f"{float(last['loss']):.4f}" if last and last.get("loss") is not None else "-",
            tps=f"{float(last['tokens_per_s']):.0f}" if last and last.get("tokens_per_s") else "-",
            layout=layout or "",
        )

    def _print_event(self, progress: Progress, tj: TenantJob, ev: dict[str, Any]) -> None:
        etype = ev.get("type")
        if etype not in SHOWN_EVENTS:
            return
        p = _payload(ev)
        who = f"[cyan]job {tj.job['id']} ({tj.tenant})[/]"
        reason = ev.get("reason") or p.get("reason") or ""
        if etype == "plan":
            msg = (f"plan [bold]{p.get('short')}[/] on {p.get('num_gpus')} GPUs, predicted "
                   f"{p.get('predicted_tokens_per_s')} tok/s — {reason}")
        elif etype == "replan":
            msg = (f"[yellow]re-plan[/] [bold]{p.get('old_short')} → {p.get('new_short')}[/] "
                   f"({p.get('decision')}): predicted {p.get('old_tokens_per_s')} → {p.get('new_tokens_per_s')} tok/s, "
                   f"switch cost {p.get('switch_cost_s')}s — {reason}")
        elif etype == "recovery":
            phases = p.get("phases") or {}
            parts = ", ".join(f"{k} {float(v):.2f}s" for k, v in phases.items())
            msg = f"[green]recovered[/] in [bold]{p.get('total_s')}s[/]: {parts}"
        elif etype == "resumed":
            msg = f"[green]resumed[/] from step {p.get('from_step')} on {p.get('short')} ({p.get('world_size')} ranks)"
        elif etype in ("node_lost", "rank_failed", "hang", "straggler", "peer_unreachable", "failed"):
            msg = f"[red]{etype}[/]: {reason}"
        elif etype in ("transition", "attempt_started"):
            msg = f"state {p.get('from')} → [bold]{p.get('to')}[/]: {reason}"
        elif etype == "decision":
            msg = f"[magenta]scheduler[/] {p.get('kind')}: {reason}"
        else:
            msg = f"{etype}: {reason}"
        progress.console.print(f"{time.strftime('%H:%M:%S')} {who} {msg}")

    def _maybe_kill_node(self, progress: Progress) -> None:
        if self.killed_node is not None or not self.jobs:
            return
        big = self.jobs[0]
        steps_done = max((int(m["step"]) for m in big.metrics), default=0)
        if steps_done < self.cfg.kill_at_step:
            return
        placed = [e for e in big.events if e["type"] == "placed"]
        if not placed:
            return
        nodes = Counter(_payload(placed[-1]).get("bundle_nodes") or [])
        alive = set(self.cluster.worker_node_ids())
        # a tenant's events name nodes by an opaque name (service.api.scrub): map them back to Ray's ids
        real = {scrub_text(n): n for n in alive} | {n: n for n in alive}
        candidates = [real[n] for n, _ in nodes.most_common() if n in real]
        if not candidates:
            return
        victim = candidates[0]
        progress.console.print(
            f"{time.strftime('%H:%M:%S')} [bold red]✗ killing node {victim[:12]}[/] (holds {nodes[scrub_text(victim)] or nodes[victim]} of "
            f"job {big.job['id']}'s ranks) after step {steps_done} — a crash, no graceful drain"
        )
        self.cluster.kill_node(victim)
        self.killed_node = victim

    # ------------------------------------------------------------------ summary
    def _summary(self, wall_s: float) -> int:
        c = self.console
        reports = [JobReport.from_api(tj.job, tj.events, tj.metrics, tj.tenant) for tj in self.jobs]
        png = save_loss_png(reports, self.workdir / "loss.png")
        c.rule("[bold]summary")
        c.print(Text.from_ansi(terminal_loss_chart(reports)))
        table = Table(title="jobs")
        for col in ("job", "tenant", "state", "steps", "final loss", "plans used", "recoveries", "GPU·s lost"):
            table.add_column(col)
        for rep in reports:
            rec = "; ".join(f"{r.get('cause')} {r.get('total_s')}s" for r in rep.recoveries) or "-"
            table.add_row(str(rep.job_id), rep.tenant, rep.state, str(len(rep.steps)),
                          f"{rep.losses[-1]:.4f}" if rep.losses else "-", " → ".join(rep.layouts) or "-", rec,
                          f"{rep.gpu_seconds_lost:.1f}")
        c.print(table)
        for rep in reports:
            for r in rep.recoveries:
                phases = r.get("phases") or {}
                c.print(f"job {rep.job_id} recovery by phase: " + ", ".join(f"{k} {v}s" for k, v in phases.items())
                        + f" = {r.get('total_s')}s")
        recovered = [r for r in reports if r.recoveries and r.losses]
        clean = [r for r in reports if not r.recoveries and r.losses]
        if recovered and clean and len(recovered[0].losses) == len(clean[0].losses):
            # Both tenants train the same model, data, seed and schedule, so the job that lost a node
            # and was re-planned onto another layout must end on the uninterrupted job's loss.
            a, b = recovered[0].losses[-1], clean[0].losses[-1]
            c.print(f"final loss after recovery {a:.7f} vs the uninterrupted job {b:.7f} "
                    f"(relative difference {abs(a - b) / abs(b):.1e})")
        c.print(f"loss curve: {png}")
        c.print(f"service log: {self.workdir / 'service.log'}; wall time {wall_s:.0f}s")
        ok = all(r.state == JobState.SUCCEEDED for r in reports)
        recovered = any(r.recoveries for r in reports)
        if self.killed_node and not recovered:
            c.print("[red]a node was killed but no recovery was recorded")
            return 1
        c.print("[bold green]demo finished: every job succeeded" if ok else "[bold red]demo finished with failures")
        return 0 if ok else 1


    def _replica_groups_phase(self) -> int:
        """The path that does not stop the world, submitted over REST like the first jobs (so ``--keep``
        shows it on the dashboard with its groups): the same model as 2 replica groups of one GPU each
        under torchft (``recovery.policy: replica_groups``, a node added back for the replacement), the
        node of one group killed. The timeline shows the surviving group stepping on with the lost
        group's micro-batches, the replacement joining from the survivor's state over the network, and
        no ``resumed``."""
        c, cfg = self.console, self.cfg
        c.rule("[bold]replica groups: the survivors keep training through a node kill")
        assert self.cluster is not None and self.jobs
        self.cluster.add_node()  # a free node for the replacement group (the first phase killed one)
        owner = self.jobs[0]
        # long enough for the kill (seen through REST metrics, a few steps late) and the heal to land mid-job
        spec = {"name": f"{owner.tenant}-replica-groups", "model": cfg.model, "steps": REPLICA_STEPS,
                "global_batch": cfg.global_batch, "min_gpus": 2, "max_gpus": 2, "seed": 1234, "lr": 3e-3,
                "warmup_steps": 3, "layout_hint": {"tp": 1}, "recovery": {"policy": "replica_groups", "groups": 2},
                "checkpoint": {"min_every_steps": 2, "max_every_steps": 5}}
        tj = TenantJob(tenant=owner.tenant, token=owner.token, spec=spec)
        r = httpx.post(f"{self.base}/v1/jobs", json=spec, timeout=60,
                       headers={"Authorization": f"Bearer {tj.token}", "Idempotency-Key": "demo-replica-groups"})
        if r.status_code != 201:
            raise DemoError(f"replica-groups submit -> {r.status_code}: {r.text}")
        tj.job = r.json()
        self.jobs.append(tj)
        c.print(f"[green]✓[/] {tj.tenant} submitted job {tj.job['id']} over REST: 2 replica groups of tp=1 "
                f"(recovery.policy replica_groups), {REPLICA_STEPS} steps; a group's node is killed after step 6")
        t0, killed = time.monotonic(), False
        deadline = t0 + self.cfg.timeout_s
        while tj.job["state"] not in TERMINAL:
            for ev in self._poll(tj):
                self._print_replica_event(tj, ev)
            done = max((int(m["step"]) for m in tj.metrics), default=0)
            if not killed and done >= 6:
                killed = self._kill_a_group_node(tj)
            if time.monotonic() > deadline:
                raise DemoError(f"the replica-groups job did not finish within {self.cfg.timeout_s:.0f}s")
            time.sleep(0.5)
        for ev in self._poll(tj):
            self._print_replica_event(tj, ev)
        types = {e["type"] for e in tj.events}
        kept = {"replica_dropped", "replica_joined"} <= types and "resumed" not in types
        if tj.job["state"] != JobState.SUCCEEDED or not kept:
            c.print(f"[bold red]replica groups: job {tj.job['state']}; dropped and joined without a restart: {kept}")
            return 1
        c.print(f"[bold green]replica groups: one group lost, the other kept stepping (world 1) and a replacement "
                f"healed from it over the network: no restart, no storage read ({time.monotonic() - t0:.0f}s)")
        return 0

    def _kill_a_group_node(self, tj: TenantJob) -> bool:
        """Kill the node of the replica job's last-placed group (a crash, no drain); False if none yet."""
        placed = [e for e in tj.events if e["type"] == "placed" and _payload(e).get("group") is not None]
        if not placed:
            return False
        alive = set(self.cluster.worker_node_ids())
        real = {scrub_text(n): n for n in alive} | {n: n for n in alive}
        nodes = [real[n] for n in _payload(placed[-1]).get("bundle_nodes") or [] if n in real]
        if not nodes:
            return False
        self.console.print(f"{time.strftime('%H:%M:%S')} [bold red]✗ killing node {nodes[0][:12]}[/] (replica group "
                           f"{_payload(placed[-1]).get('group')} of job {tj.job['id']}) — a crash, no graceful drain")
        self.cluster.kill_node(nodes[0])
        return True

    def _print_replica_event(self, tj: TenantJob, ev: dict[str, Any]) -> None:
        p, etype = _payload(ev), ev.get("type")
        if etype == "replica_dropped":
            msg = (f"[bold red]replica_dropped[/]: group {p.get('group')} ({p.get('cause')}) in step {p.get('step')}, "
                   f"{p.get('groups_left')} group(s) keep stepping")
        elif etype == "replica_joined":
            msg = (f"[bold green]replica_joined[/]: group {p.get('group')} healed from group {p.get('from_group')} "
                   f"({p.get('source')}) in {p.get('seconds')}s, step {p.get('step')}: {p.get('groups')} groups")
        elif etype in ("resumed", "node_lost", "failed", "plan", "finished"):
            msg = f"{etype}: {ev.get('reason') or p.get('reason') or p.get('short') or ''}"
        else:
            return
        self.console.print(f"{time.strftime('%H:%M:%S')} [cyan]job {tj.job['id']} ({tj.tenant})[/] {msg}")


def _payload(ev: dict[str, Any]) -> dict[str, Any]:
    p = ev.get("payload")
    return p if isinstance(p, dict) else ev


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt
