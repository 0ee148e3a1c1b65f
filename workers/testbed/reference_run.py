"""The no-failure baseline of a job: the engine's single-process run of the same spec, no Ray.

Chaos tests and benchmarks compare a job's per-step losses under faults against this curve.
"""

from __future__ import annotations

from typing import Any


def reference_losses(spec: dict[str, Any], timeout_s: float = 600.0, first: int | None = None) -> list[float]:
    """Per-step losses of ``spec`` (a job spec as ``workers.runtime.contract.job_spec.parse_job`` reads it:
    ``model``, ``steps``, ``global_batch``, ``checkpoint_dir``, ...) trained by one process; only its
    ``first`` steps when given (the schedule is still the whole job's: a long job's opening)."""
    from workers.engine.launch import run_ranks

    return run_ranks(_one_rank, 1, {**spec, "_first": first}, timeout_s=timeout_s)[0]


def reference_val_losses(spec: dict[str, Any], timeout_s: float = 600.0) -> dict[int, float]:
    """The validation losses of ``spec``'s one-process run: step (1-based) -> ``val_loss()`` on the
    steps the job evaluates (``TrainConfig.after_step``: every ``eval_every``, and the last)."""
    from workers.engine.launch import run_ranks

    return run_ranks(_one_rank_val, 1, spec, timeout_s=timeout_s)[0]


def _one_rank_val(rank: int, world_size: int, spec: dict[str, Any]) -> dict[int, float]:
    from planner.layout import Layout
    from workers.engine.config import TrainConfig
    from workers.engine.trainer import RankTrainer
    from workers.runtime.contract.job_spec import parse_job

    cfg = TrainConfig.from_dict(parse_job(spec).train)
    trainer = RankTrainer(cfg, Layout(), rank, world_size)
    out: dict[int, float] = {}
    try:
        for _ in range(cfg.steps):
            step = trainer.step().step
            if cfg.after_step(step)[0]:
                out[step] = trainer.val_loss()
        return out
    finally:
        trainer.close()


def _one_rank(rank: int, world_size: int, spec: dict[str, Any]) -> list[float]:
    from planner.layout import Layout
    from workers.engine.config import TrainConfig
    from workers.engine.trainer import RankTrainer
    from workers.runtime.contract.job_spec import parse_job

    spec = dict(spec)
    first = spec.pop("_first", None)
    cfg = TrainConfig.from_dict(parse_job(spec).train)
    trainer = RankTrainer(cfg, Layout(), rank, world_size)
    try:
        return [trainer.step().loss for _ in range(min(cfg.steps, first or cfg.steps))]
    finally:
        trainer.close()
