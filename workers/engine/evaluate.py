"""Evaluation loss on fixed windows of a text file, and the rank bodies of ``orthoplex eval`` /
``orthoplex export``.

Windows (the definition ``orthoplex eval`` documents in docs/engine.md): the token stream of a
plain text file is the tokenizer's encoding of the whole file with no special tokens added (the
byte tokenizer: its UTF-8 bytes); window ``i`` is tokens ``[i*S, i*S + S]`` inclusive -- ``S``
inputs and their ``S`` next tokens. The loss is the mean next-token cross-entropy over the first
``N`` windows (every window has ``S`` targets, so also the mean over the ``N*S`` target tokens);
``--batch-size`` only groups windows for computing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch


def text_stream(path: str | Path, tokenizer: str | Path | None) -> np.ndarray:
    """The token stream of a whole text file (no special tokens; bytes without a tokenizer)."""
    data = Path(path).read_bytes()
    if tokenizer is None:
        return np.frombuffer(data, dtype=np.uint8).astype(np.int64)
    from workers.engine.data.hf_tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer)
    return np.asarray(tok.encode(data.decode("utf-8"), add_special_tokens=False).ids, dtype=np.int64)


def windows(stream: np.ndarray, seq_len: int, n: int) -> torch.Tensor:
    """Windows ``0..n-1`` of ``stream``: row ``i`` is tokens ``[i*S, i*S + S]`` (``S + 1`` tokens)."""
    need = n * seq_len + 1
    if len(stream) < need:
        raise ValueError(f"batches: {n} windows of {seq_len} tokens need {need} tokens, the data has {len(stream)}")
    return torch.stack([torch.from_numpy(stream[i * seq_len:i * seq_len + seq_len + 1].copy()) for i in range(n)])


def checkpoint_config(checkpoint_dir: str | Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]:
    """(train config, layout, imported HF config or None) of the newest verified checkpoint, the
    train config without ``model.hf`` (its weights come from the checkpoint)."""
    from workers.engine.checkpoint import find_latest_verified
    from workers.engine.hf.config import read_hf_config

    rec, _ = find_latest_verified(checkpoint_dir)
    if rec is None:
        raise ValueError(f"checkpoint-dir: no verified checkpoint under {checkpoint_dir}")
    from workers.engine.config import TrainConfig

    train = dict(rec.manifest.extra.get("train") or {})
    if not train or not rec.manifest.layout:
        raise ValueError(f"checkpoint-dir: {rec.path} has no train config or layout in its manifest")
    train = TrainConfig.from_dict(train).to_dict()  # a manifest written under the old names reads too
    hf = train["model"].get("hf")
    base = read_hf_config(hf) if hf and Path(hf).is_dir() else None
    train.update(model={**train["model"], "hf": None}, export=None, checkpoint_dir=None)
    return train, rec.manifest.layout, base


def eval_rank(rank: int, world: int, cfg_dict: dict[str, Any], layout_dict: dict[str, Any],
              batches: list[torch.Tensor], checkpoint_dir: str | None) -> float:
    """Mean loss of ``batches`` (each ``[B, S+1]``) under the layout, from ``cfg.model.hf`` or the newest
    checkpoint under ``checkpoint_dir``."""
    from planner.layout import Layout
    from workers.engine.checkpoint import load_latest
    from workers.engine.config import TrainConfig
    from workers.engine.trainer import RankTrainer

    torch.set_num_threads(1)
    cfg = TrainConfig.from_dict(cfg_dict)
    trainer = RankTrainer(cfg, Layout.from_dict(layout_dict), rank, world)
    try:
        if checkpoint_dir is not None and load_latest(checkpoint_dir, trainer.app_state()) is None:
            raise ValueError(f"checkpoint-dir: no verified checkpoint under {checkpoint_dir}")
        # forward only: no autograd graph, no backward pass (the pipeline through its schedule's eval)
        return sum(trainer.forward_loss(b) for b in batches) / len(batches)
    finally:
        trainer.close()


def export_rank(rank: int, world: int, cfg_dict: dict[str, Any], layout_dict: dict[str, Any],
                checkpoint_dir: str, out: str, base_config: dict[str, Any] | None) -> str:
    """Load the newest checkpoint under ``checkpoint_dir`` and write it as an HF directory ``out``."""
    from planner.layout import Layout
    from workers.engine.checkpoint import load_latest
    from workers.engine.config import TrainConfig
    from workers.engine.trainer import RankTrainer

    torch.set_num_threads(1)
    cfg = TrainConfig.from_dict(cfg_dict)
    trainer = RankTrainer(cfg, Layout.from_dict(layout_dict), rank, world)
    try:
        if load_latest(checkpoint_dir, trainer.app_state()) is None:
            raise ValueError(f"checkpoint-dir: no verified checkpoint under {checkpoint_dir}")
        return trainer.export_hf(out, base_config)
    finally:
        trainer.close()
