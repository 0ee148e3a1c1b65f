"""Chaos soak over network namespaces: one job while random network faults hit random nodes.

A ``NetnsCluster`` (head + 3 nodes x 2 declared GPUs, each node its own namespace and link) runs one
elastic job (tiny model, up to 4 ranks). Every 30-60 s (``quick``: 10-20 s) a fault hits a random
node that hosts ranks; its kind comes from a shuffled round of all kinds, so every kind fires: a
partition healed after 2-15 s (sometimes within the node-loss deadline, sometimes not), a partition
from one peer, a bandwidth cap (2-20 Mbit/s), packet loss (5-20 %), or a delay of 20-100 ms each way
with 0-20 ms of jitter; the last four heal after 20-40 s. A node that was declared lost (its raylet
exits when the link heals) is restarted as a repaired machine. The soak lasts ``soak_s`` (600 s;
quick: 100 s); the job has as many steps as the no-fault median step time measured first would
finish in that time, so faults go on for the whole soak and the job ends shortly after they stop.

What must hold (checked, reported in ``bench/results/netchaos.json``): the job SUCCEEDED; every step
was done, and steps were run twice only after a resume from a checkpoint (exactly
``sum(steps_redone)``); the final 10-step mean loss is within 1 % of the engine's single-process run
of the same config (the recovery contract); afterwards no placement group, actor, process,
namespace or link is left. The baseline is the same job without faults, in the same run.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from workers.states import ATTEMPT_TERMINAL
from workers.testbed.reference_run import reference_losses

GLOBAL_BATCH = 8


def _spec(ckpt: str, steps: int) -> dict[str, Any]:
    return {"model": "tiny", "steps": steps, "global_batch": GLOBAL_BATCH, "min_gpus": 2, "max_gpus": 4,
            "checkpoint_dir": ckpt, "layout_hint": "tp=2",
            "checkpoint": {"min_every_steps": 1, "max_every_steps": 5},
            "runtime": {"heartbeat_s": 1, "heartbeat_timeout_s": 8, "hang_timeout_s": 90,
                        "collective_timeout_s": 45, "node_confirm_s": 8, "grow": True, "max_recoveries": 100}}


def _reference_losses(steps: int, ckpt: str) -> list[float]:
    cfg = {"model": "tiny", "steps": steps, "global_batch": GLOBAL_BATCH, "checkpoint_dir": ckpt}
    return reference_losses(cfg, timeout_s=1200)


def _run_job(job_id: str, spec: dict[str, Any], during: Any = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    import ray

    from workers.runtime.supervision.launch import start_supervisor, stop_supervisor

    h = start_supervisor(job_id, 1, spec)
    events: list[dict[str, Any]] = []
    try:
        while True:
            events += ray.get(h.events.remote(events[-1]["seq"] if events else 0))
            if ray.get(h.status.remote())["state"] in ATTEMPT_TERMINAL:
                break
            if during is not None:
                during(events)
            time.sleep(0.5)
        res = ray.get(h.run.remote())
        events += ray.get(h.events.remote(events[-1]["seq"] if events else 0))
        return res, events
    finally:
        stop_supervisor(job_id, 1)


class Chaos:
    """Fires random network faults on the nodes the job uses; heals and repairs them."""

    KINDS = ("partition", "partition_peer", "rate", "loss", "delay")

    def __init__(self, cluster: Any, faults: Any, rng: random.Random, every: tuple[float, float],
                 soak_s: float, hold: tuple[float, float] = (20.0, 40.0),
                 partition_hold: tuple[float, float] = (2.0, 15.0), first_kind: str | None = None,
                 clock_from_mapping: bool = False, clock: str = "seconds") -> None:
        """``hold``: how long a peer partition, cap, loss or delay lasts; ``partition_hold``: a full
        partition's; ``first_kind``: the kind of the first fault (then the shuffled rounds);
        ``clock_from_mapping``: the fault clock (first fault, ``soak_s``) starts when the job first
        maps its ranks, not at construction (a short soak must not spend its faults on the gang start).
        ``clock``: what ``every`` and ``soak_s`` count: ``"seconds"``, or ``"steps"``, the job's
        committed steps (a fixed-length job then meets the same number of faults on a fast machine as
        on a loaded one; the holds stay in seconds)."""
        if clock not in ("seconds", "steps"):
            raise ValueError(f"clock must be 'seconds' or 'steps', not {clock!r}")
        self.cluster, self.faults, self.rng, self.every = cluster, faults, rng, every
        self.hold, self.partition_hold, self.first_kind = hold, partition_hold, first_kind
        self.clock_from_mapping, self.clock = clock_from_mapping or clock == "steps", clock
        self.t0 = time.monotonic()
        self.soak_s = soak_s
        self.next_at = self.t0 + rng.uniform(*every)
        self.started = not self.clock_from_mapping
        self.heal_at: dict[str, float] = {}
        self.fired: list[dict[str, Any]] = []
        self.bag: list[str] = []
        self.loads: list[float] = []  # the machine's 1-minute load average, sampled every poll

    def __call__(self, events: list[dict[str, Any]]) -> None:
        import ray

        now = time.monotonic()
        self.loads.append(os.getloadavg()[0])
        for name, at in list(self.heal_at.items()):
            if now >= at:
                self.faults.heal(name)
                del self.heal_at[name]
                node = self.cluster.node(name)
                alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
                if node.ray_node_id not in alive:  # declared lost: its raylet exits; repair it
                    self.cluster.restart_node(name)
                    self.fired.append({"t": round(now - self.t0, 1), "kind": "repaired", "node": name})
        mapped = [e for e in events if e["type"] == "ranks_mapped"]
        # the fault clock: seconds since the start, or the job's newest committed step
        tick = now if self.clock == "seconds" else float(max((e["step"] for e in events if e["type"] == "step"),
                                                             default=0))
        if not self.started:
            if not mapped:
                return
            self.started, self.t0 = True, now
            self.next_at = tick + self.rng.uniform(*self.every)
        elapsed = tick - (self.t0 if self.clock == "seconds" else 0.0)
        if tick < self.next_at or elapsed > self.soak_s:
            return
        if not mapped:
            return
        used = sorted({self.cluster.node(n).name for n in mapped[-1]["rank_to_node"]} - set(self.heal_at))
        if not used:  # every node of the job is under a fault: this one fires once one heals
            return
        self.next_at = tick + self.rng.uniform(*self.every)
        name = self.rng.choice(used)
        if not self.bag:  # every kind once per round, in a random order: all of them fire in a soak
            self.bag = self.rng.sample(self.KINDS, len(self.KINDS))
        if self.first_kind is not None and not self.fired:
            kind = self.first_kind
        else:
            kind = self.bag.pop()
        rec: dict[str, Any] = {"t": round(now - self.t0, 1), "kind": kind, "node": name}
        if self.clock == "steps":
            rec["step"] = int(tick)
        if kind == "partition":
            self.faults.partition(name)
            hold = self.rng.uniform(*self.partition_hold)
        elif kind == "partition_peer":
            peer = self.rng.choice([n.name for n in self.cluster.workers if n.name != name])
            self.faults.partition(name, peers=[peer])
            rec["peer"] = peer
            hold = self.rng.uniform(*self.hold)
        elif kind == "rate":
            rec["mbit"] = self.rng.choice([2, 5, 10, 20])
            self.faults.rate(name, rec["mbit"])
            hold = self.rng.uniform(*self.hold)
        elif kind == "loss":
            rec["pct"] = self.rng.choice([5, 10, 20])
            self.faults.loss(name, rec["pct"])
            hold = self.rng.uniform(*self.hold)
        else:
            rec["ms"], rec["jitter_ms"] = self.rng.choice([20, 50, 100]), self.rng.choice([0, 10, 20])
            self.faults.delay(name, rec["ms"], rec["jitter_ms"])
            hold = self.rng.uniform(*self.hold)
        rec["heal_after_s"] = round(hold, 1)
        self.heal_at[name] = now + hold
        self.fired.append(rec)

    def heal_all(self) -> None:
        for name in list(self.heal_at):
            self.faults.heal(name)
        self.heal_at.clear()


def chaos_job(chaos: Chaos, steps: int, ckpt_root: Path, job_id: str = "chaos-soak") -> tuple[dict[str, Any], list[str]]:
    """One elastic job of ``steps`` on ``chaos.cluster`` (the driver connected) while ``chaos`` fires; heals every fault
    after it, runs the single-process reference and checks the soak's contract: the job SUCCEEDED, no
    step missing, steps run twice == the resumes' ``steps_redone``, final 10-step mean loss within 1 %
    of the reference, no placement group left. Returns the measurements and the list of what failed.
    The caller owns the cluster and ``chaos.faults`` (closes it) and checks for leftover processes."""
    from ray.util import placement_group_table

    problems: list[str] = []
    t1 = time.monotonic()
    try:
        res, events = _run_job(job_id, _spec(str(ckpt_root / "soak"), steps), during=chaos)
    finally:
        chaos.heal_all()
    soak_wall = time.monotonic() - t1
    ref = _reference_losses(steps, str(ckpt_root / "ref"))
    runs = [e["step"] for e in events if e["type"] == "step"]
    last = {e["step"]: e["loss"] for e in events if e["type"] == "step"}
    resumed = [e for e in events if e["type"] == "resumed"]
    if res["state"] != "SUCCEEDED":
        problems.append(f"job ended {res['state']}: {res.get('error')}")
    if sorted(set(runs)) != list(range(1, steps + 1)):  # step events are 1-based
        problems.append("steps missing")
    redone = len(runs) - len(set(runs))
    if redone != sum(e["steps_redone"] for e in resumed):
        problems.append(f"{redone} steps run twice, resumes account for {sum(e['steps_redone'] for e in resumed)}")
    ours = [last[s] for s in range(max(1, steps - 9), steps + 1) if s in last]
    mean_ours, mean_ref = sum(ours) / max(1, len(ours)), sum(ref[-10:]) / 10
    if abs(mean_ours - mean_ref) > 0.01 * mean_ref:
        problems.append(f"final 10-step mean loss {mean_ours:.4f} vs reference {mean_ref:.4f} (> 1 %)")
    deadline = time.monotonic() + 30  # the supervisor's stop removes its groups; give the GCS a moment
    while True:
        pgs = [t for t in placement_group_table().values() if t.get("state") != "REMOVED"]
        if not pgs or time.monotonic() > deadline:
            break
        time.sleep(1)
    if pgs:
        problems.append(f"{len(pgs)} placement groups left")
    by_kind: dict[str, int] = {}
    for e in events:
        if e["type"] in ("node_lost", "rank_failed", "hang", "straggler", "resumed", "recovery"):
            by_kind[e["type"]] = by_kind.get(e["type"], 0) + 1
    recoveries = [e["total_s"] for e in events if e["type"] == "recovery"]
    out = {"steps": steps, "soak_s": chaos.soak_s, "soak_wall_s": round(soak_wall, 1), "faults": chaos.fired,
           "events": by_kind, "steps_run": len(runs), "steps_redone": redone,
           "recovery_s": [round(x, 1) for x in recoveries], "final_loss_mean10": round(mean_ours, 4),
           "reference_loss_mean10": round(mean_ref, 4), "state": res["state"]}
    return out, problems


def soak(soak_s: float, every: tuple[float, float], seed: int = 0) -> dict[str, Any]:
    """Run the soak on a cluster of its own; returns the measured result with ``ok`` and the list of
    what failed."""
    import ray

    from workers.testbed.local_cluster import FAST_HEALTH_CHECK
    from workers.testbed.netns_cluster import NetnsCluster, leftovers
    from workers.testbed.network_faults import NetFaults

    rng = random.Random(seed)
    load_start = os.getloadavg()[0]
    config = {**FAST_HEALTH_CHECK, "health_check_failure_threshold": 5, "health_check_timeout_ms": 3000}
    cluster = NetnsCluster(nodes=3, gpus_per_node=2, cpus_per_node=2.0, system_config=config, connect=True)
    problems: list[str] = []
    out: dict[str, Any] = {}
    tmp = Path(tempfile.mkdtemp(prefix="orthoplex-netchaos-"))
    chaos: Chaos | None = None
    try:
        cluster.start()
        t0 = time.monotonic()
        base_res, base_ev = _run_job("chaos-base", _spec(str(tmp / "base"), 20))
        base_wall = [e["wall_s"] for e in base_ev if e["type"] == "step"]
        base_s = time.monotonic() - t0
        # as many steps as the no-fault median step would finish in soak_s (not the baseline's wall
        # time over 20 steps: that includes the gang's start, and the job ended long before the soak)
        steps = max(20, int(soak_s / max(sorted(base_wall)[len(base_wall) // 2], 1e-3)))
        chaos = Chaos(cluster, NetFaults(cluster), rng, every, soak_s)
        out, problems = chaos_job(chaos, steps, tmp)
        out.pop("state", None)
        out.update({"load": {"start": round(load_start, 1), "max": round(max(chaos.loads, default=0.0), 1),
                             "end": round(os.getloadavg()[0], 1), "cpus": os.cpu_count()},
                    "commit": _commit(),
                    "baseline": {"state": base_res["state"], "steps": 20, "wall_s": round(base_s, 1),
                                 "median_step_s": round(sorted(base_wall)[len(base_wall) // 2], 3)}})
    finally:
        if chaos is not None:
            chaos.faults.close()  # its delay lines are children of this process
        shutil.rmtree(tmp, ignore_errors=True)
        rec = cluster.record()
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
    left = leftovers(rec)
    if any(left.values()):
        problems.append(f"left behind: {left}")
    out["leftovers"] = left
    out["problems"] = problems
    out["ok"] = not problems
    return out


def _commit() -> str:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent)
    return proc.stdout.strip() or "unknown"


def run(quick: bool = False) -> dict[str, Any]:
    r = soak(100.0 if quick else 600.0, (10.0, 20.0) if quick else (30.0, 60.0))
    lines = ["## netchaos: a job under random network faults (nodes in network namespaces)", "",
             f"{r['soak_s']:.0f} s of faults ({len(r['faults'])} fired: "
             f"{', '.join(sorted({f['kind'] for f in r['faults']}))}), job of {r['steps']} steps "
             f"(no-fault baseline in the same run: 20 steps in {r['baseline']['wall_s']} s, median step "
             f"{r['baseline']['median_step_s']} s; tiny model on a 2-core machine shared with other work).", "",
             f"Code: commit {r.get('commit', '?')}. Machine load (1-minute average, as `uptime` shows it; "
             f"{r.get('load', {}).get('cpus')} CPUs): {r.get('load', {}).get('start')} at the start, up to "
             f"{r.get('load', {}).get('max')} during the soak, {r.get('load', {}).get('end')} at its end.", "",
             "| check | result |", "|---|---|",
             f"| job finished | {'yes' if not any('job ended' in p for p in r['problems']) else 'no'} |",
             f"| steps run / redone (all redone after a resume) | {r['steps_run']} / {r['steps_redone']} |",
             f"| failures seen | {r['events']} |",
             f"| recoveries (s) | {r['recovery_s']} |",
             f"| final 10-step mean loss vs single-process reference | {r['final_loss_mean10']} vs "
             f"{r['reference_loss_mean10']} |",
             f"| left behind | {r['leftovers']} |",
             f"| verdict | {'holds' if r['ok'] else 'FAILED: ' + '; '.join(r['problems'])} |"]
    return {"name": "netchaos", **r, "markdown": "\n".join(lines) + "\n"}
