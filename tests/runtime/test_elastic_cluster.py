"""The runtime's quality bars on the session cluster (3 nodes x 4 declared GPUs, CPU torch).

1. Node loss (through ``orthoplex run``; ``soak`` tier, to keep CI under its budget): 12 GPUs with TP, PP and DP; a node is killed at step K;
   the job re-plans onto the 8 GPUs left with another layout, resumes from the last checkpoint and
   finishes every step; no step is lost beyond that checkpoint; the final 10-step mean loss is within
   1% of the engine's single-process run of the same config; nothing leaks (the fixture checks).
2. Straggler, jitter, hang and grow-back in one job (``soak`` tier, see the test): a node slowed 5x is detected within two scoring
   windows and left out by the re-plan, while a node with 3% jitter is never named; a new node joins
   and the job grows onto it at a checkpoint boundary; then a rank hangs, the step deadline catches
   it and the job recovers and finishes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from workers.testbed.reference_run import reference_losses

pytestmark = pytest.mark.cluster

STEPS = 14
GLOBAL_BATCH = 12
HINT = "tp=2,pp=2,dp=3,vpp=1"


def _reference_losses(checkpoint_dir: str, steps: int) -> list[float]:
    """The engine's single-process run of the same config (no Ray): the no-failure baseline."""
    cfg = {"model": "tiny", "steps": steps, "global_batch": GLOBAL_BATCH, "checkpoint_dir": checkpoint_dir}
    return reference_losses(cfg, timeout_s=300)


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _mean_last(xs: list[float], n: int = 10) -> float:
    tail = xs[-n:]
    return sum(tail) / len(tail)


# soak tier (2-3 minutes): the default run covers node loss -> re-plan onto another layout -> resume
# with the loss checked against the no-fault run in tests/runtime/test_memsnap_cluster.py (memory and
# storage), through REST in tests/e2e/test_service_e2e.py and in the demo
@pytest.mark.soak
@pytest.mark.timeout(1500)
def test_node_loss_replans_onto_8_gpus_and_matches_the_no_failure_loss(ray_cluster, tmp_path) -> None:
    import typer
    from typer.testing import CliRunner

    from service.cli.runtime import register

    app = typer.Typer()
    register(app)

    @app.callback()
    def _root() -> None:  # a typer app with a callback keeps sub-commands named
        pass

    ev, met = tmp_path / "events.jsonl", tmp_path / "metrics.jsonl"
    kill_at = 5
    args = ["run", "--address", ray_cluster.address, "--nodes", "3", "--gpus-per-node", "4", "--model", "tiny",
            "--steps", str(STEPS), "--global-batch", str(GLOBAL_BATCH), "--min-gpus", "4",
            "--layout-hint", HINT, "--kill-node-at-step", str(kill_at), "--max-checkpoint-every", "2",
            "--hang-timeout", "60", "--checkpoint-dir", str(tmp_path / "ckpt"), "--snapshots", "--recovery", "replan",
            "--events-out", str(ev), "--metrics-out", str(met), "--job-id", "t-nodeloss"]
    t0 = time.time()
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output + repr(res.exception)
    wall = time.time() - t0
    events = _events(ev)
    types = [e["type"] for e in events]
    for needed in ("plan", "placed", "ranks_mapped", "step", "checkpoint", "node_lost", "replan", "resumed",
                   "recovery", "finished"):
        assert needed in types, f"no {needed} event in {types}"
    first = next(e for e in events if e["type"] == "plan")
    assert first["num_gpus"] == 12 and first["layout"]["tp"] == 2 and first["layout"]["pp"] == 2
    assert first["layout"]["dp"] == 3
    replan = next(e for e in events if e["type"] == "replan" and e["change"].get("lost_nodes"))
    assert replan["decision"] in ("replan", "shrink_dp")
    resumed = next(e for e in events if e["type"] == "resumed" and e["cause"] == "node_lost")
    assert resumed["world_size"] == 8
    new = resumed["layout"]
    assert (new["tp"], new["pp"], new["cp"], new["dp"]) != (2, 2, 1, 3)
    # restored from the in-memory snapshot of the step before the failure (or the one before it, when
    # the kill beat the last snapshot's push): at most one step redone, never back to the checkpoint
    lost = next(e for e in events if e["type"] == "node_lost")
    assert resumed["source"] == "memory" and resumed["from_step"] in (lost["step"] - 1, lost["step"]), resumed
    assert resumed["steps_redone"] <= 1
    steps_after = sorted({e["step"] for e in events if e["type"] == "step" and e["seq"] > resumed["seq"]})
    assert steps_after == list(range(resumed["from_step"] + 1, STEPS + 1))  # steps completed, 1-based
    assert all(e["world_size"] == 8 for e in events if e["type"] == "step" and e["seq"] > resumed["seq"])
    rec = next(e for e in events if e["type"] == "recovery" and e["cause"] == "node_lost")
    assert set(rec["phases"]) == {"detect", "plan", "place", "start", "load", "first_step"}
    assert rec["total_s"] == pytest.approx(sum(rec["phases"].values()), abs=1e-3)
    assert 0 < rec["phases"]["detect"] < 20
    assert all(e["ts"] >= events[0]["ts"] for e in events)
    # per-step metrics and the printed summary
    metrics = [json.loads(x) for x in met.read_text().splitlines()]
    assert {m["step"] for m in metrics} == set(range(1, STEPS + 1))
    assert "recovery (node_lost)" in res.output and "final loss" in res.output
    # the loss: final 10-step mean within 1% of the same run without the failure
    final = {}
    for e in events:
        if e["type"] == "step":
            final[e["step"]] = e["loss"]
    elastic = [final[s] for s in range(1, STEPS + 1)]
    reference = _reference_losses(str(tmp_path / "ref-ckpt"), STEPS)
    assert abs(_mean_last(elastic) - _mean_last(reference)) <= 0.01 * abs(_mean_last(reference)), (
        elastic, reference)
    print(f"node-loss scenario: {wall:.1f}s, recovery {rec['total_s']:.2f}s {rec['phases']}")


