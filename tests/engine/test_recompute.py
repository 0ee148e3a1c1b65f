"""Activation recompute in one process: ``selective`` keeps only the attention core's inputs, ``full``
only each block's input; both give the same loss and gradients as no recompute, bit for bit."""

from __future__ import annotations

import pytest
import torch

from workers.engine.config import ModelConfig
from workers.engine.model import build_model

pytestmark = pytest.mark.engine


def _run(mode: str, tokens: torch.Tensor) -> tuple[float, dict[str, torch.Tensor], int]:
    model = build_model(ModelConfig.preset("tiny"), seed=3)
    model.checkpoint_layers = mode == "full"
    for block in model.layers.values():
        block.attention.recompute_core = mode == "selective"
    saved = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        if not isinstance(t, torch.nn.Parameter):
            saved += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}, saved


def test_selective_and_full_recompute_save_less_and_change_nothing() -> None:
    torch.manual_seed(0)
    tokens = torch.randint(0, 256, (4, 65))
    loss, grads, kept = {}, {}, {}
    for mode in ("none", "selective", "full"):
        loss[mode], grads[mode], kept[mode] = _run(mode, tokens)
    assert kept["full"] < kept["selective"] < kept["none"], kept
    for mode in ("selective", "full"):
        assert loss[mode] == loss["none"]
        for name, g in grads["none"].items():
            assert torch.equal(grads[mode][name], g), (mode, name)
