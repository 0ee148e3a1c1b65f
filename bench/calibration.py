"""Calibration of the planner's cost model against published, measured training runs.

For every case of ``published_cases.json`` that has a measurement and a global batch, the
published layout is fixed (fields the case leaves null are searched) and the predicted tokens/s
per GPU is compared with the measured one. Measurements given as TFLOP/s per GPU are converted
with the case's own FLOP convention (Narayanan's Eq. 3 counts recompute, MosaicML uses 6N+12Lhs,
...), never with ours. Memory is compared where the case gives it (FlagPerf: GiB in use) and with
Korthikanti's Figure 1 formula oracle (activations and model states of the first stage).

Attention implementation is a property of the software a case ran: systems published before
FlashAttention (mid-2022: Megatron 2021/22, BLOOM, OPT) materialise the s² scores; later ones do not.

The data file defaults to ``tests/planner/data/published_cases.json`` in this repository.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from planner.flops import CONVENTIONS, convention_of
from planner.layout import Layout
from planner.memory import stage_memory_gb
from planner.search import search
from planner.spec import PlanSpec, SpecError, parse_spec

DEFAULT_CASES = Path(__file__).resolve().parent.parent / "tests" / "planner" / "data" / "published_cases.json"
# gathered after the planner was built, from sources the original dataset does not use (part of the fit
# since; scored leave-one-source-out)
HELDOUT_CASES = DEFAULT_CASES.with_name("heldout_cases.json")
# published runs kept out of every fit: predicted only with efficiencies fitted on the two files above
UNSEEN_CASES = DEFAULT_CASES.with_name("unseen_cases.json")


def fitted_cases() -> list[dict[str, Any]]:
    """Every case the kernel efficiencies may be fitted on (never :data:`UNSEEN_CASES`)."""
    return load_cases() + load_cases(HELDOUT_CASES)


def load_cases(path: str | Path | None = None) -> list[dict[str, Any]]:
    p = Path(path) if path else DEFAULT_CASES
    if not p.is_file():
        raise FileNotFoundError(f"published cases not found at {p}")
    return list(json.loads(p.read_text()))


def attention_of(case: dict[str, Any]) -> str:
    """The attention kernel of the software a case ran: FlashAttention-2 class ("flash": PyTorch SDPA,
    flash-attn, MosaicML's), the vendor's fused kernel ("fused": Megatron-Core / NeMo through
    Transformer Engine, cuDNN), or materialized scores (systems published before FlashAttention)."""
    text = " ".join(str(case.get(k) or "") for k in ("source", "verification", "notes", "id"))
    if re.search(r"\bFA2\b|flash", text, re.IGNORECASE):
        return "flash"
    if re.search(r"20(1\d|2[0-2])\b", text) or "bigscience" in text.lower():
        return "materialized"
    if re.search(r"megatron|nemo", text, re.IGNORECASE):
        return "fused"
    return "flash"


def tp_overlap_of(case: dict[str, Any]) -> bool:
    """Whether the case's software pipelined its TP collectives with the GEMMs (``parallel.tp_overlap``).

    TorchTitan publishes it per run ("AsyncTP" in the table's techniques, "without AsyncTP" when off).
    NVIDIA's published NeMo / Megatron-Bridge performance recipes (2024 on) run Transformer Engine's
    userbuffers TP communication overlap whenever TP > 1. Older Megatron papers and FlagPerf do not.
    """
    what = str(case.get("what") or "")
    if re.search(r"without AsyncTP", what, re.IGNORECASE):
        return False
    if re.search(r"AsyncTP", what, re.IGNORECASE):
        return True
    return re.search(r"NVIDIA(-NeMo)?/(NeMo|Megatron-Bridge)", str(case.get("source") or "")) is not None


def system_fixed(case: dict[str, Any]) -> dict[str, Any]:
    """Layout fields the case's software could not vary, kept fixed when its published layout is freed.

    Context parallelism (Megatron-Core CP, DeepSpeed-Ulysses, ring attention) appeared in 2023, after
    FlashAttention: a system of the materialised-attention era (see :func:`attention_of`) ran cp = 1
    because it had nothing else, so cp = 1 is not a layout choice its authors made. The same holds for
    ZeRO replica groups (``dp_replicate``: PyTorch FSDP's HYBRID_SHARD and DeepSpeed ZeRO++'s hpZ,
    both 2023): ZeRO of that era sharded over the whole DP group.
    """
    return {"cp": 1, "dp_replicate": 1} if attention_of(case) == "materialized" else {}


# Sources whose own text publishes the TP/PP split although the dataset's copy (an image showing only
# the model-parallel size) made it infer it: arXiv 2104.04473 Table 1 has both columns.
SPLIT_PUBLISHED_BY_PAPER = ("narayanan2021_t1_",)


def split_inferred(case: dict[str, Any]) -> bool:
    """True when only the model-parallel size TP x PP was published and the dataset chose the split."""
    if case["id"].startswith(SPLIT_PUBLISHED_BY_PAPER):
        return False
    text = " ".join(str(case.get(k) or "") for k in ("verification", "notes"))
    return re.search(r"split inferred", text, re.IGNORECASE) is not None


def published_key(case: dict[str, Any], tp: int, pp: int, cp: int, dp: int) -> tuple[int, ...]:
    """What the plan-selection bar compares: (tp, pp, cp, dp), or (tp*pp, cp, dp) when the split was
    inferred (the published fact is the model-parallel size, not how it was split)."""
    return (tp * pp, cp, dp) if split_inferred(case) else (tp, pp, cp, dp)


def source_of(case: dict[str, Any]) -> str:
    """The source a case was published by, for leave-one-source-out: the held-out records name it in
    ``source_key``; the original dataset's records by their id prefix (narayanan2021, flagperf, ...)."""
    return str(case.get("source_key") or case["id"].split("_")[0])


def case_spec(case: dict[str, Any]) -> dict[str, Any]:
    """The planner spec for a case: the record itself plus the attention implementation, the layout
    fields its software could not vary (:func:`system_fixed`) and whether its software overlapped TP
    communication (:func:`tp_overlap_of`)."""
    spec = {k: case[k] for k in ("model", "cluster", "parallel", "precision") if case.get(k) is not None}
    spec["model"] = {**case["model"], "attention": attention_of(case)}
    spec["parallel"] = dict(case.get("parallel") or {})
    for key, value in system_fixed(case).items():  # what the case's software could not vary
        if spec["parallel"].get(key) is None:
            spec["parallel"][key] = value
    if tp_overlap_of(case):
        spec["parallel"]["tp_overlap"] = True
    return spec


def measured_tokens_per_gpu(case: dict[str, Any], spec: PlanSpec) -> tuple[float | None, str]:
    meas = case.get("measured") or {}
    if meas.get("tokens_per_s_per_gpu"):
        return float(meas["tokens_per_s_per_gpu"]), "tokens/s/GPU"
    if meas.get("step_time_s") and spec.global_batch:
        n = case["cluster"]["num_gpus"]
        return spec.global_batch * spec.model.seq_len / meas["step_time_s"] / n, "step time"
    if meas.get("tflops_per_gpu"):
        conv = convention_of(case.get("flops_convention"))
        return meas["tflops_per_gpu"] * 1e12 / CONVENTIONS[conv](spec.model), f"TFLOP/s ({conv})"
    if meas.get("mfu") and case.get("flops_convention"):
        conv = convention_of(case.get("flops_convention"))
        return meas["mfu"] * spec.cluster.peak_tflops * 1e12 / CONVENTIONS[conv](spec.model), f"MFU ({conv})"
    return None, "no throughput measurement"


def _fixed_layout(spec: PlanSpec) -> bool:
    return all(k in spec.fixed for k in ("tp", "pp", "cp", "dp"))


def predict(spec: PlanSpec) -> tuple[Any, str]:
    """Best plan with the case's fixed fields (memory is not enforced: we compare time), or why not."""
    relaxed = replace(spec, memory_headroom=-100.0)
    result = search(relaxed, top_k=1)
    if result.plans:
        return result.plans[0], ""
    return None, result.rejected[0].reason if result.rejected else "no candidate"


def korthikanti_oracle(case: dict[str, Any], spec: PlanSpec) -> list[dict[str, Any]]:
    """Korthikanti Fig. 1 (first stage, embedding excluded) against the planner's own memory model:
    activations for TP-only and for SP + selective recompute, and the model states.

    Every predicted number is read from :func:`planner.memory.stage_memory_gb` for the published
    layout. Megatron 2022 kept fp32 main gradients beside the fp16 weights (2 + 4 + 12 = 18 B per
    parameter, the figure's convention), which is the planner's bf16 state layout, so the states are
    read for that layout.
    """
    meas = case["measured"]
    par = case["parallel"]
    vpp = par.get("vpp") or 1
    base = Layout(tp=par["tp"], pp=par["pp"], cp=1, dp=par["dp"], vpp=vpp, micro_batch=par["micro_batch"],
                  schedule="interleaved" if vpp > 1 else "1f1b", zero=0).with_global_batch(spec.global_batch)
    states_spec = replace(spec, precision="bf16")
    rows = []
    for key, lay in (("activations_GiB_tp_only_no_recompute", replace(base, sp=False, recompute="none")),
                     ("activations_GiB_sp_plus_selective", replace(base, sp=True, recompute="selective"))):
        first, _ = stage_memory_gb(spec, lay)
        rows.append({"case": case["id"], "quantity": key, "measured": meas[key], "predicted": first["activations"]})
    first, _ = stage_memory_gb(states_spec, base)
    rows.append({"case": case["id"], "quantity": "params_plus_optimizer_GiB",
                 "measured": meas["params_plus_optimizer_GiB"],
                 "predicted": first["weights"] + first["grads"] + first["optimizer"]})
    for r in rows:
        r["rel_error"] = r["predicted"] / r["measured"] - 1
    return rows


def run_calibration(path: str | Path | None = None, params: dict[str, float] | None = None,
                    cases: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Predict every usable case; return rows, skipped cases and the error summary.

    ``params`` (see :mod:`bench.fit`) overrides kernel efficiencies of the cases' GPUs; ``cases``
    replaces the file."""
    from bench.fit import apply_params

    rows: list[dict[str, Any]] = []
    memory_rows: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    for case in cases if cases is not None else load_cases(path):
        raw = apply_params(case_spec(case), params or {})
        if "memory_formula_unit_test" in case.get("uses", []):
            raw["parallel"].setdefault("sp", False)
            raw["parallel"].setdefault("recompute", "none")
            spec = parse_spec(raw)
            memory_rows.extend(korthikanti_oracle(case, spec))
            continue
        try:
            spec = parse_spec(raw)
        except SpecError as exc:
            skipped.append({"case": case["id"], "why": f"not plannable: {exc}"})
            continue
        measured, how = measured_tokens_per_gpu(case, spec)
        if measured is None:
            skipped.append({"case": case["id"], "why": how})
            continue
        plan, why = predict(spec)
        if plan is None:
            skipped.append({"case": case["id"], "why": f"no valid layout under the published fields: {why}"})
            continue
        est = plan.estimate
        rows.append({
            "case": case["id"], "source": source_of(case), "gpu": spec.cluster.gpu_type, "layout": plan.layout.short(),
            "micro_batch": plan.layout.micro_batch, "recompute": plan.layout.recompute,
            "measured_tokens_per_gpu": measured, "predicted_tokens_per_gpu": est.tokens_per_s_per_gpu,
            "rel_error": est.tokens_per_s_per_gpu / measured - 1, "measured_as": how,
            "attention": spec.model.attention,
        })
        mem = (case.get("measured") or {}).get("memory_gb")
        if mem:
            memory_rows.append({"case": case["id"], "quantity": "memory_GiB_in_use", "measured": mem,
                                "predicted": est.memory_gb_per_gpu,
                                "rel_error": est.memory_gb_per_gpu / mem - 1})
    errs = [abs(r["rel_error"]) for r in rows]
    merrs = [abs(r["rel_error"]) for r in memory_rows if r["quantity"] == "memory_GiB_in_use"]
    oracle = [abs(r["rel_error"]) for r in memory_rows if r["quantity"] != "memory_GiB_in_use"]
    return {
        "rows": rows,
        "memory_rows": memory_rows,
        "skipped": skipped,
        "cases": len(rows),
        "median_abs_rel_error": statistics.median(errs) if errs else float("nan"),
        "mean_abs_rel_error": statistics.fmean(errs) if errs else float("nan"),
        "max_abs_rel_error": max(errs) if errs else float("nan"),
        "memory_median_abs_rel_error": statistics.median(merrs) if merrs else float("nan"),
        "memory_max_abs_rel_error": max(merrs) if merrs else float("nan"),
        "memory_oracle_max_abs_rel_error": max(oracle) if oracle else float("nan"),
    }


def markdown(cal: dict[str, Any]) -> str:
    lines = ["| case | GPU | layout (b, recompute) | measured tok/s/GPU | predicted | error |",
             "|---|---|---|---:|---:|---:|"]
    for r in cal["rows"]:
        lines.append(f"| {r['case']} | {r['gpu']} | {r['layout']} (b={r['micro_batch']}, {r['recompute']}) | "
                     f"{r['measured_tokens_per_gpu']:.1f} | {r['predicted_tokens_per_gpu']:.1f} | "
                     f"{100 * r['rel_error']:+.1f}% |")
    lines.append("")
    lines.append(f"Throughput: {cal['cases']} cases, median |error| {100 * cal['median_abs_rel_error']:.1f}%, "
                 f"mean {100 * cal['mean_abs_rel_error']:.1f}%, max {100 * cal['max_abs_rel_error']:.1f}%.")
    lines += ["", "| case | quantity | measured GiB | predicted GiB | error |", "|---|---|---:|---:|---:|"]
    for r in cal["memory_rows"]:
        lines.append(f"| {r['case']} | {r['quantity']} | {r['measured']:.2f} | {r['predicted']:.2f} | "
                     f"{100 * r['rel_error']:+.1f}% |")
    lines.append("")
    lines.append(f"Memory in use (FlagPerf, measured): median |error| {100 * cal['memory_median_abs_rel_error']:.1f}%, "
                 f"max {100 * cal['memory_max_abs_rel_error']:.1f}%. Korthikanti Fig. 1 formula oracle: max |error| "
                 f"{100 * cal['memory_oracle_max_abs_rel_error']:.2f}%.")
    if cal["skipped"]:
        lines += ["", "Not scored: " + "; ".join(f"{s['case']} ({s['why']})" for s in cal["skipped"])]
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    print(markdown(run_calibration()))
