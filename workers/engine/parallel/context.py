"""Context parallelism: zigzag sequence split, ring attention and Ulysses (all-to-all) attention.

Written by hand because torch's ``context_parallel`` only shards the CUDA SDPA kernels (flash,
efficient, cudnn) and fails on CPU (docs/feasibility.md §2e).

**Zigzag split.** The sequence is cut into ``2*cp`` chunks; CP rank ``i`` holds chunks ``i`` and
``2*cp-1-i``. Under the causal mask, chunk ``a`` attends chunks ``<= a``, so rank ``i`` computes
``(i+1) + (2*cp-i) = 2*cp+1`` chunk blocks whatever ``i`` is: the causal work is balanced.

**Ring attention.** Each rank keeps its queries and passes its K/V chunk pair around the CP ring
(``batch_isend_irecv`` to the next rank, from the previous one) for ``cp`` steps. Every received
block is attended by the local query chunks it is visible to, and partial results are merged
with the online softmax: ``lse = logaddexp(lse_a, lse_b)``,
``o = o_a * exp(lse_a - lse) + o_b * exp(lse_b - lse)``. The backward is hand written (not
autograd through the ring): it keeps only ``q, k, v, o, lse`` from the forward, sends K/V around
the ring again (the next block in flight while the current one is worked on, as in the forward),
each followed by its gradient accumulators, recomputes each block's probabilities
from the saved ``lse`` and, after one last hop, every dK/dV accumulator is back on its owner. The
memory is bounded by one chunk-pair block of scores, as in FlashAttention.

**Ulysses.** All-to-all turns ``[B, H, S/cp, D]`` (all heads, local sequence) into
``[B, H/cp, S, D]`` (some heads, whole sequence), runs local causal attention, and all-to-alls
back. It needs the heads of a TP rank to divide by ``cp``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F

from workers.engine.model import sdpa_causal


# --------------------------------------------------------------------------- zigzag split
def zigzag_chunks(cp_rank: int, cp: int) -> tuple[int, int]:
    """The two chunk indices (of ``2*cp``) that CP rank ``cp_rank`` holds."""
    return cp_rank, 2 * cp - 1 - cp_rank


def zigzag_positions(seq_len: int, cp_rank: int, cp: int) -> torch.Tensor:
    """Global positions of the tokens CP rank ``cp_rank`` holds, in local order."""
    if seq_len % (2 * cp):
        raise ValueError(f"sequence {seq_len} is not divisible by 2*cp = {2 * cp}")
    c = seq_len // (2 * cp)
    a, b = zigzag_chunks(cp_rank, cp)
    return torch.cat([torch.arange(a * c, (a + 1) * c), torch.arange(b * c, (b + 1) * c)])


def zigzag_split(x: torch.Tensor, cp_rank: int, cp: int, dim: int = 1) -> torch.Tensor:
    """This CP rank's zigzag share of ``x`` along ``dim``."""
    if cp == 1:
        return x
    idx = zigzag_positions(x.shape[dim], cp_rank, cp).to(x.device)
    return x.index_select(dim, idx)


# --------------------------------------------------------------------------- block math
def _scores(q: torch.Tensor, k: torch.Tensor, scale: float, diag: bool) -> torch.Tensor:
    """Scores ``[B, KV, rep, Sq, Sk]`` of GQA queries ``[B, KV, rep, Sq, D]`` against ``k [B, KV, Sk, D]``."""
    s = torch.matmul(q, k.unsqueeze(2).transpose(-1, -2)) * scale
    if diag:
        n = s.shape[-1]
        mask = torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(mask, float("-inf"))
    return s


def _block_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, diag: bool
               ) -> tuple[torch.Tensor, torch.Tensor]:
    s = _scores(q, k, scale, diag)
    lse = torch.logsumexp(s, dim=-1)
    o = torch.matmul(torch.exp(s - lse.unsqueeze(-1)), v.unsqueeze(2))
    return o, lse


def _merge(o: torch.Tensor | None, lse: torch.Tensor | None, ob: torch.Tensor, lseb: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor]:
    if o is None or lse is None:
        return ob, lseb
    new = torch.logaddexp(lse, lseb)
    return o * torch.exp(lse - new).unsqueeze(-1) + ob * torch.exp(lseb - new).unsqueeze(-1), new


@dataclass
class RingStats:
    """Work counters of ring attention on this rank (for the load-balance test)."""

    blocks: int = 0  # chunk x chunk score blocks computed in the forward (a diagonal block counts 1)
    flops: int = 0  # 4 * Sq * Sk * D * heads per block, forward only
    per_step: list[int] = field(default_factory=list)


