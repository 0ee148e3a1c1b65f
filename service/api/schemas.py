"""Request and response schemas of the REST API (pydantic v2).

Every request model forbids unknown fields (``extra="forbid"``: no mass assignment, OWASP API3),
is strict (no ``"5"`` for ``5``), and bounds every string, number and list (OWASP API4). Create,
Update and Public schemas are separate; the tenant of a job comes from the token, never the body.
Strings are printable ASCII so nothing unstorable (NUL, lone surrogates) reaches the database.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    field_validator,
)

from planner.layout import normalise_recompute, recompute_error
from planner.recovery_choice import DEFAULT_SNAPSHOT_EVERY, DEFAULT_WARM_RANKS, MAX_WARM_RANKS
from planner.recovery_names import AUTO, JOB_POLICIES
from service.api.scrub import scrub, scrub_text
from workers.states import JobState

#: a job state's name, as the API accepts and returns it (derived from ``workers.states.JobState``)
JobStateName = Literal[tuple(s.value for s in JobState)]  # type: ignore[valid-type]

#: engine model presets (``workers.engine.config.MODEL_PRESETS``)
ModelPreset = Literal["tiny", "small", "llama-1b", "llama3-1b", "llama2-7b", "llama3-8b", "llama2-13b",
                      "llama2-70b", "llama3-70b", "llama3-405b"]

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
Name = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=NAME_PATTERN)]
TenantName = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9._-]*$")]
Text64 = Annotated[str, StringConstraints(max_length=64, pattern=r"^[\x20-\x7e]*$")]
PathStr = Annotated[str, StringConstraints(min_length=1, max_length=1024, pattern=r"^[\x21-\x7e][\x20-\x7e]*$")]
Int32 = 2**31 - 1


def _integral(value: Any) -> Any:
    """JSON Schema counts ``5.0`` as an integer: accept it (strict mode still refuses ``"5"``, ``true``)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _no_bool(value: Any) -> Any:
    """``false`` is not ``0`` in JSON (Python's ``False == 0`` would let it through a Literal)."""
    if isinstance(value, bool):
        raise ValueError("must be a number, not a boolean")
    return _integral(value)


#: a strict integer that also takes integral floats (``27778.0``)
Int = Annotated[int, BeforeValidator(_integral)]


def _recompute(value: Any) -> Any:
    """A recompute mode as the planner names it (``planner.layout.recompute_error`` is the one rule):
    ``none``, ``selective``, ``op``, ``layer:N``, ``full``, and the aliases ``layer``,
    ``selective_op``, ``selective_layer``; anything else is refused listing the known modes."""
    value = normalise_recompute(value)
    bad = recompute_error(value)
    if bad:
        raise ValueError(bad)
    return value


#: the schema's view of the modes (validation is :func:`_recompute`)
RECOMPUTE_PATTERN = r"^(none|selective|op|full|layer|selective_op|selective_layer|layer:([2-9]|[1-9][0-9]{1,3}))$"
Recompute = Annotated[str, BeforeValidator(_recompute),
                      Field(max_length=16, json_schema_extra={"pattern": RECOMPUTE_PATTERN},
                            description="activation recomputation: none, selective, op, layer:N (N >= 2), full; "
                                        "aliases layer (= layer:2), selective_op, selective_layer")]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


# ------------------------------------------------------------------------------------- job spec
class ModelShape(_In):
    """An explicit Llama-style decoder shape (instead of a preset name)."""

    name: Annotated[str, StringConstraints(max_length=64, pattern=r"^[A-Za-z0-9._-]*$")] = "custom"
    layers: Int = Field(ge=1, le=1024)
    hidden: Int = Field(ge=2, le=65536)
    heads: Int = Field(ge=1, le=1024)
    kv_heads: Int = Field(ge=1, le=1024)
    ffn: Int = Field(ge=1, le=1 << 20)
    vocab: Int = Field(ge=1, le=1 << 22)
    seq_len: Int = Field(ge=2, le=1 << 20)
    rope_theta: float = Field(default=10000.0, gt=0, le=1e9, allow_inf_nan=False)


