"""Gang fencing (pure files, no Ray): a newer gang's epoch fences every older rank's steps and saves."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.runtime.recovery import fencing

pytestmark = [pytest.mark.unit]


def test_each_gang_start_advances_the_epoch_and_fences_older_ones(tmp_path: Path) -> None:
    assert fencing.current(tmp_path) == 0
    old = fencing.advance(tmp_path)
    fencing.check(tmp_path, old)  # the newest epoch may write
    new = fencing.advance(tmp_path)
    assert new == old + 1 == fencing.current(tmp_path)
    with pytest.raises(fencing.Fenced, match="epoch 1 is not the current epoch 2"):
        fencing.check(tmp_path, old, "write a checkpoint")
    assert [p.name for p in tmp_path.iterdir()] == [fencing.FENCE_FILE]  # no temp file left


def test_a_fenced_rank_refuses_steps_and_saves_before_touching_its_trainer(tmp_path: Path) -> None:
    from workers.runtime.cluster.rank_worker import RankWorker

    w = RankWorker()
    w._fence = (str(tmp_path), fencing.advance(tmp_path))
    fencing.advance(tmp_path)  # a newer gang started (the node was declared lost meanwhile)
    # the worker has no trainer: reaching it would raise AttributeError, not Fenced
    with pytest.raises(fencing.Fenced, match="refusing to write a checkpoint"):
        w.save()
    with pytest.raises(fencing.Fenced, match="refusing to run a step"):
        w.step()
