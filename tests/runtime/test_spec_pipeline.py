"""One job-spec pipeline: every field of the REST job spec (``service.api.schemas.JobSpec``, walked
recursively, every branch of ``model``) reaches the runtime's parsed spec under its own name, through
the one translation (``workers.runtime.contract.attempt_spec``), unless the translation marks it
control-plane only. A field added to the API and forgotten on the way fails here; a field the
runtime does not know is refused by the translation, never dropped."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from service.api.schemas import JobSpec as ApiJobSpec
from tests.engine.hf_fixtures import make_hf_llama
from tests.engine.test_hf_data import _bpe
from workers.data_area import DataArea
from workers.engine.config import TrainConfig
from workers.runtime.contract.attempt_spec import (
    CONTROL_PLANE_ONLY,
    GRANTED,
    LANDS_AT,
    RECOVERY_LANDS_AT,
    Grant,
    attempt_spec,
)
from workers.runtime.contract.job_spec import FLAT_NAMES, GROUPS, JobSpec, RuntimeSettings, parse_job

pytestmark = pytest.mark.unit

Path_ = tuple[str, ...]

#: one API spec per branch of ``model``; together they set every field of the schema (checked below)
SAMPLES: dict[str, dict[str, Any]] = {
    "hf": {"name": "ft", "model": {"hf": "llama", "seq_len": 32}, "steps": 4, "global_batch": 4,
           "min_gpus": 1, "max_gpus": 2, "priority": 3, "preemptible": False, "elastic": True, "seed": 11,
           "lr": 0.002, "min_lr": 0.0002, "warmup_steps": 1, "weight_decay": 0.05, "grad_clip": 0.5,
           "keep_checkpoints": 3, "data": {"kind": "text", "paths": ["train.txt"], "dtype": "uint16"},
           "tokenizer": "tokenizer.json", "eval_every": 2, "eval_data": {"kind": "text", "paths": ["held-out.txt"]},
           "eval_batches": 1, "export": {"format": "hf"},
           "tracking": {"mlflow_uri": "http://mlflow.internal:5000", "experiment": "walk"},
           "checkpoint": {"min_every_steps": 2, "max_every_steps": 6, "mtbf_s": 900.0},
           "duration_days": 3.5, "failure_rates": "rsc",
           "layout_hint": {"tp": 2, "pp": 2, "cp": 1, "dp": 1, "dp_replicate": 1, "vpp": 1, "micro_batch": 1,
                           "sp": True, "zero": 1, "recompute": "layer:2", "schedule": "1f1b", "cp_method": "ring"}},
    "shape": {"name": "shaped", "steps": 3, "global_batch": 8,
              "model": {"name": "mine", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128,
                        "vocab": 512, "seq_len": 32, "rope_theta": 20000.0},
              "data": {"kind": "tokens", "paths": ["tokens.u32"], "dtype": "uint32"}},
    "preset": {"name": "plain", "model": "tiny", "steps": 2, "global_batch": 4},
    "recovery": {"name": "groups", "model": "tiny", "steps": 2, "global_batch": 4, "max_gpus": 2,
                 "recovery": {"policy": "replica_groups", "groups": 2, "snapshots": {"enabled": False, "every": 3},
                              "warm_ranks": 2}},
}


def _grant_recovery(stored: dict[str, Any]) -> dict[str, Any] | None:
    """The control plane's choice for a sample with a ``recovery`` block: on a real plan of 2 GPUs
    (``tp=1,dp=2``), by the one rule (``planner.recovery_choice.choose``)."""
    if "recovery" not in stored:
        return None
    from planner.api import evaluate
    from planner.recovery_choice import choose
    from workers.planner_spec import PlanCluster, to_planner_spec

    pspec = to_planner_spec(stored, PlanCluster(gpu_type="CPU", num_gpus=2, gpus_per_node=2))
    return choose(evaluate(pspec, "tp=1,dp=2"), stored["recovery"], pspec).to_dict()


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models inside an annotation (through Annotated, unions, lists, Optional)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def schema_paths(model: type[BaseModel], prefix: Path_ = ()) -> set[Path_]:
    """Every field of ``model``, recursively: ``("model",)``, ``("model", "hf")``, ``("data", "paths")``..."""
    out: set[Path_] = set()
    for name, f in model.model_fields.items():
        path = (*prefix, name)
        out.add(path)
        for sub in _models(f.annotation):
            out |= schema_paths(sub, path)
    return out


def value_paths(value: Any, prefix: Path_ = ()) -> dict[Path_, Any]:
    """Every (nested) field a stored spec sets, with its value."""
    out: dict[Path_, Any] = {prefix: value} if prefix else {}
    if isinstance(value, dict):
        for k, v in value.items():
            out.update(value_paths(v, (*prefix, k)))
    return out


def runtime_view(job: JobSpec) -> dict[str, Any]:
    """The parsed runtime spec as one nested dict: its own fields and the engine's ``TrainConfig``'s."""
    top = {f.name: getattr(job, f.name) for f in dataclasses.fields(job) if f.name not in ("train", "raw")}
    view = {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for k, v in top.items()}
    return {**view, **TrainConfig.from_dict(job.train).to_dict()}


def lookup(view: Any, path: Path_) -> Any:
    for key in path:
        if not isinstance(view, dict) or key not in view:
            raise KeyError(".".join(path))
        view = view[key]
    return view


@pytest.fixture(scope="module")
def area(tmp_path_factory: pytest.TempPathFactory) -> DataArea:
    root = tmp_path_factory.mktemp("walk-area")
    make_hf_llama(root / "llama", tied=False, layers=2, vocab_size=320)
    text = "".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(200))
    (root / "train.txt").write_text(text)
    (root / "held-out.txt").write_text(text[:2000])
    _bpe(root / "tokenizer.json", 300, [root / "train.txt"])
    return DataArea(root=root)


def test_the_samples_set_every_field_of_the_api_schema() -> None:
    """So that the walk below covers a new field: it needs a sample value here first."""
    covered: set[Path_] = set()
    for body in SAMPLES.values():
        covered |= set(value_paths(ApiJobSpec.model_validate(body).stored()))
    assert schema_paths(ApiJobSpec) - covered == set(), "give these API fields a value in SAMPLES"


@pytest.mark.parametrize("sample", sorted(SAMPLES))
def test_every_api_field_reaches_the_runtime_spec_under_its_name(sample: str, area: DataArea, tmp_path: Path) -> None:
    stored = ApiJobSpec.model_validate(SAMPLES[sample]).stored()  # as the API stores it
    grant = Grant(job_id=5, job_dir=tmp_path / "jobs" / "5", gpus=2, min_gpus=1, gpu_type="CPU",
                  recovery=_grant_recovery(stored))
    spec = attempt_spec(stored, area, grant)
    view = runtime_view(parse_job(spec))  # what the supervisor holds (parsed once, by launch)
    missed = []
    for path, value in value_paths(stored).items():
        if path[0] in CONTROL_PLANE_ONLY:
            assert path[0] not in spec, f"{path[0]} is control-plane only but reached the runtime"
            continue
        if isinstance(value, dict):
            continue  # its leaves are checked one by one
        if path[0] == "recovery":  # through the control plane's choice, to the runtime settings
            got = lookup(view, RECOVERY_LANDS_AT[path])
            assert got == (value if path[-1] != "policy" else stored["recovery"]["groups"]), (path, got, value)
            continue
        landings = LANDS_AT.get(path[0], (path,))
        for where in landings:
            if path[0] in LANDS_AT and where[0] not in stored:
                continue  # the tokenizer lands on the data it reads; this spec has no such data
            try:
                got = lookup(view, where)
            except KeyError:
                missed.append(".".join(path))
                continue
            if path == ("model",):  # a preset name: the engine holds the preset's shape under its name
                got = got["name"]
            if path in (("model", "hf"), ("tokenizer",)):  # resolved in the tenant's area
                assert got == str((area.root / value).resolve()), (path, got)
            elif path[0] in GRANTED:  # the scheduler's grant
                assert got == {"min_gpus": 1, "max_gpus": 2}[path[0]], (path, got)
            else:
                assert got == value, (path, got, value)
    assert missed == [], f"API fields that never reach the runtime spec: {missed}"


def test_a_field_the_runtime_does_not_know_is_refused_not_dropped(area: DataArea, tmp_path: Path) -> None:
    stored = {**ApiJobSpec.model_validate(SAMPLES["preset"]).stored(), "budget_usd": 10}
    grant = Grant(job_id=5, job_dir=tmp_path / "jobs" / "5", gpus=1, min_gpus=1, gpu_type="CPU")
    with pytest.raises(ValueError, match="budget_usd"):
        attempt_spec(stored, area, grant)


def test_the_walk_sees_the_union_branches_of_model() -> None:
    paths = schema_paths(ApiJobSpec)
    assert {("model", "hf"), ("model", "seq_len"), ("model", "rope_theta"), ("layout_hint", "cp_method"),
            ("tracking", "mlflow_uri"), ("eval_data", "dtype")} <= paths


def test_runtime_settings_read_the_flat_wire_form_and_the_grouped_one() -> None:
    """``RuntimeSettings`` is grouped by concern; a stored spec's or an override's flat ``runtime``
    (the wire form before the grouping) still loads, name for name."""
    flat = {"placement_timeout_s": 7.0, "hang_timeout_s": 5.0, "straggler_window": 3, "snapshots": True,
            "snapshot_every": 2, "replica_retry_s": 1.0, "max_recoveries": 4, "grow": False}
    grouped = {"placement": {"timeout_s": 7.0, "grow": False}, "detection": {"hang_timeout_s": 5.0},
               "stragglers": {"window": 3}, "snapshots": {"enabled": True, "every": 2}, "replicas": {"retry_s": 1.0},
               "max_recoveries": 4}
    s = RuntimeSettings.from_dict(flat)
    assert s == RuntimeSettings.from_dict(grouped)
    assert (s.placement.timeout_s, s.detection.hang_timeout_s, s.stragglers.window, s.snapshots.enabled,
            s.snapshots.every, s.replicas.retry_s, s.max_recoveries, s.placement.grow) == (7.0, 5.0, 3, True, 2, 1.0, 4, False)
    # every field of every group has exactly one flat name
    every = {(g, f.name) for g, cls in GROUPS.items() for f in dataclasses.fields(cls)}
    assert sorted(FLAT_NAMES.values()) == sorted(every)
    default = RuntimeSettings()
    for name, (group, field) in FLAT_NAMES.items():
        value = getattr(getattr(default, group), field)
        assert RuntimeSettings.from_dict({name: value}) == default, name
    with pytest.raises(ValueError, match="hang_timeout"):
        RuntimeSettings.from_dict({"hang_timeout": 1.0})
    with pytest.raises(ValueError, match=r"detection\.bogus"):
        RuntimeSettings.from_dict({"detection": {"bogus": 1.0}})


def test_replica_groups_run_for_a_job_that_exports_or_evaluates() -> None:
    """One group runs the validation loss and the HF export after its commit (``after_step``), so a
    job with ``export`` or ``eval_data`` keeps its replica groups."""
    from workers.runtime.contract.attempt_spec import replica_refusal

    choice = {"policy": "replica_groups", "groups": 2, "group_gpus": 1, "snapshots": True, "snapshot_every": 1,
              "warm_ranks": 1, "reason": "test", "source": "rule"}
    base = {"model": "tiny", "steps": 4, "global_batch": 4}
    for name, value in (("export", {"format": "hf", "dir": "x"}), ("eval_data", {"kind": "builtin"})):
        assert replica_refusal({**base, name: value}, choice) is None
    assert replica_refusal({**base, "export": {"format": "hf"}}, {**choice, "policy": "replan"}) is None
