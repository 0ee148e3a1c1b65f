"""The cluster's GPU profile (``ORTHOPLEX_GPU_TYPE``, a service setting) reaches the runtime's planner: the controller
reads it, every attempt's spec carries it, and the supervisor's first plan is priced on it."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import sqlalchemy as sa

import planner
from service.controller.apply import supervisor_spec
from service.controller.cluster_snapshot import JobRow
from service.controller.loop import Controller
from workers.runtime.cluster.placement_groups import NodeCapacity
from workers.runtime.contract.job_spec import parse_job
from workers.runtime.policy.planning import first_plan, planner_spec

pytestmark = pytest.mark.unit


def _job() -> JobRow:
    spec = {"model": "tiny", "global_batch": 8, "steps": 4, "min_gpus": 1, "max_gpus": 4}
    return JobRow(id=7, tenant_id=1, name="j", state="PENDING", priority=0, min_gpus=1, max_gpus=4, attempt=1,
                  epoch=0, cancel_requested=False, gpus_allocated=0, spec=spec, created_at=0.0,
                  admitted_at=None)


def _ctx(gpu_type: str) -> types.SimpleNamespace:
    from service.controller.context import ControllerConfig

    config = ControllerConfig()  # the attempt spec resolves the job's inputs with the storage settings
    return types.SimpleNamespace(gpu_type=gpu_type, gpus_per_node=4, config=config, recoveries={},
                                 job_storage=lambda job_id: Path("/jobs") / str(job_id))


def test_controller_takes_the_service_gpu_profile(monkeypatch) -> None:
    monkeypatch.setenv("ORTHOPLEX_GPU_TYPE", "H100")
    monkeypatch.setenv("ORTHOPLEX_GPUS_PER_NODE", "8")
    ctl = Controller(sa.create_engine("sqlite://"))
    assert (ctl.ctx.gpu_type, ctl.ctx.gpus_per_node) == ("H100", 8)


def test_attempt_spec_carries_the_profile_and_the_first_plan_is_priced_on_it() -> None:
    nodes = [NodeCapacity(id=f"n{i}", gpus=2, free_gpus=2, cpus=4.0, is_head=False) for i in range(2)]
    plans = {}
    for gpu in ("CPU", "H100"):
        spec = supervisor_spec(_ctx(gpu), _job(), gpus=4)
        assert spec["gpu_type"] == gpu
        job = parse_job(spec)
        assert planner_spec(job, nodes)["cluster"]["gpu_type"] == gpu
        plans[gpu] = first_plan(job, nodes)
    h100 = planner.plan({"model": {"name": "tiny"}, "cluster": {"gpu_type": "H100", "num_gpus": 4},
                         "parallel": {"global_batch": 8}}).plans[0]
    # priced on the H100 profile (the tiny model is launch-bound, so "only" ~10x the CPU stand-in)
    assert plans["H100"].estimate.tokens_per_s > 5 * plans["CPU"].estimate.tokens_per_s
    assert plans["H100"].estimate.tokens_per_s == pytest.approx(h100.estimate.tokens_per_s, rel=0.5)


def test_the_service_mlflow_uri_reaches_every_attempt_unless_the_job_names_its_own(monkeypatch, tmp_path) -> None:
    """``ORTHOPLEX_MLFLOW_TRACKING_URI`` (a service setting) -> the controller's config -> the attempt's
    tracking, beside the job's TensorBoard directory; a job spec's ``tracking.mlflow_uri`` wins."""
    from service.controller.runner import config_from_env
    from service.settings import Settings

    monkeypatch.setenv("ORTHOPLEX_MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    cfg = config_from_env(Settings(database_url="sqlite://", storage_path=str(tmp_path)))
    ctx = types.SimpleNamespace(gpu_type="CPU", gpus_per_node=4, recoveries={}, config=cfg,
                                job_storage=lambda job_id: tmp_path / "jobs" / str(job_id))
    tracking = supervisor_spec(ctx, _job(), gpus=4)["tracking"]
    assert tracking["mlflow_uri"] == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert tracking["tensorboard_dir"].startswith(str(tmp_path / "jobs" / "7"))
    own = _job()
    own.spec["tracking"] = {"mlflow_uri": "file:///elsewhere"}
    assert supervisor_spec(ctx, own, gpus=4)["tracking"]["mlflow_uri"] == "file:///elsewhere"
