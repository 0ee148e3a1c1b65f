"""Shared specs for the planner tests."""

from __future__ import annotations

from typing import Any

import pytest

TINY_MODEL = {"layers": 4, "hidden": 64, "heads": 8, "kv_heads": 4, "ffn": 172, "vocab": 256, "seq_len": 64}


def tiny_spec(**overrides: Any) -> dict[str, Any]:
    """The runtime's test job: 3 nodes x 4 fake GPUs and a tiny model."""
    spec: dict[str, Any] = {
        "model": dict(TINY_MODEL),
        "cluster": {"gpu_type": "cpu", "nodes": [{"id": f"node-{i}", "gpus": 4} for i in range(3)]},
        "training": {"global_batch": 12},
        "precision": "bf16",
    }
    spec.update(overrides)
    return spec


def a100_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"name": "llama3-8b"},
        "cluster": {"gpu_type": "A100-SXM4-80GB", "num_gpus": 32, "gpus_per_node": 8},
        "training": {"global_batch": 256},
        "precision": "bf16",
    }
    spec.update(overrides)
    return spec


@pytest.fixture
def tiny() -> dict[str, Any]:
    return tiny_spec()


@pytest.fixture
def a100() -> dict[str, Any]:
    return a100_spec()
