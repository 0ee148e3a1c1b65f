"""Recovery benchmark, replica-group part (issue #14): one invocation, one local cluster (4 nodes x 2
declared GPUs), the same failure (the node of the last replica group killed at 0-based step
``REP_KILL``), four systems:

  Orthoplex tp=2 x 3 groups   the issue's goal (a group = 2 ranks on one node, the fourth node spare)
  Orthoplex tp=1 x 3 groups   the peers' group size (apples to apples)
  Ray Train + TorchftConfig   ``bench.recovery_peers.run_peer("torchft")`` (group size 1, whole model)
  Ray Train restart           ``bench.recovery_peers.run_peer("restart")``

Every system is measured the same way (:func:`stall_window`), from the SURVIVING groups' own per-step
commit timestamps (Orthoplex: each group's ``commit_ts``, the ``time.time()`` of the group's commit
that its rank 0 returns to the supervisor; the peers: the ranks' own ``step`` log rows):

* longest stall: the longest gap between two consecutive commits of a survivor, over the gaps that
  end after the kill and start before the job is back at full strength (the first commit of a step
  every group computed in: a replacement heals in its first step without computing in it, torchft's
  asynchronous quorum, so that step is not yet full strength, for Orthoplex as for the peers, which
  count participants; the end of the run if it never is). The job's start cannot fall in it (the kill comes
  after ``REP_KILL`` steps).
* steady step: the median of the survivors' other gaps, without the first ``START_GAPS`` gaps of the
  run (the job's start: the warm pool importing torch, the first quorum).
* stall in own steps: a stall divided by the same run's steady step, so systems whose steps differ
  in length compare in their own units.
* common window (:func:`add_common_window`): the longest gap of each system over the same window
  after the kill (the longest kill -> full strength of the round's replica-group runs that got back).
* longest wait (:func:`waited`): the longest stall beyond one steady step of the same run.
* longest waiting, measured (``work`` of :func:`stall_window`): over the same window, each gap minus
  the survivor's own work inside it (its timed forward/backward passes and optimizer steps).
* steps redone (the worst survivor), kill -> full strength, final loss.
"""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import statistics
import tempfile
from pathlib import Path
from typing import Any

REP_NODES, REP_GPUS, REP_GROUPS, REP_TP, REP_STEPS, REP_KILL, GLOBAL_BATCH = 4, 2, 3, 2, 16, 6, 12
#: a group's rows per forward/backward pass: its whole share (12 rows / 3 groups) in one pass, as the
#: peers' groups run theirs (2 before 2026-12-06: two passes a step; the rows are shared, not the passes,
#: so a lost group's 4 rows still split 2 and 2 over the survivors)
REP_MICRO_BATCH = 4
START_GAPS = 2  # gaps to steps 1 and 2 (0-based): the job's start, excluded from the steady median
PEER_STEPS, PEER_STEPS_QUICK = 60, 50  # and on until back at full strength (bench.recovery_peers)


def waited(stall_s: float | None, steady_step_s: float | None) -> float | None:
    """The survivors' longest wait: their longest stall beyond one of the system's own steady steps
    (pure; ``None`` when either is unknown, e.g. an unbounded open stall)."""
    if stall_s is None or steady_step_s is None:
        return None
    return round(max(0.0, stall_s - steady_step_s), 3)


def worked(intervals: list[list[float]], a: float, b: float) -> float:
    """Seconds of the work ``intervals`` (``[start, end]``, one rank's, not overlapping) inside ``(a, b)``."""
    return sum(max(0.0, min(e, b) - max(s, a)) for s, e in intervals)


