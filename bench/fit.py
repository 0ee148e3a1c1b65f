"""Fit the cost model's kernel efficiencies to published runs, and score it on sources it never saw.

Only physically meaningful parameters are fitted: the sustained fraction of the peak that large
GEMMs and the attention kernels (FlashAttention-2 class and the vendor's fused one) reach, per GPU
generation. Hopper's fp8 GEMM fraction is not a parameter of its own: it is
:data:`planner.profiles.FP8_FRACTION` of the bf16 one (:data:`TIED`), so the many fp8 runs of
Transformer Engine stacks and the bf16 runs of PyTorch-native ones inform one GEMM number.
Everything else in the cost model is physics with fixed constants.

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

from planner.profiles import FP8_FRACTION, PROFILES, lookup_gpu

# (parameter name, GPU family, cluster field). One GEMM fraction per family serves bf16 and fp8 (:data:`TIED`).
PARAMETERS: tuple[tuple[str, str, str], ...] = (
    ("hopper_gemm", "hopper", "gemm_efficiency"),
    ("hopper_flash_attention", "hopper", "attention_efficiency"),
    ("hopper_fused_attention", "hopper", "fused_attention_efficiency"),
    ("ampere_gemm", "ampere", "gemm_efficiency"),
    ("ampere_flash_attention", "ampere", "attention_efficiency"),
)
FAMILIES = {"H100": "hopper", "H800": "hopper", "H200": "hopper", "A100": "ampere", "A100-40GB": "ampere",
            "A800": "ampere"}
# Where every fit starts: vendor- and paper-class values, fixed before any fitting (cuBLAS-class
# sustained GEMM fractions; FlashAttention-2's paper for A100 and H100; FA3-class fused kernels).
# A left-out source never moves the start.
PRIOR: dict[str, float] = {"hopper_gemm": 0.66, "hopper_flash_attention": 0.42,
                           "hopper_fused_attention": 0.50, "ampere_gemm": 0.80, "ampere_flash_attention": 0.62}
# cluster fields that follow a fitted one: Hopper's fp8 GEMMs reach FP8_FRACTION of the bf16 GEMMs' fraction
# of their (twice as high) peak; their casts are priced separately (planner.timing.gemm_time)
TIED: dict[str, tuple[str, str, float]] = {"hopper_gemm": ("fp8_gemm_efficiency", "hopper", FP8_FRACTION)}
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
            tied = TIED.get(name)
            if tied and cluster.get(tied[0]) is None:
                cluster[tied[0]] = params[name] * tied[2]
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
    """|error| median, mean and max of ``rows``, and the sign: how many are over- and under-predicted,
    and the median and mean signed error (predicted / measured - 1)."""
    signed = [r["rel_error"] for r in rows]
    errs = [abs(e) for e in signed]
    if not errs:
        return {"cases": 0, "median": math.nan, "mean": math.nan, "max": math.nan, "over": 0, "under": 0,
                "signed_median": math.nan, "signed_mean": math.nan}
    return {"cases": len(errs), "median": statistics.median(errs), "mean": statistics.fmean(errs), "max": max(errs),
            "over": sum(e > 0 for e in signed), "under": sum(e < 0 for e in signed),
            "signed_median": statistics.median(signed), "signed_mean": statistics.fmean(signed)}


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
