"""A submitted job's own plan is goodput-aware: its ``duration_days`` and ``failure_rates`` reach the
planner through the runtime's spec (``workers/runtime/policy/planning.py``), no Ray needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.runtime.cluster.placement_groups import NodeCapacity
from workers.runtime.contract.job_spec import parse_job
from workers.runtime.policy.planning import first_plan, planner_spec

pytestmark = pytest.mark.unit

NODES = [NodeCapacity(id=f"n{i}", gpus=4, free_gpus=4, cpus=8.0, is_head=False) for i in range(2)]


def _job(tmp_path: Path, **extra: object):
    return parse_job({"model": "tiny", "steps": 2, "global_batch": 8, "min_gpus": 1, "max_gpus": 8,
                      "checkpoint_dir": str(tmp_path / "ckpt"), **extra})


def test_the_runtime_plan_carries_the_recovery_choice(tmp_path: Path) -> None:
    job = _job(tmp_path, duration_days=7, failure_rates="rsc")
    spec = planner_spec(job, NODES)
    assert spec["duration_days"] == 7 and spec["failure_rates"] == "rsc"
    plan = first_plan(job, NODES)
    assert plan.ettr is not None and 0 < plan.ettr <= 1 and plan.recovery["policy"]


def test_cluster_rates_price_with_llama3_in_the_runtime(tmp_path: Path) -> None:
    spec = planner_spec(_job(tmp_path, duration_days=1, failure_rates="cluster"), NODES)
    assert spec["failure_rates"] == "llama3"


def test_without_a_duration_the_plan_is_the_healthy_one(tmp_path: Path) -> None:
    job = _job(tmp_path)
    assert "duration_days" not in planner_spec(job, NODES)
    assert first_plan(job, NODES).ettr is None


def test_bad_goodput_fields_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="duration_days"):
        _job(tmp_path, duration_days=-1)
    with pytest.raises(ValueError, match="failure_rates"):
        _job(tmp_path, duration_days=1, failure_rates="mars")
