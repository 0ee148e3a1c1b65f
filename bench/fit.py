"""Fit the cost model's kernel efficiencies to published runs, and score it on sources it never saw.

Only physically meaningful parameters are fitted: the sustained fraction of the peak that large
GEMMs (bf16 and fp8) and the attention kernels (FlashAttention-2 class and the vendor's fused one)
reach, per GPU generation. Everything else in the cost model is physics with fixed constants.

- :func:`fit` minimises the mean of ``min(|log(predicted / measured)|, 0.5)`` over the cases
  (a capped log error: one pathological run cannot drag every parameter) by coordinate descent on a
  multiplicative grid, each parameter kept in ``(0.05, 1]``.
- :func:`leave_one_source_out` fits on every source but one and predicts the one left out, for
  each source in turn: the left-out error of a case is its error when its source took no part in
  the fit. Sources are publications (one paper, one benchmark page), so near-duplicate runs of one
  source never sit on both sides.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from typing import Any

from planner.profiles import PROFILES, lookup_gpu

# (parameter name, GPU family, cluster field)
PARAMETERS: tuple[tuple[str, str, str], ...] = (
    ("hopper_gemm", "hopper", "gemm_efficiency"),
    ("hopper_fp8_gemm", "hopper", "fp8_gemm_efficiency"),
    ("hopper_flash_attention", "hopper", "attention_efficiency"),
    ("hopper_fused_attention", "hopper", "fused_attention_efficiency"),
    ("ampere_gemm", "ampere", "gemm_efficiency"),
    ("ampere_flash_attention", "ampere", "attention_efficiency"),
)
FAMILIES = {"H100": "hopper", "H800": "hopper", "H200": "hopper", "A100": "ampere", "A100-40GB": "ampere",
            "A800": "ampere"}
# Where every fit starts: vendor- and paper-class values, fixed before any fitting (cuBLAS-class
# sustained GEMM fractions; FlashAttention-2's paper for A100 and H100; FA3-class fused kernels;
# fp8 at 0.8 x the bf16 fraction). A left-out source never moves the start.
PRIOR: dict[str, float] = {"hopper_gemm": 0.66, "hopper_fp8_gemm": 0.56, "hopper_flash_attention": 0.42,
                           "hopper_fused_attention": 0.50, "ampere_gemm": 0.80, "ampere_flash_attention": 0.62}
LOG_CAP = 0.5
GRID = (0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.25)


def family_of(gpu_type: str | None) -> str | None:
    prof = lookup_gpu(gpu_type or "")
    return FAMILIES.get(prof.name) if prof else None


def profile_params() -> dict[str, float]:
    """The parameters as the built-in profiles hold them (H100 and A100 stand for their families)."""
    out = {}
    for name, fam, field in PARAMETERS:
        prof = PROFILES["H100" if fam == "hopper" else "A100"]
        value = getattr(prof, field)
        if field == "fused_attention_efficiency" and not value:
            value = prof.attention_efficiency
        if field == "fp8_gemm_efficiency" and not value:
            value = 0.8 * prof.gemm_efficiency
        out[name] = float(value)
    return out


def apply_params(raw: dict[str, Any], params: dict[str, float]) -> dict[str, Any]:
    """A case spec with the fitted efficiencies of its GPU's family (fields the case sets stay)."""
    if not params:
        return raw
    fam = family_of(raw.get("cluster", {}).get("gpu_type"))
    cluster = dict(raw["cluster"])
    for name, pfam, field in PARAMETERS:
        if pfam == fam and name in params and cluster.get(field) is None:
            cluster[field] = params[name]
    return {**raw, "cluster": cluster}


def loss(rows: Iterable[dict[str, Any]]) -> float:
    errs = [min(abs(math.log1p(r["rel_error"])), LOG_CAP) for r in rows]
    return statistics.fmean(errs) if errs else 0.0


class _RowCache:
    """Calibration rows of ``cases`` under a parameter set, each case predicted once per value of the
    parameters of its own GPU family (the only ones :func:`apply_params` can change for it): a
    coordinate-descent trial on one family's parameter re-predicts that family's cases only."""

    def __init__(self, cases: list[dict[str, Any]]) -> None:
        self.cases = cases
        self.memo: dict[tuple[Any, ...], list[dict[str, Any]]] = {}

    def __call__(self, params: dict[str, float]) -> list[dict[str, Any]]:
        from bench.calibration import run_calibration

        rows: list[dict[str, Any]] = []
        for i, case in enumerate(self.cases):
            fam = family_of(case["cluster"].get("gpu_type"))
            key = (i, tuple(params.get(name) for name, pfam, _ in PARAMETERS if pfam == fam))
            if key not in self.memo:
                self.memo[key] = run_calibration(cases=[case], params=params)["rows"]
            rows.extend(self.memo[key])
        return rows


def fit(cases: list[dict[str, Any]], start: dict[str, float] | None = None, rounds: int = 3,
        progress: Callable[[str], None] | None = None) -> dict[str, float]:
    """Coordinate descent of :data:`PARAMETERS` on ``cases`` (parameters no case depends on keep
    their start value)."""
    params = dict(start or PRIOR)
    families = {family_of(c["cluster"].get("gpu_type")) for c in cases}
    rows_of = _RowCache(cases)
    best = loss(rows_of(params))
    step = 1.0
    for _ in range(rounds):
        for name, fam, _field in PARAMETERS:
            if fam not in families:
                continue
            base = params[name]
            for g in GRID:
                value = min(1.0, max(0.05, base * g ** step))
                if value == params[name]:
                    continue
                trial = {**params, name: value}
                score = loss(rows_of(trial))
                if score < best - 1e-9:
                    best, params = score, trial
            if progress:
                progress(name)
        step /= 2
    return params


def summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    errs = [abs(r["rel_error"]) for r in rows]
    if not errs:
        return {"cases": 0, "median": math.nan, "mean": math.nan, "max": math.nan}
    return {"cases": len(errs), "median": statistics.median(errs), "mean": statistics.fmean(errs), "max": max(errs)}


def leave_one_source_out(cases: list[dict[str, Any]], start: dict[str, float] | None = None, rounds: int = 2,
                         progress: Callable[[str], None] | None = None,
                         only: Iterable[str] | None = None) -> dict[str, Any]:
    """Left-out rows (each predicted with parameters fitted without its source) and the fitted
    parameters per left-out source; ``only`` leaves out just those sources, one at a time (each
    still fitted on every other source)."""
    from bench.calibration import run_calibration, source_of

    sources = sorted({source_of(c) for c in cases} if only is None else set(only))
    rows: list[dict[str, Any]] = []
    fitted: dict[str, dict[str, float]] = {}
    for src in sources:
        train = [c for c in cases if source_of(c) != src]
        test = [c for c in cases if source_of(c) == src]
        params = fit(train, start, rounds)
        fitted[src] = params
        rows.extend(run_calibration(cases=test, params=params)["rows"])
        if progress:
            progress(src)
    return {"rows": rows, "params": fitted, "sources": sources}
