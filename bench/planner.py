"""Planner benchmark: search speed against a naive exhaustive search, plus the calibration table.

``run()`` times the whole ``planner.plan`` for Llama-3 405B on 16,384 H100 GPUs with every knob
free (target: under 1 s) and, in the same run, a naive exhaustive search over the same space
(every TP/CP/PP/DP factorization x micro-batch (up to 64) x vpp (every count the cost model accepts,
uneven chunks included) x schedule x SP x ZeRO x replica groups x recompute (every ``layer:N`` the
cost model accepts, N = 2 .. the busiest stage's layers, each costed) x CP method, each costed,
no dominance or bound pruning). Its limits, stated next to its numbers: micro-batches above 64 are not
tried (the planner does not try them either unless the spec fixes one), and replica groups
(``dp_replicate``) are tried only in the planner's own candidate set (``replica_options``: none, or
the split whose shard groups fit in a node), not every divisor of dp. The naive search on 16,384 GPUs takes minutes, so it
is run with a CPU-time budget and its full cost extrapolated from the fraction of factorizations it covered; on a
smaller problem (70B on 512 GPUs) both run to completion and must find the same best step time.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from bench.calibration import markdown as calibration_markdown
from bench.calibration import run_calibration
from planner import constraints as C
from planner.api import plan
from planner.layout import Layout
from planner.memory import memory_limit_gb, memory_total_gb
from planner.search import (
    LAYER_FAMILY,
    MAX_MICRO_BATCH,
    RECOMPUTE_ORDER,
    candidate_worlds,
    divisors,
    links_for,
    replica_options,
)
from planner.spec import PlanSpec, parse_spec
from planner.timing import estimate_time, hardware_for

BIG = {"model": {"name": "llama3-405b"}, "cluster": {"gpu_type": "H100", "num_gpus": 16384},
       "training": {"global_batch": 2048}, "precision": "bf16"}
SMALL = {"model": {"name": "llama3-70b"}, "cluster": {"gpu_type": "H100", "num_gpus": 512},
         "training": {"global_batch": 512}, "precision": "bf16"}


def naive_search(spec: PlanSpec, budget_s: float = math.inf) -> dict[str, Any]:
    """Cost every candidate; stop after ``budget_s`` CPU seconds and report the covered fraction."""
    t0 = time.process_time()
    world = candidate_worlds(spec)[0]
    hw = hardware_for(spec, world.speed)
    limit = memory_limit_gb(spec)
    gb, layers = spec.global_batch, spec.model.layers
    shapes = [(tp, cp, pp, world.size // (tp * cp * pp)) for tp in divisors(world.size)
              for cp in divisors(world.size // tp) for pp in divisors(world.size // (tp * cp))]
    best, costed, done = math.inf, 0, 0
    for tp, cp, pp, dp in shapes:
        if time.process_time() - t0 > budget_s:
            break
        done += 1
        if C.check_tp(spec, tp) or C.check_cp(spec, cp) or pp > layers or gb % dp:
            continue
        reps = replica_options(spec, tp, cp, dp, pp, world.gpus) if dp > 1 else [1]
        links = {r: links_for(hw, tp, cp, dp, pp, world.gpus, r) for r in reps}
        for b in [b for b in divisors(gb // dp) if b <= MAX_MICRO_BATCH]:
            nmb = gb // (dp * b)
            # every stage split the cost model accepts, uneven chunks included (check_pp refuses the rest)
            for v in range(1, layers // pp + 1) if pp > 1 else [1]:
                if C.check_pp(spec, pp, v):
                    continue
                cap = C.layer_checkpoint_cap(spec, pp, v)
                modes = [m for r in RECOMPUTE_ORDER
                         for m in ([f"layer:{n}" for n in range(2, cap + 1)] if r == LAYER_FAMILY else [r])]
                scheds = ["interleaved"] if v > 1 else (["1f1b", "gpipe"] if pp > 1 else ["1f1b"])
                for sched in scheds:
                    for sp in (False, True) if tp > 1 else (False,):
                        for zero, r in [(z, r) for z in (0, 1, 3) for r in (reps if z else [1])]:
                            for rc in modes:
                                for cpm in ("ring", "ulysses") if cp > 1 else ("ring",):
                                    lay = Layout(tp=tp, pp=pp, cp=cp, dp=dp, vpp=v, micro_batch=b,
                                                 num_micro_batches=nmb, sp=sp, zero=zero, recompute=rc,
                                                 schedule=sched, cp_method=cpm, dp_replicate=r)
                                    if C.check_schedule(spec, lay, nmb) or C.check_knobs(spec, lay):
                                        continue
                                    costed += 1
                                    if memory_total_gb(spec, lay) > limit:
                                        continue
                                    t = estimate_time(spec, hw, lay, links[r], detail=False).step_time_s
                                    best = min(best, t)
    elapsed = time.process_time() - t0
    fraction = done / len(shapes)
    return {"best_step_s": best, "costed": costed, "elapsed_s": elapsed, "fraction": fraction,
            "estimated_full_s": elapsed / fraction if fraction else math.inf}


def _stats_cells(a: dict[str, Any]) -> str:
    return (f"{a['cases']} | {100 * a['median']:.1f}% | {100 * a['mean']:.1f}% | {100 * a['max']:.0f}% | "
            f"{a['over']} / {a['under']} | {100 * a['signed_median']:+.1f}%")


STATS_HEAD = "n | median | mean | max | over / under | signed median"


def accuracy_report(quick: bool = False) -> dict[str, Any]:
    """In-sample, left-out and never-fitted error on published runs.

    In-sample: the built-in profiles, whose kernel efficiencies were fitted on every source of the
    two fitted files (``published_cases.json``, ``heldout_cases.json``). Left out: each of those
    sources predicted with efficiencies fitted on the others only (:func:`bench.fit.leave_one_source_out`).
    Never fitted: ``unseen_cases.json``, sources kept out of every fit, predicted with the profiles.
    Errors are predicted / measured - 1 in tokens/s/GPU, reported as |error| and with their sign.
    """
    from rich.progress import Progress

    from bench.calibration import HELDOUT_CASES, UNSEEN_CASES, fitted_cases, load_cases, source_of
    from bench.fit import PARAMETERS, family_of, fit, leave_one_source_out, profile_params, summary

    cases = fitted_cases()
    heldout_sources = {source_of(c) for c in load_cases(HELDOUT_CASES)}
    inside = run_calibration(cases=cases, params=profile_params())["rows"]
    unseen = run_calibration(cases=load_cases(UNSEEN_CASES), params=profile_params())["rows"]
    sources = sorted({source_of(c) for c in cases})
    n_orig = len(sources) - len(heldout_sources)
    with Progress(transient=True) as bar:
        task = bar.add_task("leave-one-source-out fits", total=len(sources))
        left = leave_one_source_out(cases, rounds=1 if quick else 3, progress=lambda _src: bar.advance(task))
    h100 = ("H100", "H800", "H200")
    precision = {c["id"]: c.get("precision") for c in cases}

    def hopper(r: dict[str, Any], prec: str | None = None) -> bool:
        return r["gpu"].upper().startswith(h100) and prec in (None, precision.get(r["case"]))

    groups = (("all fitted sources", lambda r: True),
              (f"original dataset ({n_orig} sources)", lambda r: r["source"] not in heldout_sources),
              (f"held-out dataset ({len(heldout_sources)} sources)", lambda r: r["source"] in heldout_sources),
              ("Hopper runs of the fitted sources", hopper),
              ("Hopper bf16 runs of the fitted sources", lambda r: hopper(r, "bf16")),
              ("Hopper fp8 runs of the fitted sources", lambda r: hopper(r, "fp8")))
    out_rows: list[dict[str, Any]] = []
    by_precision: list[dict[str, Any]] = []  # kept after the never-fitted rows: earlier rows keep their index
    lines = [f"| cases | in sample: {STATS_HEAD} | left out: {STATS_HEAD} |",
             "|---|" + "---:|" * 12]
    for i, (label, keep) in enumerate(groups):
        a, b = summary([r for r in inside if keep(r)]), summary([r for r in left["rows"] if keep(r)])
        lines.append(f"| {label} | {_stats_cells(a)} | {_stats_cells(b)} |")
        (out_rows if i < 4 else by_precision).append(
            {"case": f"accuracy: {label}", "cases": a["cases"], "in_sample": a, "left_out": b})
    lines += ["", f"| left-out source | {STATS_HEAD} | " + " | ".join(p[0] for p in PARAMETERS) + " |",
              "|---|" + "---:|" * (6 + len(PARAMETERS))]
    for src in left["sources"]:
        b = summary([r for r in left["rows"] if r["source"] == src])
        if not b["cases"]:
            continue
        params = left["params"][src]
        lines.append(f"| {src} | {_stats_cells(b)} | " + " | ".join(f"{params[p[0]]:.3f}" for p in PARAMETERS) + " |")
    never = summary(unseen)
    out_rows.append({"case": "accuracy: held-out, never fitted", "cases": never["cases"], "never_fitted": never,
                     "sources": sorted({r["source"] for r in unseen})})
    nf = [f"| held-out source, never fitted | {STATS_HEAD} |", "|---|" + "---:|" * 6]
    for src in sorted({r["source"] for r in unseen}):
        nf.append(f"| {src} | {_stats_cells(summary([r for r in unseen if r['source'] == src]))} |")
    nf.append(f"| all never-fitted runs | {_stats_cells(never)} |")
    # diagnostic, not the profiles: Hopper's bf16 GEMM fraction fitted on the fitted sources' Hopper bf16
    # runs alone (untied from the fp8 runs), the never-fitted runs predicted with it
    bf16_cases = [c for c in cases if c.get("precision") == "bf16" and family_of(c["cluster"].get("gpu_type")) == "hopper"]
    untied = {**profile_params(), "hopper_gemm": fit(bf16_cases, start=profile_params(),
                                                     rounds=1 if quick else 3)["hopper_gemm"]}
    diag = summary(run_calibration(cases=load_cases(UNSEEN_CASES), params=untied)["rows"])
    out_rows.append({"case": "accuracy: never fitted, bf16 GEMM fraction untied (diagnostic)", "cases": diag["cases"],
                     "never_fitted": diag, "hopper_bf16_gemm": untied["hopper_gemm"]})
    out_rows += by_precision
    nf.append(f"| diagnostic: all never-fitted runs with Hopper's bf16 GEMM fraction fitted on the fitted Hopper bf16 "
              f"runs alone ({untied['hopper_gemm']:.3f}; the profiles: {profile_params()['hopper_gemm']:.3f}) | "
              f"{_stats_cells(diag)} |")
    nf += ["", "| never-fitted run | GPU | layout (b, recompute) | measured tok/s/GPU | predicted | error |",
           "|---|---|---|---:|---:|---:|"]
    for r in unseen:
        nf.append(f"| {r['case']} | {r['gpu']} | {r['layout']} (b={r['micro_batch']}, {r['recompute']}) | "
                  f"{r['measured_tokens_per_gpu']:.1f} | {r['predicted_tokens_per_gpu']:.1f} | "
                  f"{100 * r['rel_error']:+.1f}% |")
    text = ("Accuracy on published runs (tokens/s/GPU with the published layout fixed; error = predicted / measured "
            f"- 1, over = predicted too fast). In sample: the built-in profiles, fitted on all {len(sources)} fitted "
            f"sources. Left out: each source predicted with kernel efficiencies fitted on the other {len(sources) - 1}, "
            "starting from bench/fit.py's PRIOR (only its kernel efficiencies are fitted; every other constant is "
            "fixed; Hopper's fp8 GEMM fraction is tied to its bf16 one)."
            "\n\n" + "\n".join(lines)
            + "\n\n**Held-out, never fitted** (`tests/planner/data/unseen_cases.json`): published runs from sources "
            "that take part in no fit, predicted with the built-in profiles.\n\n" + "\n".join(nf))
    return {"markdown": text, "rows": out_rows}


def _time_plan(raw: dict[str, Any], repeats: int) -> tuple[float, float, Any]:
    """Best wall-clock and best CPU seconds of ``plan(raw)`` (CPU time is what the search costs
    when the machine is shared; wall time is what a caller waits)."""
    wall, cpu, result = math.inf, math.inf, None
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        result = plan(raw)
        wall = min(wall, time.perf_counter() - t0)
        cpu = min(cpu, time.process_time() - c0)
    return wall, cpu, result


#: the goodput goals' cases (issue 41): Llama 3 405B as trained (8K sequences, 16M tokens per step) for
#: 54 days with Llama 3's failure rates, and a small job (8 GPUs, one day)
GOODPUT_BIG = {"model": {"name": "llama3-405b", "seq_len": 8192},
               "cluster": {"gpu_type": "H100", "num_gpus": 16384, "gpus_per_node": 8},
               "parallel": {"global_batch": 2048}, "precision": "bf16"}
GOODPUT_SMALL = {"model": {"name": "llama3-8b", "seq_len": 8192},
                 "cluster": {"gpu_type": "H100", "num_gpus": 8, "gpus_per_node": 8},
                 "parallel": {"global_batch": 64}, "precision": "bf16"}
GOODPUT_SEEDS = (0, 1, 2, 3)


def goodput_report(quick: bool = False) -> dict[str, Any]:
    """Goodput-aware plans (planner/goodput.py): the 405B plan's wall time, recovery choice and ETTR
    against ``orthoplex simulate`` on the same inputs (mean over seeds), and what pricing failures adds to a
    small job's plan (best and median of repeated runs, with and without ``duration_days``)."""
    import statistics

    from service.failure_sim.simulation import Config, simulate

    reps = 2 if quick else 5
    big = {**GOODPUT_BIG, "duration_days": 54, "failure_rates": "llama3"}
    walls, cpus = [], []
    result = None
    for _ in range(reps):
        c0, t0 = time.process_time(), time.perf_counter()
        result = plan(big)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    plain_walls = []
    for _ in range(reps):
        t0 = time.perf_counter()
        plan(GOODPUT_BIG)
        plain_walls.append(time.perf_counter() - t0)
    assert result is not None and result.plans
    best = result.plans[0]
    rec = best.recovery or {}
    sims = []
    for seed in GOODPUT_SEEDS[: 2 if quick else len(GOODPUT_SEEDS)]:
        sim = simulate(Config(gpus=16384, gpus_per_node=8, days=54, seed=seed, policies=(rec["policy"],),
                              spares=rec["warm_spares"], rates="llama3", layout=best.layout.spec(),
                              groups=rec["groups"] if rec["policy"] == "replica_group" else None))
        name = f"{rec['policy']}+k{rec['warm_spares']}" if rec["warm_spares"] else rec["policy"]
        sims.append(next(r.ettr for r in sim.results if r.name == name))
    small_reps = 10 if quick else 40
    small_plain, small_priced, cpu_plain, cpu_priced = [], [], [], []
    plain_result = priced_result = None
    for _ in range(small_reps):  # interleaved, so load on a shared machine hits both alike
        c0, t0 = time.process_time(), time.perf_counter()
        plain_result = plan(GOODPUT_SMALL)
        small_plain.append(time.perf_counter() - t0)
        cpu_plain.append(time.process_time() - c0)
        c0, t0 = time.process_time(), time.perf_counter()
        priced_result = plan({**GOODPUT_SMALL, "duration_days": 1, "failure_rates": "llama3"})
        small_priced.append(time.perf_counter() - t0)
        cpu_priced.append(time.process_time() - c0)
    assert plain_result is not None and priced_result is not None
    unchanged = [p.layout for p in plain_result.plans] == [p.layout for p in priced_result.plans]
    sim_mean = statistics.mean(sims)
    return {
        "big_case": "Llama 3 405B, 16,384 H100, 54 days, llama3 failure rates",
        "big_plan_wall_s": min(walls), "big_plan_wall_median_s": statistics.median(walls),
        "big_plan_cpu_s": min(cpus),
        "big_plain_wall_s": min(plain_walls),
        "big_layout": best.layout.short(), "big_tokens_per_s": best.estimate.tokens_per_s,
        "big_ettr": best.ettr, "big_effective_tokens_per_s": best.effective_tokens_per_s,
        "big_recovery": {k: rec.get(k) for k in ("policy", "groups", "snapshot_every", "checkpoint_every_steps",
                                                 "warm_spares", "source")},
        "big_simulated_ettr": sims, "big_simulated_ettr_mean": sim_mean,
        "big_ettr_gap_points": 100 * abs(sim_mean - (best.ettr or 0.0)),
        "small_case": "Llama 3 8B, 8 H100, 1 day, llama3 failure rates",
        "small_plain_best_ms": 1000 * min(small_plain), "small_priced_best_ms": 1000 * min(small_priced),
        "small_plain_median_ms": 1000 * statistics.median(small_plain),
        "small_priced_median_ms": 1000 * statistics.median(small_priced),
        "small_extra_median_ms": 1000 * (statistics.median(small_priced) - statistics.median(small_plain)),
        "small_extra_best_ms": 1000 * (min(small_priced) - min(small_plain)),
        "small_plain_cpu_median_ms": 1000 * statistics.median(cpu_plain),
        "small_priced_cpu_median_ms": 1000 * statistics.median(cpu_priced),
        "small_extra_cpu_median_ms": 1000 * (statistics.median(cpu_priced) - statistics.median(cpu_plain)),
        "small_unchanged": unchanged, "repeats": {"big": reps, "small": small_reps},
    }


