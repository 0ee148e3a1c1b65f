"""The runtime's job spec: what ``start_supervisor(job_id, attempt, spec)`` accepts.

A plain dict (JSON), so the control plane can store it with the attempt. The control plane builds it
from the API's spec with :func:`workers.runtime.contract.attempt_spec.attempt_spec` (the one
translation; the field names are the API's)::

    {"model": "tiny",                    # engine preset name, or a dict of ModelConfig fields (+ "hf": DIR)
     "steps": 20, "global_batch": 12,   # plus any TrainConfig field: seed, lr, eval_data, export, ...
     "train": {...},                     # optional extra TrainConfig fields (data, keep_checkpoints, ...)
     "checkpoint_dir": "/data/job-7",    # where the engine's layout-independent checkpoints live
     "min_gpus": 4, "max_gpus": 12,      # elastic range (max defaults to every GPU Ray has)
     "placement": {"<node id>": 4, ...}, # the scheduler's grant per node: the first plan stays within it
     "layout_hint": "tp=2,pp=2",         # fixes these fields of the first plan (re-plans are free)
     "checkpoint": {"min_every_steps": 1, "max_every_steps": 50, "mtbf_s": 3600},
     "runtime": {...RuntimeSettings fields...},
     "events_out": "events.jsonl", "metrics_out": "metrics.jsonl",
     "tracking": {"tensorboard_dir": ..., "mlflow_uri": ..., "experiment": ..., "run_name": ...},
     "faults": [...]}                    # test/demo hook only (see workers.testbed.fault_injector)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from planner.failure_rates import FAILURE_RATE_NAMES
from planner.layout import parse_hint
from planner.recovery_choice import AUTO_WARM_RANKS, MAX_WARM_RANKS
from workers.engine.config import ModelConfig, TrainConfig
from workers.runtime.contract.fault_spec import parse_faults

#: a bare runtime spec's warm ranks per node (none; the product's default is planner.recovery_choice's)
BARE_WARM_RANKS = 0


@dataclass(frozen=True)
class PlacementSettings:
    """Reserving and placing a gang."""

    timeout_s: float = 30.0  # a gang not ready by then -> try a smaller plan
    retry_s: float = 5.0  # below min_gpus: wait this long, then try again
    give_up_s: float = 600.0  # ... until this much time has passed (also: waiting for free GPUs)
    resize_retry_s: float = 30.0  # a grow that found no free GPU is tried again after this long
    cpu_per_bundle: float = 0.05
    strategy: str = "PACK"
    grow: bool = True  # re-plan onto returning nodes at a checkpoint boundary
    # pre-started rank actors (torch imported) kept idle per node (warm_pool): a number, or "auto"
    # (planner.recovery_choice: the most ranks the job's first gang runs on one node). A bare runtime
    # spec starts none, as it takes no snapshots: the product's defaults (auto, snapshots on) are
    # written into every spec the service and `orthoplex run` build (attempt_spec.recovery_settings)
    warm_ranks_per_node: int | str = BARE_WARM_RANKS


@dataclass(frozen=True)
class DetectionSettings:
    """Telling a failure: hangs, silent ranks and nodes, start and collective timeouts."""

    hang_timeout_s: float = 60.0  # a step with no progress for this long is a hang (at least)
    hang_factor: float = 5.0  # ... or this many times the median step time, whichever is larger
    start_timeout_s: float = 600.0  # actors up + rendezvous + trainer built (slow on a busy host)
    collective_timeout_s: float = 60.0  # torch.distributed timeouts (default group and sub-groups)
    heartbeat_s: float = 2.0
    heartbeat_timeout_s: float = 15.0
    node_confirm_s: float = 5.0  # how long to wait for the GCS to confirm a node death
    node_heartbeat_s: float = 0.5  # probe every gang node's raylet this often (0: off; see watchdog.NodeWatch)
    node_heartbeat_timeout_s: float = 0.5  # ... a probe unanswered this long is silence (heartbeat_timeout_s of it: down)


@dataclass(frozen=True)
class StragglerSettings:
    """Scoring slow ranks and links (``policy.stragglers``)."""

    window: int = 5  # steps per scoring window
    threshold: float = 0.7
    persist: float = 0.6  # fraction of a window's steps that must be below the threshold


@dataclass(frozen=True)
class SnapshotSettings:
    """In-memory snapshots: every rank's shard to memory on its node and another one after every
    ``every``-th step. Off in a bare runtime spec; service jobs and ``orthoplex run`` turn them on by
    default (``planner.recovery_choice.DEFAULT_SNAPSHOTS``, written through
    ``attempt_spec.recovery_settings``)."""

    enabled: bool = False
    keep: int = 3  # snapshots (steps) each node's holder keeps
    # a snapshot after every n-th step (lost work at most n steps; the push of one overlaps the next
    # n steps): 1 is the every step; bench/recovery.py also uses 3 to time a snapshot in-job
    every: int = 1


@dataclass(frozen=True)
class ReplicaSettings:
    """Replica groups: ``groups`` >= 2 groups of the hint's ``tp`` ranks each (one node each), torchft
    between them: a lost group is dropped and replaced while the others keep stepping
    (workers.runtime.recovery.replica_groups)."""

    groups: int = 0
    timeout_s: float = 20.0  # torchft's timeouts (quorum, cross-group collectives, healing)
    # the quorum service drops a group silent this long; a group the supervisor finds dead is dropped
    # at once (``quorum_service.QuorumLighthouse.forget``; 0.5 s until then, when the redo's quorum
    # waited for it, docs/runtime.md)
    heartbeat_timeout_s: float = 2.0
    # a replica group's node heartbeat period (and the step wait's poll): a dead node found sooner
    # lets the survivors stop waiting for their reduction with it sooner
    node_heartbeat_s: float = 0.1
    join_timeout_s: float = 10.0  # a quorum waits this long for a live group that has not asked yet
    retry_s: float = 5.0  # no GPUs for a replacement group: look again after this long


#: the groups of :class:`RuntimeSettings`, by the attribute that holds each
GROUPS: dict[str, type] = {"placement": PlacementSettings, "detection": DetectionSettings,
                           "stragglers": StragglerSettings, "snapshots": SnapshotSettings,
                           "replicas": ReplicaSettings}
#: the flat wire names (a stored spec's or an override's ``runtime``, as they were before the settings
#: were grouped) -> (group, field); a group's own field names are accepted flat too where they are unique
FLAT_NAMES: dict[str, tuple[str, str]] = {
    "placement_timeout_s": ("placement", "timeout_s"), "placement_retry_s": ("placement", "retry_s"),
    "placement_give_up_s": ("placement", "give_up_s"), "resize_retry_s": ("placement", "resize_retry_s"),
    "cpu_per_bundle": ("placement", "cpu_per_bundle"), "strategy": ("placement", "strategy"),
    "grow": ("placement", "grow"), "warm_ranks_per_node": ("placement", "warm_ranks_per_node"),
    **{f.name: ("detection", f.name) for f in dataclasses.fields(DetectionSettings)},
    "straggler_window": ("stragglers", "window"), "straggler_threshold": ("stragglers", "threshold"),
    "straggler_persist": ("stragglers", "persist"),
    "snapshots": ("snapshots", "enabled"), "snapshot_keep": ("snapshots", "keep"), "snapshot_every": ("snapshots", "every"),
    "replica_groups": ("replicas", "groups"), "replica_timeout_s": ("replicas", "timeout_s"),
    "replica_heartbeat_timeout_s": ("replicas", "heartbeat_timeout_s"),
    "replica_node_heartbeat_s": ("replicas", "node_heartbeat_s"),
    "replica_join_timeout_s": ("replicas", "join_timeout_s"), "replica_retry_s": ("replicas", "retry_s"),
}


@dataclass(frozen=True)
class RuntimeSettings:
    """The runtime's knobs of one job, grouped by concern (``settings.detection.hang_timeout_s``)."""

    placement: PlacementSettings = field(default_factory=PlacementSettings)
    detection: DetectionSettings = field(default_factory=DetectionSettings)
    stragglers: StragglerSettings = field(default_factory=StragglerSettings)
    snapshots: SnapshotSettings = field(default_factory=SnapshotSettings)
    replicas: ReplicaSettings = field(default_factory=ReplicaSettings)
    max_recoveries: int = 10
    node_death_limit: int = 2  # rank processes died this often on one live node: keep it out (0: never)
    linger_s: float = 0.0  # >0: a finished detached supervisor exits on its own after this long

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> RuntimeSettings:
        """From a spec's ``runtime``: the flat wire form (``{"hang_timeout_s": 5, "snapshots": true}``,
        :data:`FLAT_NAMES`), grouped (``{"detection": {"hang_timeout_s": 5}}``), or both;
        ``ValueError`` naming an unknown setting."""
        groups: dict[str, dict[str, Any]] = {g: {} for g in GROUPS}
        top: dict[str, Any] = {}
        unknown: list[str] = []
        for key, value in dict(d or {}).items():
            if key in GROUPS and isinstance(value, dict):
                names = {f.name for f in dataclasses.fields(GROUPS[key])}
                unknown += [f"{key}.{k}" for k in value if k not in names]
                groups[key].update({k: v for k, v in value.items() if k in names})
            elif key in FLAT_NAMES:
                group, name = FLAT_NAMES[key]
                groups[group][name] = value
            elif key in ("max_recoveries", "node_death_limit", "linger_s"):
                top[key] = value
            else:
                unknown.append(key)
        if unknown:
            raise ValueError(f"unknown runtime setting(s): {', '.join(sorted(unknown))}")
        warm = groups["placement"].get("warm_ranks_per_node", BARE_WARM_RANKS)
        if warm != AUTO_WARM_RANKS and (isinstance(warm, bool) or not isinstance(warm, int)
                                        or not 0 <= warm <= MAX_WARM_RANKS):
            raise ValueError(f"runtime.warm_ranks_per_node: must be {AUTO_WARM_RANKS!r} or a whole number "
                             f"0..{MAX_WARM_RANKS}, got {warm!r}")
        every = groups["snapshots"].get("every", 1)
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"runtime.snapshot_every: must be a whole number of steps >= 1, got {every!r}")
        return cls(**{g: GROUPS[g](**groups[g]) for g in GROUPS}, **top)