class HFModel(_In):
    """A Hugging Face Llama checkpoint directory (``config.json`` + ``*.safetensors``) in the tenant's
    data area: the job starts from its weights; the planner plans the shape its ``config.json`` gives."""

    hf: PathStr = Field(description="the checkpoint directory, relative to your data area (or shared:<root>/...)")
    seq_len: Int | None = Field(default=None, ge=2, le=1 << 20,
                                description="training sequence length (default: min(2048, max_position_embeddings))")


class DataSpec(_In):
    """Where the tokens come from: the built-in corpus, text files or token memmaps. ``paths`` are
    relative to the tenant's data area (files, directories or globs) or ``shared:<root>/<path>``
    for an admin-declared read-only root; anything outside is refused (``s3://``/``gs://`` too).
    ``kind: text`` reads ``.txt``/``.md`` files as bytes, or, with the job's ``tokenizer``, also
    ``.jsonl`` (a ``text`` field per line) and ``.parquet`` (a ``text`` column) files."""

    kind: Literal["builtin", "text", "tokens"] = "builtin"
    paths: list[PathStr] = Field(default_factory=list, max_length=64)
    dtype: Literal["uint16", "uint32"] = "uint16"


class CheckpointSpec(_In):
    """Checkpoint cadence bounds; the supervisor picks the interval in between (Young's formula)."""

    min_every_steps: Int = Field(default=1, ge=1, le=1_000_000)
    max_every_steps: Int = Field(default=50, ge=1, le=1_000_000)
    mtbf_s: float = Field(default=3600.0, gt=0, le=1e9, allow_inf_nan=False)


class SnapshotsSpec(_In):
    """In-memory snapshots: each rank's shard to memory on its node and another one after every
    ``every``-th step, so a re-plan restores from memory, not storage."""

    enabled: bool | None = Field(default=None, description="default: true (false with policy restart, which "
                                                            "restores from storage)")
    every: Annotated[int, Field(ge=1, le=1_000_000), BeforeValidator(_integral)] | None = Field(
        default=None, description=f"a snapshot after every N-th step (at most N steps redone); default: "
                                  f"{DEFAULT_SNAPSHOT_EVERY}")


class RecoverySpec(_In):
    """How the job recovers from a lost node or rank. ``auto`` (the default) picks from the plan:
    replica groups when the plan's data parallelism holds two or more full replicas in memory,
    re-plan from memory otherwise (``planner.recovery_choice``); ``POST /v1/plans`` and the job say
    what it chose and why."""

    policy: Literal[tuple(JOB_POLICIES)] = Field(  # type: ignore[valid-type]
        default=AUTO, description="auto: chosen from the plan; replica_groups: lost groups are dropped and "
                                  "replaced from a live peer while the others step on; replan: re-plan onto the "
                                  "nodes left, restoring from memory snapshots; restart: restore from storage")
    groups: Annotated[int, Field(ge=2, le=4096), BeforeValidator(_no_bool)] | None = Field(
        default=None, description="replica groups (only with policy replica_groups; default: the most that fit "
                                  "in memory); must divide the plan's dp")
    snapshots: SnapshotsSpec | None = None
    warm_ranks: Annotated[int, Field(ge=0, le=MAX_WARM_RANKS), BeforeValidator(_no_bool)] | None = Field(
        default=None, description=f"pre-started rank processes kept idle per node, so a re-plan's ranks start "
                                  f"warm; 0 turns them off; default: {DEFAULT_WARM_RANKS}")


class LayoutHint(_In):
    """Parallel hints: the fields given are fixed in the first plan (re-plans are free)."""

    tp: Annotated[int, Field(ge=1, le=1024), BeforeValidator(_integral)] | None = None
    pp: Annotated[int, Field(ge=1, le=1024), BeforeValidator(_integral)] | None = None
    cp: Annotated[int, Field(ge=1, le=1024), BeforeValidator(_integral)] | None = None
    dp: Annotated[int, Field(ge=1, le=4096), BeforeValidator(_integral)] | None = None
    dp_replicate: Annotated[int, Field(
        ge=1, le=4096, description="replica groups inside dp (HSDP): ZeRO shards inside a group, plain replication "
                                   "across groups; must divide dp"), BeforeValidator(_integral)] | None = None
    vpp: Annotated[int, Field(ge=1, le=64), BeforeValidator(_integral)] | None = None
    micro_batch: Annotated[int, Field(ge=1, le=65536), BeforeValidator(_integral)] | None = None
    sp: bool | None = None
    zero: Annotated[Literal[0, 1, 3], BeforeValidator(_no_bool)] | None = None
    recompute: Recompute | None = None
    schedule: Literal["gpipe", "1f1b", "interleaved"] | None = None
    cp_method: Literal["ring", "ulysses"] | None = None


