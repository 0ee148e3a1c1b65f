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
from workers.tenant_json import load_file

INDEX_FILE = "model.safetensors.index.json"

_LAYER_MAP = {
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_TOP_MAP = {"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
            "output.weight": "lm_head.weight"}


class HFWeightsError(ValueError):
    """A safetensors checkpoint that cannot be read; the message names the file or tensor."""


def engine_name(name: str) -> str:
    """A parameter name without wrapper prefixes (activation checkpointing, FSDP)."""
    return name.replace("_checkpoint_wrapped_module.", "").replace("_fsdp_wrapped_module.", "")


def hf_name(name: str) -> str:
    """The HF tensor name of an engine parameter."""
    name = engine_name(name)
    if name in _TOP_MAP:
        return _TOP_MAP[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "layers" and parts[2] in _LAYER_MAP:
        return f"model.layers.{parts[1]}.{_LAYER_MAP[parts[2]]}"
    raise KeyError(f"no HF name for parameter {name!r}")


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
        # every file it opens follows the data area's rule for paths a tenant's file names: relative,
        # no '..', inside this directory with symlinks followed (never another tenant's weights)
        shown = str(self.path / INDEX_FILE)
        index = referenced_path(self.path, INDEX_FILE, shown, required=False)
        if index is not None:
            weight_map = load_file(index, shown).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise HFWeightsError(f"{shown}: weight_map must be a non-empty object "
                                     f"(tensor name -> file), got {type(weight_map).__name__}")
            for k, v in weight_map.items():
                referenced_path(self.path, v, f"{shown}: weight_map[{k[:80]!r}]")
            files = sorted(set(weight_map.values()))
        else:
            files = sorted(p.name for p in self.path.glob("*.safetensors"))
            weight_map = None
        if not files:
            raise HFWeightsError(f"{self.path}: no *.safetensors files")
        self._handles: dict[str, Any] = {}
        self.where: dict[str, str] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, str] = {}
        for f in files:
            fp = referenced_path(self.path, f, shown if weight_map is not None else str(self.path / f))
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
        n = hf_name(engine_param)
        if n == "lm_head.weight" and (tied or n not in self.where):
            return "model.embed_tokens.weight"
        return n

    def check_against(self, cfg: ModelConfig, tied: bool) -> None:
        """Every tensor the engine's model needs is present with its shape (before any rank starts)."""
        from workers.engine.model import Transformer

        with torch.device("meta"):
            model = Transformer(cfg)
        for name, p in model.named_parameters():
            src = self.source_name(name, tied)
            if src not in self.where:
                raise HFWeightsError(f"{self.path}: tensor {src!r} missing")
            if self.shapes[src] != tuple(p.shape):
                raise HFWeightsError(f"{self.path}: tensor {src!r} has shape {list(self.shapes[src])}, "
                                     f"config.json gives {list(p.shape)}")


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