def stall_window(step_ts: dict[str, list[list[float]]], kill_ts: float, full_ts: float | None,
                 end_ts: float | None = None, work: dict[str, list[list[float]]] | None = None) -> dict[str, Any]:
    """The survivors' longest stall across the failure and the steady median step (pure).

    ``step_ts``: per survivor, ``[step, ts]`` of each of its commits; ``kill_ts``: the kill;
    ``full_ts``: the first commit at full strength after it (``None``: never); ``end_ts``: when the
    run ended. A survivor that never committed after the kill stalled from its last commit to the
    end of the run (``stall_open``; with no ``end_ts``, ``stall_s`` is None: unbounded).

    ``work``: per survivor, the ``[start, end]`` of its own work (forward/backward passes, optimizer
    steps); then ``waiting_s`` is the longest time a survivor spent waiting
    between two commits in the same window (a gap minus the survivor's work inside it: quorums,
    reductions, failure detection, a replacement's heal, the supervisor's round trip)."""
    end = float("inf") if full_ts is None else full_ts
    stall: float | None = 0.0
    waiting: float | None = 0.0 if work is not None else None
    ends_step, wait_ends, steady, stall_open, kill_gap = None, None, [], False, None
    for g, rows in step_ts.items():
        mine = sorted(rows, key=lambda r: r[1])
        busy = (work or {}).get(g, [])
        if mine and mine[-1][1] < kill_ts < float("inf"):  # stepped no more after the kill
            stall_open = True
            stall = None if end_ts is None or stall is None else max(stall, end_ts - mine[-1][1])
            if waiting is not None:
                waiting = None if end_ts is None else max(waiting, end_ts - mine[-1][1] - worked(busy, mine[-1][1], end_ts))
        for i, (a, b) in enumerate(itertools.pairwise(mine)):
            gap = b[1] - a[1]
            if a[1] < kill_ts <= b[1]:  # the gap across the kill: the interrupted step and its redo
                kill_gap = max(gap, kill_gap or 0.0)
            if b[1] > kill_ts and a[1] < end:
                if stall is not None and gap > stall:
                    stall, ends_step = gap, int(b[0])
                idle = gap - worked(busy, a[1], b[1])
                if waiting is not None and idle > waiting:
                    waiting, wait_ends = idle, int(b[0])
            elif i >= START_GAPS:
                steady.append(gap)
    stall_s = None if stall is None else round(stall, 3)
    steady_s = round(statistics.median(steady), 3) if steady else None
    return {"stall_s": stall_s, "stall_ends_step": ends_step, "stall_open": stall_open,
            "kill_gap_s": None if kill_gap is None else round(kill_gap, 3), "steady_step_s": steady_s,
            "wait_s": waited(stall_s, steady_s),
            **({} if work is None else {"waiting_s": None if waiting is None else round(waiting, 3),
                                        "waiting_ends_step": wait_ends})}


def _replica_run(tag: str, work: Path, *, tp: int, fault: bool, steps: int = REP_STEPS) -> dict[str, Any]:
    import ray

    from workers.runtime.supervision.launch import start_supervisor, stop_supervisor

    spec = {"model": "tiny", "steps": steps, "global_batch": GLOBAL_BATCH, "checkpoint_dir": str(work / tag),
            "layout_hint": {"tp": tp, "micro_batch": REP_MICRO_BATCH}, "checkpoint": {"min_every_steps": 100, "max_every_steps": 100},
            "runtime": {"replica_groups": REP_GROUPS, "warm_ranks_per_node": tp, "grow": False,
                        "hang_timeout_s": 120, "start_timeout_s": 600},
            "faults": [{"kind": "kill_node", "at_step": REP_KILL, "rank": -1}] if fault else []}
    job = f"bench-replicas-{tag}"
    handle = start_supervisor(job, 1, spec, enable_fault_injection=fault)
    result = ray.get(handle.run.remote(), timeout=3600)
    events = ray.get(handle.events.remote(0))
    stop_supervisor(job, 1)
    if result["state"] != "SUCCEEDED":
        story = [(e["type"], e.get("step"), e.get("reason", "")[:160]) for e in events if e["type"] != "step"]
        raise RuntimeError(f"replica run {tag} did not finish: {result['state']} {result['error']}; events {story}")
    groups = result["replicas"]["groups"]
    dropped = [e for e in events if e["type"] == "replica_dropped"]
    joined = [e for e in events if e["type"] == "replica_joined"]
    lost = {str(e["group"]) for e in dropped}
    survivors = [g for g, h in groups.items() if g not in lost and h.get("healed_from") is None and "commit_ts" in h]
    step_ts = {g: [[int(k), v] for k, v in groups[g]["commit_ts"].items()] for g in survivors}
    # each survivor's own work (its rank 0's attempts: forward/backward passes, optimizer steps)
    work = {g: [w for a in groups[g].get("attempts", {}).values() for w in a.get("work", [])] for g in survivors}
    if fault and not survivors:
        # every original group was dropped (more than the killed one): no survivor to measure, so the
        # job's own progress stands in (per step, the first commit of any group), and the row says so
        first: dict[int, float] = {}
        for h in groups.values():
            for k, v in h.get("commit_ts", {}).items():
                first[int(k)] = min(v, first.get(int(k), v))
        step_ts = {"job": [[k, v] for k, v in first.items()]}
    launched_again = sorted(int(k) for k, n in result["step_attempts"].items() if n > 1 and int(k) >= REP_KILL)
    row: dict[str, Any] = {
        "run": tag, "system": f"Orthoplex tp={tp} x {REP_GROUPS} groups", "tp": tp, "group_size": tp,
        "final_loss": result["final_loss"], "losses": {int(k): v for k, v in result["losses"].items()},
        "survivors": survivors, "resumed_events": sum(e["type"] == "resumed" for e in events),
        # a step is never launched again once passed, so a step >= REP_KILL launched again came after the kill
        "steps_redone": sum(int(result["step_attempts"][str(k)]) - 1 for k in launched_again),
        "redone_steps": sorted({s for g in survivors for s in groups[g].get("aborted", []) if s >= REP_KILL}),
        "aborted_before_kill": sorted({s for g in survivors for s in groups[g].get("aborted", []) if s < REP_KILL}),
        "step_attempts": result["step_attempts"], "steps": steps}
    if not fault:
        return {**row, **stall_window(step_ts, float("inf"), None, work=work)}
    kill = next(e for e in events if e["type"] == "fault_injected")
    new = [g for g, h in groups.items() if h.get("healed_from") is not None and "commit_ts" in h]
    full_ts = full_strength_ts(groups, new, REP_GROUPS)
    row.update(stall_window(step_ts, kill["ts"], full_ts, work=work if survivors else None))
    row.update({"kill_ts": kill["ts"], "full_strength_ts": full_ts, "survivor_commit_ts": step_ts,
                "replacement_commit_ts": {g: groups[g]["commit_ts"] for g in new}})  # raw, to check the numbers
    row.update({"dropped": [(e["group"], e["step"]) for e in dropped],
                "drop_reasons": [e.get("reason", "")[:240] for e in dropped],
                "breakdown": stall_breakdown(groups, survivors, [e for e in events if e["type"] == "replica_dropped"],
                                             kill["ts"]),
                "extra_groups_dropped": len(dropped) - 1, "stall_from": "survivors" if survivors else "job progress",
                "full_strength_s": None if full_ts is None else round(full_ts - kill["ts"], 3),
                "groups_at_end": len(groups) - len(lost)})
    if new and joined:
        g = new[0]
        row.update({"replica_joined_seconds": joined[0]["seconds"], "joined_at_step": joined[0]["step"],
                    "healed_from": groups[g].get("healed_from"), "warm_ranks": groups[g].get("warm_ranks"),
                    "replacement_on_spare_node": groups[g]["node"] not in {groups[o]["node"] for o in groups if o != g}})
    return row


