"""Drains and resizes without a restart, on the session cluster (3 nodes x 4 GPUs), driven from outside
the way the control plane drives a supervisor (``drain(nodes)``, ``resize(gpus)``).

1. One gang (``tp=2,dp=2`` on 4 GPUs, memory snapshots on): its node is drained. At the next step
   boundary every rank's snapshot of the step just done is pushed, the gang re-plans without the node
   and restores from memory (``resumed``: cause ``drain``, source ``memory``, nothing redone; then
   ``drained``). It is then shrunk to 2 GPUs: again from memory, nothing redone. Every step ran once,
   in order, with the no-failure run's loss (1e-4, across the layout changes); no checkpoint was
   written or read for either move (the only one is the final one).
2. Three replica groups (``tp=1``): a group's node is drained -- that group leaves at a step boundary
   (``replica_dropped`` cause ``drain``), the others keep stepping, a replacement elsewhere heals from
   a live peer (``replica_joined``). Then a shrink to 2 groups drops the newest group (cause
   ``shrink``), and a grow back to 3 adds one that heals from a peer. The two groups that were never
   asked to move are the same processes throughout; no ``resumed``, no step launched twice.

Structure only: no durations are asserted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.controller import helpers as h
from workers.testbed.reference_run import reference_losses

pytestmark = pytest.mark.cluster


class _Watch:
    """A supervisor's events, pulled as they come."""

    def __init__(self, sup: Any) -> None:
        self.sup = sup
        self.seen: list[dict[str, Any]] = []

    def events(self) -> list[dict[str, Any]]:
        import ray

        self.seen.extend(ray.get(self.sup.events.remote(self.seen[-1]["seq"] if self.seen else 0), timeout=60))
        return self.seen

    def first(self, kind: str, after: int = 0, **match: Any) -> dict[str, Any] | None:
        return next((e for e in self.events() if e["type"] == kind and e["seq"] > after
                     and all(e.get(k) == v for k, v in match.items())), None)

    def wait(self, kind: str, what: str, after: int = 0, timeout_s: float = 180, **match: Any) -> dict[str, Any]:
        return h.wait_for(lambda: self.first(kind, after, **match), timeout_s, what)


# finite (the reference run trains the same schedule: the LR decays over ``steps``), and enough for the
# drain and the shrink to happen well before the end (neither steps while it moves)
SINGLE_STEPS = 60


def _single_spec(tmp_path: Path) -> dict[str, Any]:
    return {
        "model": "tiny", "steps": SINGLE_STEPS, "global_batch": 4, "seed": 7, "min_gpus": 2, "max_gpus": 4,
        "layout_hint": "tp=2,dp=2", "checkpoint_dir": str(tmp_path / "ckpt"),
        "checkpoint": {"min_every_steps": 100_000, "max_every_steps": 100_000},
        "runtime": {**h.FAST_RUNTIME, "grow": False, "snapshots": True, "warm_ranks_per_node": 0},
    }


@pytest.mark.timeout(600)
def test_a_drained_gang_moves_from_memory_and_a_shrink_too_with_nothing_redone(ray_cluster, tmp_path: Path) -> None:
    import ray

    from workers.runtime.supervision.launch import start_supervisor, stop_supervisor

    spec = _single_spec(tmp_path)
    sup = start_supervisor("t-drain-1", 1, spec)
    w = _Watch(sup)
    try:
        w.wait("step", "the first steps", step=2)
        node = ray.get(sup.status.remote(), timeout=60)["nodes"][0]
        answer = ray.get(sup.drain.remote({node: 60.0}), timeout=60)
        assert answer["new"] == [node]
        assert ray.get(sup.drain.remote({node: 60.0}), timeout=60)["new"] == []  # a repeat arms nothing
        moved = w.wait("resumed", "resumed after the drain", cause="drain")
        drained = w.wait("drained", "drained")
        status = ray.get(sup.status.remote(), timeout=60)
        assert node not in status["nodes"] and status["draining"] == [node]
        last = max(e["step"] for e in w.events() if e["type"] == "step" and e["seq"] < moved["seq"])
        assert (moved["source"], moved["steps_redone"], moved["from_step"]) == ("memory", 0, last)
        assert drained["nodes"] == [node] and drained["how"] == "replan" and drained["source"] == "memory"
        assert drained["step"] == last and drained["deadline_s"] == 60.0
        placed = [e for e in w.events() if e["type"] == "placed" and e["seq"] < moved["seq"]]
        assert len(placed) == 2 and node not in placed[-1]["bundle_nodes"]

        # a shrink (the scheduler's) of a one-gang job: a re-plan from its memory snapshot too
        w.wait("step", "a step after the drain", after=moved["seq"])
        assert ray.get(sup.resize.remote(2), timeout=60)["armed"]
        shrunk = w.wait("resumed", "resumed after the shrink", cause="resize")
        before = max(e["step"] for e in w.events() if e["type"] == "step" and e["seq"] < shrunk["seq"])
        assert (shrunk["source"], shrunk["steps_redone"], shrunk["from_step"], shrunk["world_size"]) == (
            "memory", 0, before, 2)
        w.wait("step", "a step on 2 GPUs", after=shrunk["seq"], world_size=2)
        summary = ray.get(sup.run.remote(), timeout=300)
        events = w.events()
    finally:
        stop_supervisor("t-drain-1", 1)
    assert summary["state"] == "SUCCEEDED", summary
    steps = [e["step"] for e in events if e["type"] == "step"]
    assert steps == list(range(1, SINGLE_STEPS + 1))  # each step once, in order: nothing redone
    assert [e["cause"] for e in events if e["type"] == "resumed"] == ["drain", "resize"]
    # neither move wrote (nor read) storage: the only checkpoint is the final one
    assert [e["step"] for e in events if e["type"] == "checkpoint"] == [SINGLE_STEPS]
    ref = reference_losses({**{k: v for k, v in spec.items() if k != "runtime"}, "checkpoint_dir": str(tmp_path / "r")})
    moves = [(e["cause"], e["from_step"], e["short"]) for e in events if e["type"] == "resumed"]

    def bound(step: int) -> float:
        """1e-4 through the first step after the last move (each restore exact: parameters, optimizer,
        data position); later, 1e-3: tens of steps on another layout than the one-process reference
        add float reassociation (a run of this spec measured 2e-4 at steps 55-58, 2026-12-07)."""
        return 1e-4 if step <= shrunk["from_step"] + 1 else 1e-3

    off = [(e["step"], e["world_size"], e["loss"], ref[e["step"] - 1]) for e in events if e["type"] == "step"
           and abs(e["loss"] - ref[e["step"] - 1]) > bound(e["step"]) * abs(ref[e["step"] - 1])]
    assert not off, (moves, off[:8])  # every step's loss as in the run without moves


