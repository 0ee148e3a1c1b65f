"""Hugging Face Llama checkpoints in and out: ``config.json`` <-> :class:`ModelConfig`, and
``*.safetensors`` read slice by slice into a rank's shards (import) or written tensor by tensor
from them (export). No ``transformers`` needed: only ``safetensors``.

``config`` and ``headers`` (the header-only check the control plane runs) import no torch; the
torch parts (``weights``: ``HFCheckpoint``, ``load_hf_shards``) load on first use of their names.
"""

from typing import Any

from workers.engine.hf.config import HFConfigError, hf_config, model_config_from_hf, read_hf_config
from workers.engine.hf.headers import HFWeightsError, check_checkpoint, hf_name

__all__ = [
    "HFCheckpoint",
    "HFConfigError",
    "HFWeightsError",
    "check_checkpoint",
    "hf_config",
    "hf_name",
    "load_hf_shards",
    "model_config_from_hf",
    "read_hf_config",
]

_TORCH_NAMES = ("HFCheckpoint", "load_hf_shards")


def __getattr__(name: str) -> Any:
    """``HFCheckpoint`` and ``load_hf_shards`` import torch: only when asked for."""
    if name in _TORCH_NAMES:
        from workers.engine.hf import weights

        return getattr(weights, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
