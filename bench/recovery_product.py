"""``orthoplex bench recovery --parts product``: issue 38's goals measured through the service, as a user
gets them: jobs submitted over REST with a spec that names no recovery option (the service's defaults:
``recovery.policy`` auto, snapshots and warm ranks on), each fault run against its no-fault run in the
same invocation, on the same cluster and service.

Stack: ``orthoplex demo``'s machinery (``service.demo.runner.Demo``): a local Ray cluster with declared
GPUs and Ray token auth, ``orthoplex serve`` (API + controller) on SQLite, a tenant and its token made
over REST. Faults come from outside, as an operator or a crash would: a node's raylet and everything
under it killed (``InProcessCluster.kill_node``, as the demo does), ``POST /v1/cluster/nodes/{node}/drain``
(deadline 60 s), and a scheduler shrink then grow (a second tenant's job that reclaims the GPUs the
replica job borrowed, then cancelled). Everything measured is read back over REST (metrics and events).

* replica job: 4 nodes x 2 declared GPUs, ``max_gpus`` 6, layout hint ``tp=2``;
* single-group job: 3 nodes x 4 declared GPUs, ``max_gpus`` 8, layout hint ``tp=4,pp=2``.

Measures (:func:`measure`): the longest gap between two consecutive committed steps (metrics ``ts``;
steps 1-2, the start, left out), steps redone (a committed step measured again in a later epoch, plus
for replica groups the in-flight step the survivors redo without a lost group: one per
``replica_dropped`` of cause ``lost``), max |loss - no-fault loss| per step, ``node_lost`` -> ``resumed``,
the ``resumed`` sources, attempts (a new attempt restores from storage), the groups after the last
``replica_joined`` and where it healed from.
"""

from __future__ import annotations

import datetime as dt
import itertools
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from workers.states import TERMINAL

STEPS, KILL_AT, GLOBAL_BATCH, RESIZE_WAIT_S = 40, 15, 12, 90.0
REPLICA = {"nodes": 4, "gpus": 2, "max_gpus": 6, "hint": {"tp": 2}}
SINGLE = {"nodes": 3, "gpus": 4, "max_gpus": 8, "hint": {"tp": 4, "pp": 2}}
DEADLINE_S = 60
RUN_TIMEOUT_S = 900.0


def _ts(x: str) -> float:
    return dt.datetime.fromisoformat(x.replace("Z", "+00:00")).timestamp()


def _p(ev: dict[str, Any]) -> dict[str, Any]:
    p = ev.get("payload")
    return p if isinstance(p, dict) else {}


