"""An HF Llama checkpoint checked from its headers alone, without torch: the control plane's check.

The API (at submission) and the controller (at every launch) check that an HF checkpoint holds
every tensor the engine's model needs, with its shape, before any rank starts. They read only
``config.json`` and the safetensors *headers* (an 8-byte little-endian length, then a JSON object
``{name: {"dtype", "shape", "data_offsets"}}``): names, shapes and dtypes, never tensor data, and
import neither torch nor safetensors. The shapes the engine expects are computed here in pure
Python from the :class:`ModelConfig` (``tests/engine/test_hf_headers.py`` holds them equal to the
parameters of the engine's ``Transformer``).

Names: ``model.embed_tokens`` = ``tok_embeddings``, ``model.layers.i.self_attn.{q,k,v,o}_proj`` =
``layers.i.attention.w{q,k,v,o}``, ``mlp.{gate,up,down}_proj`` = ``feed_forward.w{1,3,2}``,
``input_layernorm`` / ``post_attention_layernorm`` = ``attention_norm`` / ``ffn_norm``,
``model.norm`` = ``norm``, ``lm_head`` = ``output`` (``model.embed_tokens`` when the checkpoint ties
them). :mod:`workers.engine.hf.weights` reads the data with torch, by these names.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from workers.data_area import referenced_path
from workers.engine.config import ModelConfig
from workers.tenant_json import load_file, loads

INDEX_FILE = "model.safetensors.index.json"
#: bytes per element of each safetensors dtype
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "I16": 2, "F16": 2,
               "BF16": 2, "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8}
#: a header larger than this is refused (safetensors' own limit)
MAX_HEADER_BYTES = 100_000_000

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


@dataclass(frozen=True)
class TensorHeader:
    """One tensor as its file's header describes it."""

    file: str
    dtype: str
    shape: tuple[int, ...]


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


def source_name(engine_param: str, tied: bool, present: set[str] | dict[str, object]) -> str:
    """The HF tensor an engine parameter is read from (the embedding for a tied or absent head)."""
    n = hf_name(engine_param)
    if n == "lm_head.weight" and (tied or n not in present):
        return "model.embed_tokens.weight"
    return n


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The engine model's parameters (names as ``Transformer.named_parameters`` gives them, the head
    left out when tied to the embedding) and their shapes, from the config alone."""
    hd = cfg.head_dim
    out: dict[str, tuple[int, ...]] = {"tok_embeddings.weight": (cfg.vocab, cfg.hidden)}
    for i in range(cfg.layers):
        p = f"layers.{i}."
        out[p + "attention_norm.weight"] = (cfg.hidden,)
        out[p + "attention.wq.weight"] = (cfg.heads * hd, cfg.hidden)
        out[p + "attention.wk.weight"] = (cfg.kv_heads * hd, cfg.hidden)
        out[p + "attention.wv.weight"] = (cfg.kv_heads * hd, cfg.hidden)
        out[p + "attention.wo.weight"] = (cfg.hidden, cfg.heads * hd)
        out[p + "ffn_norm.weight"] = (cfg.hidden,)
        out[p + "feed_forward.w1.weight"] = (cfg.ffn, cfg.hidden)
        out[p + "feed_forward.w3.weight"] = (cfg.ffn, cfg.hidden)
        out[p + "feed_forward.w2.weight"] = (cfg.hidden, cfg.ffn)
    out["norm.weight"] = (cfg.hidden,)
    if not cfg.tie_embeddings:
        out["output.weight"] = (cfg.vocab, cfg.hidden)
    return out


def read_header(fp: Path) -> dict[str, TensorHeader]:
    """The tensors one ``*.safetensors`` file holds, from its header; :class:`HFWeightsError` naming
    the file when the header is not valid or the data it describes is not all there."""
    try:
        size = fp.stat().st_size
        with fp.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ValueError("shorter than its 8-byte header length")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise ValueError(f"header length {n} does not fit the file of {size} bytes")
            header = loads(f.read(n), str(fp))
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
        data_len = size - 8 - n
        tensors: dict[str, TensorHeader] = {}
        end = 0
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dtype, shape, (lo, hi) = str(info["dtype"]), tuple(int(s) for s in info["shape"]), info["data_offsets"]
            if dtype not in DTYPE_BYTES:
                raise ValueError(f"tensor {name!r}: unknown dtype {dtype!r}")
            count = 1
            for s in shape:
                count *= s
            if not (0 <= lo <= hi <= data_len) or hi - lo != count * DTYPE_BYTES[dtype]:
                raise ValueError(f"tensor {name!r}: data offsets {[lo, hi]} do not hold its {list(shape)} {dtype}")
            end = max(end, hi)
            tensors[name] = TensorHeader(fp.name, dtype, shape)
        if end != data_len:
            raise ValueError(f"the header describes {end} bytes of data, the file holds {data_len}")
    except OSError as e:
        raise HFWeightsError(f"{fp}: unreadable safetensors file ({e})") from None
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise HFWeightsError(f"{fp}: corrupt or unreadable safetensors file ({e})") from None
    return tensors


def checkpoint_files(path: Path) -> tuple[list[str], dict[str, str] | None]:
    """The ``*.safetensors`` files of a checkpoint directory and its index's weight map (None when
    it has no ``model.safetensors.index.json``: every file's tensors count).

    Every file it names follows the data area's rule for paths a tenant's file names
    (:func:`workers.data_area.referenced_path`): relative, no ``..``, inside this directory with
    symlinks followed, so an index never reaches another tenant's weights; errors never say whether
    an outside file exists (:class:`~workers.data_area.TenantFileError`)."""
    shown = str(path / INDEX_FILE)
    index = referenced_path(path, INDEX_FILE, shown, required=False)
    if index is not None:
        weight_map = load_file(index, shown).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise HFWeightsError(f"{shown}: weight_map must be a non-empty object "
                                 f"(tensor name -> file), got {type(weight_map).__name__}")
        for k, v in weight_map.items():
            referenced_path(path, v, f"{shown}: weight_map[{str(k)[:80]!r}]")
        files = sorted(set(weight_map.values()))
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
        weight_map = None
    if not files:
        raise HFWeightsError(f"{path}: no *.safetensors files")
    return files, weight_map


def checkpoint_headers(path: str | Path) -> dict[str, TensorHeader]:
    """Every tensor of an HF checkpoint directory (``model.safetensors``, shards with their index,
    or every ``*.safetensors`` in it) by name, from the headers."""
    root = Path(path)
    files, weight_map = checkpoint_files(root)
    out: dict[str, TensorHeader] = {}
    for f in files:
        fp = root / f
        if not fp.is_file():
            raise HFWeightsError(f"{fp}: listed in {INDEX_FILE} but missing")
        for name, t in read_header(fp).items():
            if weight_map is None or weight_map.get(name) == f:
                out[name] = t
    return out


def check_checkpoint(path: str | Path, cfg: ModelConfig, tied: bool) -> dict[str, TensorHeader]:
    """Every tensor the engine's model needs is in the checkpoint with its shape (headers only);
    :class:`HFWeightsError` naming the tensor otherwise. Returns the tensors found."""
    tensors = checkpoint_headers(path)
    for name, shape in expected_shapes(cfg).items():
        src = source_name(name, tied, tensors)
        if src not in tensors:
            raise HFWeightsError(f"{path}: tensor {src!r} missing")
        if tensors[src].shape != shape:
            raise HFWeightsError(f"{path}: tensor {src!r} has shape {list(tensors[src].shape)}, "
                                 f"config.json gives {list(shape)}")
    return tensors