class RingContext:
    """What ring attention needs: the CP group, our place in it and the peers (global ranks)."""

    def __init__(self, group: dist.ProcessGroup, cp_rank: int, cp: int, next_rank: int, prev_rank: int,
                 zigzag: bool = True) -> None:
        self.group = group
        self.cp_rank = cp_rank
        self.cp = cp
        self.next_rank = next_rank
        self.prev_rank = prev_rank
        self.zigzag = zigzag
        self.stats = RingStats()

    def chunks_of(self, cp_rank: int) -> tuple[int, int]:
        if self.zigzag:
            return zigzag_chunks(cp_rank, self.cp)
        return 2 * cp_rank, 2 * cp_rank + 1

    def pairs(self, src_rank: int) -> list[tuple[int, int, bool]]:
        """(local q chunk slot, received k chunk slot, diagonal?) blocks visible under the causal mask."""
        qc = self.chunks_of(self.cp_rank)
        kc = self.chunks_of(src_rank)
        out = []
        for a, ca in enumerate(qc):
            for b, cb in enumerate(kc):
                if cb < ca:
                    out.append((a, b, False))
                elif cb == ca:
                    out.append((a, b, True))
        return out

    def rotate(self, tensors: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[dist.Work]]:
        """Start sending ``tensors`` to the next rank and receiving the previous rank's."""
        recv = [torch.empty_like(t) for t in tensors]
        ops = []
        for t, r in zip(tensors, recv, strict=True):
            ops.append(dist.P2POp(dist.isend, t, self.next_rank, self.group))
            ops.append(dist.P2POp(dist.irecv, r, self.prev_rank, self.group))
        return recv, dist.batch_isend_irecv(ops)


