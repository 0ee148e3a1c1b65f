"""Bytes of activations a forward leaves alive for its backward, in one process.

Every tensor an op creates during the forward is noted (a weak reference to its storage); what is
still alive once the forward returned -- saved for backward by autograd, kept by a checkpoint for
its recompute, or cached by selective checkpointing -- is what the forward left for the backward.
Storages that existed before (parameters, buffers, the input) and the forward's own output are not
counted. Unlike ``saved_tensors_hooks``, this also sees what ``torch.utils.checkpoint`` holds.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class _Created(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.storages: dict[int, tuple[StorageWeakRef, int]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and not t.is_meta:
                s = t.untyped_storage()
                self.storages.setdefault(s._cdata, (StorageWeakRef(s), s.nbytes()))
        return out


def kept_bytes(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, module: torch.nn.Module) -> int:
    """Bytes the forward ``fn(x)`` leaves alive (``x``'s own bytes included: the block input is an
    activation of every mode; the output is not, it is the next layer's input)."""
    before = {t.untyped_storage()._cdata for t in (*module.parameters(), *module.buffers(), x)}
    meter = _Created()
    with meter:
        out = fn(x)
    gc.collect()
    skip = before | {out.untyped_storage()._cdata}
    alive = sum(n for cdata, (ref, n) in meter.storages.items() if cdata not in skip and not ref.expired())
    return alive + x.untyped_storage().nbytes()
