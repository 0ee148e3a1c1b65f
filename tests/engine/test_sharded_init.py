"""A rank's model parts are built on the meta device and only its shards are materialised: no rank
ever holds the whole model (the equivalence tests show the values are the whole model's, bit for
bit). Measured here on a 0.45 B-parameter model (1.8 GB in float32) with the peak resident memory of
each rank while it builds its parts."""

from __future__ import annotations

from typing import Any

import pytest

from workers.engine.launch import run_ranks

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

SHAPE = dict(name="mem", layers=8, hidden=2048, heads=16, kv_heads=16, ffn=5632, vocab=8192, seq_len=128)


def build_and_measure(rank: int, world: int, layout_text: str) -> dict[str, Any]:
    import resource

    import torch

    from planner.layout import Layout
    from workers.engine.config import ModelConfig
    from workers.engine.groups import ParallelGroups
    from workers.engine.parallel.data import local
    from workers.engine.parallelize import build_parts

    cfg = ModelConfig.from_dict(SHAPE)
    layout = Layout.parse(layout_text)
    groups = ParallelGroups(layout, rank, world)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    parts = build_parts(cfg, 0, layout, groups, torch.device("cpu"))
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    held = sum(local(p).numel() * local(p).element_size() for p in parts.parameters())
    finite = all(bool(torch.isfinite(local(p)).all()) for p in parts.parameters())
    groups.close()
    return {"peak_growth": after - before, "held": held, "finite": finite,
            "full": cfg.num_params() * 4}


@pytest.mark.parametrize("layout", ["tp=2", "dp=2,zero=3", "pp=2"])
def test_no_rank_materialises_the_whole_model(layout: str) -> None:
    for r in run_ranks(build_and_measure, 2, layout, timeout_s=500):
        full = r["full"]
        assert r["finite"]
        assert 0.4 * full < r["held"] < 0.6 * full, r  # half the model each (norms, replicated, are tiny)
        # measured 0.58-0.68 x: the half held plus one full tensor at a time (the largest is 2.6 % of
        # the model) and what the allocator keeps; building the whole model first grows a process by
        # 1.16 x before a single shard is cut
        assert r["peak_growth"] < 0.85 * full, {k: v / 2**20 for k, v in r.items() if k != "finite"}