def _halves(x: torch.Tensor, dim: int) -> list[torch.Tensor]:
    return list(x.chunk(2, dim=dim))


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rc: RingContext):  # type: ignore[override]
        b, h, s, d = q.shape
        kvh = k.shape[1]
        scale = d ** -0.5
        qg = q.view(b, kvh, h // kvh, s, d)
        qs = _halves(qg, 3)
        outs: list[torch.Tensor | None] = [None, None]
        lses: list[torch.Tensor | None] = [None, None]
        cur_k, cur_v = k.contiguous(), v.contiguous()
        for step in range(rc.cp):
            src = (rc.cp_rank - step) % rc.cp
            pending = None
            if step < rc.cp - 1:
                (nk, nv), works = rc.rotate([cur_k, cur_v])
                pending = (nk, nv, works)
            ks, vs = _halves(cur_k, 2), _halves(cur_v, 2)
            n = 0
            for a, bb, diag in rc.pairs(src):
                ob, lb = _block_fwd(qs[a], ks[bb], vs[bb], scale, diag)
                outs[a], lses[a] = _merge(outs[a], lses[a], ob, lb)
                n += 1
            rc.stats.blocks += n
            rc.stats.per_step.append(n)
            rc.stats.flops += n * 4 * (s // 2) * (s // 2) * d * h
            if pending is not None:
                for w in pending[2]:
                    w.wait()
                cur_k, cur_v = pending[0], pending[1]
        o = torch.cat([outs[0], outs[1]], dim=3)  # type: ignore[list-item]
        lse = torch.cat([lses[0], lses[1]], dim=3)  # type: ignore[list-item]
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.rc = rc
        return o.view(b, h, s, d)

    @staticmethod
    def backward(ctx, do: torch.Tensor):  # type: ignore[override]
        q, k, v, o, lse = ctx.saved_tensors
        rc: RingContext = ctx.rc
        b, h, s, d = q.shape
        kvh = k.shape[1]
        scale = d ** -0.5
        qg = q.view(b, kvh, h // kvh, s, d)
        dog = do.contiguous().view(b, kvh, h // kvh, s, d)
        delta = (dog * o).sum(-1)  # [B, KV, rep, S]
        qs, dos, lses, deltas = _halves(qg, 3), _halves(dog, 3), _halves(lse, 3), _halves(delta, 3)
        dq = [torch.zeros_like(qs[0]), torch.zeros_like(qs[1])]
        cur_k, cur_v = k.contiguous(), v.contiguous()
        dk = torch.zeros_like(cur_k)
        dv = torch.zeros_like(cur_v)
        for step in range(rc.cp):
            src = (rc.cp_rank - step) % rc.cp
            # the next K/V block travels while this one is worked on; its gradient accumulators
            # can only follow once this step has added to them
            kv_next = rc.rotate([cur_k, cur_v]) if step < rc.cp - 1 else None
            ks, vs = _halves(cur_k, 2), _halves(cur_v, 2)
            dks, dvs = _halves(dk, 2), _halves(dv, 2)
            for a, bb, diag in rc.pairs(src):
                sc = _scores(qs[a], ks[bb], scale, diag)
                p = torch.exp(sc - lses[a].unsqueeze(-1))  # [B, KV, rep, Sq, Sk]
                dvs[bb] += torch.matmul(p.transpose(-1, -2), dos[a]).sum(2)
                dp = torch.matmul(dos[a], vs[bb].unsqueeze(2).transpose(-1, -2))
                ds = p * (dp - deltas[a].unsqueeze(-1)) * scale
                dq[a] += torch.matmul(ds, ks[bb].unsqueeze(2))
                dks[bb] += torch.matmul(ds.transpose(-1, -2), qs[a]).sum(2)
            if rc.cp > 1:  # (on the last step this hop brings the accumulators home)
                (dk, dv), works = rc.rotate([dk, dv])
                for w in works:
                    w.wait()
            if kv_next is not None:
                (cur_k, cur_v), works = kv_next
                for w in works:
                    w.wait()
        dqf = torch.cat(dq, dim=3).view(b, h, s, d)
        return dqf, dk, dv, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rc: RingContext) -> torch.Tensor:
    """Causal attention over the whole (zigzag-split) sequence; ``q [B,H,S_loc,D]``, ``k, v [B,KV,S_loc,D]``."""
    return _RingAttention.apply(q, k, v, rc)


# --------------------------------------------------------------------------- Ulysses
def _heads_to_seq(x: torch.Tensor, group: dist.ProcessGroup, cp: int) -> torch.Tensor:
    b, h, s, d = x.shape
    send = x.reshape(b, cp, h // cp, s, d).permute(1, 0, 2, 3, 4).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv.permute(1, 2, 0, 3, 4).reshape(b, h // cp, cp * s, d)


def _seq_to_heads(x: torch.Tensor, group: dist.ProcessGroup, cp: int) -> torch.Tensor:
    b, hc, sf, d = x.shape
    s = sf // cp
    send = x.reshape(b, hc, cp, s, d).permute(2, 0, 1, 3, 4).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv.permute(1, 0, 2, 3, 4).reshape(b, hc * cp, s, d)


class _HeadsToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup, cp: int):  # type: ignore[override]
        ctx.group, ctx.cp = group, cp
        return _heads_to_seq(x, group, cp)

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        return _seq_to_heads(g.contiguous(), ctx.group, ctx.cp), None, None


class _SeqToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup, cp: int):  # type: ignore[override]
        ctx.group, ctx.cp = group, cp
        return _seq_to_heads(x, group, cp)

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        return _heads_to_seq(g.contiguous(), ctx.group, ctx.cp), None, None


def ulysses_refusal(heads_local: int, cp: int) -> str | None:
    """Why Ulysses cannot run (``None`` when it can)."""
    if heads_local % cp:
        return (f"cp_method=ulysses needs the attention heads of each TP rank ({heads_local}) to be "
                f"divisible by cp={cp}: the all-to-all gives every CP rank heads/cp whole heads")
    return None


class UlyssesContext:
    def __init__(self, group: dist.ProcessGroup, cp_rank: int, cp: int, seq_local: int) -> None:
        self.group = group
        self.cp = cp
        # all-to-all concatenates the CP ranks' zigzag shares in rank order; this puts them in order
        order = torch.cat([zigzag_positions(seq_local * cp, r, cp) for r in range(cp)])
        self.to_natural = torch.argsort(order)
        self.from_natural = order


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, uc: UlyssesContext) -> torch.Tensor:
    cp = uc.cp
    if q.shape[1] % cp:
        raise ValueError(ulysses_refusal(q.shape[1], cp))
    if k.shape[1] % cp:  # too few KV heads to split: give every query head its own copy
        rep = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    qf, kf, vf = (_HeadsToSeq.apply(t.contiguous(), uc.group, cp) for t in (q, k, v))
    idx = uc.to_natural.to(q.device)
    qf, kf, vf = (t.index_select(2, idx) for t in (qf, kf, vf))
    of = sdpa_causal(qf, kf, vf)
    of = of.index_select(2, uc.from_natural.to(q.device))
    return _SeqToHeads.apply(of.contiguous(), uc.group, cp)


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Plain causal attention (float64-friendly math path), for tests."""
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    s = q.shape[2]
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    return F.softmax(scores, dim=-1) @ v
