"""Which (model, layout, batch) combinations the engine runs, and why not. Pure Python (no torch).

The rules live in :mod:`planner.engine_rules` (their one home, shared with the planner's engine-only
plans); this module words them for the engine's callers. The CLI calls :func:`layout_problems`
before any process starts; the trainer calls it again.
"""

from __future__ import annotations

from planner import engine_rules
from planner.layout import Layout
from workers.engine.config import ModelConfig


def tp_refusal(cfg: ModelConfig, tp: int) -> str | None:
    """Why tensor parallelism ``tp`` cannot split ``cfg`` (None: it can)."""
    r = engine_rules.tp_rule(cfg, tp)
    return r[1] if r else None


def layout_problems(cfg: ModelConfig, layout: Layout, global_batch: int, world_size: int | None = None
                    ) -> list[str]:
    """Every reason ``layout`` cannot train ``cfg`` with ``global_batch`` (empty when it can)."""
    return [reason for _field, reason in engine_rules.refusals(cfg, layout, global_batch, world_size)]
