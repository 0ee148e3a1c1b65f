"""The one translation of a job spec: the REST API's spec, as stored with the job, into the runtime
spec of one attempt (what ``start_supervisor`` takes and :func:`~workers.runtime.contract.job_spec.parse_job`
parses, once per process).

Every field keeps its name on the way, down to the engine's ``TrainConfig`` (``eval_data``,
``export``, ``model.hf``, ...). What the translation does to each field of the API's
``service.api.schemas.JobSpec``:

- passes it as it is: ``steps``, ``global_batch``, ``seed``, ``lr``, ``min_lr``, ``warmup_steps``,
  ``weight_decay``, ``grad_clip``, ``keep_checkpoints``, ``eval_every``, ``eval_batches``,
  ``layout_hint``, ``checkpoint``, ``data``/``eval_data`` (their paths are resolved again where the
  engine reads, in the tenant's area that goes with them), an explicit ``model`` shape or preset;
- resolves it in the tenant's data area (:mod:`workers.job_inputs`: an input gone since submission
  is a ``ValueError`` naming the field, the attempt fails): ``model.hf`` (the directory, and the
  shape its ``config.json`` gives) and ``tokenizer``, which lands where it is used, on the text data
  (:data:`LANDS_AT`);
- places it in the job's directory: ``export`` gets its ``dir``, ``tracking`` its TensorBoard
  directory, run name and the service's MLflow URI when the job names none;
- replaces it by the scheduler's grant (:data:`GRANTED`: ``min_gpus``, ``max_gpus``);
- replaces it by the control plane's choice (``recovery``: the grant's ``recovery``, what
  ``planner.recovery_choice`` made of the block on the job's plan and the GPUs granted): the runtime
  settings ``snapshots``, ``snapshot_every``, ``warm_ranks_per_node`` and ``replica_groups``, one
  replica group's layout as the ``layout_hint`` fields the job left open (its ``dp`` always: the
  job's is the groups' times one group's), and the plan's checkpoint
  cadence when the job set no ``checkpoint`` (:func:`recovery_settings`);
- keeps it in the control plane (:data:`CONTROL_PLANE_ONLY`: ``name``, ``priority``,
  ``preemptible``, ``elastic``).

A field the runtime does not know is refused here (``ValueError`` naming it), never dropped;
``tests/runtime/test_spec_pipeline.py`` walks every field of the API schema through this function.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.layout import Layout, parse_hint
from workers import object_store
from workers.data_area import DataArea
from workers.engine.config import ModelConfig
from workers.job_inputs import CHECKPOINT_DIR, EXPORT_DIR, TENSORBOARD_DIR, hf_model, tokenizer_path
from workers.runtime.contract.job_spec import SPEC_FIELDS, RuntimeSettings, check_replica_spec

#: fields of the API's spec that the control plane alone acts on (they never reach a rank)
CONTROL_PLANE_ONLY: frozenset[str] = frozenset({"name", "priority", "preemptible", "elastic"})
#: fields the attempt's grant sets (the scheduler's decision), not the stored value
GRANTED: frozenset[str] = frozenset({"min_gpus", "max_gpus"})
#: fields the control plane's recovery choice replaces (:func:`recovery_settings`)
CHOSEN: frozenset[str] = frozenset({"recovery"})
#: where each field of the API's ``recovery`` block lands in the runtime spec (through the choice)
RECOVERY_LANDS_AT: dict[tuple[str, ...], tuple[str, ...]] = {
    ("recovery", "snapshots", "enabled"): ("runtime", "snapshots", "enabled"),
    ("recovery", "snapshots", "every"): ("runtime", "snapshots", "every"),
    ("recovery", "warm_ranks"): ("runtime", "placement", "warm_ranks_per_node"),
    ("recovery", "groups"): ("runtime", "replicas", "groups"),
    ("recovery", "policy"): ("runtime", "replicas", "groups"),  # replica_groups: >= 2; else 0
}
#: the layout fields of one replica group that the translation writes into the hint (where unset)
REPLICA_HINT: tuple[str, ...] = ("tp", "pp", "cp", "dp", "vpp", "micro_batch", "sp", "zero", "recompute", "schedule",
                                 "cp_method")
_DEFAULT_LAYOUT = Layout()
#: API fields that land elsewhere in the runtime spec: the tokenizer goes with the text data it reads
LANDS_AT: dict[str, tuple[tuple[str, ...], ...]] = {"tokenizer": (("data", "tokenizer"), ("eval_data", "tokenizer"))}


@dataclass(frozen=True)
class Grant:
    """What the control plane decides for one attempt of a job."""

    job_id: int
    job_dir: Path | str  # the job's directory (checkpoints, export, TensorBoard under it; a URL on s3://)
    gpus: int  # the GPUs the scheduler granted: the runtime plans within min_gpus..gpus
    min_gpus: int
    gpu_type: str  # the cluster's GPU profile, the one submissions were fit-checked against
    placement: dict[str, int] | None = None  # node id -> GPUs (None: the runtime places them)
    mlflow_uri: str | None = None  # the service's default MLflow tracking URI
    #: the job's recovery on this grant (``planner.recovery_choice.RecoveryChoice.to_dict()``); None:
    #: none was planned, the block's policy without a plan (``recovery_choice.unplanned``)
    recovery: Mapping[str, Any] | None = None
    #: extra keys merged into the runtime spec (dicts merged one level deep): tests and demos
    overrides: Mapping[str, Any] = field(default_factory=dict)


def attempt_spec(stored: Mapping[str, Any], area: DataArea, grant: Grant) -> dict[str, Any]:
    """The runtime spec of one attempt of the job whose API spec (as stored) is ``stored``; its
    inputs resolved in the tenant's ``area``. ``ValueError`` naming the field when an input is gone
    or a field is one the runtime does not know."""
    skip = CONTROL_PLANE_ONLY | GRANTED | CHOSEN | set(LANDS_AT) | {"model", "export", "tracking"}
    spec: dict[str, Any] = {k: v for k, v in stored.items() if k not in skip}
    model = stored.get("model", "tiny")
    if isinstance(model, Mapping) and "hf" in model:
        path, shape = hf_model(model, area)
        spec["model"] = {**shape, "hf": str(path)}
    else:
        spec["model"] = model if isinstance(model, str) else dict(model)
    vocab = _vocab(spec["model"])
    tok = stored.get("tokenizer")
    tok_path = str(tokenizer_path(str(tok), area, vocab)) if tok else None
    for key in ("data", "eval_data"):
        data = stored.get(key)
        if not isinstance(data, Mapping):
            continue
        d = dict(data)
        if d.get("kind", "builtin") != "builtin":
            d["area"] = area.to_dict()  # the engine resolves the paths in it where it reads
            if tok_path and d.get("kind") == "text":
                d["tokenizer"] = tok_path
        spec[key] = d
    export = stored.get("export")
    if isinstance(export, Mapping):
        spec["export"] = {**dict(export), "dir": str(object_store.under(grant.job_dir, EXPORT_DIR))}
    tracking = dict(stored.get("tracking") or {})
    spec["tracking"] = {"tensorboard_dir": str(object_store.under(grant.job_dir, TENSORBOARD_DIR)),
                        "mlflow_uri": tracking.get("mlflow_uri") or grant.mlflow_uri,
                        "experiment": tracking.get("experiment", "orthoplex"),
                        "run_name": f"job-{grant.job_id}"}
    spec["checkpoint_dir"] = str(object_store.under(grant.job_dir, CHECKPOINT_DIR))
    spec["gpu_type"] = grant.gpu_type
    spec["min_gpus"] = max(1, min(grant.min_gpus, grant.gpus))
    spec["max_gpus"] = grant.gpus
    if grant.placement:
        spec["placement"] = {str(n): int(g) for n, g in grant.placement.items()}
    # capacity belongs to the scheduler: the runtime must not grow onto returning nodes by itself
    spec["runtime"] = {**dict(spec.get("runtime") or {}), "grow": False}
    recovery_settings(spec, stored, grant.recovery)
    for key, value in grant.overrides.items():
        if isinstance(value, Mapping) and isinstance(spec.get(key), Mapping):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    unknown = sorted(set(spec) - set(SPEC_FIELDS))
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: not a field of the runtime's job spec (the control plane "
                         "would drop it; add it to the runtime or to attempt_spec.CONTROL_PLANE_ONLY)")
    return spec


def recovery_settings(spec: dict[str, Any], stored: Mapping[str, Any], choice: Mapping[str, Any] | None) -> None:
    """Write the recovery ``choice`` (or, with none, the stored block's policy without a plan) into the
    runtime ``spec``: its ``runtime`` settings, a replica group's layout into the ``layout_hint``
    fields the job left open, the plan's checkpoint cadence when the job set no ``checkpoint``."""
    from planner.recovery_choice import RecoveryChoice, unplanned

    c = RecoveryChoice.from_dict(choice) if choice is not None else unplanned(stored.get("recovery"))
    spec["runtime"] = {**spec["runtime"], "snapshots": c.snapshots, "snapshot_every": c.snapshot_every,
                       "warm_ranks_per_node": c.warm_ranks,
                       "replica_groups": c.groups if c.policy == "replica_groups" else 0}
    if c.policy == "replica_groups" and c.group_layout:
        hint = dict(parse_hint(spec.get("layout_hint")))
        hint.pop("dp_replicate", None)  # the groups are the replicas now
        hint.pop("dp", None)  # the job's dp is the groups' times one group's: the group's goes in
        for key in REPLICA_HINT:
            value = c.group_layout.get(key)
            if key not in hint and value is not None and value != getattr(_DEFAULT_LAYOUT, key):
                hint[key] = value
        spec["layout_hint"] = hint
    if c.checkpoint_every_steps and "checkpoint" not in stored:
        spec["checkpoint"] = {"min_every_steps": c.checkpoint_every_steps, "max_every_steps": c.checkpoint_every_steps}


def replica_refusal(stored: Mapping[str, Any], choice: Mapping[str, Any]) -> str | None:
    """Why the runtime would refuse ``choice``'s replica groups for the job ``stored`` (what
    ``job_spec.check_replica_spec`` says of the translated spec), or None when it runs them."""
    if choice.get("policy") != "replica_groups":
        return None
    spec: dict[str, Any] = {"runtime": {}, "layout_hint": stored.get("layout_hint")}
    recovery_settings(spec, stored, choice)
    try:
        check_replica_spec(parse_hint(spec.get("layout_hint")), RuntimeSettings.from_dict(spec["runtime"]),
                           int(stored["global_batch"]))
    except ValueError as exc:
        return str(exc)
    return None


def _vocab(model: str | Mapping[str, Any]) -> int:
    if isinstance(model, str):
        return ModelConfig.preset(model).vocab
    return int(model["vocab"])
