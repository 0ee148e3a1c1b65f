"""Calibration against published runs, and the plan-selection quality bars."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import pytest

from bench.calibration import (
    case_spec,
    load_cases,
    published_key,
    run_calibration,
    split_inferred,
    system_fixed,
)
from planner.search import search
from planner.spec import parse_spec

pytestmark = pytest.mark.unit

LAYOUT_KEYS = ("tp", "pp", "cp", "dp", "vpp")

# The bar: with the published layout left free, the published one is in the top 5 (by TP/PP/CP/DP shape,
# best plan per shape) or rejected for a correct reason. Fields the case's software could not vary stay
# fixed (``system_fixed``: no CP and no ZeRO replica groups before 2023), and where only the model-parallel size TP x PP was
# published the comparison is on (TP x PP, CP, DP) (``published_key``).
# Cases where the bar is not met, and why. The test below fails if one of them starts meeting it
# (then delete it here and in docs/planner.md).
KNOWN_GAPS = {
    "narayanan2021_t1_GPT-18.4B": "TP8 is the paper's rule (TP = node size, then PP) from its 162B sweep; at h=6144 "
                                  "without SP the model prices TP8 26% slower than TP2xPP4 (unmeasured)",
    "narayanan2021_t1_GPT-39.1B": "same rule; the model prices TP8xPP2 18% slower than TP2xPP8 (unmeasured)",
    "flagperf_llama3_70b_h100_64gpu": "Megatron's TP8xPP4 recipe; the model prices TP4 layouts up to 8.5% faster "
                                      "(FlagPerf's Llama-2 70B pair measured TP4 23% faster than TP8)",
    "flagperf_llama2_70b_h800_tp8pp4": "a known-worse layout: FlagPerf measured TP4xPP8 23% faster (we predict 10%)",
    # the paper's ZeRO-3 baseline, measured slower than its PTD-P layouts; with ZeRO-3 kept, TP 2-8 cuts the
    # per-GPU gather volume and the model prices it 16-73% faster than pure DP
    "narayanan2021_t2_175B_zero3_384gpu": "a known-worse baseline: pure-DP ZeRO-3, 6% slower than PTD-P as measured",
    "narayanan2021_t2_175B_zero3_1536gpu": "a known-worse baseline: pure-DP ZeRO-3, 3.2x slower than PTD-P as measured",
}


@lru_cache(maxsize=1)
def calibration() -> dict[str, Any]:
    return run_calibration()


def test_calibration_median_error_within_10_percent() -> None:
    cal = calibration()
    assert cal["cases"] >= 30
    assert cal["median_abs_rel_error"] <= 0.10, cal["median_abs_rel_error"]
    # the A100 Megatron cases are the well-documented core: tighter
    a100 = sorted(abs(r["rel_error"]) for r in cal["rows"] if r["case"].startswith(("narayanan2021_t1", "korthikanti")))
    assert a100[len(a100) // 2] <= 0.08


def test_memory_formula_oracle_is_reproduced() -> None:
    rows = [r for r in calibration()["memory_rows"] if r["quantity"] != "memory_GiB_in_use"]
    assert len(rows) == 12
    for r in rows:
        assert abs(r["rel_error"]) < 0.01, r


def _selection_cases() -> list[dict[str, Any]]:
    return [c for c in load_cases() if "plan_selection" in c.get("uses", [])
            and (c.get("parallel") or {}).get("global_batch")]


@lru_cache(maxsize=64)
def _search_pair(case_id: str) -> tuple[Any, Any]:
    case = next(c for c in load_cases() if c["id"] == case_id)
    raw = case_spec(case)
    knobs = {k: v for k, v in raw["parallel"].items() if k not in LAYOUT_KEYS and v is not None}
    free = search(parse_spec({**raw, "parallel": {**knobs, **system_fixed(case)}}), top_k=5)
    published = search(parse_spec(raw), top_k=1)
    return free, published


def _free_and_published(case: dict[str, Any]) -> tuple[Any, Any]:
    return _search_pair(case["id"])


# Published layouts the planner refuses, with the one right reason, worked out by hand from the record:
# OPT-175B ran 992 GPUs as 8 x 124 with 1024 sequences per step (ragged per-rank batches, which a
# layout of equal micro-batches cannot express).
EXPECTED_REJECTIONS = {
    "opt_175b_992gpu": ("global_batch", "global_batch 1024 not divisible by dp 124"),
}


# Cases the calibration does not score, each with the one right reason (worked out from the record): the
# 530B rows publish no global batch (Narayanan's ZeRO-3 530B used a different, unpublished batch;
# Korthikanti's 2240-GPU row gives only TFLOP/s), and OPT's ragged batch (EXPECTED_REJECTIONS).
EXPECTED_SKIPS = {
    "narayanan2021_t2_530B_zero3_640gpu": ("parallel.global_batch", "is required (in parallel or training)"),
    "korthikanti2022_530B_2240gpu": ("parallel.global_batch", "is required (in parallel or training)"),
    "opt_175b_992gpu": ("global_batch", "global_batch 1024 not divisible by dp 124"),
}


def test_every_skipped_case_is_skipped_for_its_right_reason() -> None:
    """Not only that a reason exists: the kind (field) and the text are the expected cause, and the
    record really has that cause."""
    from planner.spec import SpecError

    skipped = {s["case"]: s["why"] for s in calibration()["skipped"]}
    assert set(skipped) == set(EXPECTED_SKIPS)
    cases = {c["id"]: c for c in load_cases()}
    for case_id, (kind, reason) in EXPECTED_SKIPS.items():
        case = cases[case_id]
        if kind.startswith("parallel."):  # refused by the spec parser, naming the field
            assert case["parallel"].get("global_batch") is None and not case.get("training")
            with pytest.raises(SpecError) as err:
                parse_spec(case_spec(case))
            assert err.value.field == kind and reason in str(err.value)
            assert skipped[case_id] == f"not plannable: {kind}: {reason}"
        else:  # every candidate refused by the search, for that one reason
            result = search(parse_spec(case_spec(case)), top_k=1)
            assert not result.plans and set(result.rejected_counts) == {kind}
            assert {r.reason for r in result.rejected} == {reason}
            assert skipped[case_id] == f"no valid layout under the published fields: {reason}"
    assert EXPECTED_REJECTIONS.items() <= {k: v for k, v in EXPECTED_SKIPS.items()}.items()


@pytest.mark.parametrize("case", _selection_cases(), ids=lambda c: c["id"])
def test_top_plan_at_least_as_fast_as_published(case: dict[str, Any]) -> None:
    free, published = _free_and_published(case)
    if case["id"] in EXPECTED_REJECTIONS:
        kind, reason = EXPECTED_REJECTIONS[case["id"]]
        assert not published.plans
        # every candidate was refused for that reason and no other
        assert set(published.rejected_counts) == {kind}
        assert {r.reason for r in published.rejected} == {reason}
        return
    assert published.plans, [(r.kind, r.reason) for r in published.rejected[:3]]
    assert free.plans
    assert free.plans[0].estimate.step_time_s <= published.plans[0].estimate.step_time_s * (1 + 1e-9)


def test_published_layout_in_top5_or_rejected() -> None:
    met, missed = [], []
    for case in _selection_cases():
        free, published = _free_and_published(case)
        par = case["parallel"]
        keys = [published_key(case, p.layout.tp, p.layout.pp, p.layout.cp, p.layout.dp) for p in free.plans]
        if not published.plans:
            assert case["id"] in EXPECTED_REJECTIONS
            met.append(case["id"])  # rejected; the reason is checked above
        elif published_key(case, par["tp"], par["pp"], par["cp"], par["dp"]) in keys:
            met.append(case["id"])
        else:
            missed.append(case["id"])
    assert sorted(missed) == sorted(KNOWN_GAPS), {"unexpected misses": set(missed) - set(KNOWN_GAPS),
                                                  "now met, update KNOWN_GAPS": set(KNOWN_GAPS) - set(missed)}
    assert len(met) >= 16


def test_selection_bar_reads_only_what_was_published() -> None:
    cases = {c["id"]: c for c in load_cases()}
    # the paper's Table 1 lists TP and PP; Table 2 gives only the model-parallel size 96
    assert not split_inferred(cases["narayanan2021_t1_GPT-18.4B"])
    assert split_inferred(cases["narayanan2021_t2_175B_ptdp_384gpu"])
    assert published_key(cases["narayanan2021_t2_175B_ptdp_384gpu"], 4, 24, 1, 4) == published_key(
        cases["narayanan2021_t2_175B_ptdp_384gpu"], 8, 12, 1, 4)
    # no context parallelism in pre-2023 software; FlagPerf's Megatron-Core has it
    assert system_fixed(cases["bloom_176b_384gpu"]) == {"cp": 1, "dp_replicate": 1}
    assert system_fixed(cases["narayanan2021_t1_GPT-7.5B"]) == {"cp": 1, "dp_replicate": 1}
    assert system_fixed(cases["flagperf_llama3_70b_h100_64gpu"]) == {}


def test_no_published_layout_is_refused_for_memory() -> None:
    """Every published run fits: its layout, searched with the normal memory headroom, yields a plan
    (or is refused for the one structural reason listed in EXPECTED_REJECTIONS)."""
    for case in load_cases():
        if "memory_formula_unit_test" in case.get("uses", []) or not (case.get("parallel") or {}).get("global_batch"):
            continue
        result = search(parse_spec(case_spec(case)), top_k=1)
        if case["id"] in EXPECTED_REJECTIONS:
            continue
        assert result.plans, (case["id"], [(r.kind, r.reason) for r in result.rejected[:3]])
