"""The planner's input: parse a dict shaped like a ``published_cases.json`` record into a frozen spec.

Every error is a :class:`SpecError` whose message starts with the dotted field name
(``model.heads``, ``cluster.num_gpus``, ...), so a CLI or an HTTP handler can show it as is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from planner.failure_rates import FAILURE_RATE_NAMES, FailureRates
from planner.failure_rates import resolve as resolve_rates
from planner.layout import (
    CP_METHODS,
    SCHEDULES,
    ZERO_STAGES,
    checkpoint_interval,
    normalise_recompute,
    recompute_error,
)
from planner.profiles import FP8_FRACTION, lookup_gpu, lookup_model
from planner.recovery_cost import PHASES, PRIOR, Calibration, Phases


class SpecError(ValueError):
    """Bad planner input; ``field`` is the dotted name of the offending field."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


ATTENTION_KERNELS = ("flash", "fused", "materialized")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq_len: int
    name: str = ""
    gated_mlp: bool = True  # SwiGLU (3 matrices) vs GeLU MLP (2 matrices)
    # "flash": FlashAttention-2-class kernel (PyTorch SDPA, flash-attn 2); "fused": the vendor's fused
    # kernel (cuDNN / Transformer Engine, FlashAttention-3 class on Hopper); both keep no s^2
    # activations and skip the causal half; "materialized": s^2 scores in memory (pre-2022 stacks)
    attention: str = "flash"
    tied_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclass(frozen=True, slots=True)
class NodeSpec:
    id: str | int
    gpus: int
    speed: float = 1.0


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    num_gpus: int
    gpus_per_node: int
    gpu_mem_gb: float
    peak_tflops: float
    peak_tflops_fp8: float
    mem_bw_GBps: float
    intra_node_bw_GBps: float
    inter_node_bw_Gbps_per_gpu: float
    gemm_efficiency: float
    attention_efficiency: float
    nodes: tuple[NodeSpec, ...]
    fused_attention_efficiency: float = 0.0  # 0 = same as attention_efficiency
    fp8_gemm_efficiency: float = 0.0  # of the fp8 peak, large GEMMs; 0 = FP8_FRACTION x gemm_efficiency
    gpu_type: str = ""
    min_gpus: int = 0  # 0 = exactly num_gpus


@dataclass(frozen=True, slots=True)
class PlanSpec:
    model: ModelSpec
    cluster: ClusterSpec
    global_batch: int
    precision: str = "bf16"  # bf16 | fp16 | fp8
    fixed: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)  # parallel fields the job fixes
    engine_only: bool = False
    tp_overlap: bool = False  # the training software pipelines TP collectives with GEMMs (parallel.tp_overlap)
    memory_headroom: float = 0.05  # fraction of GPU memory kept free
    restart_s: float = 60.0  # replan: process restart + NCCL init + first step warm-up
    checkpoint_read_GBps: float = 2.0  # replan: per-GPU checkpoint load bandwidth
    horizon_s: float = 3600.0  # replan: time over which a switch must pay for itself
    # goodput-aware plans (planner.goodput): on when duration_days is given
    duration_days: float | None = None
    failure_rates: FailureRates | None = None
    calibration: Calibration = PRIOR  # base recovery phases: this cluster's recorded ones, or the prior

    def with_cluster(self, cluster: ClusterSpec) -> PlanSpec:
        return replace(self, cluster=cluster)


# --------------------------------------------------------------------------------------- helpers
LIMITS = {"model.layers": 4096, "cluster.num_gpus": 1 << 20, "training.global_batch": 1 << 24,
          "parallel.global_batch": 1 << 24, "model.seq_len": 1 << 24}
DEFAULT_LIMIT = 1 << 31


