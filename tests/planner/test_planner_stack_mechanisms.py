"""What the training stack does that the cost model prices (issue 41): Transformer Engine's fp8 casts,
the output layer in bf16, the all-gather side of TP overlap, DP buckets spread over interleaved
chunks, Hopper's fp8 GEMM fraction tied to its bf16 one; and the held-out set kept out of every fit."""

from __future__ import annotations

import dataclasses
import json

import pytest

from bench.calibration import (
    UNSEEN_CASES,
    attention_of,
    case_spec,
    fitted_cases,
    load_cases,
    run_calibration,
    source_of,
    tp_overlap_of,
)
from bench.fit import PARAMETERS, TIED, apply_params, profile_params, summary
from planner.profiles import FP8_FRACTION, PROFILES
from planner.spec import parse_spec
from planner.timing import dp_windows, gemm_time, hardware_for, head_time, tp_overlapped

pytestmark = pytest.mark.unit

SPEC = {"model": {"name": "llama3-70b"}, "cluster": {"gpu_type": "H100", "num_gpus": 64},
        "training": {"global_batch": 64}}


def _hw(precision: str, attention: str = "flash"):  # type: ignore[no-untyped-def]
    raw = {**SPEC, "model": {**SPEC["model"], "attention": attention}, "precision": precision}
    return hardware_for(parse_spec(raw))


def test_te_fuses_fp8_casts_and_bf16_is_untouched() -> None:
    m, n, k = 8192.0, 7168.0, 8192.0
    torchao, te = _hw("fp8"), _hw("fp8", "fused")
    assert te.te and not torchao.te
    unfused = gemm_time(torchao, m, n, k)
    separate = gemm_time(te, m, n, k)  # an input not made by a TE norm: one fused cast-transpose
    from_norm = gemm_time(te, m, n, k, fused_input=True)  # LayerNormLinear emits fp8 itself
    assert from_norm < separate < unfused
    # the cast traffic each pays (forward-equivalent, a third of the step's): 16 B per input element and
    # 8 B per output element unfused; TE 4 B per input element (none from a norm) and 4 B per output one
    bw = te.mem_bw
    assert unfused - from_norm == pytest.approx((8 * (m * k + k * n) + 5 * m * n - 4 * m * n) / bw / 3, rel=1e-9)
    assert separate - from_norm == pytest.approx(4 * m * k / bw / 3, rel=1e-9)
    # bf16 GEMMs pay no casts, whatever the stack
    assert gemm_time(_hw("bf16"), m, n, k) == gemm_time(_hw("bf16", "fused"), m, n, k, fused_input=True)


def test_output_layer_runs_in_bf16_under_fp8() -> None:
    """Megatron's output layer is not a TE module and torchao's float8 skips it: the logits GEMM costs the
    same in fp8 as in bf16 (the same peak and fraction), for every stack."""
    m = parse_spec(SPEC).model
    for attention in ("flash", "fused"):
        assert head_time(m, _hw("fp8", attention), 1, 4, 1) == pytest.approx(head_time(m, _hw("bf16", attention), 1, 4, 1))


def test_tp_overlap_hides_the_all_gather_side() -> None:
    """An all-gather starts on the rank's own shard (nothing exposed); a reduce-scatter's last step is:
    1/(2T) of the traffic is exposed when the GEMMs are long enough, all beyond them when not."""
    exposed, hidden = tp_overlapped(8.0, 100.0, 4)
    assert hidden == pytest.approx(7.0)
    assert exposed == pytest.approx(1.0 + 0.15 * 7.0)
    exposed, hidden = tp_overlapped(8.0, 3.0, 4)
    assert hidden == pytest.approx(3.0) and exposed == pytest.approx(5.0 + 0.15 * 3.0)


def test_dp_buckets_spread_over_interleaved_chunks() -> None:
    assert dp_windows(2.0, 4.0, 1, 8, 32) == (4.0, 2.0)  # plain pipeline: the last backward, the first forward
    rs, ag = dp_windows(2.0, 4.0, 4, 8, 32)
    assert rs == pytest.approx(4.0 / 4 * (1 + 8 * 3)) and ag == pytest.approx(2.0 / 4 * (1 + 8 * 3))
    assert dp_windows(2.0, 4.0, 4, 8, 2)[0] < rs  # fewer micro-batches than stages: a shorter cool-down
    assert dp_windows(2.0, 4.0, 2, 8, 32)[0] < rs


