"""Small random ``transformers`` Llama checkpoints for the HF import/export tests (no downloads)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}


def make_hf_llama(out: Path, tied: bool, seed: int = 0, layers: int = 4, shard_size: str | None = None,
                  **overrides: Any) -> Path:
    """A random ``LlamaForCausalLM`` (hidden 64, 8 heads, 2 KV heads: GQA; rotary ``llama3``
    scaling) saved with ``save_pretrained`` (safetensors). ``initializer_range`` 0.1: logits far
    from uniform, so a wrong weight or rotary layout moves the loss well past the tolerance."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    kw: dict[str, Any] = dict(vocab_size=256, hidden_size=64, intermediate_size=172, num_hidden_layers=layers,
                              num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256,
                              rms_norm_eps=1e-5, initializer_range=0.1, tie_word_embeddings=tied,
                              rope_parameters=dict(LLAMA3_ROPE))
    kw.update(overrides)
    model = LlamaForCausalLM(LlamaConfig(**kw))
    # random norm weights too (HF initialises them to 1): a swapped norm would go unnoticed otherwise
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    save_kw = {"max_shard_size": shard_size} if shard_size else {}
    model.save_pretrained(out, **save_kw)
    return out


def hf_window_loss(path: Path, batch: torch.Tensor) -> float:
    """``transformers``' mean next-token cross-entropy of ``batch [B, S+1]`` (S inputs, S targets)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(batch[:, :-1]).logits
    return float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                                   batch[:, 1:].reshape(-1)))


class NoBackward:
    """Inside it, any backward pass raises and every module forward is recorded with whether
    autograd was recording (``grad_calls``): evaluation must leave both at zero."""

    def __enter__(self) -> NoBackward:
        self.forward_calls = 0
        self.grad_calls = 0
        self._saved = (torch.autograd.backward, torch.Tensor.backward)

        def refuse(*_a: Any, **_k: Any) -> None:
            raise AssertionError("a backward pass ran during evaluation")

        def seen(_mod: Any, _args: Any, _out: Any) -> None:
            self.forward_calls += 1
            self.grad_calls += int(torch.is_grad_enabled())

        torch.autograd.backward = refuse  # type: ignore[assignment]
        torch.Tensor.backward = refuse  # type: ignore[method-assign]
        self._hook = torch.nn.modules.module.register_module_forward_hook(seen)
        return self

    def __exit__(self, *exc: object) -> None:
        torch.autograd.backward, torch.Tensor.backward = self._saved  # type: ignore[assignment]
        self._hook.remove()


def train_then_eval_loss(trainer: Any, batch: torch.Tensor) -> tuple[float, float]:
    """``batch``'s loss through the training path (``forward_backward``), then forward only
    (``forward_loss``) under :class:`NoBackward`: no backward pass may run, no module under
    autograd, and no gradient is left behind."""
    loss = trainer.forward_backward(batch)
    for p in trainer.params:
        p.grad = None
    with NoBackward() as nb:
        evaluated = trainer.forward_loss(batch)
    assert nb.forward_calls > 0 and nb.grad_calls == 0, nb.grad_calls
    assert all(p.grad is None for p in trainer.params)
    return loss, evaluated


def oracle_case(out: Path, text: Path, seed: int, seq: int, windows: int = 8) -> tuple[dict, torch.Tensor, float]:
    """An oracle case: a random untied ``LlamaForCausalLM`` saved under ``out``, ``windows`` real-text
    windows of ``seq + 1`` bytes of ``text``, and transformers' loss on them. Returns the
    ``TrainConfig`` (as a dict) that imports the model, the batch and that loss."""
    from workers.engine.config import TrainConfig
    from workers.engine.hf import model_config_from_hf, read_hf_config

    hf = make_hf_llama(out, tied=False, seed=seed)
    data = torch.tensor(list(text.read_bytes()), dtype=torch.long)
    batch = torch.stack([data[i * seq:i * seq + seq + 1] for i in range(windows)])
    model = dataclasses.replace(model_config_from_hf(read_hf_config(hf), seq, name="hf"), hf=str(hf))
    cfg = TrainConfig(model=model, steps=1, global_batch=windows)
    return cfg.to_dict(), batch, hf_window_loss(hf, batch)
