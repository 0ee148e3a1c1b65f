"""``runtime.snapshot_every`` (``RuntimeSettings.snapshots.every``): a rank snapshots after every n-th step only, and says so per step.

A real :class:`RankWorker` in a gloo group of one (no Ray): its pusher is replaced by one that keeps
what it is handed, so the test sees which steps' snapshots leave the rank and what they hold."""

from __future__ import annotations

from typing import Any

import pytest

from workers.runtime.contract.job_spec import RuntimeSettings

pytestmark = pytest.mark.engine


def _run(tmp_path: Any, every: int, steps: int) -> tuple[list[dict[str, Any]], list[tuple[int, list[str]]]]:
    from planner.layout import Layout
    from workers.engine.config import ModelConfig, TrainConfig
    from workers.runtime.cluster.rank_worker import RankWorker
    from workers.runtime.cluster.rendezvous import Rendezvous, free_port

    pushed: list[tuple[int, list[str]]] = []

    class Keeping(RankWorker):
        def _pusher(self, epoch: int, world: int, holders: list[Any]) -> Any:
            return lambda step, files: pushed.append((step, sorted(files)))

    w = Keeping()
    cfg = TrainConfig(model=ModelConfig.preset("tiny"), steps=steps, global_batch=4, seed=3, grad_clip=1.0).to_dict()
    rdzv = Rendezvous("127.0.0.1", free_port(), "gloo", 30.0).to_dict()
    w.setup(rdzv, cfg, Layout(micro_batch=2).with_global_batch(4).to_dict(), 0, 1, 30.0,
            snapshot_to=[], snapshot_every=every)
    try:
        out = [w.step() for _ in range(steps)]
    finally:
        w.close()  # waits for the last push
    return out, pushed


def test_a_snapshot_after_every_third_step_only(tmp_path) -> None:
    out, pushed = _run(tmp_path, every=3, steps=7)
    assert [o["step"] for o in out] == list(range(1, 8))
    # the steps that took one report their wait for it; the others none
    assert [o["step"] for o in out if o["snapshot_s"] is not None] == [3, 6]
    assert all(o["snapshot_s"] >= 0.0 for o in out if o["snapshot_s"] is not None)
    # the step that takes a snapshot says how long the one before it took to push (none before step 3's)
    assert [o["snapshot_push_s"] is not None for o in out if o["snapshot_s"] is not None] == [False, True]
    assert out[5]["snapshot_push_s"] > 0.0
    # what left the rank: the snapshots of steps 3 and 6, each this rank's file plus the metadata
    assert pushed == [(3, [".metadata", "__0_0.distcp"]), (6, [".metadata", "__0_0.distcp"])]


def test_every_step_is_the_default() -> None:
    assert RuntimeSettings().snapshots.every == 1
    assert RuntimeSettings.from_dict({"snapshot_every": 4}).snapshots.every == 4


@pytest.mark.parametrize("bad", [0, -2, 1.5, "3", True])
def test_a_snapshot_cadence_that_is_not_a_positive_whole_number_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"runtime\.snapshot_every"):
        RuntimeSettings.from_dict({"snapshot_every": bad})