class ExportSpec(_In):
    """What the job writes after its last step (listed in its artifacts)."""

    format: Literal["hf"] = Field(description="hf: a transformers-loadable directory (config, safetensors, "
                                              "the tokenizer files when the job used one)")


class TrackingSpec(_In):
    """Where the job's metrics go besides its TensorBoard files (always written into its area)."""

    mlflow_uri: Annotated[str, StringConstraints(min_length=1, max_length=512, pattern=r"^https?://[\x21-\x7e]+$")] | None = Field(
        default=None, description="an MLflow tracking server (http:// or https://); default: the service's "
                                  "ORTHOPLEX_MLFLOW_TRACKING_URI, if set")
    experiment: Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[\x20-\x7e]+$")] = "orthoplex"


def _model_kind(value: Any) -> str:
    if isinstance(value, str):
        return "preset"
    # a dict when validating, the model instance when serialising
    return "hf" if isinstance(value, HFModel) or (isinstance(value, dict) and "hf" in value) else "shape"


ModelField = Annotated[
    Annotated[ModelPreset, Tag("preset")] | Annotated[ModelShape, Tag("shape")] | Annotated[HFModel, Tag("hf")],
    Discriminator(_model_kind),
]


class JobSpec(_In):
    """A declarative training job (never code). ``min_gpus <= max_gpus``; the planner must find a
    layout for some GPU count in that range, or the job is refused with 422."""

    name: Name
    model: ModelField = Field(description="an engine preset name, an explicit shape, or {\"hf\": DIR}")
    steps: Int = Field(ge=1, le=10_000_000)
    global_batch: Int = Field(ge=1, le=1_000_000)
    min_gpus: Int = Field(default=1, ge=1, le=4096)
    max_gpus: Int = Field(default=1, ge=1, le=4096)
    priority: Int = Field(default=0, ge=-100, le=100, description="order within the tenant; higher first")
    preemptible: bool = True
    elastic: bool | None = Field(default=None, description="may be grown/shrunk; default: max_gpus > min_gpus")
    seed: Annotated[int, Field(ge=0, le=Int32), BeforeValidator(_integral)] | None = None
    lr: float | None = Field(default=None, gt=0, le=10, allow_inf_nan=False)
    min_lr: float | None = Field(default=None, ge=0, le=10, allow_inf_nan=False)
    warmup_steps: Annotated[int, Field(ge=0, le=10_000_000), BeforeValidator(_integral)] | None = None
    weight_decay: float | None = Field(default=None, ge=0, le=10, allow_inf_nan=False)
    grad_clip: float | None = Field(default=None, ge=0, le=1e6, allow_inf_nan=False)
    keep_checkpoints: Annotated[int, Field(ge=1, le=100), BeforeValidator(_integral)] | None = None
    data: DataSpec | None = None
    tokenizer: PathStr | None = Field(default=None, description="a tokenizer.json or HF tokenizer directory in "
                                                                "your data area, for kind: text data")
    eval_every: Annotated[int, Field(ge=1, le=10_000_000), BeforeValidator(_integral)] | None = Field(
        default=None, description="validation loss on eval_data every K steps and after the last (val_loss)")
    eval_data: DataSpec | None = Field(default=None, description="held-out data for eval_every (same rules as data)")
    eval_batches: Annotated[int, Field(ge=1, le=10_000), BeforeValidator(_integral)] | None = Field(
        default=None, description="validation windows: the first eval_batches * global_batch of eval_data")
    export: ExportSpec | None = None
    tracking: TrackingSpec | None = None
    checkpoint: CheckpointSpec | None = None
    layout_hint: LayoutHint | None = None
    duration_days: float | None = Field(
        default=None, gt=0, le=3650, allow_inf_nan=False,
        description="expected days of training: plans are ranked by effective tokens/s (healthy tokens/s x ETTR "
                    "under failure_rates) and carry their recovery settings (docs/goodput.md)")
    failure_rates: Literal["llama3", "rsc", "cluster"] | None = Field(
        default=None, description="failure rates the plan is priced with (needs duration_days; default llama3): "
                                  "a published table, or cluster: node losses per node-day in this service's "
                                  "event store (llama3 until 1,000 node-days are recorded)")
    recovery: RecoverySpec | None = Field(default=None, description="recovery policy, snapshots and warm ranks; "
                                                                    "default: auto, snapshots on, warm ranks on")

    def stored(self) -> dict[str, Any]:
        """The spec as stored with the job (and handed to the runtime): no unset optionals."""
        return self.model_dump(mode="json", exclude_none=True)


