"""The snapshot format's needed-files fetch (``workers.engine.checkpoint.snapshot``), one process.

Two "ranks" save disjoint parts of one state dict (as two ranks of a gang hold different shards;
plans built by DCP's own planner, deduplicated as a gang's are); a load asks the fetch callback for
the rank files its reads overlap and nothing else, and gets the saved values back, from raw bytes.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.planner import SavePlan

from workers.engine.checkpoint.snapshot import (
    FORMAT,
    METADATA,
    MemoryReader,
    load_snapshot,
    pack,
    plan_layout,
    shard_name,
    stage,
)


def _snapshot(sd: dict[str, Any], owner: Mapping[str, int], world: int = 2) -> tuple[Any, dict[str, bytes]]:
    """Snapshot files of ``sd`` where FQN prefix ``k`` is saved by rank ``owner[k]``."""
    planner = DefaultSavePlanner()
    planner.set_up_planner(sd, None, True)
    local = planner.create_local_plan()
    plans = [SavePlan([i for i in local.items if owner[i.index.fqn.split(".")[0]] == r],
                      planner_data=local.planner_data) for r in range(world)]
    global_plans, metadata = planner.create_global_plan(plans)
    files: dict[str, bytes] = {}
    for r in range(world):
        layout = plan_layout(global_plans, metadata, r)
        buf = torch.empty(layout.total, dtype=torch.uint8)
        files[shard_name(r)] = pack(stage(layout, planner, buf), buf)
        if r == 0:
            files[METADATA] = layout.metadata
    head = pickle.loads(files[METADATA])
    assert head["format"] == FORMAT and head["world"] == world
    return head["metadata"], files


class _Recorder:
    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    def __call__(self, handles: Mapping[str, Any]) -> dict[str, bytes]:
        self.asked.append(sorted(handles))
        return {n: bytes(h) for n, h in handles.items()}


def _state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(3)
    return {"a": {"w": torch.randn(4, 6, generator=g), "n": torch.tensor(7)},
            "b": {"w": torch.randn(5, generator=g, dtype=torch.float64), "cfg": {"lr": 0.5, "name": "x"}}}


@pytest.mark.parametrize(("want", "files"), [("a", ["__0_0.distcp"]), ("b", ["__1_0.distcp"]),
                                             ("ab", ["__0_0.distcp", "__1_0.distcp"])])
def test_a_load_fetches_only_the_rank_files_its_reads_overlap(want: str, files: list[str]) -> None:
    saved = _state()
    metadata, snap = _snapshot(saved, {"a": 0, "b": 1})
    target = {k: {"w": torch.zeros_like(v["w"])} for k, v in saved.items() if k in want}
    if "a" in want:
        target["a"]["n"] = torch.tensor(0)
    if "b" in want:
        target["b"]["cfg"] = {"lr": 0.0, "name": ""}
    fetch = _Recorder()
    reader = MemoryReader(metadata, snap, fetch)
    dcp.load(target, storage_reader=reader, no_dist=True)
    assert fetch.asked == [files] and reader.fetched == files
    for k in want:
        assert torch.equal(target[k]["w"], saved[k]["w"])
    if "a" in want:
        assert int(target["a"]["n"]) == 7
    if "b" in want:
        assert target["b"]["cfg"] == {"lr": 0.5, "name": "x"}


def test_a_missing_needed_file_is_an_error_an_unneeded_one_is_not() -> None:
    saved = _state()
    metadata, snap = _snapshot(saved, {"a": 0, "b": 1})
    only_a = {n: b for n, b in snap.items() if n != shard_name(1)}
    target = {"a": {"w": torch.zeros(4, 6), "n": torch.tensor(0)}}
    dcp.load(target, storage_reader=MemoryReader(metadata, only_a, _Recorder()), no_dist=True)
    assert torch.equal(target["a"]["w"], saved["a"]["w"])
    target = {"b": {"w": torch.zeros(5, dtype=torch.float64), "cfg": {"lr": 0.0}}}
    with pytest.raises(CheckpointException) as err:  # DCP wraps the reader's error (a BaseException)
        dcp.load(target, storage_reader=MemoryReader(metadata, only_a, _Recorder()), no_dist=True)
    assert "snapshot lacks ['__1_0.distcp']" in str(err.value)


def test_a_snapshot_without_this_format_is_refused() -> None:
    with pytest.raises(ValueError, match="format"):
        load_snapshot(object(), {METADATA: pickle.dumps({"format": "dcp"})}, fetch=_Recorder())