def full_strength_ts(groups: dict[str, Any], new: list[str], n_groups: int) -> float | None:
    """When the job is back at full strength: the first commit of a replacement group in a step that
    ``n_groups`` groups computed (a replacement heals in its first step without computing in it:
    torchft's asynchronous quorum; the peers count theirs the same way, by participants)."""
    out = [groups[g]["commit_ts"][str(a["step"])] for g in new for a in groups[g].get("attempts", {}).values()
           if a["event"] == "step" and (a.get("participants") or 0) >= n_groups
           and str(a["step"]) in groups[g].get("commit_ts", {})]
    return min(out, default=None)


def stall_breakdown(groups: dict[str, Any], survivors: list[str], dropped: list[dict[str, Any]],
                    kill_ts: float) -> dict[str, Any]:
    """Where a survivor's stall goes: the supervisor's drop (``replica_dropped``) and each survivor's
    step attempts around the kill (rank 0's phases: start, quorum formed, backward done, cross-group
    reduction done, commit vote; seconds after the kill), with torchft's error of an aborted one."""
    def rel(x: float) -> float:
        return round(x - kill_ts, 3)

    att = {}
    for g in survivors:
        rows = [a for a in groups[g].get("attempts", {}).values() if a.get("vote", a["start"]) >= kill_ts - 0.2]
        att[g] = [{"step": a["step"], "event": a["event"], "participants": a["participants"],
                   **{k: rel(a[k]) for k in ("start", "quorum", "backward", "reduced", "reduce", "vote") if k in a},
                   **({"error": a["error"][:160]} if a.get("error") else {})}
                  for a in sorted(rows, key=lambda a: a["start"])][:5]
    # the replacements' first (healing) attempt: the step they join in is a survivor's gap too
    joined = {g: [{"step": a["step"], "event": a["event"], "participants": a["participants"],
                   **{k: rel(a[k]) for k in ("start", "quorum", "backward", "reduce", "vote") if k in a}}
                  for a in sorted(h.get("attempts", {}).values(), key=lambda a: a["start"])][:1]
              for g, h in groups.items() if h.get("healed_from") is not None}
    return {"dropped_s": [rel(e["ts"]) for e in dropped], "attempts": att, "replacements": joined}