def goodput_markdown(g: dict[str, Any]) -> str:
    rec = g["big_recovery"]
    groups = f" x{rec['groups']}" if rec["policy"] == "replica_group" else ""
    lines = ["### Goodput-aware plans (issue 41)", "",
             "| case | plan wall (s, best / median) | plan CPU (s, best) | healthy-speed plan wall (s) | layout | "
             "recovery | ETTR (plan) | ETTR (simulate, mean of seeds) | gap (points) |",
             "|---|---:|---:|---:|---|---|---:|---:|---:|",
             f"| {g['big_case']} | {g['big_plan_wall_s']:.3f} / {g['big_plan_wall_median_s']:.3f} | "
             f"{g.get('big_plan_cpu_s', float('nan')):.3f} | "
             f"{g['big_plain_wall_s']:.3f} | {g['big_layout']} | {rec['policy']}{groups}, snapshot every "
             f"{rec['snapshot_every']} steps, {rec['warm_spares']} warm spares | {100 * g['big_ettr']:.2f}% | "
             f"{100 * g['big_simulated_ettr_mean']:.2f}% ({', '.join(f'{100 * x:.2f}' for x in g['big_simulated_ettr'])}) | "
             f"{g['big_ettr_gap_points']:.2f} |", "",
             "| case | plan wall (ms, median / best) | priced for failures, wall (ms, median / best) | "
             "extra wall (ms, median / best) | plan CPU → priced CPU (ms, median) | extra CPU (ms, median) | "
             "same layouts, same order |",
             "|---|---:|---:|---:|---:|---:|---|",
             f"| {g['small_case']} | {g['small_plain_median_ms']:.1f} / {g['small_plain_best_ms']:.1f} | "
             f"{g['small_priced_median_ms']:.1f} / {g['small_priced_best_ms']:.1f} | "
             f"{g['small_extra_median_ms']:.1f} / {g['small_extra_best_ms']:.1f} | "
             f"{g['small_plain_cpu_median_ms']:.1f} → {g['small_priced_cpu_median_ms']:.1f} | "
             f"{g['small_extra_cpu_median_ms']:.1f} | {'yes' if g['small_unchanged'] else 'NO'} |", "",
             f"Goals: the 405B plan in < 2 s, its ETTR within 1 point of the simulator's; the small job's plan unchanged "
             f"and ≤ 50 ms slower (CPU time is the pricing's own cost; wall time includes waiting for a CPU on a "
             f"shared machine). Repeats: {g['repeats']['big']} (405B), {g['repeats']['small']} (small, interleaved). "
             f"Measured {g.get('finished_at', '?')} on {g.get('host', '?')} (load {g.get('load_1min', '?')})."]
    return "\n".join(lines)


