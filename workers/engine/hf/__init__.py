"""Hugging Face Llama checkpoints in and out: ``config.json`` <-> :class:`ModelConfig`, and
``*.safetensors`` read slice by slice into a rank's shards (import) or written tensor by tensor
from them (export). No ``transformers`` needed: only ``safetensors``."""

from workers.engine.hf.config import HFConfigError, hf_config, model_config_from_hf, read_hf_config
from workers.engine.hf.weights import HFCheckpoint, hf_name, load_hf_shards

__all__ = [
    "HFCheckpoint",
    "HFConfigError",
    "hf_config",
    "hf_name",
    "load_hf_shards",
    "model_config_from_hf",
    "read_hf_config",
]