class JobPublic(_Out):
    id: int
    name: str
    state: JobStateName
    reason: str = Field(description="why the job is in its state: while PENDING, why it still waits "
                                    "(the scheduler's latest reason); else the reason of its last state change")
    priority: int
    min_gpus: int
    max_gpus: int
    gpus_allocated: int
    cancel_requested: bool
    attempt: int = Field(description="number of the current attempt (0 before the first)")
    spec: dict[str, Any]
    created_at: dt.datetime
    updated_at: dt.datetime
    admitted_at: dt.datetime | None = None
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    final_loss: float | None = None
    final_step: int | None = None
    recovery: dict[str, Any] | None = Field(
        default=None, description="the recovery the control plane chose for the latest attempt: policy "
                                  "(replica_groups, replan, restart), groups, group_gpus, snapshots, snapshot_every, "
                                  "warm_ranks, reason, source (rule, plan or spec); null before the first attempt "
                                  "and in job lists")

    @field_validator("reason", mode="after")
    @classmethod
    def _scrub_reason(cls, v: str) -> str:
        return scrub_text(v)


class JobList(BaseModel):
    items: list[JobPublic] = Field(max_length=100)
    next_cursor: int | None = Field(default=None, description="pass as `cursor` for the next page")


class EventPublic(_Out):
    id: int = Field(description="increasing; pass the last one as `since`")
    source: str
    seq: int
    epoch: int | None = Field(default=None, description="fencing epoch of the attempt that produced it; "
                                                        "null for control-plane events outside an attempt")
    type: str
    payload: dict[str, Any] = Field(description="absolute paths and Ray node ids are replaced by names")
    ts: dt.datetime

    @field_validator("payload", mode="after")
    @classmethod
    def _scrub_payload(cls, v: dict[str, Any]) -> dict[str, Any]:
        return scrub(v)


class MetricPublic(_Out):
    step: int = Field(description="steps completed when it was measured (1..steps), as a checkpoint counts")
    epoch: int = Field(description="fencing epoch of the attempt that measured it (a step redone after a "
                                   "recovery appears once per epoch)")
    loss: float | None = None
    tokens_per_s: float | None = None
    val_loss: float | None = Field(default=None, description="validation loss on eval_data (steps the job "
                                                             "evaluated: every eval_every, and the last)")
    ts: dt.datetime


# ------------------------------------------------------------------------------------- plans
class PlanOut(BaseModel):
    gpus: int = Field(description="GPU count the plans were searched for (max_gpus, down to min_gpus)")
    plans: list[dict[str, Any]] = Field(max_length=20, description="best first (planner Plan.to_dict())")
    recovery: dict[str, Any] | None = Field(default=None, description="what the job's recovery block comes to on "
                                                                     "the best plan: policy, groups, snapshots, "
                                                                     "warm_ranks and why (reason)")
    rejected: list[dict[str, Any]] = Field(max_length=50, description="a sample of rejected candidates")
    searched: int
    search_time_s: float
    goodput: dict[str, Any] | None = Field(
        default=None, description="with duration_days: the failure rates and recovery phases the plans are priced "
                                  "with, every layout's healthy tokens/s, ETTR and effective tokens/s, and why each "
                                  "runner-up lost (each plan carries ettr, effective_tokens_per_s, recovery)")


