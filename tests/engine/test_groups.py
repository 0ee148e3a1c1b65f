"""Process groups: built from the Layout's rank grid, a timeout on every sub-group (a silent peer
becomes an error, not a hang), and teardown + rebuild with another layout in the same process."""

import time

import pytest

from planner.layout import Layout
from workers.engine.launch import run_ranks

# spawned multi-rank runs: generous on a shared/loaded box (the suite budget is for an idle one)
pytestmark = pytest.mark.timeout(1800)


def _body(rank: int, world: int) -> dict:
    import torch
    import torch.distributed as dist

    from workers.engine.groups import ParallelGroups

    out: dict = {}
    for spec in ("cp=2", "tp=2", "dp=2", "pp=2", "dp=2,dp_replicate=2,zero=1"):
        g = ParallelGroups(Layout.parse(spec), rank, world, timeout_s=30)
        dims = ("tp", "cp", "dp", "pp", "dp_cp", "dp_shard_cp") + (("dp_replicate",) if g.replicated else ())
        out[spec] = {d: dist.get_process_group_ranks(getattr(g, d)) for d in dims}
        g.close()
    # a peer that never joins the collective: the sub-group times out after ~2 s instead of hanging
    g = ParallelGroups(Layout.parse("cp=2"), rank, world, timeout_s=2)
    if rank == 0:
        t0 = time.monotonic()
        try:
            dist.all_reduce(torch.ones(4), group=g.cp)
            out["timeout"] = None
        except RuntimeError as e:
            out["timeout"] = (time.monotonic() - t0, str(e)[:200])
    else:
        time.sleep(6)
    g.close()
    return out


@pytest.mark.engine
def test_groups_follow_the_layout_time_out_and_rebuild() -> None:
    results = run_ranks(_body, 2)
    for rank, r in enumerate(results):
        assert r["cp=2"]["cp"] == [0, 1] and r["cp=2"]["tp"] == [rank] and r["cp=2"]["dp_cp"] == [0, 1]
        assert r["tp=2"]["tp"] == [0, 1] and r["tp=2"]["dp_cp"] == [rank]
        assert r["dp=2"]["dp"] == [0, 1] and r["pp=2"]["pp"] == [0, 1]
        assert r["dp=2"]["dp_shard_cp"] == [0, 1]  # without replica groups ZeRO shards over all of dp_cp
        # two replica groups of one rank each: ZeRO inside a replica, the all-reduce across the two
        hsdp = r["dp=2,dp_replicate=2,zero=1"]
        assert hsdp["dp_shard_cp"] == [rank] and hsdp["dp_replicate"] == [0, 1]
        assert hsdp["dp"] == [0, 1] and hsdp["dp_cp"] == [0, 1]
    elapsed, message = results[0]["timeout"]
    assert 1.5 < elapsed < 6, (elapsed, message)