def test_hopper_fp8_fraction_is_tied_to_bf16() -> None:
    for name in ("H100", "H800", "H200"):
        prof = PROFILES[name]
        assert prof.fp8_gemm_efficiency == pytest.approx(FP8_FRACTION * prof.gemm_efficiency)
    assert "hopper_fp8_gemm" not in {p[0] for p in PARAMETERS}
    out = apply_params({**SPEC, "precision": "fp8"}, {"hopper_gemm": 0.7})
    assert out["cluster"]["gemm_efficiency"] == 0.7
    assert out["cluster"][TIED["hopper_gemm"][0]] == pytest.approx(0.7 * FP8_FRACTION)
    # a case's own fp8 fraction is kept
    own = apply_params({**SPEC, "cluster": {**SPEC["cluster"], "fp8_gemm_efficiency": 0.5}}, {"hopper_gemm": 0.7})
    assert own["cluster"]["fp8_gemm_efficiency"] == 0.5


def test_summary_reports_the_sign() -> None:
    s = summary([{"rel_error": 0.1}, {"rel_error": -0.05}, {"rel_error": 0.2}])
    assert (s["cases"], s["over"], s["under"]) == (3, 2, 1)
    assert s["median"] == pytest.approx(0.1) and s["signed_median"] == pytest.approx(0.1)
    assert s["signed_mean"] == pytest.approx(0.25 / 3) and s["max"] == pytest.approx(0.2)


def test_never_fitted_cases_stay_out_of_every_fit_and_are_scored() -> None:
    unseen = load_cases(UNSEEN_CASES)
    fitted = fitted_cases()
    assert len({source_of(c) for c in unseen}) >= 2
    assert not {source_of(c) for c in unseen} & {source_of(c) for c in fitted}
    assert not {c["id"] for c in unseen} & {c["id"] for c in fitted}
    for c in unseen:
        assert c["source"] and c["url"].startswith("https://") and c["what"] and c["verification"], c["id"]
        assert c["cluster"]["gpu_type"].startswith("H100"), c["id"]
    # no never-fitted publication is in a fitted file under another name (same page, other source key)
    fitted_urls = {c.get("url", "").split("/blob/")[0] for c in fitted}
    assert not {c["url"].split("/blob/")[0] for c in unseen} & fitted_urls
    # the stack each ran: Megatron-LM (Transformer Engine) for Nemotron-4, Meta's PyTorch stack for Llama 3,
    # PyTorch FSDP with SDPA flash attention for IBM's fms-fsdp, nanotron with flash attention 2 for SmolLM3
    kinds = {source_of(c): attention_of(c) for c in unseen}
    assert kinds == {"llama3_paper": "flash", "nemotron4_340b": "fused", "fms_fsdp_h100": "flash", "smollm3_hf": "flash"}
    assert not any(tp_overlap_of(c) for c in unseen if source_of(c) == "fms_fsdp_h100")
    cal = run_calibration(cases=unseen, params=profile_params())
    assert cal["cases"] == len(unseen) and not cal["skipped"]
    for c in unseen:
        parse_spec(case_spec(c))  # plannable as recorded


def test_bench_planner_keeps_the_part_it_does_not_rerun(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from bench.planner import _previous

    old = {"name": "planner", "finished_at": "T0", "markdown": "search table\n\nAccuracy on published runs ...",
           "rows": [{"case": "a", "planner_s": 1.0}, {"case": "b", "planner_s": 2.0}, {"case": "calibration"}]}
    path = tmp_path / "planner.json"
    path.write_text(json.dumps(old))
    got = _previous(path)
    assert [r["case"] for r in got["search"]["rows"]] == ["a", "b"]
    assert got["search"]["markdown"] == "search table"
    assert got["accuracy"]["markdown"].startswith("Accuracy on published runs")
    assert [r["case"] for r in got["accuracy"]["rows"]] == ["calibration"]
    new = {**old, "parts_data": {"search": {"rows": [], "markdown": "s", "finished_at": "T1"}}}
    path.write_text(json.dumps(new))
    assert _previous(path) == new["parts_data"]
    assert _previous(tmp_path / "missing.json") == {}


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_profiles_hold_the_fit_on_every_fitted_source() -> None:
    """The built-in Hopper/Ampere numbers are the fit bench/fit.py finds on the fitted sources (3 rounds),
    to the third decimal (the unseen cases are not among them)."""
    from bench.fit import fit

    got = fit(fitted_cases(), rounds=3)
    want = profile_params()
    for name, _fam, _field in PARAMETERS:
        assert got[name] == pytest.approx(want[name], abs=0.0015), name
    assert dataclasses.asdict(PROFILES["H100"])["gemm_efficiency"] == want["hopper_gemm"]
