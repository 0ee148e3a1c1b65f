"""Configuration dataclasses of the engine: model shape, data source, training run.

All three are plain dataclasses, JSON-serialisable through ``to_dict``/``from_dict`` so they can be
stored with a job attempt and shipped to Ray actors.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.profiles import MODEL_PRESETS as _PLANNER_PRESETS


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a Llama-style decoder (RMSNorm, RoPE, GQA, SwiGLU; head untied unless ``tie_embeddings``)."""

    name: str = "tiny"
    layers: int = 4
    hidden: int = 64
    heads: int = 8
    kv_heads: int = 4
    ffn: int = 172
    vocab: int = 256
    seq_len: int = 64
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02
    # Llama 3.1 rotary scaling (``rope_type: llama3``); factor 0 = none
    rope_scaling_factor: float = 0.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position: int = 8192
    #: one parameter for the token embedding and the output head (``tie_word_embeddings``): with
    #: pipeline stages, the first and the last stage each hold a copy kept identical (gradients summed
    #: between them before the update, as Megatron does)
    tie_embeddings: bool = False
    #: the HF Llama checkpoint directory this shape came from (its ``config.json``) and the weights
    #: start from (instead of the seed); the job spec's ``model.hf``, resolved. None: a preset or shape
    hf: str | None = None

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"model field '{name}' must be an integer >= 1, got {value!r}")
        if self.hidden % self.heads:
            raise ValueError(f"model hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"model heads {self.heads} is not divisible by kv_heads {self.kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"model head_dim {self.head_dim} must be even for rotary embeddings")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def num_params(self) -> int:
        """Parameter count (embedding + layers + final norm + head, unless tied to the embedding)."""
        hd = self.head_dim
        attn = self.hidden * hd * (self.heads * 2 + self.kv_heads * 2)
        mlp = 3 * self.hidden * self.ffn
        per_layer = attn + mlp + 2 * self.hidden
        heads = 1 if self.tie_embeddings else 2
        return heads * self.vocab * self.hidden + self.layers * per_layer + self.hidden

    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6 * non-embedding params + attention (12 * L * h * s / 2 causal);
        the head's matmul counts whether or not it shares the embedding's weight."""
        non_embed = self.num_params() - (0 if self.tie_embeddings else self.vocab * self.hidden)
        return 6.0 * non_embed + 6.0 * self.layers * self.hidden * self.seq_len

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown model field(s): {', '.join(unknown)}")
        return cls(**data)

    @classmethod
    def preset(cls, name: str) -> ModelConfig:
        if name not in MODEL_PRESETS:
            raise ValueError(f"unknown model preset {name!r}; known: {', '.join(MODEL_PRESETS)}")
        return cls(name=name, **MODEL_PRESETS[name])

    @classmethod
    def from_json(cls, path: str | Path) -> ModelConfig:
        """Read a shape from a JSON file: either a full dict or ``{"preset": NAME, ...overrides}``."""
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a JSON object")
        data = dict(data.get("model", data))  # accept a planner-style spec with a "model" key
        data.pop("params_b", None)
        if "preset" in data:
            base = cls.preset(str(data.pop("preset"))).to_dict()
            base.update(data)
            data = base
        data.setdefault("name", Path(path).stem)
        return cls.from_dict(data)


# The planner's presets are the source of the names and shapes (so a plan and the engine agree);
# the engine adds a few small/1B shapes and the Llama-3 rotary base.
_ENGINE_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(layers=4, hidden=64, heads=8, kv_heads=4, ffn=172, vocab=256, seq_len=64),
    "small": dict(layers=8, hidden=256, heads=8, kv_heads=4, ffn=688, vocab=256, seq_len=256),
    "llama-1b": dict(layers=16, hidden=2048, heads=32, kv_heads=8, ffn=8192, vocab=128256, seq_len=2048,
                     rope_theta=500000.0),
    "llama3-1b": dict(layers=16, hidden=2048, heads=32, kv_heads=8, ffn=8192, vocab=128256, seq_len=2048,
                      rope_theta=500000.0),
}
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    **{name: dict(shape, **({"rope_theta": 500000.0} if name.startswith("llama3") else {}))
       for name, shape in _PLANNER_PRESETS.items()},
    **_ENGINE_PRESETS,
}
PLANNER_MODEL_KEYS = ("name", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len")


def planner_model(model: str | Mapping[str, Any]) -> dict[str, Any]:
    """The planner's ``model`` fields for a preset name or an explicit shape (a job spec's ``model``):
    the shape the engine will build, without engine-only fields such as ``rope_theta``."""
    if isinstance(model, str):
        return {"name": model, **{k: v for k, v in MODEL_PRESETS[model].items() if k in PLANNER_MODEL_KEYS}}
    return {k: model[k] for k in PLANNER_MODEL_KEYS if k in model}


@dataclass(frozen=True)
class DataConfig:
    """Where the tokens come from: ``builtin`` (stdlib sources), ``text`` files or ``tokens`` memmaps."""

    kind: str = "builtin"
    paths: tuple[str, ...] = ()
    dtype: str = "uint16"
    #: ``workers.data_area.DataArea.to_dict()`` when a tenant's job reads: paths are then relative
    #: to it and resolved by ``workers.data_area`` again where the engine reads (None: paths as given)
    area: dict[str, Any] | None = None
    tokenizer: str | None = None  # text kind: a tokenizers JSON / HF tokenizer dir instead of bytes

    def __post_init__(self) -> None:
        if self.kind not in ("builtin", "text", "tokens"):
            raise ValueError(f"data kind must be builtin|text|tokens, got {self.kind!r}")
        if self.dtype not in ("uint16", "uint32"):
            raise ValueError(f"data dtype must be uint16|uint32, got {self.dtype!r}")
        object.__setattr__(self, "paths", tuple(str(p) for p in self.paths))

    def to_dict(self) -> dict[str, Any]:
        d = {"kind": self.kind, "paths": list(self.paths), "dtype": self.dtype}
        if self.area is not None:
            d["area"] = dict(self.area)
        if self.tokenizer is not None:
            d["tokenizer"] = self.tokenizer
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DataConfig:
        return cls(kind=data.get("kind", "builtin"), paths=tuple(data.get("paths", ())),
                   dtype=data.get("dtype", "uint16"), area=data.get("area"), tokenizer=data.get("tokenizer"))

    @classmethod
    def from_path(cls, path: str | None) -> DataConfig:
        """``None`` -> builtin corpus; ``*.bin``/``*.tok``/``*.u16``/``*.u32`` -> token memmap; else text."""
        if not path:
            return cls()
        p = Path(path)
        if p.suffix in (".bin", ".u16", ".npy", ".tokens", ".tok"):
            return cls(kind="tokens", paths=(str(p),), dtype="uint16")
        if p.suffix == ".u32":
            return cls(kind="tokens", paths=(str(p),), dtype="uint32")
        return cls(kind="text", paths=(str(p),))


@dataclass(frozen=True)
class ExportConfig:
    """What the job writes after its last step (the job spec's ``export``): ``format`` ``hf`` is a
    transformers-loadable directory, written to ``dir`` (the control plane sets it in the job's directory)."""

    format: str = "hf"
    dir: str = ""

    def __post_init__(self) -> None:
        if self.format != "hf":
            raise ValueError(f"export format must be hf, got {self.format!r}")
        if not self.dir:
            raise ValueError("export dir: required (where the export is written)")

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "dir": self.dir}


def _from_legacy(d: dict[str, Any]) -> dict[str, Any]:
    """A stored train config (a checkpoint manifest's ``extra["train"]``) under the names used before
    the job spec's names reached the engine: ``init_hf`` is ``model.hf``, ``export_hf`` is
    ``export.dir``, ``val_data`` is ``eval_data``. :meth:`TrainConfig.from_dict` reads them; nothing
    writes them."""
    if "val_data" in d:
        d.setdefault("eval_data", d.pop("val_data"))
    init_hf = d.pop("init_hf", None)
    if init_hf:
        d["model"] = {**dict(d.get("model") or {}), "hf": init_hf}
    export_hf = d.pop("export_hf", None)
    if export_hf:
        d.setdefault("export", {"format": "hf", "dir": export_hf})
    return d


@dataclass
class TrainConfig:
    """One training run: model, schedule of the optimizer, data and checkpoint cadence."""

    model: ModelConfig = field(default_factory=ModelConfig)
    steps: int = 10
    global_batch: int = 8
    seed: int = 0
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 2
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    beta1: float = 0.9
    beta2: float = 0.95
    data: DataConfig = field(default_factory=DataConfig)
    checkpoint_dir: str | None = None
    export: ExportConfig | None = None  # after the last step (the weights as an HF checkpoint directory)
    eval_every: int = 0  # validation loss every K steps (and after the last) on eval_data
    eval_data: DataConfig | None = None
    eval_batches: int = 2  # validation windows: the first eval_batches * global_batch of eval_data
    save_every: int = 0
    keep_checkpoints: int = 2

    def __post_init__(self) -> None:
        if isinstance(self.model, str):
            self.model = ModelConfig.preset(self.model)
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.global_batch < 1:
            raise ValueError(f"global_batch must be >= 1, got {self.global_batch}")
        if self.warmup_steps < 0 or self.save_every < 0:
            raise ValueError("warmup_steps and save_every must be >= 0")
        if self.keep_checkpoints < 1:
            raise ValueError("keep_checkpoints must be >= 1")
        if self.eval_every < 0 or self.eval_batches < 1:
            raise ValueError("eval_every must be >= 0 and eval_batches >= 1")
        if self.eval_every and self.eval_data is None:
            raise ValueError("eval_every needs eval_data")

    def after_step(self, step: int) -> tuple[bool, bool]:
        """Whether step ``step`` (1-based) is followed by the validation loss (every ``eval_every``
        steps, and the last) and by the HF export (the last): the one rule ranks and supervisors read."""
        return (bool(self.eval_every) and (step % self.eval_every == 0 or step == self.steps),
                self.export is not None and step == self.steps)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["model"] = self.model.to_dict()
        d["data"] = self.data.to_dict()
        d["eval_data"] = self.eval_data.to_dict() if self.eval_data is not None else None
        d["export"] = self.export.to_dict() if self.export is not None else None
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        d = _from_legacy(dict(data))
        d["model"] = ModelConfig.from_dict(d.get("model", {}))
        d["data"] = DataConfig.from_dict(d.get("data", {}))
        if d.get("eval_data") is not None:
            d["eval_data"] = DataConfig.from_dict(d["eval_data"])
        if d.get("export") is not None:
            d["export"] = ExportConfig(**d["export"])
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown train field(s): {', '.join(unknown)}")
        return cls(**d)