def _peer(kind: str, cluster: Any, work: Path, quick: bool, **kw: Any) -> dict[str, Any]:
    """A peer run (``torchft``, ``restart``: Ray Train; ``torchft-direct``: torchft's Manager in plain
    processes, no Ray) on the compare's failure, its numbers in the compare's windows."""
    from bench.recovery_peers import run_peer
    from bench.recovery_torchft import KIND, run_direct

    steps = PEER_STEPS_QUICK if quick else PEER_STEPS
    if kind == KIND:
        out = run_direct(steps=steps, kill_at=REP_KILL, work=work / "direct", **kw)
    else:
        out = run_peer(kind, steps=steps, kill_at=REP_KILL,  # type: ignore[arg-type]
                       cluster=cluster, work=work, gpus_per_group=REP_GPUS, **kw)
    out["stall_s_whole_run_after_kill"] = out["stall_s"]  # summarize's own (unbounded) window, for reference
    out["steps_redone_whole_run"] = out["steps_redone"]  # with attempts redone before the kill (load, start)
    out["steps_redone"] = out["steps_redone_after_fault"]
    out["survivor_commit_ts"] = out.pop("survivor_step_ts")
    out["kill_ts"] = out["fault_ts"]
    out.update(stall_window(out["survivor_commit_ts"], out["fault_ts"], out["full_strength_ts"], out.get("ended_ts"),
                            work=out.pop("survivor_work")))
    out["group_size"] = 1
    out.pop("losses", None)
    return out


def _rel_diff(run: dict[str, Any], ref: dict[str, Any]) -> float:
    return max(abs(run["losses"][k] - v) / abs(v) for k, v in ref["losses"].items())


FAULT_RUNS = ("tp2-fault", "tp1-fault")
#: the peers of a compare round (torchft: Ray Train + ``TorchftConfig``; torchft-direct: torchft's Manager
#: in plain processes, as TorchTitan's fault-tolerance mode; restart: Ray Train's restart)
PEER_RUNS = ("torchft", "torchft-direct", "restart")


def settle(cluster: Any, timeout_s: float = 90.0) -> dict[str, Any]:
    """Back to ``cluster.nodes`` live worker nodes before the next run, the GCS agreeing. A node killed
    in the last run can still count as alive for a few seconds, and ``restore()`` then adds no node in
    its place: the next run starts without its spare node (seen 2026-12-07: Ray Train + torchft's lost
    group then had nowhere to go and its ``fit()`` hung; the restart peer never killed a node). So:
    restore, then wait until the GCS counts exactly ``cluster.nodes`` alive nodes with GPUs, none of
    them with a raylet that refuses connections, and every GPU free, restoring again meanwhile."""
    import time

    import ray

    def raylet_gone(n: dict[str, Any]) -> bool:  # a killed raylet refuses connections at once
        try:
            socket.create_connection((n["NodeManagerAddress"], n["NodeManagerPort"]), timeout=1.0).close()
        except ConnectionRefusedError:
            return True
        except OSError:
            return False
        return False

    t0 = time.monotonic()
    while True:
        cluster.restore()
        alive = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("GPU")]
        stale = [n for n in alive if raylet_gone(n)]  # dead, the GCS not told yet: wait, then restore
        free = ray.available_resources().get("GPU", 0.0)
        total = sum(n["Resources"]["GPU"] for n in alive)
        if not stale and len(alive) == cluster.nodes and free >= total:
            return {"settle_s": round(time.monotonic() - t0, 2), "nodes": len(alive)}
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"the cluster did not settle in {timeout_s:.0f} s: {len(alive)} GPU nodes alive "
                               f"(want {cluster.nodes}), {free} of {total} GPUs free")
        time.sleep(0.5)


def _round(cluster: Any, work: Path, quick: bool) -> dict[str, dict[str, Any]]:
    """One round: Orthoplex tp=2 and tp=1 (each with a no-fault reference run unless ``quick`` drops
    tp=1's), then the peers, on the same cluster and failure; the common stall window added."""
    settle(cluster)
    runs: dict[str, dict[str, Any]] = {}
    plan: list[tuple[str, int, bool]] = [("tp2-clean", 2, False), ("tp2-fault", 2, True)]
    plan += [] if quick else [("tp1-clean", 1, False)]
    plan += [("tp1-fault", 1, True)]
    for tag, tp, fault in plan:
        runs[tag] = _replica_run(tag, work, tp=tp, fault=fault)
        settle(cluster)
    for kind in PEER_RUNS:
        try:
            runs[kind] = _peer(kind, cluster, work, quick)
        except Exception as exc:  # a peer that fails to run at all is an invalid comparison, not a crash
            runs[kind] = {"system": kind, "failed": repr(exc)[:500], "fit_hung": True, "stall_s": None,
                          "steady_step_s": None, "steps_redone": 0, "full_strength_s": None, "final_loss": float("nan"),
                          "steps": 0}
        settle(cluster)
    for tp in (1, 2):
        if f"tp{tp}-clean" in runs:
            runs[f"tp{tp}-fault"]["max_rel_loss_diff_vs_no_fault"] = _rel_diff(runs[f"tp{tp}-fault"], runs[f"tp{tp}-clean"])
    for r in runs.values():
        r.pop("losses", None)
    add_common_window(runs)
    return runs


