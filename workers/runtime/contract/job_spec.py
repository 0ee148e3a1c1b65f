"""The runtime's job spec: what ``start_supervisor(job_id, attempt, spec)`` accepts.

A plain dict (JSON), so the control plane can store it with the attempt::

    {"model": "tiny",                    # engine preset name, or a dict of ModelConfig fields
     "steps": 20, "global_batch": 12,   # plus any TrainConfig field: seed, lr, warmup_steps, ...
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

from planner.layout import parse_hint
from workers.engine.config import ModelConfig, TrainConfig
from workers.runtime.contract.fault_spec import parse_faults


@dataclass(frozen=True)
class RuntimeSettings:
    placement_timeout_s: float = 30.0  # a gang not ready by then -> try a smaller plan
    placement_retry_s: float = 5.0  # below min_gpus: wait this long, then try again
    placement_give_up_s: float = 600.0  # ... until this much time has passed (also: waiting for free GPUs)
    resize_retry_s: float = 30.0  # a grow that found no free GPU is tried again after this long
    hang_timeout_s: float = 60.0  # a step with no progress for this long is a hang (at least)
    hang_factor: float = 5.0  # ... or this many times the median step time, whichever is larger
    start_timeout_s: float = 600.0  # actors up + rendezvous + trainer built (slow on a busy host)
    collective_timeout_s: float = 60.0  # torch.distributed timeouts (default group and sub-groups)
    heartbeat_s: float = 2.0
    heartbeat_timeout_s: float = 15.0
    node_confirm_s: float = 5.0  # how long to wait for the GCS to confirm a node death
    node_heartbeat_s: float = 0.5  # probe every gang node's raylet this often (0: off; see watchdog.NodeWatch)
    node_heartbeat_timeout_s: float = 0.5  # ... a probe unanswered this long is silence (heartbeat_timeout_s of it: down)
    cpu_per_bundle: float = 0.05
    straggler_window: int = 5  # steps per scoring window
    straggler_threshold: float = 0.7
    straggler_persist: float = 0.6  # fraction of a window's steps that must be below the threshold
    grow: bool = True  # re-plan onto returning nodes at a checkpoint boundary
    max_recoveries: int = 10
    node_death_limit: int = 2  # rank processes died this often on one live node: keep it out (0: never)
    linger_s: float = 0.0  # >0: a finished detached supervisor exits on its own after this long
    strategy: str = "PACK"
    # every rank's shard to memory on its node and another one after every step; off by default until
    # it pays on this machine (bench/results/recovery.md: restore from memory measured slower than from
    # storage, overhead not yet within 5%)
    snapshots: bool = False
    snapshot_keep: int = 3  # snapshots (steps) each node's holder keeps
    # a snapshot after every n-th step (lost work at most n steps; the push of one overlaps the next
    # n steps): 1 is the every step; bench/recovery.py also uses 3 to time a snapshot in-job
    snapshot_every: int = 1
    warm_ranks_per_node: int = 0  # pre-started rank actors (torch imported) kept idle per node (warm_pool)
    # >= 2: that many replica groups of the hint's ``tp`` ranks each (one node each), torchft between
    # them: a lost group is dropped and replaced while the others keep stepping (workers.runtime.recovery.replica_groups)
    replica_groups: int = 0
    replica_timeout_s: float = 20.0  # torchft's timeouts (quorum, cross-group collectives, healing)
    replica_heartbeat_timeout_s: float = 2.0  # the quorum service drops a group silent this long; a group the
    # supervisor finds dead is dropped at once (``lighthouse.QuorumLighthouse.forget``; 0.5 s until then, when
    # the redo's quorum waited for it, docs/runtime.md)
    replica_node_heartbeat_s: float = 0.1  # a replica group's node heartbeat period (and the step wait's poll):
    # a dead node found sooner lets the survivors stop waiting for their reduction with it sooner
    replica_join_timeout_s: float = 10.0  # a quorum waits this long for a live group that has not asked yet
    replica_retry_s: float = 5.0  # no GPUs for a replacement group: look again after this long

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> RuntimeSettings:
        d = dict(d or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown runtime setting(s): {', '.join(unknown)}")
        every = d.get("snapshot_every", 1)
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"runtime.snapshot_every: must be a whole number of steps >= 1, got {every!r}")
        return cls(**d)


@dataclass(frozen=True)
class JobSpec:
    train: dict[str, Any]  # TrainConfig.to_dict() shape
    min_gpus: int = 1
    max_gpus: int | None = None
    placement: dict[str, int] = field(default_factory=dict)  # node id -> GPUs granted (empty: any node)
    layout_hint: dict[str, Any] = field(default_factory=dict)
    min_every_steps: int = 1
    max_every_steps: int = 50
    mtbf_s: float = 3600.0
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
#: the keys of a submitted job spec the control plane hands to the runtime as they are (it sets
#: ``checkpoint_dir``, ``gpu_type``, ``min_gpus``, ``max_gpus`` and ``placement`` itself)
SPEC_KEYS: tuple[str, ...] = ("model", *(k for k in TRAIN_KEYS if k != "checkpoint_dir"), "train", "layout_hint",
                              "checkpoint", "runtime", "faults")


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


#: layout fields a replica group supports (TP inside a group); the others are refused
SUPPORTED_HINT = frozenset({"tp", "micro_batch", "sp"})


def check_replica_spec(hint: dict[str, Any], runtime: Any, global_batch: int) -> None:
    """Refuse what replica groups do not support (``ValueError`` naming it)."""
    r = int(runtime.replica_groups)
    if r < 2:
        return
    bad = sorted(k for k, v in hint.items() if k not in SUPPORTED_HINT and v not in (None, 1, 0, False, "none"))
    if bad:
        raise ValueError(f"replica_groups: a replica group runs tensor parallelism only (tp, micro_batch); "
                         f"{', '.join(bad)} inside a replica group is not wired (use replica_groups 0 to re-plan "
                         "all four dimensions instead)")
    if runtime.snapshots:
        raise ValueError("replica_groups: in-memory snapshots are not wired for replica groups (the live groups "
                         "are each other's copy); set snapshots false")
    mb = int(hint.get("micro_batch", 1))
    if global_batch % mb:
        raise ValueError(f"replica_groups: global_batch {global_batch} is not a multiple of micro_batch {mb}")


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
    ck = dict(spec.get("checkpoint") or {})
    job = JobSpec(
        train=cfg.to_dict(),
        min_gpus=int(spec.get("min_gpus", 1)),
        max_gpus=int(spec["max_gpus"]) if spec.get("max_gpus") else None,
        placement=_placement(spec.get("placement")),
        layout_hint=parse_hint(spec.get("layout_hint")),
        min_every_steps=int(ck.get("min_every_steps", 1)),
        max_every_steps=int(ck.get("max_every_steps", 50)),
        mtbf_s=float(ck.get("mtbf_s", 3600.0)),
        runtime=RuntimeSettings.from_dict(spec.get("runtime")),
        events_out=spec.get("events_out"),
        metrics_out=spec.get("metrics_out"),
        faults=list(spec.get("faults") or []),
        tracking=dict(spec.get("tracking") or {}),
        network=_network(spec.get("network")),
        gpu_type=spec.get("gpu_type"),
        raw=dict(spec),
    )
    if job.min_gpus < 1 or (job.max_gpus is not None and job.max_gpus < job.min_gpus):
        raise ValueError("min_gpus/max_gpus: need 1 <= min_gpus <= max_gpus")
    check_replica_spec(job.layout_hint, job.runtime, job.global_batch)
    try:
        parse_faults(job.faults)  # kinds and parameters checked here, in the caller
    except ValueError as e:
        raise ValueError(f"faults: {e}") from None
    return job