def _goodput_with_context(quick: bool) -> dict[str, Any]:
    import os
    import platform

    g = goodput_report(quick)
    g["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    g["host"] = f"{os.cpu_count()} CPUs, {platform.python_implementation()} {platform.python_version()}"
    g["load_1min"] = round(os.getloadavg()[0], 1)
    return g


def _goodput_part(quick: bool) -> dict[str, Any]:
    g = _goodput_with_context(quick)
    return {"rows": [], "markdown": goodput_markdown(g), "goodput": g}


PARTS = ("search", "accuracy", "goodput")
ACCURACY_MARK = "Accuracy on published runs"


def _search_part(quick: bool) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for label, raw, budget in (("70B on 512 H100", SMALL, math.inf if not quick else 30.0),
                               ("405B on 16,384 H100", BIG, 10.0 if quick else 30.0)):
        secs, cpu, result = _time_plan(raw, 1 if quick else 3)
        c0 = time.process_time()
        naive = naive_search(parse_spec(raw), budget)
        naive_cpu = time.process_time() - c0
        top = result.plans[0]
        rows.append({
            "case": label,
            "planner_s": secs,
            "planner_cpu_s": cpu,
            "searched": result.searched,
            "evaluated": result.evaluated,
            "naive_costed": naive["costed"],
            "naive_s": naive["estimated_full_s"],
            "naive_cpu_s": naive_cpu / naive["fraction"] if naive["fraction"] else math.inf,
            "naive_complete": naive["fraction"] >= 1.0,
            "speedup": (naive_cpu / naive["fraction"]) / cpu if naive["fraction"] and cpu else math.inf,
            "same_best": naive["fraction"] >= 1.0 and math.isclose(naive["best_step_s"], top.estimate.step_time_s,
                                                                  rel_tol=1e-9),
            "top_plan": f"{top.layout.short()} b={top.layout.micro_batch} zero={top.layout.zero} "
                        f"rc={top.layout.recompute} mfu={top.estimate.mfu:.3f}",
        })
    lines = ["| problem | planner wall (s) | planner CPU (s) | candidates | fully costed | naive CPU (s) | "
             "speed-up (CPU) | same best | top plan |",
             "|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        naive = f"{r['naive_cpu_s']:.1f}" + ("" if r["naive_complete"] else " (extrapolated)")
        same = "yes" if r["same_best"] else ("n/a (naive search time-boxed)" if not r["naive_complete"] else "NO")
        lines.append(f"| {r['case']} | {r['planner_s']:.3f} | {r['planner_cpu_s']:.3f} | {r['searched']:,} | "
                     f"{r['evaluated']:,} | {naive} | {r['speedup']:.0f}x | {same} | {r['top_plan']} |")
    try:
        import os

        load = f" Load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores."
    except OSError:  # pragma: no cover
        load = ""
    lines.append("")
    lines.append("Wall time includes waiting for a CPU on a shared machine; CPU time is the search's own cost." + load)
    lines.append("")
    lines.append("Baseline limits: the naive search is the planner's own cost model without pruning, over the same "
                 "space (every factorization, micro-batch up to 64, every vpp the model accepts, every knob); "
                 "on 16,384 GPUs it is time-boxed and its full cost extrapolated from the share of factorizations "
                 "it covered. It checks the pruning, not the cost model.")
    return {"rows": rows, "markdown": "\n".join(lines)}


def _accuracy_part(quick: bool) -> dict[str, Any]:
    cal = run_calibration()
    accuracy = accuracy_report(quick)
    rows = [{"case": "calibration", "cases": cal["cases"],
             "median_abs_rel_error": cal["median_abs_rel_error"], "mean_abs_rel_error": cal["mean_abs_rel_error"],
             "max_abs_rel_error": cal["max_abs_rel_error"],
             "memory_median_abs_rel_error": cal["memory_median_abs_rel_error"],
             "memory_max_abs_rel_error": cal["memory_max_abs_rel_error"]}, *accuracy["rows"]]
    return {"rows": rows, "markdown": accuracy["markdown"] + "\n\n" + calibration_markdown(cal)}


def _previous(path: Path) -> dict[str, Any]:
    """The parts of the last results file, as ``{part: {"rows", "markdown", "finished_at"}}`` (files
    written before the parts existed are split at the accuracy section)."""
    if not path.is_file():
        return {}
    import json

    before = json.loads(path.read_text())
    if "parts_data" in before:
        return dict(before["parts_data"])
    md, rows = before.get("markdown", ""), before.get("rows", [])
    cut = md.find(ACCURACY_MARK)
    n_search = sum(1 for r in rows if "planner_s" in r)
    when = before.get("finished_at", "?")
    return {"search": {"rows": rows[:n_search], "markdown": md[:cut].rstrip() if cut >= 0 else md,
                       "finished_at": when},
            "accuracy": {"rows": rows[n_search:], "markdown": md[cut:] if cut >= 0 else "", "finished_at": when}}


def run(quick: bool = False, parts: list[str] | None = None) -> dict[str, Any]:
    """The search benchmark, the accuracy report and the goodput-aware plans. ``parts`` (default: all, or
    ``PLANNER_PARTS``, comma-separated: ``search``, ``accuracy``, ``goodput``): the parts to run; the others are carried over from
    the last ``bench/results/planner.json``, saying which run they come from."""
    import os

    from bench.common import RESULTS_DIR

    parts = parts or [p.strip() for p in os.environ.get("PLANNER_PARTS", ",".join(PARTS)).split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts:
        raise ValueError(f"unknown planner part(s) {unknown}; choose from {', '.join(PARTS)}")
    before = _previous(RESULTS_DIR / "planner.json") if set(parts) != set(PARTS) else {}
    data: dict[str, Any] = {}
    carried: dict[str, str] = {}
    for part, fn in (("search", _search_part), ("accuracy", _accuracy_part), ("goodput", _goodput_part)):
        if part in parts:
            data[part] = {**fn(quick), "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        elif part in before:
            data[part] = before[part]
            carried[part] = str(before[part].get("finished_at", "?"))
    md = []
    for part in PARTS:
        if part in data:
            if part in carried:
                md.append(f"_The {part} part was not rerun in this run: from the run finished {carried[part]}._")
            md.append(data[part]["markdown"])
    rows = [r for part in PARTS if part in data for r in data[part]["rows"]]
    return {"name": "planner", "quick": quick, "parts": parts, "carried": carried, "parts_data": data,
            "rows": rows, "markdown": "\n\n".join(md), "goodput": data.get("goodput", {}).get("goodput")}


if __name__ == "__main__":  # pragma: no cover
    import sys

    print(run(quick="--quick" in sys.argv)["markdown"])
