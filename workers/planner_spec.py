"""Job spec + cluster -> the planner's input: the one builder, used by the API's fit check and dry
run (``service.api.fit_check``), the controller's goodput curves (``service.controller.curves``) and
the runtime's plans and re-plans (``workers.runtime.policy.planning``), so the fit check, the goodput
curve and the real plan price the same model, batch, hint and precision on the same GPU profile.

Pure Python (no torch, no Ray).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from planner.layout import parse_hint
from workers.engine.config import planner_model

PRECISION = "bf16"  # what the engine trains in
#: the job's goodput inputs the planner reads (``failure_rates`` as a table's name or the cluster's numbers)
GOODPUT_KEYS: tuple[str, ...] = ("duration_days", "failure_rates", "recovery_phases")


@dataclass(frozen=True)
class PlanCluster:
    """The GPUs a plan may use: ``num_gpus`` at most (and at least ``min_gpus``, when given; else
    exactly ``num_gpus``), either on a uniform cluster of ``gpus_per_node`` or on explicit ``nodes``
    (``[{"id", "gpus", "speed"}]``, the runtime's view of the GPUs Ray has)."""

    gpu_type: str
    num_gpus: int
    min_gpus: int | None = None
    gpus_per_node: int | None = None
    nodes: Sequence[Mapping[str, Any]] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"gpu_type": self.gpu_type, "num_gpus": int(self.num_gpus)}
        if self.min_gpus is not None:
            out["min_gpus"] = int(self.min_gpus)
        if self.nodes:
            out["nodes"] = [dict(n) for n in self.nodes]
        elif self.gpus_per_node is not None:
            out["gpus_per_node"] = min(int(self.gpus_per_node), int(self.num_gpus))
        return out


def hint_fields(hint: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """The parallel fields a layout hint fixes: a dict as given (the planner judges its values and
    names the field it refuses), or the CLI syntax ``"tp=2,pp=2"`` parsed."""
    if isinstance(hint, Mapping):
        return {k: v for k, v in hint.items() if v is not None}
    return parse_hint(hint)


def to_planner_spec(job: Mapping[str, Any], cluster: PlanCluster, *,
                    training: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``planner.plan`` / ``planner.replan`` spec of ``job`` (a job spec in its submitted shape:
    ``model`` preset name or shape, ``global_batch``, optional ``layout_hint``) on ``cluster``,
    restricted to what the engine runs. ``training``: the planner's ``restart_s`` / ``horizon_s``."""
    parallel: dict[str, Any] = {"global_batch": int(job["global_batch"]), **hint_fields(job.get("layout_hint"))}
    spec: dict[str, Any] = {
        "model": planner_model(job.get("model", "tiny")),
        "cluster": cluster.to_dict(),
        "parallel": parallel,
        "precision": PRECISION,
        "engine_only": True,
    }
    if training:
        spec["training"] = dict(training)
    for key in GOODPUT_KEYS:  # goodput-aware plans (planner.goodput)
        if job.get(key) is not None:
            spec[key] = job[key]
    return spec