@dataclass(frozen=True)
class CheckpointBounds:
    """The job spec's ``checkpoint``: the supervisor picks the interval in between (Young's formula)."""

    min_every_steps: int = 1
    max_every_steps: int = 50
    mtbf_s: float = 3600.0

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> CheckpointBounds:
        d = dict(d or {})
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"checkpoint: unknown field(s) {', '.join(unknown)}")
        return cls(int(d.get("min_every_steps", 1)), int(d.get("max_every_steps", 50)), float(d.get("mtbf_s", 3600.0)))


@dataclass(frozen=True)
class JobSpec:
    train: dict[str, Any]  # TrainConfig.to_dict() shape
    min_gpus: int = 1
    max_gpus: int | None = None
    placement: dict[str, int] = field(default_factory=dict)  # node id -> GPUs granted (empty: any node)
    layout_hint: dict[str, Any] = field(default_factory=dict)
    checkpoint: CheckpointBounds = field(default_factory=CheckpointBounds)
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    events_out: str | None = None
    metrics_out: str | None = None
    faults: list[dict[str, Any]] = field(default_factory=list)
    #: where the supervisor logs the job's metrics (``workers.runtime.supervision.job_tracking``)
    tracking: dict[str, Any] = field(default_factory=dict)
    # the links the planner plans against, when they are known (a tc-capped test network): keys of
    # NETWORK_KEYS, overriding the GPU profile's; empty: the profile's
    network: dict[str, float] = field(default_factory=dict)
    gpu_type: str | None = None  # the GPU profile the job is planned on (MFU's peak)
    # goodput-aware plans (planner.goodput): the job's expected days and the failure table it is priced with
    duration_days: float | None = None
    failure_rates: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return int(self.train["steps"])

    @property
    def global_batch(self) -> int:
        return int(self.train["global_batch"])

    @property
    def model(self) -> dict[str, Any]:
        return dict(self.train["model"])


