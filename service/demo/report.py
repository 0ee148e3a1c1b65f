"""The demo's closing report: a loss curve as a PNG and in the terminal, plans used, GPU time lost."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class JobReport:
    """What one job did, reconstructed from its events and metrics."""

    job_id: int
    name: str
    tenant: str
    state: str
    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    layouts: list[str] = field(default_factory=list)
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    replans: list[dict[str, Any]] = field(default_factory=list)
    gpu_seconds_lost: float = 0.0

    @classmethod
    def from_api(cls, job: dict[str, Any], events: Sequence[dict[str, Any]], metrics: Sequence[dict[str, Any]],
                 tenant: str) -> JobReport:
        rep = cls(job_id=int(job["id"]), name=str(job.get("name", "")), tenant=tenant, state=str(job.get("state")))
        by_step: dict[int, float] = {}
        for m in metrics:  # a step re-run after a recovery keeps its latest value
            if m.get("loss") is not None:
                by_step[int(m["step"])] = float(m["loss"])
        rep.steps = sorted(by_step)
        rep.losses = [by_step[s] for s in rep.steps]
        gpus_now = 0  # GPUs of the layout the job runs on, to price a recovery
        for ev in events:
            payload = ev.get("payload") or ev
            etype = ev.get("type")
            layout = payload.get("layout")
            if etype in ("plan", "resumed", "ranks_mapped") and isinstance(layout, dict):
                gpus_now = _world(layout)
            if etype == "plan":
                label = _layout_label(payload.get("layout") or payload.get("plan", {}).get("layout"))
                if label and (not rep.layouts or rep.layouts[-1] != label):
                    rep.layouts.append(label)
            elif etype == "replan":
                rep.replans.append(payload)
                label = _layout_label(payload.get("new"))
                if label and (not rep.layouts or rep.layouts[-1] != label):
                    rep.layouts.append(label)
            elif etype == "recovery":
                rep.recoveries.append(payload)
                phases = payload.get("phases") or {}
                lost_steps_s = float(payload.get("lost_work_s", 0.0))
                gpus = int(payload.get("gpus_before", 0) or 0) or gpus_now
                rep.gpu_seconds_lost += gpus * (sum(float(v) for v in phases.values()) + lost_steps_s)
        return rep


def _world(layout: dict[str, Any]) -> int:
    return int(layout.get("tp", 1) or 1) * int(layout.get("pp", 1) or 1) * int(layout.get("cp", 1) or 1) * int(
        layout.get("dp", 1) or 1
    )


def _layout_label(layout: Any) -> str | None:
    if not isinstance(layout, dict):
        return None
    label = f"tp{layout.get('tp', 1)}·pp{layout.get('pp', 1)}·cp{layout.get('cp', 1)}·dp{layout.get('dp', 1)}"
    if int(layout.get("vpp", 1) or 1) > 1:
        label += f"·vpp{layout['vpp']}"
    return label


def save_loss_png(reports: Sequence[JobReport], path: Path) -> Path:
    """Loss against step for every job, recoveries marked; written with matplotlib's Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for rep in reports:
        if rep.steps:
            ax.plot(rep.steps, rep.losses, label=f"job {rep.job_id} {rep.name} ({rep.tenant})")
        for rec in rep.recoveries:
            if "from_step" in rec:
                ax.axvline(int(rec["from_step"]), color="red", linestyle="--", linewidth=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("Orthoplex demo: training loss (dashed: resumed after a failure)")
    ax.grid(alpha=0.3)
    if any(r.steps for r in reports):
        ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def terminal_loss_chart(reports: Sequence[JobReport], width: int = 90, height: int = 18) -> str:
    """The same curves drawn with plotext, as a string for the terminal."""
    import plotext as plt

    plt.clear_figure()
    plt.plotsize(width, height)
    plt.theme("clear")
    for rep in reports:
        if rep.steps:
            plt.plot(rep.steps, rep.losses, label=f"job {rep.job_id}")
    plt.title("loss")
    plt.xlabel("step")
    return plt.build()
