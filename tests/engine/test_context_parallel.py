"""Ring attention and Ulysses against plain causal attention in float64, zigzag load balance,
and the Ulysses refusal."""

from datetime import timedelta

import pytest
import torch

from planner.layout import Layout
from workers.engine.config import ModelConfig
from workers.engine.launch import run_ranks
from workers.engine.parallel.context import zigzag_positions
from workers.engine.validate import layout_problems

# spawned multi-rank runs: generous on a shared/loaded box (the suite budget is for an idle one)
pytestmark = pytest.mark.timeout(1800)


def _ranks_body(rank: int, world: int) -> dict:
    import torch.distributed as dist

    from workers.engine.parallel.context import (
        RingContext,
        UlyssesContext,
        reference_attention,
        ring_attention,
        ulysses_attention,
        zigzag_split,
    )

    out: dict = {}
    for cp in (2, 4):
        groups = [list(range(i, i + cp)) for i in range(0, world, cp)]
        pgs = [dist.new_group(g, timeout=timedelta(seconds=60)) for g in groups]
        gi = rank // cp
        group, members = pgs[gi], groups[gi]
        cp_rank = members.index(rank)
        g = torch.Generator().manual_seed(5)
        b, h, kv, s, d = 2, 8, 4, 32, 16
        q = torch.randn(b, h, s, d, generator=g, dtype=torch.float64, requires_grad=True)
        k = torch.randn(b, kv, s, d, generator=g, dtype=torch.float64, requires_grad=True)
        v = torch.randn(b, kv, s, d, generator=g, dtype=torch.float64, requires_grad=True)
        dout = torch.randn(b, h, s, d, generator=g, dtype=torch.float64)
        ref = reference_attention(q, k, v)
        ref.backward(dout)
        refs = [t.detach() for t in (ref, q.grad, k.grad, v.grad)]

        def local(t: torch.Tensor, cp_rank: int = cp_rank, cp: int = cp) -> torch.Tensor:
            return zigzag_split(t.detach(), cp_rank, cp, dim=2).clone().requires_grad_(True)

        for method in ("ring", "ulysses", "ring-contiguous"):
            ql, kl, vl = local(q), local(k), local(v)
            if method == "ulysses":
                o = ulysses_attention(ql, kl, vl, UlyssesContext(group, cp_rank, cp, s // cp))
            else:
                rc = RingContext(group, cp_rank, cp, members[(cp_rank + 1) % cp], members[(cp_rank - 1) % cp],
                                 zigzag=method == "ring")
                if method == "ring-contiguous":  # the contiguous split: only the work counters matter
                    ql, kl, vl = (t.detach()[:, :, cp_rank * s // cp:(cp_rank + 1) * s // cp].clone()
                                  for t in (q, k, v))
                o = ring_attention(ql, kl, vl, rc)
                out[(cp, method, "blocks")] = rc.stats.blocks
                out[(cp, method, "flops")] = rc.stats.flops
            if method == "ring-contiguous":
                continue
            o.backward(zigzag_split(dout, cp_rank, cp, dim=2))
            errs = []
            for got, want in zip((o, ql.grad, kl.grad, vl.grad), refs, strict=True):
                errs.append(float((got.detach() - zigzag_split(want, cp_rank, cp, dim=2)).abs().max()))
            out[(cp, method, "err")] = max(errs)
        dist.barrier()
        for pg in pgs:
            dist.destroy_process_group(pg)
    return out


@pytest.mark.engine
def test_ring_and_ulysses_are_exact_in_float64_and_zigzag_balances_work() -> None:
    results = run_ranks(_ranks_body, 4)
    for cp in (2, 4):
        for method in ("ring", "ulysses"):
            worst = max(r[(cp, method, "err")] for r in results)
            assert worst < 1e-12, (cp, method, worst)
        # zigzag: every rank computes the same number of chunk blocks (2*cp + 1) — equal within 1 block
        blocks = [r[(cp, "ring", "blocks")] for r in results]
        assert max(blocks) - min(blocks) <= 1 and blocks[0] == 2 * cp + 1, blocks
        flops = [r[(cp, "ring", "flops")] for r in results]
        assert max(flops) == min(flops)
        # the contiguous split is unbalanced: the last rank does far more causal work than the first
        contiguous = [r[(cp, "ring-contiguous", "blocks")] for r in results[:cp]]
        assert contiguous[-1] - contiguous[0] >= 4 * (cp - 1), contiguous


@pytest.mark.engine
def test_zigzag_positions_cover_the_sequence_once() -> None:
    for cp in (1, 2, 4):
        allpos = torch.cat([zigzag_positions(64, r, cp) for r in range(cp)])
        assert sorted(allpos.tolist()) == list(range(64))
    assert zigzag_positions(16, 0, 2).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]


@pytest.mark.engine
def test_ulysses_is_refused_with_a_reason_when_heads_do_not_divide() -> None:
    cfg = ModelConfig(name="odd", layers=2, hidden=48, heads=6, kv_heads=2, ffn=96, vocab=256, seq_len=64)
    problems = layout_problems(cfg, Layout.parse("cp=4,cp_method=ulysses"), global_batch=4)
    assert any("ulysses" in p and "heads of each TP rank (6)" in p and "cp=4" in p for p in problems), problems
    # ring attention takes the same layout
    assert layout_problems(cfg, Layout.parse("cp=4,cp_method=ring"), global_batch=4) == []
    # with TP the per-rank head count is what must divide
    problems = layout_problems(cfg, Layout.parse("tp=2,cp=2,cp_method=ulysses"), global_batch=4)
    assert any("(3)" in p for p in problems), problems