#: the ``TrainConfig`` fields a job spec sets at its top level (``model`` is parsed on its own; the
#: supervisor decides ``save_every``): the one list of them
TRAIN_KEYS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TrainConfig)
                                    if f.name not in ("model", "save_every"))
#: every top-level field of the runtime's job spec (what :func:`parse_job` reads); the translation
#: from the API's spec refuses any other (``attempt_spec``), so nothing is dropped on the way
SPEC_FIELDS: tuple[str, ...] = ("model", *TRAIN_KEYS, "train", "min_gpus", "max_gpus", "placement", "layout_hint",
                                "checkpoint", "runtime", "events_out", "metrics_out", "faults", "tracking", "network",
                                "gpu_type", "replan_horizon_s", "duration_days", "failure_rates")


#: the planner's link fields a job spec may set under ``network`` (per GPU, per direction)
NETWORK_KEYS: tuple[str, ...] = ("inter_node_bw_Gbps_per_gpu", "intra_node_bw_GBps")


def _network(raw: Any) -> dict[str, float]:
    if not raw:
        return {}
    if not isinstance(raw, dict) or set(raw) - set(NETWORK_KEYS):
        raise ValueError(f"network: an object with keys among {', '.join(NETWORK_KEYS)}")
    out = {k: float(v) for k, v in raw.items()}
    if any(v <= 0 for v in out.values()):
        raise ValueError("network: bandwidths must be > 0")
    return out


