"""The held-out published runs, the kernel-efficiency fit and leave-one-source-out scoring."""

from __future__ import annotations

import itertools
from functools import lru_cache
from typing import Any

import pytest

from bench.calibration import HELDOUT_CASES, case_spec, load_cases, run_calibration, source_of
from bench.fit import PRIOR, apply_params, fit, leave_one_source_out, summary
from planner.search import search
from planner.spec import parse_spec

pytestmark = pytest.mark.unit

# Measured orderings the model does not keep, and why (the test fails when one is kept again). Empty since
# ZeRO-3's per-GPU gather volume is priced at one NIC per GPU with fp32 gradient reduce-scatters (the
# three Narayanan 2021 ZeRO-3 vs PTD-P pairs, see docs/planner.md "Measured orderings").
KNOWN_ORDER_EXCEPTIONS: set[tuple[str, str]] = set()
ORDER_GAP = 0.05  # pairs measured closer than this are ties at the model's accuracy


@lru_cache(maxsize=1)
def _all() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    cases = load_cases() + load_cases(HELDOUT_CASES)
    return cases, run_calibration(cases=cases)["rows"]


def test_heldout_records_cite_their_source() -> None:
    cases = load_cases(HELDOUT_CASES)
    assert len(cases) >= 40
    assert len({source_of(c) for c in cases}) >= 5
    original = {source_of(c) for c in load_cases()}
    for c in cases:
        assert c["source"] and c["url"].startswith("https://") and c["what"], c["id"]
        assert source_of(c) not in original
        assert c["measured"].get("tokens_per_s_per_gpu") or c["measured"].get("tflops_per_gpu"), c["id"]


def test_no_heldout_layout_is_refused_and_in_sample_error() -> None:
    for case in load_cases(HELDOUT_CASES):
        result = search(parse_spec(case_spec(case)), top_k=1)
        assert result.plans, (case["id"], [(r.kind, r.reason) for r in result.rejected[:3]])
    cal = run_calibration(HELDOUT_CASES)
    assert cal["cases"] == len(load_cases(HELDOUT_CASES)) and not cal["skipped"]
    # in sample: the profiles' efficiencies were fitted on these sources too (the left-out error is
    # what `orthoplex bench planner` reports)
    assert cal["median_abs_rel_error"] <= 0.10


def test_measured_orderings_are_kept() -> None:
    cases, rows = _all()
    by_id = {c["id"]: c for c in cases}
    broken = set()
    for a, b in itertools.combinations(rows, 2):
        ca, cb = by_id[a["case"]], by_id[b["case"]]
        same = (a["source"] == b["source"] and ca["model"].get("name") == cb["model"].get("name")
                and ca["model"]["seq_len"] == cb["model"]["seq_len"] and ca.get("precision") == cb.get("precision"))
        if not same or abs(a["measured_tokens_per_gpu"] / b["measured_tokens_per_gpu"] - 1) < ORDER_GAP:
            continue
        if (a["measured_tokens_per_gpu"] > b["measured_tokens_per_gpu"]) != (
                a["predicted_tokens_per_gpu"] > b["predicted_tokens_per_gpu"]):
            broken.add((a["case"], b["case"]))
    assert broken == KNOWN_ORDER_EXCEPTIONS


def _planted(cases: list[dict[str, Any]], params: dict[str, float]) -> list[dict[str, Any]]:
    """The cases with their measurement replaced by the model's own prediction under ``params``."""
    rows = {r["case"]: r for r in run_calibration(cases=cases, params=params)["rows"]}
    return [{**c, "measured": {"tokens_per_s_per_gpu": rows[c["id"]]["predicted_tokens_per_gpu"]}} for c in cases]


def test_fit_recovers_planted_efficiencies_and_leaves_the_source_out() -> None:
    heldout = load_cases(HELDOUT_CASES)
    a100 = [c for c in heldout if source_of(c) == "torchtitan_a100"][:4]
    planted_a = _planted(a100[:2], {**PRIOR, "ampere_gemm": 0.60})
    planted_b = [{**c, "source_key": "other"} for c in _planted(a100[2:], {**PRIOR, "ampere_gemm": 0.76})]
    got = fit(planted_a)
    assert got["ampere_gemm"] == pytest.approx(0.60, rel=0.04)
    assert got["hopper_gemm"] == PRIOR["hopper_gemm"]  # no Hopper case: untouched
    left = leave_one_source_out(planted_a + planted_b, rounds=2)
    assert left["params"]["torchtitan_a100"]["ampere_gemm"] == pytest.approx(0.76, rel=0.04)
    left_a = [r for r in left["rows"] if r["source"] == "torchtitan_a100"]
    assert len(left_a) == 2 and all(r["rel_error"] > 0.05 for r in left_a)  # fitted on the faster source


def test_params_reach_only_their_gpu_family() -> None:
    raw = {"model": {"name": "llama3-8b"}, "cluster": {"gpu_type": "A100", "num_gpus": 8},
           "training": {"global_batch": 8}}
    out = apply_params(raw, {**PRIOR, "ampere_gemm": 0.5, "hopper_gemm": 0.1})
    assert out["cluster"]["gemm_efficiency"] == 0.5
    assert parse_spec(out).cluster.gemm_efficiency == 0.5
    own = apply_params({**raw, "cluster": {**raw["cluster"], "gemm_efficiency": 0.9}}, {"ampere_gemm": 0.5})
    assert own["cluster"]["gemm_efficiency"] == 0.9


def test_tp_overlap_is_read_from_what_each_source_ran() -> None:
    """parallel.tp_overlap comes from the case's own record: TorchTitan names AsyncTP per run (and
    "without AsyncTP" when off), NVIDIA's NeMo / Megatron-Bridge recipes run TE's TP overlap, the
    2021-22 papers and FlagPerf do not."""
    from bench.calibration import tp_overlap_of

    by_id = {c["id"]: c for c in load_cases() + load_cases(HELDOUT_CASES)}
    assert tp_overlap_of(by_id["torchtitan_h100_t5_405b_1f1b"])
    assert not tp_overlap_of(by_id["torchtitan_h100_t4_70b_2d"])  # "without AsyncTP"
    assert tp_overlap_of(by_id["nemo2407_llama2-70b_64gpu"])
    assert tp_overlap_of(by_id["mbridge2511_llama3-405b_1024gpu_gbs512"])
    assert not any(tp_overlap_of(c) for i, c in by_id.items()
                   if i.startswith(("narayanan2021", "korthikanti2022", "flagperf", "torchtitan_a100")))
    spec = parse_spec(case_spec(by_id["nemo2407_llama2-70b_64gpu"]))
    assert spec.tp_overlap and not parse_spec(case_spec(by_id["flagperf_llama3_70b_h100_64gpu"])).tp_overlap


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_left_out_median_on_the_heldout_sources_is_within_10_percent() -> None:
    """The claim README and `orthoplex bench planner` make, checked: each held-out source predicted with
    kernel efficiencies fitted on every other source only (the bench's leave-one-source-out, 3 rounds)
    has a median |error| <= 10%, and every held-out run is scored (none refused, none skipped). Only
    the 5 held-out sources are left out here (the bench leaves out all 11) to keep CI's time."""
    cases = load_cases() + load_cases(HELDOUT_CASES)
    heldout = {source_of(c) for c in load_cases(HELDOUT_CASES)}
    left = leave_one_source_out(cases, rounds=3, only=heldout)
    rows = left["rows"]
    assert {r["source"] for r in rows} == heldout
    assert len(rows) == len(load_cases(HELDOUT_CASES))
    assert summary(rows)["median"] <= 0.10, summary(rows)
