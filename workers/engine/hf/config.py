"""A Hugging Face Llama ``config.json`` as an engine :class:`ModelConfig`, and back.

Accepted: ``model_type: llama`` (Llama 2 and 3 configs), GQA (``num_key_value_heads``),
``rms_norm_eps``, ``tie_word_embeddings``, the rotary base and Llama 3.1 scaling in either
spelling: the Hub's ``rope_theta`` + ``rope_scaling: {"rope_type"|"type": "llama3", ...}`` or the
newer ``rope_parameters: {"rope_theta": ..., "rope_type": "default"|"llama3", ...}``. Anything the
engine's decoder does not compute (biases, another activation, another rotary type, a ``head_dim``
other than ``hidden / heads``) is refused naming the field, never silently ignored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workers.data_area import referenced_path
from workers.engine.config import ModelConfig
from workers.tenant_json import load_file

SUPPORTED_MODEL_TYPES = ("llama",)


class HFConfigError(ValueError):
    """A ``config.json`` the engine cannot train; the message names the field."""


def read_hf_config(path: str | Path) -> dict[str, Any]:
    """``config.json`` of an HF checkpoint directory (or the file itself), read as a tenant's file:
    inside the directory (symlinks followed), bounded in size and nesting, an object."""
    p = Path(path)
    if p.is_dir():
        f = referenced_path(p, "config.json", str(p / "config.json"), required=False)
        if f is None:
            raise HFConfigError(f"{p / 'config.json'}: no config.json "
                                "(an HF checkpoint directory holds config.json and *.safetensors)")
    else:
        f = referenced_path(p.parent, p.name, str(p))
    return load_file(f, str(p / "config.json") if p.is_dir() else str(p))


def _rope(data: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(theta, llama3 scaling parameters or None) from either spelling."""
    params = data.get("rope_parameters")
    if isinstance(params, dict) and "default" not in params and isinstance(next(iter(params.values()), None), dict):
        raise HFConfigError("rope_parameters: per-layer-type rotary parameters are not supported")
    if isinstance(params, dict):
        theta = params.get("rope_theta", data.get("rope_theta", 10000.0))
        scaling: dict[str, Any] | None = params
    else:
        theta = data.get("rope_theta", 10000.0)
        scaling = data.get("rope_scaling")
    if scaling is None:
        return float(theta), None
    if not isinstance(scaling, dict):
        raise HFConfigError(f"rope_scaling: expected an object, got {scaling!r}")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    field = "rope_parameters.rope_type" if isinstance(params, dict) else "rope_scaling.rope_type"
    if kind == "default":
        return float(theta), None
    if kind != "llama3":
        raise HFConfigError(f"{field}: {kind!r} is not supported (default or llama3)")
    missing = [k for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
               if k not in scaling]
    if missing:
        raise HFConfigError(f"{field} llama3 lacks {', '.join(missing)}")
    return float(theta), scaling


def model_config_from_hf(data: dict[str, Any], seq_len: int, name: str = "hf") -> ModelConfig:
    """The engine shape of an HF Llama config, training on ``seq_len``-token sequences."""
    mt = data.get("model_type")
    if mt is None:
        raise HFConfigError("model_type: missing from config.json (expected 'llama')")
    if mt not in SUPPORTED_MODEL_TYPES:
        raise HFConfigError(f"model_type: {mt!r} is not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if not isinstance(data.get(key), int):
            raise HFConfigError(f"{key}: missing or not an integer in config.json")
    if data.get("hidden_act", "silu") != "silu":
        raise HFConfigError(f"hidden_act: {data['hidden_act']!r} is not supported (silu)")
    for key in ("attention_bias", "mlp_bias"):
        if data.get(key):
            raise HFConfigError(f"{key}: biases are not supported")
    if data.get("pretraining_tp", 1) != 1:
        raise HFConfigError("pretraining_tp: only 1 is supported")
    heads = data["num_attention_heads"]
    hidden = data["hidden_size"]
    head_dim = data.get("head_dim") or hidden // heads
    if head_dim * heads != hidden:
        raise HFConfigError(f"head_dim: {head_dim} * num_attention_heads {heads} != hidden_size {hidden}")
    theta, scaling = _rope(data)
    max_pos = data.get("max_position_embeddings")
    if isinstance(max_pos, int) and seq_len > max_pos:
        raise HFConfigError(f"seq_len: {seq_len} exceeds max_position_embeddings {max_pos}")
    extra: dict[str, Any] = {}
    if scaling is not None:
        extra = dict(rope_scaling_factor=float(scaling["factor"]),
                     rope_low_freq_factor=float(scaling["low_freq_factor"]),
                     rope_high_freq_factor=float(scaling["high_freq_factor"]),
                     rope_original_max_position=int(scaling["original_max_position_embeddings"]))
    try:
        return ModelConfig(name=name, layers=data["num_hidden_layers"], hidden=hidden, heads=heads,
                           kv_heads=data.get("num_key_value_heads") or heads, ffn=data["intermediate_size"],
                           vocab=data["vocab_size"], seq_len=seq_len, rope_theta=theta,
                           norm_eps=float(data.get("rms_norm_eps", 1e-6)),
                           tie_embeddings=bool(data.get("tie_word_embeddings", False)), **extra)
    except ValueError as e:
        raise HFConfigError(str(e)) from None


def hf_config(cfg: ModelConfig, base: dict[str, Any] | None = None, max_position: int | None = None
              ) -> dict[str, Any]:
    """An HF ``LlamaForCausalLM`` ``config.json`` for ``cfg`` (``tie_word_embeddings`` as it trains).

    ``base`` (the imported checkpoint's config) keeps its other fields (token ids, ...)."""
    out = dict(base or {})
    for k in ("rope_scaling", "rope_parameters", "rope_theta", "torch_dtype", "dtype", "transformers_version"):
        out.pop(k, None)
    rope: dict[str, Any] = {"rope_theta": cfg.rope_theta, "rope_type": "default"}
    if cfg.rope_scaling_factor:
        rope = {"rope_theta": cfg.rope_theta, "rope_type": "llama3", "factor": cfg.rope_scaling_factor,
                "low_freq_factor": cfg.rope_low_freq_factor, "high_freq_factor": cfg.rope_high_freq_factor,
                "original_max_position_embeddings": cfg.rope_original_max_position}
    out.update({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": cfg.hidden,
        "intermediate_size": cfg.ffn, "num_hidden_layers": cfg.layers, "num_attention_heads": cfg.heads,
        "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "vocab_size": cfg.vocab,
        "rms_norm_eps": cfg.norm_eps, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "tie_word_embeddings": cfg.tie_embeddings, "dtype": "float32",
        "max_position_embeddings": max(max_position or 0, int(out.get("max_position_embeddings") or 0), cfg.seq_len),
        # both spellings: rope_theta/rope_scaling for transformers 4.x, rope_parameters for 5.x
        "rope_theta": cfg.rope_theta, "rope_parameters": rope,
    })
    if cfg.rope_scaling_factor:
        out["rope_scaling"] = rope
    return out
