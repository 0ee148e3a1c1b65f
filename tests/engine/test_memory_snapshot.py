"""In-memory snapshots (``workers.engine.checkpoint.snapshot``): taken after every step with an async
DCP save to tmpfs, read back as bytes; loading them into another layout and world size continues the
uninterrupted curve to 1e-4, as a storage checkpoint does (the same DCP resharding path)."""

from pathlib import Path

import pytest
from engine_harness import fast_layout, random_batches, tiny_cfg

from workers.engine.launch import run_ranks

pytestmark = pytest.mark.timeout(900)


def _train_with_snapshots(rank: int, world: int, spec: str, root: str) -> dict:
    from workers.engine.checkpoint.snapshot import Snapshotter
    from workers.engine.trainer import RankTrainer

    cfg = tiny_cfg(steps=5)
    batches = random_batches(cfg, 5, seed=7)
    t = RankTrainer(cfg, fast_layout(spec), rank, world)
    kept: dict[int, dict[str, bytes]] = {}
    snap = Snapshotter(t, lambda step, files: kept.setdefault(step, {}).update(
        {n: b"".join(parts) for n, parts in files.items()}), tag=f"t{world}")
    losses = []
    for b in batches:
        losses.append(t.train_batch(b).loss)
        snap.start()  # overlapped with the next step
    snap.close()
    t.close()
    leftovers = sorted(str(p) for p in Path(snap._shared).glob("**/*") if p.is_file()) if snap._shared.exists() else []
    return {"losses": losses, "files": kept, "leftovers": leftovers, "stats": snap.stats}


def _resume(rank: int, world: int, spec: str, files: dict) -> list[float]:
    from workers.engine.checkpoint.snapshot import load_snapshot
    from workers.engine.trainer import RankTrainer

    cfg = tiny_cfg(steps=5)
    batches = random_batches(cfg, 5, seed=7)
    t = RankTrainer(cfg, fast_layout(spec), rank, world)
    start = load_snapshot(t, files)
    assert start == 3, start
    out = [t.train_batch(b).loss for b in batches[start:]]
    t.close()
    return out


@pytest.mark.engine
def test_snapshot_of_tp_pp_reloads_into_another_layout_and_continues_the_curve(tmp_path: Path) -> None:
    runs = run_ranks(_train_with_snapshots, 2, "pp=2", str(tmp_path), timeout_s=600)
    full = runs[0]["losses"]
    assert runs[0]["losses"] == runs[1]["losses"]
    assert all(r["leftovers"] == [] for r in runs), [r["leftovers"] for r in runs]
    assert all(r["stats"]["snapshots"] == 5 for r in runs)
    # every step's snapshot: rank 0's shard + .metadata, rank 1's shard
    step3 = {**runs[0]["files"][3], **runs[1]["files"][3]}
    assert ".metadata" in step3 and sum(n.endswith(".distcp") for n in step3) == 2
    # another layout and world size: one rank, no PP
    got = run_ranks(_resume, 1, "dp=1", step3, timeout_s=600)[0]
    assert len(got) == 2
    for a, b in zip(got, full[3:], strict=True):
        assert abs(a - b) <= 1e-4 * abs(b), (got, full)
    # a snapshot missing a shard is refused by DCP, not silently half-loaded
    broken = {k: v for k, v in step3.items() if not k.startswith("__1_")}
    with pytest.raises(Exception):  # noqa: B017 - run_ranks re-raises the rank's error
        run_ranks(_resume, 1, "dp=1", broken, timeout_s=600)
