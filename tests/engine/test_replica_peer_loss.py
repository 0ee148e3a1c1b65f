"""A replica rank told by the supervisor that a peer group's node is down (issue #14): the waits of a
step attempt that end on it (``ReplicaStepper._reduce``, ``ReplicaStepper._redo_hint``). Unit: a
stand-in for torchft's manager and managed work, real threads and futures."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any

import pytest
import torch

from workers.engine.replica_ft import ReplicaStepper

pytestmark = pytest.mark.unit


class _Manager:
    def __init__(self) -> None:
        self.errors: list[Exception] = []

    def report_error(self, exc: Exception) -> None:
        self.errors.append(exc)


class _Inner:
    """A process group's work: a torch future completed by the test."""

    def __init__(self) -> None:
        self.fut: torch.futures.Future = torch.futures.Future()

    def get_future(self) -> torch.futures.Future:
        return self.fut

    def is_completed(self) -> bool:
        return self.fut.done()


class _Work:
    """torchft's managed work: ``_work`` and a blocking ``wait``."""

    def __init__(self) -> None:
        self._work = _Inner()
        self.waited = False

    def wait(self) -> bool:
        self._work.fut.wait()
        self.waited = True
        return True


def _stepper(kept_groups: list[int] | None = None) -> ReplicaStepper:
    s = ReplicaStepper.__new__(ReplicaStepper)  # only the state these waits use
    s.manager = _Manager()
    s._dead_groups, s._wake = set(), None
    s._kept = None if kept_groups is None else {"groups": kept_groups}
    return s


def _in_thread(fn: Any, *args: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}
    th = threading.Thread(target=lambda: out.update(value=fn(*args), at=time.monotonic()), daemon=True)
    th.start()
    return th, out


def test_a_reduction_with_a_group_named_dead_stops_waiting_and_is_voted_down() -> None:
    s, work = _stepper(), _Work()
    th, _ = _in_thread(s._reduce, work, [0, 1, 2])
    time.sleep(0.2)
    assert th.is_alive()  # waiting for the reduction
    s.peers_lost([2])
    th.join(timeout=5)
    assert not th.is_alive() and not work.waited  # the gloo work is left to fail on its own
    assert len(s.manager.errors) == 1 and "[2]" in str(s.manager.errors[0])
    work._work.fut.set_result(None)  # it completes later: nothing else happens


def test_a_group_outside_the_quorum_named_dead_leaves_the_reduction_alone() -> None:
    s, work = _stepper(), _Work()
    th, _ = _in_thread(s._reduce, work, [0, 1])
    s.peers_lost([2])  # e.g. the group a redo left out
    time.sleep(0.2)
    assert th.is_alive()
    work._work.fut.set_result(None)
    th.join(timeout=5)
    assert not th.is_alive() and work.waited and not s.manager.errors


def test_a_group_named_dead_before_the_reduction_starts_does_not_wait_at_all() -> None:
    s, work = _stepper(), _Work()
    s.peers_lost([1])
    s._reduce(work, [0, 1, 2])
    assert not work.waited and len(s.manager.errors) == 1
    # ... and a reduction that already finished is taken as it is
    s2, done = _stepper(), _Work()
    done._work.fut.set_result(None)
    s2.peers_lost([1])
    s2._reduce(done, [0, 1])
    assert done.waited and not s2.manager.errors


def test_the_rank_s_own_redo_takes_the_step_set_when_the_dead_group_is_named_before_the_quorum() -> None:
    s, asked = _stepper(kept_groups=[0, 1, 2]), Future()
    th, out = _in_thread(s._redo_hint, asked)
    time.sleep(0.2)
    assert th.is_alive()  # neither the quorum nor the supervisor yet
    s.peers_lost([2])
    th.join(timeout=5)
    assert out["value"] == ([0, 1], [0, 1, 2])


def test_the_rank_s_own_redo_follows_torchft_when_the_quorum_comes_first() -> None:
    s, asked = _stepper(kept_groups=[0, 1, 2]), Future()
    th, out = _in_thread(s._redo_hint, asked)
    s.peers_lost([7])  # a group of no concern wakes it up, nothing more
    time.sleep(0.2)
    assert th.is_alive()
    asked.set_result(time.time())
    th.join(timeout=5)
    assert out["value"] == (None, None)
    assert _stepper(kept_groups=None)._redo_hint(asked) == (None, None)  # nothing kept: nothing to guess


@pytest.mark.engine
def test_the_warm_up_pass_leaves_parameters_optimizer_and_rng_as_they_were(tmp_path) -> None:
    """``replica_passes.warm_up`` (a replica rank's thrown-away first pass and optimizer step at lr 0,
    before its torchft manager): a real ``RankTrainer`` in a gloo group of one; nothing a step depends
    on may change, and the next real step equals a fresh trainer's first step."""
    import torch.distributed as dist
    from engine_harness import tiny_cfg

    from planner.layout import Layout
    from workers.engine.replica_passes import warm_up
    from workers.engine.trainer import RankTrainer

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        cfg = tiny_cfg(steps=2, global_batch=4)
        trainer = RankTrainer(cfg, Layout(micro_batch=2).with_global_batch(4), 0, 1)
        params = [p.detach().clone() for p in trainer.params]
        lrs = [g["lr"] for g in trainer.optimizer.param_groups]
        rng = torch.get_rng_state()
        assert warm_up(trainer, trainer._data(), 4) > 0
        assert all(p.grad is None for p in trainer.params)
        assert not trainer.optimizer.state  # the lr-0 step's state dropped: AdamW starts afresh
        assert [g["lr"] for g in trainer.optimizer.param_groups] == lrs
        assert torch.equal(torch.get_rng_state(), rng)
        for a, b in zip(trainer.params, params, strict=True):
            assert torch.equal(a.detach(), b)
        trainer.step()
        warmed = [p.detach().clone() for p in trainer.params]
        trainer.close()
        fresh = RankTrainer(cfg, Layout(micro_batch=2).with_global_batch(4), 0, 1)
        torch.set_rng_state(rng)
        fresh.step()
        for a, b in zip(fresh.params, warmed, strict=True):
            assert torch.equal(a.detach(), b)
        fresh.close()
    finally:
        dist.destroy_process_group()