def _replica_spec(tmp_path: Path) -> dict[str, Any]:
    return {
        "model": "tiny", "steps": 100_000, "global_batch": 12, "seed": 5,
        "layout_hint": {"tp": 1, "micro_batch": 2}, "checkpoint_dir": str(tmp_path / "ckpt"),
        "checkpoint": {"min_every_steps": 100_000, "max_every_steps": 100_000},
        "runtime": {**h.FAST_RUNTIME, "grow": False, "replica_groups": 3, "warm_ranks_per_node": 1},
    }


@pytest.mark.timeout(600)
def test_replica_groups_drain_shrink_and_grow_while_the_others_keep_stepping(ray_cluster, tmp_path: Path) -> None:
    import ray

    from workers.runtime.supervision.launch import start_supervisor, stop_supervisor

    sup = start_supervisor("t-drain-rg", 1, _replica_spec(tmp_path))
    w = _Watch(sup)
    try:
        w.wait("step", "the first steps", step=3)
        placed = [e for e in w.events() if e["type"] == "placed"]
        node_of = {int(e["placement_group"].rsplit("-rg", 1)[1]): e["bundle_nodes"][0] for e in placed}
        assert sorted(node_of) == [0, 1, 2]
        drained_node = node_of[1]
        ray.get(sup.drain.remote({drained_node: 60.0}), timeout=60)
        dropped = w.wait("replica_dropped", "group 1 dropped for the drain", group=1)
        assert dropped["cause"] == "drain" and dropped["groups_left"] == 2
        drained = w.wait("drained", "drained")
        assert drained["how"] == "replica_groups" and drained["groups"] == [1] and drained["nodes"] == [drained_node]
        joined = w.wait("replica_joined", "a replacement joined", after=dropped["seq"])
        assert joined["source"] == "peer" and joined["from_group"] in (0, 2) and drained_node not in joined["nodes"]
        # steps went on between the drop and the join: the survivors never stopped
        assert w.first("step", after=dropped["seq"]) is not None

        after_join = w.wait("step", "a step with the replacement", after=joined["seq"], world_size=3)
        assert ray.get(sup.resize.remote(2), timeout=60)
        shrunk = w.wait("replica_dropped", "a group dropped for the shrink", after=after_join["seq"], cause="shrink")
        assert shrunk["group"] == joined["group"] and shrunk["groups_left"] == 2  # the newest group leaves
        w.wait("step", "a step on 2 groups", after=shrunk["seq"], world_size=2)
        assert ray.get(sup.resize.remote(3), timeout=60)
        grown = w.wait("replica_joined", "a group joined for the grow", after=shrunk["seq"])
        assert grown["source"] == "peer" and drained_node not in grown["nodes"]
        w.wait("step", "a step on 3 groups again", after=grown["seq"], world_size=3)
        assert ray.get(sup.cancel.remote(), timeout=60)
        summary = ray.get(sup.run.remote(), timeout=300)
        events = w.events()
    finally:
        stop_supervisor("t-drain-rg", 1)
    assert summary["state"] == "CANCELLED", summary
    assert not [e for e in events if e["type"] in ("resumed", "node_lost", "rank_failed", "hang")]
    steps = [e["step"] for e in events if e["type"] == "step"]
    assert steps == list(range(1, len(steps) + 1))  # each step once, in order
    assert set(summary["step_attempts"].values()) <= {1}  # no step launched twice: nothing redone
    reps = summary["replicas"]
    assert [(d["group"], d["cause"]) for d in reps["dropped"]] == [(1, "drain"), (joined["group"], "shrink")]
    assert sorted(reps["live"]) == [0, 2, grown["group"]]
    # the groups never asked to move were never started again: 3 gangs at the start, then only the
    # drained group's replacement and the grow's group; both stepped from step 0 on, every step
    assert len([e for e in events if e["type"] == "started"]) == 5
    for g in (0, 2):
        committed = reps["groups"][str(g)]["committed"]
        assert committed == list(range(0, len(steps)))[:len(committed)] and len(committed) >= len(steps) - 1