# Default tier again since issue 37. In 2 of 3 clean-clone runs on 2026-12-02 the compute-straggler
# scorer named a second, healthy node (or the re-plan kept the slowed one): a 3x slowdown scores about
# 0.33, while the default threshold (0.7) sits where busy-time noise alone puts a healthy node of a
# loaded host (0.67 seen in the netns spec-fault job), and a node measured at a third of the speed is
# one the planner may keep. The job now slows the node 5x (score ~0.2, a speed the planner leaves out)
# and flags only below 0.45, far from both.
@pytest.mark.chaos  # several faults in one run: a slow node, jitter, a returning node, a hung rank
@pytest.mark.timeout(2400)
def test_straggler_jitter_grow_and_hang_in_one_job(ray_cluster, tmp_path) -> None:
    import ray

    from workers.runtime.supervision.launch import start_supervisor, stop_supervisor

    # 4-step windows: a node is flagged when 3 of a window's 4 steps score below 0.45 (3-step windows
    # took 2 of 3, and a run at a load of 40 on 2 cores once flagged a healthy node that way)
    window = 4
    spec = {
        "model": "tiny", "steps": 22, "global_batch": GLOBAL_BATCH, "checkpoint_dir": str(tmp_path / "ckpt"),
        "layout_hint": HINT, "min_gpus": 4, "checkpoint": {"max_every_steps": 3},
        "runtime": {"straggler_window": window, "straggler_threshold": 0.45, "hang_timeout_s": 12,
                    "heartbeat_s": 1.0},
        "faults": [
            {"kind": "jitter_node", "at_step": 0, "rank": 0, "amplitude": 0.03},
            {"kind": "slow_node", "at_step": 5, "rank": -1, "factor": 5.0},
            {"kind": "hang_rank", "at_step": 16, "rank": 1},
        ],
    }
    handle = start_supervisor("t-straggler", 1, spec, enable_fault_injection=True)
    grown: list[str] = []
    try:
        run_ref = handle.run.remote()
        deadline = time.time() + 2000
        while not ray.wait([run_ref], timeout=1.0)[0] and time.time() < deadline:
            # a node joins once the job runs without the straggler (main thread: Ray adds nodes here only)
            evs = ray.get(handle.events.remote(0))
            if not grown and any(e["type"] == "resumed" and e["cause"] == "straggler" for e in evs):
                grown.append(ray_cluster.add_node())
        result = ray.get(run_ref, timeout=60)
    finally:
        events = ray.get(handle.events.remote(0))
        stop_supervisor("t-straggler", 1)
    assert result["state"] == "SUCCEEDED", (result["error"], [(e["type"], e["reason"]) for e in events])
    faults = [e for e in events if e["type"] == "fault_injected"]
    jitter_node = next(e["node"] for e in faults if e["kind"] == "jitter_node")
    slow = next(e for e in faults if e["kind"] == "slow_node")
    stragglers = [e for e in events if e["type"] == "straggler"]
    assert stragglers, [(e["type"], e["reason"]) for e in events]
    story = "\n".join(f'{e["type"]} step={e.get("step")} node={str(e.get("node"))[:8]} score={e.get("score")} '
                      f'steps={e.get("steps")} nodes={[str(n)[:8] for n in e.get("nodes") or []]} '
                      f'cause={e.get("cause")} reason={str(e.get("reason"))[:120]}'
                      for e in events if e["type"] not in ("step", "checkpoint"))
    assert {e["node"] for e in stragglers} == {slow["node"]} != {jitter_node}, (
        f'slowed {slow["node"][:8]} at step {slow["step"]}, jitter {jitter_node[:8]}\n{story}')
    # detected within two scoring windows of the slowdown
    assert stragglers[0]["step"] - slow["step"] <= 2 * window
    replans = [e for e in events if e["type"] == "replan"]
    after = next(e for e in replans if e["seq"] > stragglers[0]["seq"])
    assert after["decision"] != "keep" and slow["node"] not in after["nodes"]
    resumed = [e for e in events if e["type"] == "resumed"]
    assert next(e for e in resumed if e["cause"] == "straggler")["world_size"] == 8
    # grow: the new node joined, the job re-planned onto it at a checkpoint boundary
    assert grown, "the job never resumed without the straggler"
    grow = next(e for e in replans if e["change"].get("added_nodes"))
    assert grown[0] in grow["nodes"] and slow["node"] not in grow["nodes"]
    assert grow["new_tokens_per_s"] > grow["old_tokens_per_s"]
    ckpt_steps = {e["step"] for e in events if e["type"] == "checkpoint"}
    grown_resume = next(e for e in resumed if e["seq"] > grow["seq"] and e["cause"] == "grow")
    assert grown_resume["from_step"] in ckpt_steps and grown_resume["world_size"] == 12
    # hang: caught by the step deadline, recovered, finished
    hang = next(e for e in events if e["type"] == "hang")
    assert any(e["cause"] == "hang" and e["seq"] > hang["seq"] for e in resumed)
    rec = [e for e in events if e["type"] == "recovery"]
    assert {e["cause"] for e in rec} >= {"straggler", "grow", "hang"}
    assert events[-1]["type"] == "finished"
