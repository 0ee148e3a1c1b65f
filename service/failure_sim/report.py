"""What a simulation prints: the verdict against the goals, the table (markdown too) and the plot."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from planner.recovery_names import REPLICA_GROUP, RESTART
from service.failure_sim.simulation import Simulation

#: the issue's goals for Orthoplex's best policy
TARGET_UP_TO_16K = 0.97
TARGET_ABOVE_16K = 0.90


def target_for(job_gpus: int) -> float:
    return TARGET_UP_TO_16K if job_gpus <= 16_384 else TARGET_ABOVE_16K


def verdict(sim: Simulation) -> str:
    """Whether Orthoplex's best policy reaches the goal, and if not, what would have to change."""
    ours = [r for r in sim.results if not r.name.startswith(RESTART)]
    if not ours:
        return "no Orthoplex policy simulated"
    best = max(ours, key=lambda r: r.ettr)
    target = target_for(sim.throughput.job_gpus)
    if best.ettr >= target:
        return f"best Orthoplex policy {best.name}: ETTR {best.ettr:.1%} >= goal {target:.0%}"
    m = sim.trace.mttf_s
    lost = sim.throughput.step_s / 2 if best.name.startswith(REPLICA_GROUP) else best.interval_s / 2
    ckpt = best.save_s / best.interval_s if best.interval_s > 0 else 0.0
    r_max = m * (1 - target - ckpt) - lost
    m_min = (best.restart_s + lost) / max(1e-9, 1 - target - ckpt)
    need = (f"recovery per failure <= {r_max:.0f} s (now {best.restart_s:.0f} s)" if r_max > 0 else
            "recovery and lost work below what any restart can reach")
    return (f"best Orthoplex policy {best.name}: ETTR {best.ettr:.1%} < goal {target:.0%}; it would need "
            f"{need}, or a job MTTF >= {m_min / 60:.0f} min (now {m / 60:.0f} min), or spares enough that "
            "it never runs short")


def rows(sim: Simulation) -> list[list[str]]:
    out = []
    for r in sim.results:
        out.append([r.name, f"{r.ettr:.1%}", f"{sim.closed[r.name]:.1%}", f"{r.lost_gpu_hours:,.0f}",
                    str(r.recoveries), f"{r.mean_recovery_s:,.1f}", f"{r.tokens:.3g}"])
    return out


HEADERS = ["policy", "ETTR", "closed form", "lost GPU-h", "recoveries", "mean recovery s", "tokens"]


def summary_lines(sim: Simulation) -> list[str]:
    c, x, tr = sim.config, sim.extras, sim.trace
    return [
        f"{c.gpus:,} GPUs ({c.gpus_per_node}/node), {c.days:g} days, seed {c.seed}, rates {c.rates}; job "
        f"{x['layout']} on {x['job_gpus']:,} GPUs ({x['tokens_per_s']:,.0f} tokens/s, step {x['step_s']:.2f} s), "
        f"{x['idle_nodes']} idle nodes + {c.spares} hot spares",
        f"interruptions: {tr.unexpected} unexpected, {tr.planned} planned; job MTTF {x['mttf_s'] / 3600:.2f} h",
        f"restart (baseline) {c.restart_s:g} s; Orthoplex phases from storage {x['phases_storage']}; "
        f"replica-group stall {x['stall_s']:.1f} s",
        f"base recovery phases: {x['calibration']['source']}",
        f"checkpoint to storage {sim.cost.save_storage_s():.2f} s: Young {x['young_storage_s']:.0f} s, "
        f"Daly {x['daly_storage_s']:.0f} s; snapshot {sim.cost.snapshot_s():.3f} s",
        verdict(sim),
        f"{sim.events:,} events in {sim.wall_s:.2f} s ({x['planner_calls']} planner calls, {x['planner_s']:.2f} s)",
    ]


def markdown(sim: Simulation) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(sim)]
    return "\n".join(lines)


def print_table(sim: Simulation) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=140)
    table = Table(title="Goodput by recovery policy (same failure trace)")
    for h in HEADERS:
        table.add_column(h, justify="left" if h == "policy" else "right")
    for r in rows(sim):
        table.add_row(*r)
    console.print(table)
    for line in summary_lines(sim):
        console.print(line, highlight=False, markup=False)


def plot(points: Mapping[int, Mapping[str, float]], path: Path, title: str) -> None:
    """ETTR against cluster size, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(points)
    names = list(next(iter(points.values())).keys()) if points else []
    fig, ax = plt.subplots(figsize=(8, 5))
    for name in names:
        ax.plot(sizes, [100 * points[n][name] for n in sizes], marker="o", label=name,
                linestyle="--" if "+k" in name else "-")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([f"{n // 1024}k" for n in sizes])
    ax.set_xlabel("cluster size (GPUs)")
    ax.set_ylabel("ETTR (%)")
    ax.set_ylim(0, 100)
    ax.grid(True, alpha=0.3)
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
