"""Build this rank's model parts for a layout, in TorchTitan's fixed order.

1. build the model on the meta device (no memory), cut out this rank's pipeline stages (PP);
2. per part: CP hooks (ring/Ulysses attention core), then TP/SP (DTensor plan), then activation
   recompute, then FSDP2 (zero=3) -- FSDP must wrap the TP-sharded modules, not the other way
   round -- all still on meta;
3. materialise only the shards this rank holds (``to_empty``), rotary tables for its (zigzag)
   positions, and fill the shards with exactly the values the seed gives the whole model
   (``model.init_local_shards``: full tensors generated one at a time, each rank keeps its slice).
"""

from __future__ import annotations

from functools import partial

import torch

from planner.layout import Layout
from workers.engine.config import ModelConfig
from workers.engine.groups import ParallelGroups
from workers.engine.model import Transformer, init_local_shards
from workers.engine.parallel.context import (
    RingContext,
    UlyssesContext,
    ring_attention,
    ulysses_attention,
    zigzag_positions,
)
from workers.engine.parallel.data import apply_fsdp
from workers.engine.parallel.pipeline import split_stage, stage_ids
from workers.engine.parallel.tensor import apply_tp
from workers.engine.recompute import apply_recompute


class ModelParts:
    """The stage modules this rank holds (one, or ``vpp`` with interleaving) and their stage ids;
    ``hf_elements_read``: how many elements this rank fetched from an HF checkpoint (0 without one)."""

    def __init__(self, modules: list[Transformer], stages: list[int], ring: RingContext | None,
                 hf_elements_read: int = 0) -> None:
        self.modules = modules
        self.stages = stages
        self.ring = ring
        self.hf_elements_read = hf_elements_read

    def named_parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        out: list[tuple[str, torch.nn.Parameter]] = []
        for m in self.modules:
            out.extend(m.named_parameters())
        return out

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for _, p in self.named_parameters()]


def build_parts(cfg: ModelConfig, seed: int, layout: Layout, groups: ParallelGroups,
                device: torch.device, hf: str | None = None) -> ModelParts:
    """This rank's parts; weights from the seed, or read from the HF checkpoint ``hf`` (``ModelConfig.hf``;
    each rank reads only its slices: ``workers.engine.hf.load_hf_shards``)."""
    with torch.device("meta"):  # no rank ever holds the whole model: shards are filled in at the end
        full = Transformer(cfg)
    c = groups.coords
    num_stages = layout.pp * layout.vpp
    ids = stage_ids(layout, c.pp) if layout.pp > 1 else [0]
    modules = [split_stage(full, s, num_stages) for s in ids] if layout.pp > 1 else [full]

    ring: RingContext | None = None
    core = None
    if layout.cp > 1:
        if layout.cp_method == "ring":
            ring = RingContext(groups.cp, c.cp, layout.cp,
                               next_rank=groups.global_rank("cp", (c.cp + 1) % layout.cp),
                               prev_rank=groups.global_rank("cp", (c.cp - 1) % layout.cp))
            core = partial(ring_attention, rc=ring)
        else:
            uc = UlyssesContext(groups.cp, c.cp, layout.cp, cfg.seq_len // layout.cp)
            core = partial(ulysses_attention, uc=uc)
    positions = zigzag_positions(cfg.seq_len, c.cp, layout.cp) if layout.cp > 1 else None

    apply_recompute(modules, layout.recompute)  # counts this rank's blocks across its chunks (layer:N)
    for m in modules:
        for block in m.layers.values():
            if core is not None:
                block.attention.core = core
        apply_tp(m, groups.tp_mesh, sp=layout.sp)
        m.tie()  # TP distributed the embedding's and the head's weights separately: one again
        if layout.zero == 3:
            apply_fsdp(m, groups, pp_enabled=layout.pp > 1)
        m.to_empty(device=device)
        if layout.zero != 3:
            m.tie()  # to_empty replaced each module's meta parameter on its own (FSDP keeps shared ones)
        if cfg.tie_embeddings and m.tok_embeddings is not None and m.output is not None:
            assert m.output.weight is m.tok_embeddings.weight, "tied embeddings came apart"
        m.rope.reset((positions if positions is not None else torch.arange(cfg.seq_len)).to(device))
    read = 0
    if hf:
        from workers.engine.hf import load_hf_shards

        read = load_hf_shards(modules, cfg, hf)
    else:
        init_local_shards(modules, cfg, seed)
    return ModelParts(modules, ids, ring, hf_elements_read=read)