# ------------------------------------------------------------------------------------- cluster
class ClusterJob(BaseModel):
    id: int
    name: str
    state: JobStateName
    gpus_allocated: int
    tenant_id: int | None = Field(default=None, description="admin view only")


class NodeDrainIn(_In):
    deadline_s: float = Field(gt=0, le=7 * 86_400, allow_inf_nan=False,
                              description="seconds every job on the node has to move off it (at most 7 days)")


DrainState = Literal["draining", "drained", "active"]


class NodeDrainOut(BaseModel):
    node_id: str
    state: DrainState = Field(description="draining: jobs still hold GPUs there; drained: none do (it takes no "
                                          "new work either way, until undrained); active: not drained")
    gpus_held: int = Field(description="GPUs placement groups still hold on the node")
    deadline_s: float | None = None
    requested_at: dt.datetime | None = None
    deadline_at: dt.datetime | None = None


class ClusterOut(BaseModel):
    available: bool = Field(description="False when Ray could not be asked (see reason)")
    reason: str | None = None
    total_gpus: int
    used_gpus: int
    free_gpus: int
    alive_nodes: int
    nodes: list[dict[str, Any]] = Field(description="per node GPUs and allocations (admin view only)")
    jobs: list[ClusterJob] = Field(description="jobs holding GPUs (a tenant sees only its own)")
    draining_nodes: int = Field(default=0, description="nodes drained by an operator (no new work goes there)")
    drains: list[NodeDrainOut] = Field(default_factory=list, description="the drained nodes and their state "
                                                                       "(admin view only)")
    ray_address: str | None = Field(default=None, description="the Ray cluster's address (admin view only; "
                                                              "its token is never shown)")
    ray_insecure: bool | None = Field(default=None, description="ORTHOPLEX_ALLOW_INSECURE_RAY is set (admin view only)")


# ------------------------------------------------------------------------------------- tenants
class TenantCreate(_In):
    name: TenantName
    gpu_quota: Int = Field(default=0, ge=0, le=1_000_000, description="guaranteed GPUs")
    weight: float = Field(default=1.0, gt=0, le=1e6, allow_inf_nan=False, description="fair-share weight")
    max_jobs: Int = Field(default=100, ge=1, le=100_000, description="most non-terminal jobs at once")
    submit_per_minute: Int = Field(default=60, ge=1, le=100_000, description="job submissions per minute")


class TenantUpdate(_In):
    gpu_quota: Annotated[int, Field(ge=0, le=1_000_000), BeforeValidator(_integral)] | None = None
    weight: float | None = Field(default=None, gt=0, le=1e6, allow_inf_nan=False)
    max_jobs: Annotated[int, Field(ge=1, le=100_000), BeforeValidator(_integral)] | None = None
    submit_per_minute: Annotated[int, Field(ge=1, le=100_000), BeforeValidator(_integral)] | None = None


class TenantPublic(_Out):
    id: int
    name: str
    gpu_quota: int
    weight: float
    max_jobs: int
    submit_per_minute: int
    created_at: dt.datetime


class TenantList(BaseModel):
    items: list[TenantPublic] = Field(max_length=100)
    next_cursor: int | None = None


class TokenCreate(_In):
    name: Text64 = ""
    expires_in_days: Annotated[int, Field(ge=1, le=3650), BeforeValidator(_integral)] | None = Field(default=90, description="null: never expires")


class TokenCreated(_Out):
    id: int
    tenant_id: int
    name: str
    prefix: str = Field(description="first characters of the token, safe to show")
    token: str = Field(description="the secret: shown once, stored only as a hash")
    created_at: dt.datetime
    expires_at: dt.datetime | None = None


# ------------------------------------------------------------------------------------- system
class Health(BaseModel):
    status: Literal["ok"]


class Ready(BaseModel):
    status: Literal["ready", "not ready"]
    checks: dict[str, str]
    warnings: list[str] = Field(default_factory=list, description="e.g. ORTHOPLEX_ALLOW_INSECURE_RAY is set")