def _placement(raw: Any) -> dict[str, int]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(isinstance(g, int) and g > 0 for g in raw.values()):
        raise ValueError("placement: must map node ids to positive GPU counts")
    return {str(n): int(g) for n, g in raw.items()}


def check_replica_spec(hint: dict[str, Any], runtime: Any, global_batch: int) -> None:
    """Refuse what replica groups cannot run (``ValueError`` naming it): any layout runs inside a
    group (TP x PP x CP x DP with ZeRO/FSDP: the hint is one group's layout), but the global batch
    must come in whole blocks a group runs together (``replica_rows.replica_problems``), and
    ``dp_replicate`` (replicas inside one process group) is what the groups already are."""
    from planner.layout import Layout
    from workers.engine.replica_rows import replica_problems

    if int(runtime.replicas.groups) < 2:
        return
    if int(hint.get("dp_replicate", 1) or 1) > 1:
        raise ValueError("replica_groups: layout_hint.dp_replicate > 1 inside a replica group; the replica groups "
                         "are the replicas (use dp and zero for one group's layout)")
    problems = replica_problems(Layout.from_dict(dict(hint)), global_batch)
    if problems:
        raise ValueError("replica_groups: " + "; ".join(problems))


def _duration(raw: Any) -> float | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0 < raw <= 3650:
        raise ValueError(f"duration_days: must be a number of days in (0, 3650], got {raw!r}")
    return float(raw)


def parse_job(spec: dict[str, Any]) -> JobSpec:
    """Validate a job spec dict; raises ``ValueError`` naming the field."""
    if not isinstance(spec, dict):
        raise ValueError("spec: must be an object")
    model = spec.get("model", "tiny")
    mc = ModelConfig.preset(model) if isinstance(model, str) else ModelConfig.from_dict(dict(model))
    train: dict[str, Any] = {"model": mc.to_dict()}
    for key in TRAIN_KEYS:
        if key in spec:
            train[key] = spec[key]
    train.update(dict(spec.get("train") or {}))
    train["save_every"] = 0  # the supervisor decides when to save
    if not train.get("checkpoint_dir"):
        raise ValueError("checkpoint_dir: required (re-plan and resume load from it)")
    cfg = TrainConfig.from_dict(train)  # validates
    job = JobSpec(
        train=cfg.to_dict(),
        min_gpus=int(spec.get("min_gpus", 1)),
        max_gpus=int(spec["max_gpus"]) if spec.get("max_gpus") else None,
        placement=_placement(spec.get("placement")),
        layout_hint=parse_hint(spec.get("layout_hint")),
        checkpoint=CheckpointBounds.from_dict(spec.get("checkpoint")),
        runtime=RuntimeSettings.from_dict(spec.get("runtime")),
        events_out=spec.get("events_out"),
        metrics_out=spec.get("metrics_out"),
        faults=list(spec.get("faults") or []),
        tracking=dict(spec.get("tracking") or {}),
        network=_network(spec.get("network")),
        gpu_type=spec.get("gpu_type"),
        duration_days=_duration(spec.get("duration_days")),
        failure_rates=spec.get("failure_rates"),
        raw=dict(spec),
    )
    if job.failure_rates is not None and job.failure_rates not in FAILURE_RATE_NAMES:
        raise ValueError(f"failure_rates: must be one of {', '.join(FAILURE_RATE_NAMES)}, got {job.failure_rates!r}")
    if job.min_gpus < 1 or (job.max_gpus is not None and job.max_gpus < job.min_gpus):
        raise ValueError("min_gpus/max_gpus: need 1 <= min_gpus <= max_gpus")
    check_replica_spec(job.layout_hint, job.runtime, job.global_batch)
    try:
        parse_faults(job.faults)  # kinds and parameters checked here, in the caller
    except ValueError as e:
        raise ValueError(f"faults: {e}") from None
    return job