def compare(quick: bool, repeat: int = 1) -> dict[str, Any]:
    """``repeat`` rounds of the systems on one cluster, one invocation, with the medians over them
    (``quick``: no tp=1 no-fault run, shorter peers)."""
    import time

    from workers.testbed.local_cluster import InProcessCluster

    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    started, t0 = time.strftime("%Y-%m-%d %H:%M", time.gmtime()), time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="orthoplex-bench-compare-"))
    loads = [os.getloadavg()[0]]
    rounds: list[dict[str, Any]] = []
    cluster = InProcessCluster(nodes=REP_NODES, gpus_per_node=REP_GPUS).start()
    try:
        for i in range(repeat):
            print(f"compare: round {i + 1} of {repeat}", flush=True)
            rounds.append({"runs": _round(cluster, work, quick)})
            loads.append(os.getloadavg()[0])
    finally:
        cluster.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    out = {"rounds": rounds, "repeat": repeat, "quick": quick, "load_average_1min": [round(x, 1) for x in loads],
           "started": started, "wall_s": round(time.monotonic() - t0)}
    out["medians"] = medians(out)
    return out


def rounds_of(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The rounds of a compare result (results written before ``--repeat`` hold one round, at the top)."""
    return r.get("rounds") or [r]


def peer_problem(peer: dict[str, Any]) -> str | None:
    """Why a peer run cannot be compared with (None: it can): its ``fit()`` hung, its survivors never
    stepped again, or it never got back to full strength. Such a run makes the comparison invalid."""
    if peer.get("failed"):
        return "the run failed"
    if peer.get("fit_hung"):
        return "fit() hung"
    if peer.get("stall_open"):
        return "survivors never stepped again"
    if peer.get("full_strength_s") is None:
        return "never back at full strength"
    return None


def stall_steps(x: dict[str, Any], value: str = "stall_s") -> float | None:
    """A run's stall (``value``) in its own steady steps: comparable across systems whose steps differ."""
    v, step = x.get(value), x.get("steady_step_s")
    return None if v is None or not step else round(v / step, 2)


def add_common_window(runs: dict[str, dict[str, Any]]) -> None:
    """The same window for every fault run of a round: from the kill to the kill plus the longest
    kill -> full strength of the round's replica-group runs that got back (``window_s``: the
    restart peer's tens of seconds would make it the whole run); each run's longest
    survivor gap in it (``stall_window_s``) and that in its own steady steps (``stall_window_steps``)."""
    back = [x["full_strength_s"] for k, x in runs.items() if k not in ("tp2-clean", "tp1-clean", "restart")
            and x.get("full_strength_s") is not None]
    if not back:
        return
    window = max(back)
    for k, x in runs.items():
        if k in ("tp2-clean", "tp1-clean") or not x.get("survivor_commit_ts") or x.get("kill_ts") is None:
            continue
        w = stall_window(x["survivor_commit_ts"], x["kill_ts"], x["kill_ts"] + window,
                         x.get("ended_ts") if x.get("full_strength_s") is None else None)
        x["window_s"] = round(window, 3)
        x["stall_window_s"] = w["stall_s"]
        x["stall_window_steps"] = None if w["stall_s"] is None or not x.get("steady_step_s") \
            else round(w["stall_s"] / x["steady_step_s"], 2)


def _worse_or_equal(a: dict[str, Any], b: dict[str, Any], value: str = "stall_s") -> bool:
    """``a``'s stall (``value``) is known, ``b``'s too, and ``a``'s is no shorter. An open or unknown
    stall decides nothing (False): a hung run is never counted on either side."""
    va, vb = a.get(value), b.get(value)
    if a.get("stall_open") or b.get("stall_open") or va is None or vb is None:
        return False
    return vb <= va


def as_good(x: dict[str, Any], peer: dict[str, Any], value: str = "stall_s") -> bool:
    """The goal's verdict: run ``x`` is at least as good as ``peer`` on the stall (``value``) and on
    steps redone, and dropped no group beside the killed one. Never true against a peer run that hung
    or never recovered (:func:`peer_problem`): that comparison is invalid, not a win."""
    return (peer_problem(peer) is None and _worse_or_equal(peer, x, value)
            and x["steps_redone"] <= peer["steps_redone"] and not x.get("extra_groups_dropped"))


def verdict(x: dict[str, Any], peer: dict[str, Any], value: str = "stall_s") -> str:
    """``yes``, ``no`` or ``invalid (why)`` for :func:`as_good`."""
    problem = peer_problem(peer)
    if problem:
        return f"invalid ({problem})"
    return "yes" if as_good(x, peer, value) else "no"


def _spread(xs: list[float]) -> dict[str, Any]:
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3), "n": len(xs)}


