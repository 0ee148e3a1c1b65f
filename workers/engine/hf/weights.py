"""HF Llama ``*.safetensors`` <-> the engine's parameters, one slice at a time.

Names: ``model.embed_tokens`` = ``tok_embeddings``, ``model.layers.i.self_attn.{q,k,v,o}_proj`` =
``layers.i.attention.w{q,k,v,o}``, ``mlp.{gate,up,down}_proj`` = ``feed_forward.w{1,3,2}``,
``input_layernorm`` / ``post_attention_layernorm`` = ``attention_norm`` / ``ffn_norm``,
``model.norm`` = ``norm``, ``lm_head`` = ``output`` (``model.embed_tokens`` when the checkpoint ties
them: the engine ties them too, one parameter; a last pipeline stage's head copy reads it as well).

Rotary layout: HF rotates the two *halves* of each head (``x[i]`` with ``x[i + d/2]``), the
engine rotates *adjacent pairs* (``x[2i]`` with ``x[2i+1]``). The same permutation of the rows of
``wq`` and ``wk`` inside every head maps one onto the other (q.k is unchanged by permuting both):
engine row ``2i`` is HF row ``i``, engine row ``2i+1`` is HF row ``i + d/2``.

Names and the header-only check (no torch, for the control plane): :mod:`workers.engine.hf.headers`.

Import: every rank works out which global index range of each tensor dimension its local shard
covers (TP ``Shard``, FSDP's ``Shard`` / ``_StridedShard`` nested inside TP's, PP stages hold
whole tensors) and reads exactly that with ``safe_open(...).get_slice`` -- for ``wq``/``wk`` the
whole heads around it, which the row permutation needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from workers.data_area import referenced_path
from workers.engine.config import ModelConfig
from workers.engine.hf.headers import (
    INDEX_FILE,
    HFWeightsError,
    checkpoint_files,
    engine_name,
    hf_name,
    source_name,
)

__all__ = ["INDEX_FILE", "HFCheckpoint", "HFWeightsError", "engine_name", "hf_name", "load_hf_shards"]


def rope_rows_hf_to_engine(head_dim: int) -> torch.Tensor:
    """Row order inside one head: engine row ``j`` is HF row ``perm[j]``."""
    half = head_dim // 2
    return torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).reshape(-1)


def rope_rows_engine_to_hf(head_dim: int) -> torch.Tensor:
    return torch.argsort(rope_rows_hf_to_engine(head_dim))


def is_rotary(name: str) -> bool:
    return engine_name(name).endswith(("attention.wq.weight", "attention.wk.weight"))


class HFCheckpoint:
    """The tensors of an HF checkpoint directory: ``model.safetensors``, or shards with their index
    (``model.safetensors.index.json``), or every ``*.safetensors`` in it. Headers are read (and
    checked) on open; tensor data only as slices are asked for."""

    def __init__(self, path: str | Path) -> None:
        from safetensors import safe_open

        self.path = Path(path)
        files, weight_map = checkpoint_files(self.path)
        self._handles: dict[str, Any] = {}
        self.where: dict[str, str] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, str] = {}
        for f in files:
            fp = referenced_path(self.path, f, str(self.path / INDEX_FILE) if weight_map is not None
                                 else str(self.path / f))
            try:
                h = safe_open(str(fp), framework="pt")
                keys = list(h.keys())
                for k in keys:
                    sl = h.get_slice(k)
                    self.shapes[k] = tuple(sl.get_shape())
                    self.dtypes[k] = sl.get_dtype()
            except Exception as e:  # safetensors raises its own SafetensorError / OSError
                raise HFWeightsError(f"{self.path / f}: corrupt or unreadable safetensors file ({e})") from None
            self._handles[f] = h
            for k in keys:
                if weight_map is not None and weight_map.get(k) != f:
                    continue
                self.where[k] = f

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def read(self, name: str, index: tuple[slice, ...] = ()) -> torch.Tensor:
        """``tensor[index]`` read from disk (only the slice), as float32."""
        if name not in self.where:
            raise HFWeightsError(f"{self.path}: tensor {name!r} missing")
        try:
            sl = self._handles[self.where[name]].get_slice(name)
            t = sl[index] if index else sl[:]
        except Exception as e:
            raise HFWeightsError(f"{self.path / self.where[name]}: cannot read {name!r} ({e})") from None
        return t.float()

    def source_name(self, engine_param: str, tied: bool) -> str:
        return source_name(engine_param, tied, self.where)


def _chunk_range(start: int, stop: int, parts: int, index: int) -> tuple[int, int]:
    """``torch.chunk``'s ``index``-th piece of ``range(start, stop)`` (DTensor's sharding rule)."""
    n = stop - start
    size = -(-n // parts) if n else 0
    lo = min(start + index * size, stop)
    return lo, min(lo + size, stop)


def local_ranges(p: torch.Tensor) -> list[tuple[int, int]]:
    """The global ``[start, stop)`` of each dimension that this rank's shard of ``p`` covers.

    Plain ``Shard``s nest in mesh-dimension order; FSDP2's ``_StridedShard`` (FSDP over a dimension
    TP already shards) shards the TP-local piece, so it is applied after the others.
    """
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import _StridedShard

    ranges = [(0, s) for s in p.shape]
    if not isinstance(p, DTensor):
        return ranges
    mesh = p.device_mesh
    coords = mesh.get_coordinate()
    assert coords is not None
    order = [i for i, pl in enumerate(p.placements) if not isinstance(pl, _StridedShard)]
    order += [i for i, pl in enumerate(p.placements) if isinstance(pl, _StridedShard)]
    for i in order:
        pl = p.placements[i]
        if pl.is_replicate():
            continue
        dim = pl.dim  # type: ignore[attr-defined]
        ranges[dim] = _chunk_range(*ranges[dim], mesh.size(i), coords[i])
    local = p._local_tensor.shape
    got = tuple(b - a for a, b in ranges)
    if got != tuple(local):
        raise RuntimeError(f"placements {p.placements}: computed local shape {got}, shard has {tuple(local)}")
    return ranges


@torch.no_grad()
def load_hf_shards(modules: list[nn.Module], cfg: ModelConfig, path: str | Path) -> int:
    """Fill the parameters of ``modules`` (this rank's parts, any layout) from the HF checkpoint at
    ``path``, reading only the slices this rank holds; returns the number of elements fetched from
    the files (a q/k slice is fetched whole heads at a time, for the rotary permutation)."""
    from torch.distributed.tensor import DTensor

    from workers.engine.hf.config import read_hf_config

    tied = bool(read_hf_config(path).get("tie_word_embeddings", False))
    ckpt = HFCheckpoint(path)
    hd = cfg.head_dim
    read = 0
    for m in modules:
        for name, p in m.named_parameters():
            src = ckpt.source_name(name, tied)
            ranges = local_ranges(p)
            dst = p._local_tensor if isinstance(p, DTensor) else p
            if is_rotary(name):
                (r0, r1), cols = ranges[0], ranges[1]
                h0, h1 = r0 // hd, -(-r1 // hd)
                block = ckpt.read(src, (slice(h0 * hd, h1 * hd), slice(*cols)))
                perm = rope_rows_hf_to_engine(hd)
                block = block.view(h1 - h0, hd, -1)[:, perm].reshape(-1, block.shape[-1])
                value = block[r0 - h0 * hd:r1 - h0 * hd]
                read += block.numel()
            else:
                value = ckpt.read(src, tuple(slice(a, b) for a, b in ranges))
                read += value.numel()
            dst.copy_(value.to(dst.dtype))
    return read
