"""Sequence parallelism: the activations of the norm/residual regions shrink by TP on every rank."""

import pytest
import torch

from engine_harness import random_batches, tiny_cfg
from planner.layout import Layout
from workers.engine.launch import run_ranks


def _local_bytes(t: object) -> int:
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.to_local()
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _measure(rank: int, world: int, specs: list[str]) -> dict:
    from workers.engine.model import RMSNorm
    from workers.engine.trainer import RankTrainer

    cfg = tiny_cfg()
    batch = random_batches(cfg, 1, seed=3)[0]
    out = {}
    for spec in specs:
        trainer = RankTrainer(cfg, Layout.parse(spec + ",micro_batch=8"), rank, world)
        region = {"bytes": 0}
        saved = {"bytes": 0}

        def hook(_m: torch.nn.Module, args: tuple, result: torch.Tensor, region: dict = region) -> None:
            region["bytes"] += _local_bytes(args[0]) + _local_bytes(result)

        handles = [m.register_forward_hook(hook) for m in trainer.parts.modules[0].modules()
                   if isinstance(m, RMSNorm)]

        def pack(t: torch.Tensor, saved: dict = saved) -> torch.Tensor:
            saved["bytes"] += _local_bytes(t)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            trainer.forward_backward(batch)
        for h in handles:
            h.remove()
        trainer.close()
        out[spec] = (region["bytes"], saved["bytes"])
    return out


@pytest.mark.engine
def test_sequence_parallel_divides_norm_region_activations_by_tp() -> None:
    for world in (2, 4):
        results = run_ranks(_measure, world, [f"tp={world}", f"tp={world},sp=false"])
        for r in results:
            sp_region, sp_saved = r[f"tp={world}"]
            full_region, full_saved = r[f"tp={world},sp=false"]
            assert sp_region * world == full_region, (world, sp_region, full_region)
            assert sp_saved < full_saved  # and the whole saved-for-backward footprint drops