MEDIAN_VALUES = ("stall_s", "stall_steps", "stall_window_s", "stall_window_steps", "steady_step_s", "waiting_s",
                 "full_strength_s", "steps_redone")


def medians(r: dict[str, Any]) -> dict[str, Any]:
    """Per system, over the rounds whose run of it is valid: median, min, max of each value; the
    number of rounds whose peer run was invalid; and the verdicts of tp=2 against each peer over the
    medians (``invalid`` if any round's peer run was)."""
    out: dict[str, Any] = {}
    rounds = rounds_of(r)
    for key in (*FAULT_RUNS, *PEER_RUNS):
        rows = [rd["runs"][key] for rd in rounds if key in rd["runs"]]
        valid = [x for x in rows if peer_problem(x) is None]
        vals: dict[str, Any] = {"system": rows[0]["system"] if rows else key, "runs": len(rows),
                                "invalid": [peer_problem(x) for x in rows if peer_problem(x)]}
        for v in MEDIAN_VALUES:
            xs = [stall_steps(x) if v == "stall_steps" else x.get(v) for x in valid]
            xs = [x for x in xs if x is not None]
            if xs:
                vals[v] = _spread(xs)
        out[key] = vals
    tp2 = out.get("tp2-fault", {})
    for key in PEER_RUNS:
        peer = out.get(key, {})
        if not peer.get("runs"):
            continue
        if peer["invalid"] or tp2.get("invalid"):
            out[f"verdict_tp2_vs_{key}"] = f"invalid ({len(peer['invalid'])} of {peer['runs']} peer runs: " \
                                           f"{'; '.join(sorted(set(peer['invalid'])))})" if peer["invalid"] \
                else "invalid (Orthoplex tp=2 did not recover)"
            continue
        # the common window when both measured it (results before it: the stall to full strength)
        stall = "stall_window_s" if tp2.get("stall_window_s") and peer.get("stall_window_s") else "stall_s"
        ok = all(tp2.get(v) and peer.get(v) and tp2[v]["median"] <= peer[v]["median"] for v in (stall, "steps_redone"))
        out[f"verdict_tp2_vs_{key}"] = ("yes" if ok else "no") + ("" if stall == "stall_window_s" else " (stall to full strength)")
    return out


def compare_summary(r: dict[str, Any]) -> dict[str, Any]:
    """The history row of a compare: medians of tp=2's and torchft's stall in seconds and in their own
    steps over the common window, and the verdict."""
    m = r.get("medians") or medians(r)
    tp2, ft, direct = m.get("tp2-fault", {}), m.get("torchft", {}), m.get("torchft-direct", {})

    def med(x: dict[str, Any], v: str) -> float | None:
        return (x.get(v) or {}).get("median")

    return {"rounds": len(rounds_of(r)), "tp2 stall s": med(tp2, "stall_s"), "tp2 stall steps": med(tp2, "stall_steps"),
            "tp2 step s": med(tp2, "steady_step_s"), "torchft stall s": med(ft, "stall_s"),
            "torchft stall steps": med(ft, "stall_steps"), "torchft step s": med(ft, "steady_step_s"),
            "torchft runs invalid": len(ft.get("invalid", [])), "tp2 vs torchft": m.get("verdict_tp2_vs_torchft"),
            **({} if not direct.get("runs") else {
                "torchft-direct stall s": med(direct, "stall_s"), "torchft-direct stall steps": med(direct, "stall_steps"),
                "torchft-direct runs invalid": len(direct.get("invalid", [])),
                "tp2 vs torchft-direct": m.get("verdict_tp2_vs_torchft-direct")})}


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def _stall(x: dict[str, Any], value: str = "stall_s") -> str:
    """A run's stall (``value``: ``stall_s`` or ``waiting_s``): seconds, or that its survivors never
    stepped again after the kill."""
    v = x.get(value)
    if x.get("stall_open"):
        return "never stepped again" if v is None else f">= {v:.2f} (never stepped again)"
    return _fmt(v)


def _med(m: dict[str, Any], v: str, spec: str = ".2f") -> str:
    x = m.get(v)
    if not x:
        return "-"
    return f"{format(x['median'], spec)} ({format(x['min'], spec)}-{format(x['max'], spec)})"


