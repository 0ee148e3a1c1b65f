"""Where in-memory snapshots cost CPU (issue #14, steady state): the re-plan benchmark's job
(``bench.recovery``: 3 nodes x 4 declared GPUs, ``tp=4,pp=2`` on 8, tiny model, 40 steps, no fault)
with snapshots off and on, in alternating pairs on one cluster, while every process's CPU time is
sampled from ``/proc`` and added up by kind (rank actors, snapshot holders, raylets, ...).

The baseline is the same job with snapshots off, in the same run. What it answers: how many CPU
seconds per step the snapshots add and in which processes; on this 2-core host those seconds come
out of the ranks' share, which is what the off/on step-time pairs of ``bench/recovery.py`` see.
Limits: the host's other work is sampled too (its kinds are listed, not subtracted); a process that
exits between two samples (every 0.3 s) loses its last partial interval.

Run ``python -m bench.snapshot_cpu`` or ``orthoplex bench snapshot_cpu`` (``--quick``: one pair).
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workers.runtime.cluster import procfs

KINDS = ("SnapshotHolder", "RankWorker", "JobSupervisor", "raylet", "gcs_server", "dashboard", "log_monitor",
         "runtime_env", "ray::IDLE")
Reading = dict[str, tuple[str, float]]  # pid -> (command line, CPU seconds so far)


def process_kind(cmdline: str) -> str:
    """The kind a process is counted under: a known Ray/Orthoplex process by name, else ``other``."""
    for k in KINDS:
        if k in cmdline:
            return k
    return "other"


def read_processes() -> Reading:
    """Every process's command line and user + system CPU seconds, from ``/proc``."""
    out: Reading = {}
    for pid in procfs.pids():
        fields = procfs.stat_fields(pid)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fields:
            out[str(pid)] = (cmd, procfs.cpu_seconds(fields))
    return out


class CpuByKind:
    """Adds up the CPU seconds every process spends between :meth:`start` and :meth:`stop`, by kind
    (a process born in between counts from zero)."""

    def __init__(self, read: Callable[[], Reading] = read_processes, every_s: float = 0.3) -> None:
        self.read, self.every_s = read, every_s
        self.seconds: dict[str, float] = {}
        self._last: Reading = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> None:
        now = self.read()
        for pid, (cmd, cpu) in now.items():
            base = self._last[pid][1] if pid in self._last else 0.0
            kind = process_kind(cmd)
            self.seconds[kind] = self.seconds.get(kind, 0.0) + max(0.0, cpu - base)
        self._last = now

    def start(self) -> CpuByKind:
        self._last = self.read()
        self._thread = threading.Thread(target=self._loop, name="cpu-by-kind", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.tick()

    def stop(self) -> dict[str, float]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.tick()
        return dict(self.seconds)


def run(quick: bool = False) -> dict[str, Any]:
    from bench.recovery import RE_GPUS, RE_NODES, RE_STEPS, _replan_run
    from workers.testbed.local_cluster import InProcessCluster

    order = [False, True] if quick else [False, True, True, False]
    work = Path(tempfile.mkdtemp(prefix="orthoplex-bench-snapcpu-"))
    cluster = InProcessCluster(nodes=RE_NODES, gpus_per_node=RE_GPUS).start()
    runs: list[dict[str, Any]] = []
    try:
        for i, snap in enumerate(order):
            meter = CpuByKind().start()
            t0 = time.monotonic()
            row = _replan_run(f"{'on' if snap else 'off'}{i}", work, steps=RE_STEPS, snapshots=snap, fault=False,
                              drop=False, warm=0)
            cpu = meter.stop()
            steady = row["step_walls"][5:]
            runs.append({"snapshots": snap, "wall_s": round(time.monotonic() - t0, 1), "steps": len(row["step_walls"]),
                         "median_step_s": round(statistics.median(steady), 3),
                         "cpu_s": {k: round(v, 2) for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])}})
            print(runs[-1], flush=True)
    finally:
        cluster.shutdown()
    return {"name": "snapshot_cpu", "runs": runs, "summary": summarize(runs), "markdown": markdown(runs)}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean CPU seconds per step by kind, snapshots on minus off; median step on / off."""
    kinds = sorted({k for r in runs for k in r["cpu_s"]})

    def per_step(snap: bool, kind: str) -> float:
        rs = [r for r in runs if r["snapshots"] is snap]
        return statistics.fmean(r["cpu_s"].get(kind, 0.0) / r["steps"] for r in rs)

    extra = {k: round(per_step(True, k) - per_step(False, k), 4) for k in kinds}
    on = statistics.median(r["median_step_s"] for r in runs if r["snapshots"])
    off = statistics.median(r["median_step_s"] for r in runs if not r["snapshots"])
    return {"extra_cpu_s_per_step": extra, "extra_cpu_s_per_step_total": round(sum(extra.values()), 4),
            "rank_cpu_s_per_step_off": round(per_step(False, "RankWorker"), 4),
            "median_step_on_over_off": round(on / off, 3)}


def markdown(runs: list[dict[str, Any]]) -> str:
    s = summarize(runs)
    kinds = [k for k, v in sorted(s["extra_cpu_s_per_step"].items(), key=lambda kv: -abs(kv[1]))]
    lines = ["CPU seconds by process kind over whole jobs of the re-plan benchmark (3 nodes x 4 declared GPUs, "
             "`tp=4,pp=2`, tiny model, 40 steps, no fault), snapshots off (baseline) and on, alternating, one "
             "cluster, this 2-core host.", "",
             "| run | median step (s) | wall (s) | " + " | ".join(kinds) + " |",
             "|---|---|---|" + "---|" * len(kinds)]
    for r in runs:
        lines.append(f"| snapshots {'on' if r['snapshots'] else 'off'} | {r['median_step_s']} | {r['wall_s']} | "
                     + " | ".join(f"{r['cpu_s'].get(k, 0.0):.1f}" for k in kinds) + " |")
    lines.append("| **on - off, CPU s per step** | | | "
                 + " | ".join(f"{s['extra_cpu_s_per_step'][k]:+.3f}" for k in kinds) + " |")
    lines += ["", f"Snapshots add **{s['extra_cpu_s_per_step_total']:.3f} CPU s per step** in all (the ranks alone "
              f"use {s['rank_cpu_s_per_step_off']:.2f} CPU s per step with snapshots off); median step on / off: "
              f"**{s['median_step_on_over_off']:.3f}x**. `other` is every process not named (the bench itself, "
              "Ray's agents, the host)."]
    return "\n".join(lines)


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The history row of a run (``bench.render``)."""
    s = result.get("summary") or summarize(result["runs"])
    return {"extra CPU s per step": s["extra_cpu_s_per_step_total"], "median step on / off": s["median_step_on_over_off"]}


if __name__ == "__main__":
    import sys

    from bench.common import write_result

    result = run(quick="--quick" in sys.argv)
    print(result["markdown"])
    print("wrote", *write_result(result))