def _int(value: Any, name: str, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or value is None:
        raise SpecError(name, f"must be an integer >= {minimum}, got {value!r}")
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise SpecError(name, f"must be an integer >= {minimum}, got {value!r}")
        value = int(value)
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise SpecError(name, f"must be an integer >= {minimum}, got {value!r}") from None
    if not isinstance(value, int):
        raise SpecError(name, f"must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise SpecError(name, f"must be an integer >= {minimum}, got {value!r}")
    limit = LIMITS.get(name, DEFAULT_LIMIT)
    if value > limit:
        raise SpecError(name, f"must be at most {limit}, got {value!r}")
    return value


def _float(value: Any, name: str, *, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(name, f"must be a number, got {value!r}")
    f = float(value)
    if not math.isfinite(f) or (positive and f <= 0):
        raise SpecError(name, f"must be a positive number, got {value!r}")
    return f


def _bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise SpecError(name, f"must be true or false, got {value!r}")


def _section(spec: Mapping[str, Any], key: str, *, required: bool) -> Mapping[str, Any]:
    value = spec.get(key)
    if value is None:
        if required:
            raise SpecError(key, "is required")
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(key, f"must be an object, got {type(value).__name__}")
    return value


def _check_keys(section: Mapping[str, Any], prefix: str, known: set[str]) -> None:
    for key in section:
        if key not in known:
            raise SpecError(f"{prefix}.{key}", f"unknown field; known: {', '.join(sorted(known))}")


# --------------------------------------------------------------------------------------- model
_MODEL_KEYS = {"name", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len", "gated_mlp",
               "attention", "tied_embeddings", "notes"}


def parse_model(raw: Mapping[str, Any]) -> ModelSpec:
    _check_keys(raw, "model", _MODEL_KEYS)
    values: dict[str, Any] = {}
    name = raw.get("name") or ""
    if not isinstance(name, str):
        raise SpecError("model.name", f"must be a string, got {name!r}")
    preset = lookup_model(name) if name else None
    for key in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len"):
        value = raw.get(key)
        if value is None and preset is not None:
            value = preset[key]
        if value is None and key == "kv_heads":
            value = raw.get("heads") if raw.get("heads") is not None else (preset or {}).get("heads")
        if value is None and key == "ffn" and raw.get("hidden") is not None:
            value = 4 * _int(raw["hidden"], "model.hidden")
        if value is None:
            hint = f" (no built-in preset named {name!r})" if name and preset is None else ""
            raise SpecError(f"model.{key}", f"is required{hint}")
        values[key] = _int(value, f"model.{key}")
    if values["hidden"] % values["heads"]:
        raise SpecError("model.heads", f"hidden {values['hidden']} is not divisible by heads {values['heads']}")
    if values["kv_heads"] > values["heads"] or values["heads"] % values["kv_heads"]:
        raise SpecError("model.kv_heads", f"heads {values['heads']} is not a multiple of kv_heads {values['kv_heads']}")
    gated = raw.get("gated_mlp")
    # GPT-style MLPs use ffn = 4h with two matrices; Llama-style SwiGLU uses three and ffn != 4h.
    values["gated_mlp"] = _bool(gated, "model.gated_mlp") if gated is not None else values["ffn"] != 4 * values["hidden"]
    attention = raw.get("attention", "flash")
    if attention not in ATTENTION_KERNELS:
        raise SpecError("model.attention", f"must be one of {', '.join(ATTENTION_KERNELS)}, got {attention!r}")
    values["attention"] = attention
    values["tied_embeddings"] = _bool(raw.get("tied_embeddings", False), "model.tied_embeddings")
    return ModelSpec(name=name, **values)


# --------------------------------------------------------------------------------------- cluster
_CLUSTER_KEYS = {"gpu_type", "num_gpus", "gpus_per_node", "gpu_mem_gb", "peak_tflops", "peak_tflops_fp8",
                 "mem_bw_GBps", "intra_node_bw_GBps", "inter_node_bw_Gbps_per_gpu", "gemm_efficiency",
                 "attention_efficiency", "fused_attention_efficiency", "fp8_gemm_efficiency",
                 "nodes", "failed_nodes", "lost_nodes", "node_speeds", "min_gpus", "allow_fewer",
                 "cluster_notes", "notes"}


def _parse_nodes(raw: Any, gpus_per_node: int | None) -> list[NodeSpec]:
    if not isinstance(raw, list) or not raw:
        raise SpecError("cluster.nodes", "must be a non-empty list of {id, gpus, speed}")
    nodes: list[NodeSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        where = f"cluster.nodes[{i}]"
        if not isinstance(item, Mapping):
            raise SpecError(where, f"must be an object, got {item!r}")
        _check_keys(item, where, {"id", "gpus", "speed", "name"})
        node_id = item.get("id", item.get("name", i))
        if not isinstance(node_id, str | int) or isinstance(node_id, bool):
            raise SpecError(f"{where}.id", f"must be a string or integer, got {node_id!r}")
        if str(node_id) in seen:
            raise SpecError(f"{where}.id", f"duplicate node id {node_id!r}")
        seen.add(str(node_id))
        gpus = item.get("gpus", gpus_per_node)
        if gpus is None:
            raise SpecError(f"{where}.gpus", "is required")
        speed = _float(item.get("speed", 1.0), f"{where}.speed")
        nodes.append(NodeSpec(id=node_id, gpus=_int(gpus, f"{where}.gpus"), speed=speed))
    return nodes


def parse_cluster(raw: Mapping[str, Any], top: Mapping[str, Any]) -> ClusterSpec:
    _check_keys(raw, "cluster", _CLUSTER_KEYS)
    gpu_type = raw.get("gpu_type") or ""
    if not isinstance(gpu_type, str):
        raise SpecError("cluster.gpu_type", f"must be a string, got {gpu_type!r}")
    prof = lookup_gpu(gpu_type) if gpu_type else None
    if prof is None and (raw.get("peak_tflops") is None or raw.get("gpu_mem_gb") is None):
        what = f"unknown GPU type {gpu_type!r}" if gpu_type else "no gpu_type"
        raise SpecError("cluster.gpu_type", f"{what}; name a known one (A100, A800, H100, H800, H200, B200, "
                        "V100, L40S, MI300X, CPU) or give cluster.peak_tflops and cluster.gpu_mem_gb")

    def pick(key: str, default: float | None) -> float:
        value = raw.get(key)
        if value is None:
            if default is None:
                raise SpecError(f"cluster.{key}", "is required")
            return float(default)
        return _float(value, f"cluster.{key}")

    peak = pick("peak_tflops", prof.peak_tflops if prof else None)
    mem = pick("gpu_mem_gb", prof.mem_gb if prof else None)
    fp8_default = (prof.peak_tflops_fp8 if prof and prof.peak_tflops_fp8 else 2 * peak)
    gpn_raw = raw.get("gpus_per_node")
    nodes_raw = raw.get("nodes")
    gpus_per_node = _int(gpn_raw, "cluster.gpus_per_node") if gpn_raw is not None else None
    if nodes_raw is not None:
        nodes = _parse_nodes(nodes_raw, gpus_per_node)
        total = sum(n.gpus for n in nodes)
        if raw.get("num_gpus") is not None:
            n = _int(raw["num_gpus"], "cluster.num_gpus")
            if n > total:
                raise SpecError("cluster.num_gpus", f"{n} is more than the {total} GPUs of cluster.nodes")
        if gpus_per_node is None:
            gpus_per_node = max(n.gpus for n in nodes)
    else:
        if raw.get("num_gpus") is None:
            raise SpecError("cluster.num_gpus", "is required (or give cluster.nodes)")
        total = _int(raw["num_gpus"], "cluster.num_gpus")
        if gpus_per_node is None:
            gpus_per_node = min(prof.gpus_per_node if prof else 8, total)
        full, rest = divmod(total, gpus_per_node)
        nodes = [NodeSpec(id=i, gpus=gpus_per_node) for i in range(full)]
        if rest:
            nodes.append(NodeSpec(id=full, gpus=rest))
    # re-planning inputs: nodes that are gone, per-node speeds
    gone = raw.get("failed_nodes", raw.get("lost_nodes")) or []
    if not isinstance(gone, list):
        raise SpecError("cluster.failed_nodes", "must be a list of node ids")
    gone_ids = {str(g) for g in gone}
    unknown = gone_ids - {str(n.id) for n in nodes}
    if unknown:
        raise SpecError("cluster.failed_nodes", f"unknown node id(s) {sorted(unknown)}")
    speeds = raw.get("node_speeds") or {}
    if not isinstance(speeds, Mapping):
        raise SpecError("cluster.node_speeds", "must map node id -> relative speed")
    by_id = {str(n.id): n for n in nodes}
    for key, value in speeds.items():
        if str(key) not in by_id:
            raise SpecError("cluster.node_speeds", f"unknown node id {key!r}")
        by_id[str(key)] = replace(by_id[str(key)], speed=_float(value, f"cluster.node_speeds.{key}"))
    nodes = [by_id[str(n.id)] for n in nodes if str(n.id) not in gone_ids]
    if not nodes:
        raise SpecError("cluster.failed_nodes", "no node is left")
    total = sum(n.gpus for n in nodes)
    num_gpus = total
    if raw.get("num_gpus") is not None and nodes_raw is not None:
        num_gpus = min(total, _int(raw["num_gpus"], "cluster.num_gpus"))
    min_gpus = 0
    mg = raw.get("min_gpus", top.get("min_gpus"))
    allow = raw.get("allow_fewer", top.get("allow_fewer", False))
    if mg is not None:
        min_gpus = min(_int(mg, "cluster.min_gpus"), num_gpus)
    elif _bool(allow, "cluster.allow_fewer"):
        min_gpus = 1
    eff = pick("gemm_efficiency", prof.gemm_efficiency if prof else 0.7)
    if eff > 1:
        raise SpecError("cluster.gemm_efficiency", f"must be in (0, 1], got {eff}")
    attn_eff = pick("attention_efficiency", prof.attention_efficiency if prof else 0.6 * eff)
    if attn_eff > 1:
        raise SpecError("cluster.attention_efficiency", f"must be in (0, 1], got {attn_eff}")
    fused_eff = pick("fused_attention_efficiency", prof.fused_attention_efficiency or attn_eff if prof else attn_eff)
    if fused_eff > 1:
        raise SpecError("cluster.fused_attention_efficiency", f"must be in (0, 1], got {fused_eff}")
    fp8_eff = pick("fp8_gemm_efficiency", prof.fp8_gemm_efficiency or FP8_FRACTION * eff if prof else FP8_FRACTION * eff)
    if fp8_eff > 1:
        raise SpecError("cluster.fp8_gemm_efficiency", f"must be in (0, 1], got {fp8_eff}")
    return ClusterSpec(
        num_gpus=num_gpus,
        gpus_per_node=gpus_per_node,
        gpu_mem_gb=mem,
        peak_tflops=peak,
        peak_tflops_fp8=pick("peak_tflops_fp8", fp8_default),
        mem_bw_GBps=pick("mem_bw_GBps", prof.mem_bw_GBps if prof else peak * 1000 / 150),
        intra_node_bw_GBps=pick("intra_node_bw_GBps", prof.intra_node_bw_GBps if prof else 100.0),
        inter_node_bw_Gbps_per_gpu=pick("inter_node_bw_Gbps_per_gpu",
                                        prof.inter_node_bw_Gbps_per_gpu if prof else 100.0),
        gemm_efficiency=eff,
        attention_efficiency=attn_eff,
        fused_attention_efficiency=fused_eff,
        fp8_gemm_efficiency=fp8_eff,
        nodes=tuple(nodes),
        gpu_type=prof.name if prof else gpu_type,
        min_gpus=min_gpus,
    )


# --------------------------------------------------------------------------------------- parallel
_PARALLEL_KEYS = {"tp", "pp", "cp", "dp", "dp_replicate", "vpp", "micro_batch", "global_batch", "sp", "zero",
                  "recompute", "schedule", "cp_method", "num_micro_batches", "tp_overlap"}


def parse_parallel(raw: Mapping[str, Any]) -> dict[str, Any]:
    _check_keys(raw, "parallel", _PARALLEL_KEYS)
    fixed: dict[str, Any] = {}
    for key in ("tp", "pp", "cp", "dp", "dp_replicate", "vpp", "micro_batch"):
        if raw.get(key) is not None:
            fixed[key] = _int(raw[key], f"parallel.{key}")
    if raw.get("sp") is not None:
        fixed["sp"] = _bool(raw["sp"], "parallel.sp")
    if raw.get("zero") is not None:
        z = _int(raw["zero"], "parallel.zero", minimum=0)
        if z not in ZERO_STAGES:
            raise SpecError("parallel.zero", f"must be one of {', '.join(map(str, ZERO_STAGES))}, got {z}")
        fixed["zero"] = z
    if raw.get("recompute") is not None:
        rc = normalise_recompute(raw["recompute"])
        bad = recompute_error(rc)
        if bad:
            raise SpecError("parallel.recompute", bad)
        fixed["recompute"] = rc
    for key, allowed in (("schedule", SCHEDULES), ("cp_method", CP_METHODS)):
        if raw.get(key) is not None:
            if raw[key] not in allowed:
                raise SpecError(f"parallel.{key}", f"must be one of {', '.join(allowed)}, got {raw[key]!r}")
            fixed[key] = raw[key]
    if fixed.get("dp_replicate", 1) > 1 and fixed.get("zero") == 0:
        raise SpecError("parallel.dp_replicate", "replica groups (dp_replicate > 1) need zero 1 or 3")
    if "dp" in fixed and fixed["dp"] % fixed.get("dp_replicate", 1):
        raise SpecError("parallel.dp_replicate", f"must divide dp {fixed['dp']}, got {fixed['dp_replicate']}")
    if fixed.get("schedule") == "interleaved" and fixed.get("vpp") == 1:
        raise SpecError("parallel.vpp", "schedule interleaved needs vpp >= 2 (vpp 1 is the plain 1f1b pipeline)")
    if fixed.get("vpp", 1) > 1 and fixed.get("schedule", "interleaved") != "interleaved":
        raise SpecError("parallel.schedule", f"vpp {fixed['vpp']} needs schedule interleaved, got {fixed['schedule']!r}")
    if fixed.get("schedule") == "interleaved" and fixed.get("pp") == 1:
        raise SpecError("parallel.schedule", "interleaved needs pp > 1")
    return fixed


def parse_precision(value: Any) -> str:
    if value is None:
        return "bf16"
    if not isinstance(value, str):
        raise SpecError("precision", f"must be bf16, fp16 or fp8, got {value!r}")
    v = value.lower()
    if "fp8" in v or "float8" in v:
        return "fp8"
    if "bf16" in v or "bfloat16" in v:
        return "bf16"
    if "fp16" in v or "float16" in v:
        return "fp16"
    if "amp" in v or "mixed" in v:
        return "bf16"
    raise SpecError("precision", f"must be bf16, fp16 or fp8, got {value!r}")


# --------------------------------------------------------------------------------------- spec
def parse_spec(spec: Mapping[str, Any] | PlanSpec, *, engine_only: bool | None = None) -> PlanSpec:
    """Build a :class:`PlanSpec` from a dict (unknown top-level keys such as ``measured`` are ignored)."""
    if isinstance(spec, PlanSpec):
        return spec if engine_only is None else replace(spec, engine_only=engine_only)
    if not isinstance(spec, Mapping):
        raise SpecError("spec", f"must be an object, got {type(spec).__name__}")
    model = parse_model(_section(spec, "model", required=True))
    cluster = parse_cluster(_section(spec, "cluster", required=True), spec)
    parallel_raw = _section(spec, "parallel", required=False)
    fixed = parse_parallel(parallel_raw)
    training = _section(spec, "training", required=False)
    gb = parallel_raw.get("global_batch")
    gb_field = "parallel.global_batch"
    if gb is None:
        gb, gb_field = training.get("global_batch"), "training.global_batch"
    if gb is None:
        raise SpecError("parallel.global_batch", "is required (in parallel or training)")
    global_batch = _int(gb, gb_field)
    if "micro_batch" in fixed and global_batch % fixed["micro_batch"]:
        raise SpecError("parallel.micro_batch", f"does not divide global_batch {global_batch}")
    every = checkpoint_interval(fixed.get("recompute", "none"))
    if every > max(2, model.layers):  # layer:N checkpoints every N-th layer of a stage: N <= the layers
        raise SpecError("parallel.recompute", f"layer:N needs N <= the model's {model.layers} layers (a larger N "
                                              f"checkpoints no layer: that is none), got {fixed['recompute']!r}")
    eo = spec.get("engine_only", False) if engine_only is None else engine_only
    tp_overlap = _bool(parallel_raw.get("tp_overlap", False), "parallel.tp_overlap")
    if tp_overlap and _bool(eo, "engine_only"):
        raise SpecError("parallel.tp_overlap", "workers/engine does not overlap TP communication with its GEMMs; "
                                               "leave it false for engine-only plans")
    extra: dict[str, float] = {}
    for key in ("restart_s", "checkpoint_read_GBps", "horizon_s", "memory_headroom"):
        value = training.get(key, spec.get(key))
        if value is not None:
            extra[key] = _float(value, f"training.{key}", positive=key != "memory_headroom")
    if extra.get("memory_headroom", 0.05) >= 1:
        raise SpecError("training.memory_headroom", "must be below 1")
    duration, rates, calibration = parse_goodput(spec, cluster.gpus_per_node)
    return PlanSpec(model=model, cluster=cluster, global_batch=global_batch,
                    precision=parse_precision(spec.get("precision")), fixed=fixed,
                    engine_only=_bool(eo, "engine_only"), tp_overlap=tp_overlap, duration_days=duration,
                    failure_rates=rates, calibration=calibration, **extra)  # type: ignore[arg-type]


MAX_DURATION_DAYS = 3650.0


def parse_goodput(spec: Mapping[str, Any], gpus_per_node: int) -> tuple[float | None, FailureRates | None,
                                                                         Calibration]:
    """``duration_days`` (turns goodput-aware ranking on), ``failure_rates`` (``llama3`` | ``rsc``, default
    ``llama3``; or ``cluster``'s numbers: ``{"name": "cluster", "node_failures_per_node_day": x,
    "node_days": n}``, which the service resolves) and ``recovery_phases`` (the base phases,
    ``{"phases": {detect, plan, place, start, load, first_step}, "recorded": n, "source": "..."}``;
    default: the prior)."""
    raw_days = spec.get("duration_days")
    raw_rates = spec.get("failure_rates")
    raw_phases = spec.get("recovery_phases")
    if raw_days is None:
        if raw_rates is not None:
            raise SpecError("duration_days", "is required with failure_rates (the job's expected days of training)")
        return None, None, PRIOR
    days = _float(raw_days, "duration_days")
    if days > MAX_DURATION_DAYS:
        raise SpecError("duration_days", f"must be at most {MAX_DURATION_DAYS:g}, got {raw_days!r}")
    if raw_rates is None:
        raw_rates = "llama3"
    if isinstance(raw_rates, str) and raw_rates not in FAILURE_RATE_NAMES:
        raise SpecError("failure_rates", f"must be one of {', '.join(FAILURE_RATE_NAMES)}, got {raw_rates!r}")
    if not isinstance(raw_rates, str | Mapping):
        raise SpecError("failure_rates", f"must be one of {', '.join(FAILURE_RATE_NAMES)}, got {raw_rates!r}")
    try:
        rates = resolve_rates(raw_rates, gpus_per_node)
    except ValueError as exc:
        field_name, _, msg = str(exc).partition(": ")
        raise SpecError(field_name, msg) from None
    return days, rates, _parse_calibration(raw_phases)


def _parse_calibration(raw: Any) -> Calibration:
    if raw is None:
        return PRIOR
    if not isinstance(raw, Mapping) or not isinstance(raw.get("phases"), Mapping):
        raise SpecError("recovery_phases", "must be {\"phases\": {phase: seconds}, \"recorded\": n, \"source\": ...}")
    values = {}
    for p in PHASES:
        v = raw["phases"].get(p)
        if v is None:
            raise SpecError(f"recovery_phases.phases.{p}", "is required")
        values[p] = _float(v, f"recovery_phases.phases.{p}", positive=False)
        if values[p] < 0:
            raise SpecError(f"recovery_phases.phases.{p}", f"must be >= 0 seconds, got {v!r}")
    recorded = _int(raw.get("recorded", 0), "recovery_phases.recorded", minimum=0)
    source = raw.get("source", "given in the spec")
    if not isinstance(source, str):
        raise SpecError("recovery_phases.source", f"must be a string, got {source!r}")
    return Calibration(Phases(**values), recorded, source)