def compare_markdown(r: dict[str, Any]) -> str:
    """The compare part: medians over the rounds, then every round's runs, then the goals of the last round."""
    rounds = rounds_of(r)
    m = r.get("medians") or medians(r)
    lines = [f"### Replica groups vs Ray Train + torchft vs Ray Train restart ({len(rounds)} round(s) in one "
             f"invocation, {REP_NODES} nodes x {REP_GPUS} declared GPUs, {REP_GROUPS} groups, the last group's node "
             f"killed at 0-based step {REP_KILL})", "",
             "Medians over the rounds whose run is valid (min-max); a peer run that hung or never got back to full "
             "strength is invalid and makes the verdict invalid, never a win.", "",
             "| system | valid runs | stall, kill -> full strength (s) | in own steady steps | stall, common window (s) | "
             "in own steady steps | steady step (s) | waiting, measured (s) | kill -> full strength (s) | steps redone |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for key in (*FAULT_RUNS, *PEER_RUNS):
        x = m.get(key)
        if not x or not x.get("runs"):
            continue
        bad = f" ({'; '.join(x['invalid'])})" if x["invalid"] else ""
        lines.append(f"| {x['system']} | {x['runs'] - len(x['invalid'])} of {x['runs']}{bad} | {_med(x, 'stall_s')} | "
                     f"{_med(x, 'stall_steps', '.1f')} | {_med(x, 'stall_window_s')} | {_med(x, 'stall_window_steps', '.1f')} | "
                     f"{_med(x, 'steady_step_s', '.3f')} | {_med(x, 'waiting_s')} | {_med(x, 'full_strength_s')} | "
                     f"{_med(x, 'steps_redone', '.0f')} |")
    padded = sorted({x["min_step_s"] for rd in rounds for x in rd["runs"].values() if x.get("min_step_s")})
    direct = any("torchft-direct" in rd["runs"] for rd in rounds)
    lines += ["", "Verdict, Orthoplex tp=2 at least as good (median stall over the common window, median steps redone): "
              + "; ".join(f"against {k}: **{m[f'verdict_tp2_vs_{k}']}**" for k in PEER_RUNS if f"verdict_tp2_vs_{k}" in m)
              + ".", "",
              "| round | system | stall (s) | own steps | common window (s) | stall in it (s) | own steps | steady step (s) | "
              "waiting (s) | kill -> full (s) | redone | final loss | max rel. loss diff vs no-fault | valid |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, rd in enumerate(rounds, 1):
        for key in (*FAULT_RUNS, *[k for k in rd["runs"] if k not in FAULT_RUNS and not k.endswith("-clean")]):
            x = rd["runs"].get(key)
            if x is None:
                continue
            diff = x.get("max_rel_loss_diff_vs_no_fault")
            lines.append(
                f"| {i} | {x['system']} | {_stall(x)} | {_fmt(stall_steps(x), '.1f')} | {_fmt(x.get('window_s'))} | "
                f"{_fmt(x.get('stall_window_s'))} | {_fmt(x.get('stall_window_steps'), '.1f')} | "
                f"{_fmt(x['steady_step_s'], '.3f')} | {_stall(x, 'waiting_s')} | {_fmt(x.get('full_strength_s'))} | "
                f"{x['steps_redone']} | {x['final_loss']:.6f} | {'-' if diff is None else f'{diff:.1e}'} | "
                f"{peer_problem(x) or 'yes'} |")
    lines += ["", "How each number is taken, the same for every system: from the surviving groups' own per-step commit "
              "timestamps. Stall: the longest gap between two consecutive commits of a survivor that ends after the "
              "kill and starts before the job is back at full strength (the end of the run if never). Common window: "
              "from the kill to the kill plus the longest kill -> full strength of the round's replica-group runs that got back, "
              "the same for every system of the round; its stall is the longest gap in it. Own steps: a stall divided "
              "by the system's steady median step of the same run (the first gaps of the run and the stall window "
              f"excluded). Waiting: each gap minus the survivor's own work inside it. The peers train the same tiny "
              f"model, global batch {GLOBAL_BATCH}, engine optimizer and data with their own plain-torch loop, "
              + (f"**every peer step padded by sleeping to {' or '.join(f'{p:g}' for p in padded)} s** (the harness before issue 37: the peers' stall "
                 "in seconds then holds about two padded steps by construction; compare the stalls in own steps); "
                 if padded else "with no step padding; ")
              + "Ray Train's `TorchftConfig` makes each worker its own replica group (1 process, whole model), "
              + ("and torchft used directly (`torchft-direct`: its `Manager` and lighthouse in plain processes, as "
                 "TorchTitan's fault-tolerance mode runs it; its group's process is killed instead of its node, and the "
                 "driver starts a replacement process at once), " if direct else "")
              + "Orthoplex tp=2 runs 2 ranks per group, tp=1 one. The killed group's node dies in its step "
              f"{REP_KILL} after the backward pass, before the cross-group reduction, in all systems."]
    lines += [hang_note(i, x) for i, rd in enumerate(rounds, 1) for x in rd["runs"].values() if x.get("fit_hung")]
    if r.get("quick"):
        lines += ["", f"_Quick mode: no tp=1 no-fault run, peers {PEER_STEPS_QUICK} steps._"]
    lines += ["", goals_markdown(rounds[-1]), "",
              f"_Host load average (1 min) at the start and after each round: {r.get('load_average_1min')}._"]
    return "\n".join(lines)


def hang_note(i: int, x: dict[str, Any]) -> str:
    """What a hung peer run hung on, from its diagnosis at the deadline (``bench.recovery_peers``)."""
    d = x.get("hang_diagnosis") or {}
    stuck = [pg for pg in d.get("placement_groups", []) if pg.get("state") not in ("CREATED", "REMOVED")]
    held = (x.get("gpus_free") or {}).get("gpus_held")
    what = (f"{len(stuck)} placement group(s) not placed ({', '.join(sorted({str(pg.get('state')) for pg in stuck}))}): "
            "Ray Train replaces a lost replica group at the same placement-group slot and waits for it forever when "
            "no alive node can take it (`bench/torchft_hang_repro.py`; runs before the harness settled the cluster "
            "could start without a spare node)" if stuck else
            "no placement group waiting" if d else "not diagnosed (a run before the diagnosis)")
    return (f"\n_Round {i}, {x['system']}: hung ({x.get('failed') or 'ended at the deadline'}); {what}; GPUs held "
            f"by others before it started: {'-' if held is None else held}._")


def goals_markdown(rd: dict[str, Any]) -> str:
    """Issue 14's replica-group goals for Orthoplex tp=2 in one round, verdicts computed."""
    runs = rd["runs"]
    f = runs["tp2-fault"]
    c = runs.get("tp2-clean", {})
    diff = f.get("max_rel_loss_diff_vs_no_fault", float("nan"))

    def yes(ok: bool) -> str:
        return "yes" if ok else "**no**"

    back = f.get("groups_at_end") == REP_GROUPS and bool(f.get("replacement_on_spare_node"))
    extra = int(f.get("extra_groups_dropped") or 0)
    stall_ok = not f.get("stall_open") and f["stall_s"] is not None and f["stall_s"] <= 3 and not extra
    why = (f"; **{extra} more group(s) dropped** ({f.get('dropped')}), stall from {f.get('stall_from')}"
           if extra else "")
    peers = []
    for key in [k for k in runs if k not in FAULT_RUNS and not k.endswith("-clean")]:
        p = runs[key]
        peers.append(f"| at least as good as {p['system']} (same round) on stall and steps redone | tp=2: stall "
                     f"{_stall(f)} vs {_stall(p)} s ({_fmt(stall_steps(f), '.1f')} vs {_fmt(stall_steps(p), '.1f')} own "
                     f"steps), redone {f['steps_redone']} vs {p['steps_redone']} | {verdict(f, p)} |")
    return "\n".join([
        f"#### Goals (issue 14, replica groups: Orthoplex tp={REP_TP} x {REP_GROUPS} groups, last round)", "",
        "| goal | measured | met? |", "|---|---|---|",
        f"| survivors' longest stall <= 3 s | {_stall(f)} s (steady median step {_fmt(f['steady_step_s'], '.3f')} s; "
        f"no-fault run's {_fmt(c.get('steady_step_s'), '.3f')} s{why}) | {yes(stall_ok)} |",
        f"| at most one step redone | {f['steps_redone']} (0-based {f.get('redone_steps')}) | {yes(f['steps_redone'] <= 1)} |",
        f"| every step's loss within 1e-4 relative of the no-fault run | max rel. diff {diff:.1e} | {yes(diff <= 1e-4)} |",
        f"| back at {REP_GROUPS} groups, replacement on the spare node | {f.get('groups_at_end')} groups at the end, "
        f"kill -> full strength {_fmt(f.get('full_strength_s'))} s, spare node: {f.get('replacement_on_spare_node')} "
        f"| {yes(back)} |",
        f"| no storage read | `resumed` events: {f['resumed_events']} | {yes(f['resumed_events'] == 0)} |",
        *peers])


if __name__ == "__main__":
    from bench.render import load_history

    for rec in load_history("recovery"):
        if "tp2 vs torchft" in rec.get("summary", {}):
            s = rec["summary"]
            print(rec["finished_at"], s["tp2 stall s"], s["torchft stall s"], s["tp2 vs torchft"])
