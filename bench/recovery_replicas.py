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
* longest wait (:func:`waited`): the longest stall beyond one steady step of the same system in the
  same run. The issue defines a stall as "only the time the surviving ranks wait"; a gap between two
  commits also holds the step's own work, whose length differs between the systems (torchft's steps
  slept to 0.3 s, Orthoplex's CPU-bound tp=2 step 0.35-0.6 s), so the wait is reported beside each
  stall, with its own verdict. The goal's verdict stays on the stall: the wait leans on a noisy
  baseline (a peer run that never gets back to full strength has only the few gaps before the kill
  for its steady median, slow ones at the job's start: 1.3 s for a 0.5 s step on 2026-12-06). A step
  with fewer groups, whose survivors compute the lost group's rows (the global batch kept),
  counts its extra work as wait.
* longest waiting, measured (``work`` of :func:`stall_window`): over the same window, each gap minus
  the survivor's own work inside it (its timed forward/backward passes and optimizer steps; a peer's
  step padding counts as work), the issue's "only the time the surviving ranks wait" taken from the
  survivors' own timestamps rather than from a steady median.
* steps redone (the worst survivor), kill -> full strength, final loss.
"""

from __future__ import annotations

import itertools
import os
import shutil
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
#: the later torchft runs' lighthouse heartbeat timeout (torchft's stall waits for it; Ray Train's default is
#: 2 s): 0.5 s, the shortest a live group's heartbeat survived on this loaded host (docs/runtime.md)
TORCHFT_FAST_HEARTBEAT_MS = 500
PEER_STEPS, PEER_STEPS_QUICK = 60, 50  # 30 was too few: torchft's replacement had not joined (2026-12-03)


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
    steps, a peer's step padding); then ``waiting_s`` is the longest time a survivor spent waiting
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
    from bench.recovery_peers import run_peer

    out = run_peer(kind, steps=PEER_STEPS_QUICK if quick else PEER_STEPS, kill_at=REP_KILL,  # type: ignore[arg-type]
                   cluster=cluster, work=work, gpus_per_group=REP_GPUS, **kw)
    out["stall_s_whole_run_after_kill"] = out["stall_s"]  # summarize's own (unbounded) window, for reference
    out["steps_redone_whole_run"] = out["steps_redone"]  # with attempts redone before the kill (load, start)
    out["steps_redone"] = out["steps_redone_after_fault"]
    out.update(stall_window(out.pop("survivor_step_ts"), out["fault_ts"], out["full_strength_ts"], out.get("ended_ts"),
                            work=out.pop("survivor_work")))
    out["group_size"] = 1
    out.pop("losses", None)
    return out


def _rel_diff(run: dict[str, Any], ref: dict[str, Any]) -> float:
    return max(abs(run["losses"][k] - v) / abs(v) for k, v in ref["losses"].items())


def compare(quick: bool) -> dict[str, Any]:
    """The four systems on one cluster, one invocation (``quick``: no tp=1 no-fault run, shorter peers)."""
    import time

    from workers.testbed.local_cluster import InProcessCluster

    started, t0 = time.strftime("%Y-%m-%d %H:%M", time.gmtime()), time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="orthoplex-bench-compare-"))
    loads = [os.getloadavg()[0]]
    runs: dict[str, dict[str, Any]] = {}
    cluster = InProcessCluster(nodes=REP_NODES, gpus_per_node=REP_GPUS).start()
    try:
        plan: list[tuple[str, int, bool]] = [("tp2-clean", 2, False), ("tp2-fault", 2, True)]
        plan += [] if quick else [("tp1-clean", 1, False)]
        plan += [("tp1-fault", 1, True)]
        for tag, tp, fault in plan:
            runs[tag] = _replica_run(tag, work, tp=tp, fault=fault)
            loads.append(os.getloadavg()[0])
            cluster.restore()
        for kind in ("torchft", "restart"):
            runs[kind] = _peer(kind, cluster, work, quick)
            loads.append(os.getloadavg()[0])
            cluster.restore()
        if not quick:
            # torchft at a short lighthouse heartbeat timeout (the peer's default here: 2 s); then the
            # same with every step padded to Orthoplex tp=2's own no-fault steady step of this run (a stall
            # in seconds then compares recovery, not step lengths: 0.3 s vs a CPU-bound tp=2 step), slept
            # after the step, and spent computing before the reduction (a CPU-bound step, as Orthoplex's
            # is here: a sleep hides the failure's detection)
            matched = runs["tp2-clean"]["steady_step_s"]
            hb = f", heartbeat timeout {TORCHFT_FAST_HEARTBEAT_MS / 1000:g} s"
            for tag, extra, suffix in (
                    ("torchft-fast", {}, hb),
                    ("torchft-matched", {"min_step_s": matched}, f"{hb}, step padded to tp=2's {matched:.2f} s"),
                    ("torchft-matched-compute", {"min_step_s": matched, "pad": "compute"},
                     f"{hb}, step of {matched:.2f} s of compute")):
                runs[tag] = _peer("torchft", cluster, work, quick, heartbeat_timeout_ms=TORCHFT_FAST_HEARTBEAT_MS,
                                  **extra)
                runs[tag]["system"] += suffix
                loads.append(os.getloadavg()[0])
                cluster.restore()
    finally:
        cluster.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    for tp in (1, 2):
        if f"tp{tp}-clean" in runs:
            runs[f"tp{tp}-fault"]["max_rel_loss_diff_vs_no_fault"] = _rel_diff(runs[f"tp{tp}-fault"], runs[f"tp{tp}-clean"])
    for r in runs.values():
        r.pop("losses", None)
    return {"runs": runs, "quick": quick, "load_average_1min": [round(x, 1) for x in loads], "started": started,
            "wall_s": round(time.monotonic() - t0)}


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}x"


def _stall(x: dict[str, Any], value: str = "stall_s") -> str:
    """A run's stall (``value``: ``stall_s``, ``wait_s`` for its wait or ``waiting_s`` for its
    measured waiting): seconds, or that its survivors never stepped again after the kill."""
    v = _value(x, value)
    if x.get("stall_open"):
        return "never stepped again" if v is None else f">= {v:.2f} (never stepped again)"
    return _fmt(v)


def _value(x: dict[str, Any], value: str) -> float | None:
    """A run's ``stall_s``, ``wait_s`` (rows written before the wait was recorded: from their stall
    and steady step, by the same rule) or ``waiting_s`` (None for rows written before it was measured)."""
    return waited(x["stall_s"], x["steady_step_s"]) if value == "wait_s" else x.get(value)


def _worse_or_equal(a: dict[str, Any], b: dict[str, Any], value: str = "stall_s") -> bool:
    """``a``'s stall (``value``: its wait, its waiting, or ``stall_s``: its longest gap) is no shorter than ``b``'s
    (an open stall is as long as the run allowed)."""
    va, vb = _value(a, value), _value(b, value)
    if a.get("stall_open"):
        return not b.get("stall_open") or va is None or (vb or 0) <= va
    return not b.get("stall_open") and vb is not None and va is not None and vb <= va


def as_good(x: dict[str, Any], peer: dict[str, Any], value: str = "stall_s") -> bool:
    """The goal's verdict: run ``x`` is at least as good as ``peer`` on the stall (``value``:
    ``stall_s``, ``wait_s`` or ``waiting_s``) and on steps redone, and dropped no group beside the killed one."""
    return (_worse_or_equal(peer, x, value) and x["steps_redone"] <= peer["steps_redone"]
            and not x.get("extra_groups_dropped"))


def _steps(stall: float | None, step: float | None) -> str:
    """The stall in the system's own steady steps: comparable across systems whose steps differ in
    length (the peers' padded 0.3 s, Orthoplex's CPU-bound tp=2 step); the verdicts use seconds."""
    return "-" if stall is None or not step else f"{stall / step:.1f}"


def compare_markdown(r: dict[str, Any]) -> str:
    runs = r["runs"]
    ft = runs["torchft"]
    rows = [runs["tp2-fault"], runs["tp1-fault"], ft,
            *[runs[k] for k in ("torchft-fast", "torchft-matched", "torchft-matched-compute") if k in runs],
            runs["restart"]]
    lines = [f"### Replica groups vs Ray Train + torchft vs Ray Train restart (one invocation, {REP_NODES} nodes x "
             f"{REP_GPUS} declared GPUs, {REP_GROUPS} groups, the last group's node killed at 0-based step {REP_KILL})",
             "",
             "| system | group size | survivors' longest stall, kill -> full strength (s) | steady median step (s) | "
             "stall in steady steps | longest wait beyond a steady step (s) | wait / torchft | "
             "longest waiting, measured (s) | waiting / torchft | steps redone | "
             "redone / torchft | kill -> full strength (s) | full / torchft | final loss | "
             "max rel. loss diff vs no-fault | steps |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for x in rows:
        diff = x.get("max_rel_loss_diff_vs_no_fault")
        if x.get("extra_groups_dropped"):
            lines.append(f"| {x['system']}: **{x['extra_groups_dropped']} more group(s) dropped than the killed one** "
                         f"({x['dropped']}; stall from {x['stall_from']}) | | | | | | | | | | | | | | | |")
        lines.append(
            f"| {x['system']} | {x['group_size']} | {_stall(x)} | {_fmt(x['steady_step_s'], '.3f')} | "
            f"{_steps(x['stall_s'], x['steady_step_s'])} | {_stall(x, 'wait_s')} | "
            f"{_ratio(_value(x, 'wait_s'), _value(ft, 'wait_s'))} | {_stall(x, 'waiting_s')} | "
            f"{_ratio(_value(x, 'waiting_s'), _value(ft, 'waiting_s'))} | {x['steps_redone']} | "
            f"{x['steps_redone']} vs {ft['steps_redone']} | {_fmt(x.get('full_strength_s'))} | "
            f"{_ratio(x.get('full_strength_s'), ft['full_strength_s'])} | {x['final_loss']:.6f} | "
            f"{'not measured' if diff is None else f'{diff:.1e}'} | {x['steps']} |")
    lines += ["", "How each number is taken, the same for every system: from the surviving groups' own per-step "
              "commit timestamps (Orthoplex: each group's commit time returned by its rank 0; the peers: the "
              "ranks' own step log rows). Stall: the longest gap between two consecutive commits of a survivor "
              "that ends after the kill and starts before the first commit of a step every group computed in "
              "(a replacement heals in its first step without a share of it; the end of "
              "the run if never back). Wait: that stall beyond one steady median step of the same system "
              "in the same run, toward the issue's \"only the time the surviving ranks wait\" (a gap also holds the "
              "step's own work, whose length differs between the systems; a step with fewer groups counts "
              "its extra rows as wait; the steady median of a run that never gets back rests on the "
              "few gaps before the kill), reported beside the stall. Waiting, measured: in the same window, "
              "the longest gap minus the survivor's own work inside it, from its own timestamps of each "
              "piece of work (forward/backward passes, optimizer steps; the peers' step padding counts as "
              "work, standing in for a real step's compute): the time it spent in quorums, reductions, "
              "failure detection, a replacement's heal and the round trip between steps. "
              "**The job's start is excluded**: the kill comes after "
              f"{REP_KILL} steps, and the steady median leaves out the first {START_GAPS} gaps of the run (the warm "
              "pool importing torch, the first quorum) and the stall window. Steps redone: the worst survivor's "
              "step attempts after the kill that redo a step (Orthoplex: a step's attempts beyond the first, from the "
              "ranks' voted-down attempts (a rank redoes one at once); torchft: "
              "aborted attempts + repeated commits; restart: steps rerun since the checkpoint); attempts redone "
              "*before* the kill (the loaded host, the start) are not counted here, see below.", "",
              "Differences, stated: Ray Train's `TorchftConfig` makes each worker its own replica group, so a "
              "peer group is 1 process holding the whole model on 2 declared GPUs (Orthoplex tp=2: 2 ranks per "
              "group; tp=1: 1 rank per group, 1 GPU). Each group runs its 4 rows of a step in one forward/backward "
              f"pass in all systems (Orthoplex: micro_batch {REP_MICRO_BATCH}; the survivors of a lost group take "
              "2 of its rows each). The peers train the same tiny model, global batch "
              f"{GLOBAL_BATCH}, engine optimizer and data, but with their own plain-torch loop, every step padded to "
              f"{ft['min_step_s']} s by sleeping after it (their unpadded ~40 ms step is shorter than a "
              "replacement's start; the 'step padded to' row: slept to Orthoplex tp=2's no-fault steady step of "
              "this run; the 'of compute' row: the same length spent spinning before the reduction, a CPU-bound "
              "step like Orthoplex's: asleep, a survivor waits out the dead peer's teardown inside its pad), over "
              f"{ft['steps']} steps (Orthoplex: {REP_STEPS} unpadded steps) so the replacement can join; the "
              f"killed group's node dies in 0-based step {REP_KILL} after its backward pass, before the "
              "cross-group reduction, in all systems (the peers: by the group's own worker; Orthoplex: by the "
              "fault hook). While a group is missing, torchft's survivors average their own rows only (smaller "
              "batch), so its loss curve is not the no-fault one; no no-fault peer run is done here, hence "
              "'not measured'. Restart: a Ray Train checkpoint every 2 steps. Peer stall over the whole rest of "
              f"the run after the kill (their own summary's window): torchft {_fmt(ft.get('stall_s_whole_run_after_kill'))} s, "
              f"restart {_fmt(runs['restart'].get('stall_s_whole_run_after_kill'))} s. Steps redone over the whole run, "
              f"before the kill too: torchft {ft.get('steps_redone_whole_run')}, restart "
              f"{runs['restart'].get('steps_redone_whole_run')}; Orthoplex tp=2 aborted before the kill: "
              f"{runs['tp2-fault'].get('aborted_before_kill')}, tp=1: {runs['tp1-fault'].get('aborted_before_kill')}."]
    for x in rows:
        if x.get("fit_hung"):
            lines += ["", f"**{x['system']}: `fit()` did not return within its deadline** (the replacement "
                      f"{'joined' if x.get('full_strength_s') is not None else 'never committed a step'}); the run "
                      "was aborted through Ray Train's own Ctrl-C path and its numbers are the ranks' logs up to then."]
    if r.get("quick"):
        lines += ["", "_Quick mode: no tp=1 no-fault run (its loss check is not measured), peers "
                  f"{PEER_STEPS_QUICK} steps._"]
    lines += ["", goals_markdown(r), "",
              f"_Host load average (1 min) at the start and after each run: {r['load_average_1min']}._"]
    return "\n".join(lines)


def goals_markdown(r: dict[str, Any]) -> str:
    """Issue 14's replica-group goals for Orthoplex tp=2, verdicts computed."""
    runs = r["runs"]
    f, c, ft, one = runs["tp2-fault"], runs["tp2-clean"], runs["torchft"], runs["tp1-fault"]
    diff = f.get("max_rel_loss_diff_vs_no_fault", float("nan"))

    def yes(ok: bool) -> str:
        return "yes" if ok else "**no**"

    def vs(label: str, peer: dict[str, Any] | None, extra: str = "", tp1: bool = True) -> list[str]:
        if peer is None:
            return []
        tp1_text = (f"; tp=1 (same group size): stall {_stall(one)} s (wait {_stall(one, 'wait_s')} s), "
                    f"redone {one['steps_redone']}" if tp1 else "")
        one_ok = f" (tp=1: {yes(as_good(one, peer))})" if tp1 else ""
        waiting = f.get("waiting_s") is not None
        wait_ok = (f" (wait: {yes(as_good(f, peer, 'wait_s'))}"
                   + (f"; waiting: {yes(as_good(f, peer, 'waiting_s'))})" if waiting else ")"))
        return [f"| {label} | tp=2: stall {_stall(f)} vs {_stall(peer)} s; wait beyond a steady step "
                f"{_stall(f, 'wait_s')} vs {_stall(peer, 'wait_s')} s"
                + (f"; waiting, measured {_stall(f, 'waiting_s')} vs {_stall(peer, 'waiting_s')} s " if waiting else " ")
                + f"({_steps(f['stall_s'], f['steady_step_s'])} vs {_steps(peer['stall_s'], peer['steady_step_s'])} "
                f"steady steps), redone {f['steps_redone']} vs {peer['steps_redone']}{extra}{tp1_text}"
                f" | {yes(as_good(f, peer))}{wait_ok}{one_ok}{hung_note(peer)} |"]

    def matched_extra(peer: dict[str, Any] | None) -> str:
        if peer is None:
            return ""
        return (f", kill -> full strength {_fmt(f.get('full_strength_s'))} vs {_fmt(peer.get('full_strength_s'))} s; "
                f"steady step {_fmt(peer['steady_step_s'], '.3f')} vs {_fmt(f['steady_step_s'], '.3f')} s")

    fast, matched, compute = runs.get("torchft-fast"), runs.get("torchft-matched"), runs.get("torchft-matched-compute")
    peers = [*vs("at least as good as Ray Train + torchft (same run) on stall and steps lost: torchft as configured "
                 f"(heartbeat timeout {ft.get('heartbeat_timeout_ms', 0) / 1000:g} s, steps slept to "
                 f"{ft.get('min_step_s', 0):.2f} s)", ft),
             *vs("the same against torchft at a short heartbeat timeout "
                 f"({(fast or {}).get('heartbeat_timeout_ms', 0) / 1000:g} s)", fast),
             *vs("the same, torchft's steps slept to tp=2's own no-fault step "
                 f"({(matched or {}).get('min_step_s', 0):.2f} s)", matched, matched_extra(matched), tp1=False),
             *vs("the same, torchft's steps spent computing to tp=2's own no-fault step "
                 f"({(compute or {}).get('min_step_s', 0):.2f} s; a CPU-bound step, as tp=2's is)", compute,
                 matched_extra(compute), tp1=False)]

    back = f.get("groups_at_end") == REP_GROUPS and bool(f.get("replacement_on_spare_node"))
    extra = int(f.get("extra_groups_dropped") or 0)
    stall_ok = not f.get("stall_open") and f["stall_s"] <= 3 and not extra
    # the redo's own gap; a later, longer gap is a step with fewer groups (each survivor computes a larger
    # share: the global batch kept) or the replacement's join step
    kill_gap = "" if f.get("kill_gap_s") is None else f"the gap across the kill {f['kill_gap_s']:.2f} s; "
    why = (f"; **{extra} more group(s) dropped** ({f.get('dropped')}), stall from {f.get('stall_from')}"
           if extra else "")
    return "\n".join([
        f"#### Goals (issue 14, replica groups: Orthoplex tp={REP_TP} x {REP_GROUPS} groups)", "",
        "| goal | measured | met? |", "|---|---|---|",
        f"| survivors' longest stall <= 3 s | {_stall(f)} s (ends at 0-based step {f['stall_ends_step']}; {kill_gap}"
        f"steady median step {_fmt(f['steady_step_s'], '.3f')} s; no-fault run's steady median "
        f"{_fmt(c['steady_step_s'], '.3f')} s{why}) | {yes(stall_ok)} |",
        f"| at most one step redone | {f['steps_redone']} (0-based {f['redone_steps']}) | {yes(f['steps_redone'] <= 1)} |",
        f"| every step's loss within 1e-4 relative of the no-fault run | max rel. diff {diff:.1e} | {yes(diff <= 1e-4)} |",
        f"| back at {REP_GROUPS} groups, replacement on the spare node | {f.get('groups_at_end')} groups at the end, "
        f"kill -> full strength {_fmt(f.get('full_strength_s'))} s, healed from group {f.get('healed_from')}, "
        f"spare node: {f.get('replacement_on_spare_node')} | {yes(back)} |",
        f"| no storage read | `resumed` events: {f['resumed_events']} | {yes(f['resumed_events'] == 0)} |",
        *peers])