class _Stack:
    """A cluster and the service on it (the demo's), a tenant, and REST calls."""

    def __init__(self, nodes: int, gpus: int, work: Path) -> None:
        from rich.console import Console

        from service.demo.runner import Demo, DemoConfig

        self.demo = Demo(DemoConfig(nodes=nodes, gpus_per_node=gpus, workdir=work, replica_phase=False),
                         console=Console(quiet=True))
        self.gpus = gpus
        self.tokens: dict[str, str] = {}
        self.owner: dict[int, str] = {}  # job id -> its tenant's token (job routes take a tenant token)

    def start(self) -> _Stack:
        self.demo._start_cluster()
        self.demo._start_service()
        return self

    def stop(self) -> None:
        self.demo.stop()

    def tenant(self, name: str, quota: int) -> str:
        t = self.demo._admin("POST", "/v1/tenants", {"name": name, "gpu_quota": quota, "weight": 1.0})
        self.tokens[name] = self.demo._admin("POST", f"/v1/tenants/{t['id']}/tokens", {"name": name})["token"]
        return self.tokens[name]

    def _call(self, method: str, path: str, token: str | None = None, **kw: Any) -> Any:
        r = httpx.request(method, self.demo.base + path, timeout=60,
                          headers={"Authorization": f"Bearer {token or self.demo.admin_token}"}, **kw)
        if r.status_code >= 400:
            raise RuntimeError(f"{method} {path} -> {r.status_code}: {r.text[:500]}")
        return r.json()

    def submit(self, tenant: str, spec: dict[str, Any]) -> int:
        jid = int(self._call("POST", "/v1/jobs", self.tokens[tenant], json=spec)["id"])
        self.owner[jid] = self.tokens[tenant]
        return jid

    def job(self, jid: int) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{jid}", self.owner[jid])

    def events(self, jid: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        since = 0
        while True:
            page = self._call("GET", f"/v1/jobs/{jid}/events", self.owner[jid], params={"since": since, "limit": 1000})
            items = page["items"] if isinstance(page, dict) else page
            if not items:
                return out
            out += items
            since = max(int(e["id"]) for e in items)

    def metrics(self, jid: int) -> list[dict[str, Any]]:
        return self._call("GET", f"/v1/jobs/{jid}/metrics", self.owner[jid], params={"limit": 1000}) or []

    def steps_done(self, jid: int) -> int:
        return max((int(m["step"]) for m in self.metrics(jid)), default=0)

    def wait(self, jid: int, cond: Any, what: str, timeout_s: float = RUN_TIMEOUT_S) -> Any:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            got = cond()
            if got:
                return got
            if self.job(jid)["state"] in TERMINAL:
                raise RuntimeError(f"job {jid} ended {self.job(jid)['state']} waiting for {what}")
            if self.demo.service is not None and self.demo.service.poll() is not None:
                raise RuntimeError("the service died")
            time.sleep(0.5)
        raise RuntimeError(f"job {jid}: timed out waiting for {what}")

    def finish(self, jid: int) -> str:
        end = time.monotonic() + RUN_TIMEOUT_S
        while (state := self.job(jid)["state"]) not in TERMINAL:
            if time.monotonic() > end:
                raise RuntimeError(f"job {jid}: timed out waiting for the end")
            time.sleep(0.5)
        return str(state)

    def job_nodes(self, jid: int) -> list[str]:
        """The job's nodes (Ray ids), most ranks first, from its latest ``placed`` events."""
        from service.api.scrub import scrub_text

        alive = self.demo.cluster.worker_node_ids()
        real = {scrub_text(n): n for n in alive} | {n: n for n in alive}
        placed = [e for e in self.events(jid) if e["type"] == "placed"]
        count: Counter[str] = Counter()
        for e in placed[-4:]:
            count.update(_p(e).get("bundle_nodes") or [])
        return [real[n] for n, _ in count.most_common() if n in real]


def _spec(name: str, cfg: dict[str, Any], steps: int) -> dict[str, Any]:
    """The job as a user writes it: no recovery option named."""
    return {"name": name, "model": "tiny", "steps": steps, "global_batch": GLOBAL_BATCH, "min_gpus": 1,
            "max_gpus": cfg["max_gpus"], "seed": 1234, "layout_hint": dict(cfg["hint"]),
            "checkpoint": {"min_every_steps": 1, "max_every_steps": 10}}


def measure(job: dict[str, Any], events: list[dict[str, Any]], metrics: list[dict[str, Any]],
            ref: dict[int, float] | None) -> dict[str, Any]:
    """What the REST view of one run says (see the module's docstring)."""
    rows = sorted(metrics, key=lambda m: _ts(m["ts"]))
    per_step = Counter(int(m["step"]) for m in rows)
    losses = {int(m["step"]): float(m["loss"]) for m in rows if m.get("loss") is not None}  # last run of a step
    ts = [_ts(m["ts"]) for m in rows if int(m["step"]) > 2]
    gaps = [b - a for a, b in itertools.pairwise(ts)]
    types = Counter(e["type"] for e in events)
    lost = [e for e in events if e["type"] == "replica_dropped" and _p(e).get("cause", "lost") == "lost"]
    resumed = [e for e in events if e["type"] == "resumed"]
    node_lost = next((e for e in events if e["type"] == "node_lost"), None)
    after = next((e for e in resumed if node_lost is not None and int(e["id"]) > int(node_lost["id"])), None)
    joined = [e for e in events if e["type"] == "replica_joined"]
    choice = next((_p(e).get("recovery") for e in events if e["type"] == "attempt_started" and _p(e).get("recovery")),
                  None) or job.get("recovery")
    out: dict[str, Any] = {
        "state": job["state"], "attempts": int(job.get("attempt") or types.get("attempt_started", 0)),
        "steps": len(per_step), "final_loss": losses.get(max(losses)) if losses else None,
        "longest_gap_s": round(max(gaps), 3) if gaps else None,
        "median_gap_s": round(sorted(gaps)[len(gaps) // 2], 3) if gaps else None,
        "steps_measured_again": sum(n - 1 for n in per_step.values()),
        "steps_redone": sum(n - 1 for n in per_step.values()) + len(lost),
        "resumed": [{k: _p(e).get(k) for k in ("cause", "source", "from_step", "steps_redone")} for e in resumed],
        "storage_reads": sum(1 for e in resumed if _p(e).get("source") == "storage"),
        "events": {k: types[k] for k in ("node_lost", "replica_dropped", "replica_joined", "drained", "resumed",
                                          "started", "attempt_started", "checkpoint", "decision") if types.get(k)},
        "replica_dropped": [{k: _p(e).get(k) for k in ("group", "step", "groups_left", "cause")}
                            for e in events if e["type"] == "replica_dropped"],
        "replica_joined": [{k: _p(e).get(k) for k in ("group", "source", "from_group", "groups", "seconds")}
                           for e in joined],
        "drained": [{k: _p(e).get(k) for k in ("how", "source", "step", "seconds")}
                    for e in events if e["type"] == "drained"],
        "recovery": {k: (choice or {}).get(k) for k in ("policy", "groups", "group_gpus", "snapshots", "warm_ranks",
                                                         "reason")} if isinstance(choice, dict) else None,
    }
    if joined:
        out["groups_at_end"] = _p(joined[-1]).get("groups")
        out["healed_from"] = sorted({_p(e).get("source") for e in joined})
    started = [e for e in events if e["type"] == "started"]
    if started:  # the last gang start: its warm ranks (and what an idle one holds in memory), actors and setup
        out["last_start"] = {k: _p(started[-1]).get(k) for k in ("warm_ranks", "warm_rank_rss_mb", "actors_s",
                                                                 "setup_s")}
    rec = [e for e in events if e["type"] == "recovery"]
    if rec:  # the last switch's phases (detect, plan, place, start, load, first_step)
        out["recovery_phases"] = _p(rec[-1]).get("phases")
    if node_lost is not None and after is not None:
        out["node_lost_to_resumed_s"] = round(_ts(after["ts"]) - _ts(node_lost["ts"]), 3)
        out["resume_source"] = _p(after).get("source")
    if ref is not None:
        common = [s for s in losses if s in ref]
        out["max_abs_loss_diff"] = max((abs(losses[s] - ref[s]) for s in common), default=None)
    out["losses"] = losses
    return out


def _one(stack: _Stack, name: str, cfg: dict[str, Any], fault: str | None, ref: dict[int, float] | None,
         steps: int = STEPS) -> dict[str, Any]:
    jid = stack.submit("bench", _spec(name, cfg, steps))
    t0 = time.time()
    node = None
    if fault is not None:
        stack.wait(jid, lambda: stack.steps_done(jid) >= KILL_AT - 1, f"step {KILL_AT - 1}")
        node = stack.job_nodes(jid)[-1 if fault == "kill" else 0]
        if fault == "kill":
            stack.demo.cluster.kill_node(node)
        else:
            stack._call("POST", f"/v1/cluster/nodes/{node}/drain", json={"deadline_s": DEADLINE_S})
    state = stack.finish(jid)
    row = measure(stack.job(jid), stack.events(jid), stack.metrics(jid), ref)
    row.update({"run": name, "job_id": jid, "fault": fault, "fault_at_step": KILL_AT if fault else None,
                "wall_s": round(time.time() - t0, 1), "state": state})
    if fault == "drain" and node is not None:
        stack._call("POST", f"/v1/cluster/nodes/{node}/undrain")
    if fault == "kill":  # the cluster back to its size (no driver here: the service's is the only one)
        stack.demo.cluster.add_node()
        time.sleep(5)
    return row


def _resize(stack: _Stack, cfg: dict[str, Any]) -> dict[str, Any]:
    """The replica job of tenant ``elastic`` (quota 4: its third group borrowed) and, once it trains,
    a job of tenant ``urgent`` (quota 4, exactly 4 GPUs) that reclaims the borrowed group: the scheduler
    shrinks the replica job by a group; cancelling the urgent job (once it trains, or after
    ``RESIZE_WAIT_S``) lets it grow back. The replica job is cancelled once the grow is seen (or not,
    after ``RESIZE_WAIT_S``): what happened is in the row (``urgent_started``, ``grown``)."""
    jid = stack.submit("elastic", {**_spec("resize", cfg, 100_000), "min_gpus": 2})
    stack.wait(jid, lambda: stack.steps_done(jid) >= 5, "step 5")
    out: dict[str, Any] = {"run": "resize", "job_id": jid, "gpus_before": stack.job(jid).get("gpus_allocated")}
    urgent = stack.submit("urgent", {"name": "urgent", "model": "tiny", "steps": 100_000, "global_batch": 8,
                                     "min_gpus": 4, "max_gpus": 4, "seed": 1})
    t_submit = time.time()

    def seen(kind: str, since: float) -> list[dict[str, Any]]:
        return [e for e in stack.events(jid) if e["type"] == kind and _ts(e["ts"]) >= since - 1]

    try:
        shrunk = stack.wait(jid, lambda: seen("replica_dropped", t_submit), "a shrink", timeout_s=RESIZE_WAIT_S)
        out["shrink"] = {k: _p(shrunk[0]).get(k) for k in ("cause", "groups_left", "step")}
        try:
            stack.wait(urgent, lambda: stack.steps_done(urgent) >= 1, "the urgent job training",
                       timeout_s=RESIZE_WAIT_S)
            out["urgent_started"] = True
        except RuntimeError:
            out["urgent_started"] = False  # the shrunk group's GPUs never reached it while the job ran
        out["urgent_waited_s"] = round(time.time() - t_submit, 1)
    finally:
        stack._call("POST", f"/v1/jobs/{urgent}/cancel", stack.tokens["urgent"])
    t_cancel = time.time()
    try:
        stack.wait(jid, lambda: seen("replica_joined", t_cancel), "a grow", timeout_s=RESIZE_WAIT_S)
        out["grown"] = True
        stack.wait(jid, lambda: stack.steps_done(jid) >= 3 + max(int(_p(e).get("step") or 0)
                                                                 for e in seen("replica_joined", t_cancel)),
                   "steps after the grow", timeout_s=120)
    except RuntimeError:
        out["grown"] = False
    stack._call("POST", f"/v1/jobs/{jid}/cancel", stack.tokens["elastic"])
    state = stack.finish(jid)
    row = measure(stack.job(jid), stack.events(jid), stack.metrics(jid), None)
    row.pop("losses")
    out.update(row)
    out["state"] = state
    out["never_stopped"] = (not row["resumed"] and row["attempts"] <= 1 and "shrink" in out and out["grown"])
    return out


KEYS = ("replica", "single")


def product(quick: bool = False, keys: tuple[str, ...] = KEYS) -> dict[str, Any]:
    """Both clusters (or those of ``keys``), each with its service; the runs of each against its no-fault run."""
    out: dict[str, Any] = {"steps": STEPS, "kill_at_step": KILL_AT, "global_batch": GLOBAL_BATCH,
                           "drain_deadline_s": DEADLINE_S, "replica": {}, "single": {}, "not_run": {},
                           "ran": list(keys)}
    for key, cfg in ((k, {"replica": REPLICA, "single": SINGLE}[k]) for k in KEYS if k in keys):
        work = Path(tempfile.mkdtemp(prefix=f"orthoplex-bench-product-{key}-"))
        stack = _Stack(cfg["nodes"], cfg["gpus"], work)
        try:
            stack.start()
            stack.tenant("bench", cfg["nodes"] * cfg["gpus"])
            base = _one(stack, f"{key}-nofault", cfg, None, None)
            ref = base["losses"]
            runs = {"nofault": base}
            for fault in ("kill", "drain"):
                try:
                    runs[fault] = _one(stack, f"{key}-{fault}", cfg, fault, ref)
                except Exception as exc:  # the row says why, the others still run
                    out["not_run"][f"{key}-{fault}"] = repr(exc)[:400]
            if key == "replica" and not quick:
                stack.tenant("elastic", 4)
                stack.tenant("urgent", 4)
                try:
                    runs["resize"] = _resize(stack, cfg)
                except Exception as exc:
                    out["not_run"]["replica-resize"] = repr(exc)[:400]
            for r in runs.values():
                r.pop("losses", None)
            out[key] = runs
        except Exception as exc:
            out["not_run"][key] = repr(exc)[:400]
        finally:
            stack.stop()
            shutil.rmtree(work, ignore_errors=True)
    return out


def merge(before: dict[str, Any] | None, now: dict[str, Any], before_at: str) -> dict[str, Any]:
    """``now`` (a run of some of :data:`KEYS`) with the other keys' runs of ``before`` (the last results
    file's product part, finished ``before_at``); ``carried``: key -> the run it comes from."""
    ran = list(now.get("ran") or KEYS)
    out = dict(now)
    if not before:
        return out
    prior = dict(before.get("carried") or {})
    for key in KEYS:
        if key in ran or not before.get(key):
            continue
        out[key] = before[key]
        out["not_run"] = {**out.get("not_run", {}),
                          **{k: v for k, v in (before.get("not_run") or {}).items() if k.split("-")[0] == key}}
        out.setdefault("carried", {})[key] = prior.get(key) or before_at
    return out


# ------------------------------------------------------------------------------------------ render
def _yes(ok: bool | None) -> str:
    return "-" if ok is None else ("yes" if ok else "**no**")


def goal_rows(p: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    """(case, goal, measured, holds) per goal; ``holds`` None where the run is missing ("not run: why")."""
    rep, sg, nr = p.get("replica") or {}, p.get("single") or {}, p.get("not_run") or {}

    def why(key: str) -> str:
        return "not run: " + (nr.get(key) or nr.get(key.split("-")[0]) or "no result").replace("|", "/")

    rows: list[tuple[str, str, str, bool | None]] = []
    k = rep.get("kill")
    chosen = (rep.get("nofault") or {}).get("recovery") or {}
    if chosen:
        rows.append(("replica job", "auto picks replica groups (3 x tp=2)",
                     f"{chosen.get('policy')} {chosen.get('groups')} groups: {chosen.get('reason')}",
                     chosen.get("policy") == "replica_groups" and chosen.get("groups") == 3))
    if k:
        base = rep["nofault"]
        rows += [
            ("replica job, node killed", "survivors' longest gap <= 3 s",
             f"{k['longest_gap_s']} s (no-fault run {base['longest_gap_s']} s)", (k["longest_gap_s"] or 1e9) <= 3),
            ("replica job, node killed", "1 step redone", str(k["steps_redone"]), k["steps_redone"] == 1),
            ("replica job, node killed", "every step's loss within 1e-4 of the no-fault run",
             f"max abs diff {k['max_abs_loss_diff']:.1e}" if k.get("max_abs_loss_diff") is not None else "-",
             k.get("max_abs_loss_diff") is not None and k["max_abs_loss_diff"] <= 1e-4),
            ("replica job, node killed", "back at 3 groups, healed from a peer",
             f"groups {k.get('groups_at_end')}, healed from {k.get('healed_from')}",
             k.get("groups_at_end") == 3 and k.get("healed_from") == ["peer"]),
            ("replica job, node killed", "no storage read",
             f"resumed {k['resumed']}; attempts {k['attempts']}", k["storage_reads"] == 0 and k["attempts"] <= 1)]
    else:
        rows.append(("replica job, node killed", "<= 3 s, 1 redo, 1e-4, 3 groups from a peer", why("replica-kill"),
                     None))
    s = sg.get("kill")
    if s:
        rows += [
            ("single-group job, node killed", "node_lost -> resumed <= 5 s, from memory",
             f"{s.get('node_lost_to_resumed_s')} s from {s.get('resume_source')}",
             (s.get("node_lost_to_resumed_s") or 1e9) <= 5 and s.get("resume_source") == "memory"),
            ("single-group job, node killed", "at most 1 step redone", str(s["steps_redone"]), s["steps_redone"] <= 1)]
    else:
        rows.append(("single-group job, node killed", "<= 5 s from memory, <= 1 redo", why("single-kill"), None))
    for key, label in (("replica", "replica job"), ("single", "single-group job")):
        d = (rep if key == "replica" else sg).get("drain")
        if d:
            rows.append((f"{label}, drain (deadline {p.get('drain_deadline_s')} s)", "0 steps redone, no storage read",
                         f"{d['steps_redone']} redone; resumed {d['resumed']}; drained {d['drained']}; "
                         f"attempts {d['attempts']}",
                         d["steps_redone"] == 0 and d["storage_reads"] == 0 and d["attempts"] <= 1
                         and bool(d["drained"])))
        else:
            rows.append((f"{label}, drain", "0 steps redone, no storage read", why(f"{key}-drain"), None))
    r = rep.get("resize")
    if r:
        rows.append(("replica job, scheduler shrink then grow", "surviving groups never stop (no resumed, no new gang)",
                     f"shrink {r.get('shrink')}; the reclaiming job started while it ran: {r.get('urgent_started')} "
                     f"(after {r.get('urgent_waited_s')} s); grown back: {r.get('grown')}; joined {r['replica_joined']}; "
                     f"resumed {r['resumed']}; attempts {r['attempts']}", r["never_stopped"]))
    else:
        rows.append(("replica job, scheduler shrink then grow", "surviving groups never stop", why("replica-resize"),
                     None))
    return rows


def product_markdown(p: dict[str, Any]) -> str:
    lines = ["### Through the service, default options (issue 38)", "",
             f"Jobs submitted over REST naming no recovery option; tiny model, global batch {p['global_batch']}, "
             f"{p['steps']} steps; faults after step {p['kill_at_step'] - 1} is seen: a node killed (its raylet and "
             f"everything under it), or drained (deadline {p['drain_deadline_s']} s). Replica job: 4 nodes x 2 declared "
             "GPUs, `max_gpus` 6, hint `tp=2`. Single-group job: 3 x 4, `max_gpus` 8, hint `tp=4,pp=2`. Each against "
             "its no-fault run on the same cluster and service, same invocation; measured from the REST metrics and "
             "events (losses as the step events carry them: 6 decimals, so 1e-6 is one rounding unit). Steps redone: "
             "committed steps measured again, plus the in-flight step the survivors redo per group lost.", "", "| case | goal | measured | holds? |", "|---|---|---|---|"]
    for case, goal, measured, ok in goal_rows(p):
        lines.append(f"| {case} | {goal} | {measured} | {_yes(ok)} |")
    carried = p.get("carried") or {}
    if carried:
        lines += ["", "_Not rerun in this run: " + "; ".join(f"the {k} runs, from the run finished {at}"
                                                           for k, at in carried.items()) + "._"]
    runs = [r for key in ("replica", "single") for r in (p.get(key) or {}).values()]
    if runs:
        lines += ["", "| run | state | attempts | steps | longest gap (s) | median gap (s) | redone | resumed sources | "
                  "final loss | wall (s) |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in runs:
            src = ", ".join(str(x.get("source")) for x in r["resumed"]) or "-"
            loss = "-" if r.get("final_loss") is None else f"{r['final_loss']:.6f}"
            lines.append(f"| {r['run']} | {r['state']} | {r['attempts']} | {r['steps']} | {r['longest_gap_s']} | "
                         f"{r['median_gap_s']} | {r['steps_redone']} | {src} | {loss} | {r.get('wall_s', '-')} |")
    phased = [r for r in runs if r.get("recovery_phases")]
    if phased:
        names = list(phased[0]["recovery_phases"])
        lines += ["", "Recovery phases of the last switch (the runtime's `recovery` event, seconds); warm ranks: "
                  "per node (the job's choice), and of the new gang's ranks how many started warm; an idle warm "
                  "rank's host memory (RSS):", "",
                  "| run | warm per node | ranks warm | idle warm rank (MiB) | " + " | ".join(names) + " | total |",
                  "|---" * (len(names) + 5) + "|"]
        for r in phased:
            ph, st = r["recovery_phases"], r.get("last_start") or {}
            lines.append(f"| {r['run']} | {(r.get('recovery') or {}).get('warm_ranks', '-')} | "
                         f"{st.get('warm_ranks', '-')} | {st.get('warm_rank_rss_mb') or '-'} | "
                         + " | ".join(f"{ph.get(n, 0):.2f}" for n in names) + f" | {sum(ph.values()):.2f} |")
    return "\n".join(lines)


def product_summary(p: dict[str, Any]) -> dict[str, Any]:
    carried = p.get("carried") or {}
    k = (p.get("replica") or {}).get("kill") or {} if "replica" not in carried else {}
    s = (p.get("single") or {}).get("kill") or {} if "single" not in carried else {}
    return {"product replica gap s": k.get("longest_gap_s"), "product replica redone": k.get("steps_redone"),
            "product single resumed s": s.get("node_lost_to_resumed_s"),
            "product goals held": sum(1 for *_, ok in goal_rows(p) if ok),
            "product goals": len(goal_rows(p))}