def hung_note(peer: dict[str, Any]) -> str:
    """A verdict against a peer run whose ``fit()`` hung is no fair verdict: say so next to it."""
    return ("; **the peer's run hung** (`fit()` ended by the deadline), so this verdict says little"
            if peer.get("fit_hung") else "")


PEER_RUNS = ("torchft", "torchft-fast", "torchft-matched", "torchft-matched-compute")


def across_runs_markdown(result: dict[str, Any], keys: list[str]) -> str:
    """The compare runs ``keys`` of ``recovery.json`` (``result``) in one table: Orthoplex's wait and
    stall (longest gap) against every torchft run of the same invocation, and the tally of the goal's
    verdict (:func:`as_good`) and of the same on the wait."""
    head = ["| run | tp=2 stall (wait; waiting), s | tp=1 stall (wait; waiting), s | "
            + " | ".join(f"{k} stall (wait; waiting), s" for k in PEER_RUNS)
            + " | tp=2 as good on stall and redone | on wait and redone | on waiting and redone "
            "| tp=1 as good on stall and redone |",
            "|---|---|---|" + "---|" * len(PEER_RUNS) + "---|---|---|---|"]
    won = {"stall_s": 0, "wait_s": 0, "waiting_s": 0}
    measured = 0  # torchft runs of the compare runs that measured the waiting
    won_tp1 = 0
    total = 0

    def cell(x: dict[str, Any]) -> str:
        return f"{_stall(x)} ({_stall(x, 'wait_s')}; {_stall(x, 'waiting_s')})"

    for key in keys:
        runs = result[key]["runs"]
        f = runs["tp2-fault"]
        peers = [runs[k] for k in PEER_RUNS if k in runs]
        tally = {v: sum(as_good(f, p, v) for p in peers) if _value(f, v) is not None or f.get("stall_open") else 0
                 for v in won}
        tp1 = sum(as_good(runs["tp1-fault"], p) for p in peers)
        won_tp1 += tp1
        for v in won:
            won[v] += tally[v]
        total += len(peers)
        measured += len(peers) if f.get("waiting_s") is not None else 0
        head.append(f"| {result[key].get('started', key)} | {cell(f)} | {cell(runs['tp1-fault'])} | "
                    + " | ".join(cell(runs[k]) if k in runs else "-" for k in PEER_RUNS)
                    + f" | {tally['stall_s']} of {len(peers)} | {tally['wait_s']} of {len(peers)} | "
                    + (f"{tally['waiting_s']} of {len(peers)}" if f.get("waiting_s") is not None else "not measured")
                    + f" | {tp1} of {len(peers)} |")
    head += ["", f"Over these {len(keys)} runs, Orthoplex tp=2 is at least as good as torchft on the stall and on "
             f"steps redone in **{won['stall_s']} of {total}** torchft runs; on the wait and steps redone "
             f"in {won['wait_s']} of {total}; on the measured waiting and steps redone in {won['waiting_s']} of "
             f"{measured} (the runs that measured it). Orthoplex tp=1 (torchft's group size) on the "
             f"stall and steps redone: {won_tp1} of {total}."]
    return "\n".join(head)


if __name__ == "__main__":
    import json

    from bench.common import RESULTS_DIR

    res = json.loads((RESULTS_DIR / "recovery.json").read_text())
    print(across_runs_markdown(res, res["compare_series"]))
