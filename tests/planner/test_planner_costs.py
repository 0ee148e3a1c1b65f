"""Memory and step-time components behave like the physics they model."""

from __future__ import annotations

import dataclasses
import math

import pytest

from planner import Layout, Plan, evaluate, parse_spec
from planner.flops import korthikanti_per_token, model_flops_per_token, palm_per_token, total_params
from planner.memory import GiB, activation_bytes_per_layer, estimate_memory
from tests.planner.conftest import a100_spec

pytestmark = pytest.mark.unit

GPT22B = {"model": {"layers": 48, "hidden": 6144, "heads": 64, "ffn": 24576, "vocab": 51200, "seq_len": 2048,
                    "attention": "materialized"},
          "cluster": {"gpu_type": "A100", "num_gpus": 8}, "training": {"global_batch": 4}}


def _plan(spec: dict, text: str) -> Plan:
    """Cost a layout with memory out of the way (these tests are about the components)."""
    roomy = {**spec, "cluster": {**spec["cluster"], "gpu_mem_gb": 10_000}}
    result = evaluate(roomy, Layout.parse(text))
    assert isinstance(result, Plan), result
    return result


def test_korthikanti_activation_terms_exact() -> None:
    spec = parse_spec(GPT22B)
    lay = Layout(tp=8, micro_batch=4, sp=False, recompute="none")
    # Korthikanti Table 2, TP only: s·b·h·(10 + 24/t + 5·a·s/(h·t)) bytes per layer
    s, b, h, a, t = 2048, 4, 6144, 64, 8
    assert activation_bytes_per_layer(spec, lay) == pytest.approx(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)))
    sp_sel = dataclasses.replace(lay, sp=True, recompute="selective")
    assert activation_bytes_per_layer(spec, sp_sel) == pytest.approx(34 * s * b * h / t)
    full = dataclasses.replace(lay, sp=True, recompute="full")
    assert activation_bytes_per_layer(spec, full) == pytest.approx(2 * s * b * h / t)
    # 48 layers of TP-only activations: Korthikanti Fig. 1 says 59.25 GiB
    assert activation_bytes_per_layer(spec, lay) * 48 / GiB == pytest.approx(59.25, rel=1e-3)


def test_model_state_bytes_and_zero() -> None:
    spec = a100_spec()
    z0 = _plan(spec, "tp=1,pp=1,dp=32,zero=0,micro_batch=1").estimate.memory_breakdown_gb
    z1 = _plan(spec, "tp=1,pp=1,dp=32,zero=1,micro_batch=1").estimate.memory_breakdown_gb
    z3 = _plan(spec, "tp=1,pp=1,dp=32,zero=3,micro_batch=1").estimate.memory_breakdown_gb
    assert z1["optimizer"] == pytest.approx(z0["optimizer"] / 32)
    assert z1["weights"] == z0["weights"]
    assert z3["grads"] < z1["grads"]
    # ZeRO-3 (FSDP2): fp32 master weights, fp32 grads and Adam m, v, all sharded: 16 B per parameter
    total3 = z3["weights"] + z3["grads"] + z3["optimizer"]
    assert total3 == pytest.approx((z0["weights"] + z0["grads"] + z0["optimizer"]) * 16 / 18 / 32)
    assert z3["weights"] == pytest.approx(2 * z0["weights"] / 32)
    # bf16: 2 (weights) + 4 (fp32 grads) + 12 (Adam) bytes per parameter
    assert z0["optimizer"] == pytest.approx(6 * z0["weights"]) and z0["grads"] == pytest.approx(2 * z0["weights"])


def test_recompute_sp_and_schedule_reduce_or_raise_memory() -> None:
    spec = a100_spec()
    base = "tp=2,pp=4,dp=4,micro_batch=1"
    none = _plan(spec, base + ",recompute=none,sp=false").estimate.memory_gb_per_gpu
    sel = _plan(spec, base + ",recompute=selective,sp=false").estimate.memory_gb_per_gpu
    full = _plan(spec, base + ",recompute=full,sp=false").estimate.memory_gb_per_gpu
    sp = _plan(spec, base + ",recompute=none,sp=true").estimate.memory_gb_per_gpu
    assert full < none and sel <= none and sp < none
    gpipe = parse_spec(spec)
    lay = Layout.parse(base + ",schedule=gpipe").with_global_batch(256)
    one = Layout.parse(base).with_global_batch(256)
    assert estimate_memory(gpipe, lay).total_gb > estimate_memory(gpipe, one).total_gb
    inter = Layout.parse(base + ",vpp=2").with_global_batch(256)
    assert estimate_memory(gpipe, inter).components["activations"] > estimate_memory(gpipe, one).components[
        "activations"]


def test_time_components_add_up_and_bubble_formula() -> None:
    spec = a100_spec()
    for text in ("tp=2,pp=4,dp=4,micro_batch=1", "tp=2,pp=4,dp=4,micro_batch=2,vpp=2", "tp=4,cp=2,dp=4,zero=3"):
        est = _plan(spec, text).estimate
        assert sum(est.time_breakdown_s.values()) == pytest.approx(est.step_time_s)
        assert all(v >= 0 for v in est.time_breakdown_s.values())
        lay = Layout.parse(text).with_global_batch(256)
        p, v, m = lay.pp, lay.vpp, lay.num_micro_batches
        pipe = est.step_time_s - est.time_breakdown_s["dp_comm"] - est.time_breakdown_s["optimizer"]
        assert est.time_breakdown_s["bubble"] / pipe == pytest.approx((p - 1) / (v * m + p - 1))
        assert est.bubble_fraction == pytest.approx((p - 1) / (v * m + p - 1))


def test_interleaving_shrinks_the_bubble_and_hides_its_extra_p2p() -> None:
    """Interleaving sends 2v activations per micro-batch instead of 2 (more traffic), but the
    interleaved schedule overlaps them with the other chunks' compute: a plain pipeline hides none."""
    spec = a100_spec()
    one = _plan(spec, "tp=2,pp=4,dp=4,micro_batch=4").estimate
    two = _plan(spec, "tp=2,pp=4,dp=4,micro_batch=4,vpp=2").estimate
    assert two.time_breakdown_s["bubble"] < one.time_breakdown_s["bubble"]
    assert one.hidden_comm_s["pp_p2p"] == 0.0
    traffic_one = one.time_breakdown_s["pp_p2p"]
    hidden_two = two.hidden_comm_s["pp_p2p"]
    assert hidden_two > traffic_one  # twice the traffic, most of it hidden
    assert two.time_breakdown_s["pp_p2p"] < traffic_one


def test_p2p_exposed_only_beyond_the_chunk_compute() -> None:
    from planner.timing import OVERLAP_COST, p2p_exposed

    link = (1e9, 1e-5)
    p2p = 2 * 4 * (1e-3 + 1e-5)  # vpp 4: 8 transfers of 1 ms + latency
    assert p2p_exposed(p2p, 1, link, 1.0, 1.0) == (p2p, 0.0)
    exposed, hidden = p2p_exposed(p2p, 4, link, 1.0, 1.0)  # chunks far longer than a transfer
    assert hidden == pytest.approx(8e-3) and exposed == pytest.approx(8e-5 + OVERLAP_COST * 8e-3)
    exposed, hidden = p2p_exposed(p2p, 4, link, 0.0, 0.0)  # nothing to hide under
    assert hidden == pytest.approx(0.0, abs=1e-12) and exposed == pytest.approx(p2p)


def test_tp_overlap_hides_tp_comm_under_the_gemms() -> None:
    """parallel.tp_overlap (TE userbuffers, PyTorch AsyncTP): TP collectives run under the GEMMs,
    all but one ring step of each (1/T) and what the GEMMs cannot cover."""
    spec = a100_spec()
    plain = _plan(spec, "tp=8,pp=1,dp=4,micro_batch=1").estimate
    over = _plan({**spec, "parallel": {"tp_overlap": True}}, "tp=8,pp=1,dp=4,micro_batch=1").estimate
    assert plain.hidden_comm_s["tp_comm"] == 0.0
    assert over.hidden_comm_s["tp_comm"] > 0.0
    assert over.time_breakdown_s["tp_comm"] < plain.time_breakdown_s["tp_comm"]
    assert over.time_breakdown_s["tp_comm"] >= plain.time_breakdown_s["tp_comm"] / 8
    assert over.step_time_s < plain.step_time_s


def test_tp_across_nodes_costs_more_than_inside() -> None:
    spec = a100_spec(cluster={"gpu_type": "A100", "num_gpus": 32, "gpus_per_node": 8})
    inside = _plan(spec, "tp=8,dp=4,micro_batch=1").estimate.time_breakdown_s["tp_comm"]
    spec4 = a100_spec(cluster={"gpu_type": "A100", "num_gpus": 32, "gpus_per_node": 4})
    across = _plan(spec4, "tp=8,dp=4,micro_batch=1")
    assert across.spanning_counts["tp"] == 4
    assert across.estimate.time_breakdown_s["tp_comm"] > 3 * inside


def test_recompute_costs_time_and_mfu_convention() -> None:
    spec = a100_spec()
    none = _plan(spec, "tp=2,pp=2,dp=8,micro_batch=1,recompute=none").estimate
    full = _plan(spec, "tp=2,pp=2,dp=8,micro_batch=1,recompute=full").estimate
    assert full.time_breakdown_s["recompute"] > 0.2 * full.time_breakdown_s["gemm"] / 3
    assert full.step_time_s > none.step_time_s
    assert full.hfu > full.mfu and none.hfu == pytest.approx(none.mfu)
    parsed = parse_spec(spec)
    tokens = 256 * 8192
    assert none.mfu == pytest.approx(model_flops_per_token(parsed.model) * tokens / none.step_time_s / (32 * 312e12))


def test_megatron_convention_reduces_to_korthikanti_for_gpt() -> None:
    m = parse_spec({**GPT22B, "model": {**GPT22B["model"], "tied_embeddings": True}}).model
    assert model_flops_per_token(m) == pytest.approx(korthikanti_per_token(m), rel=2e-3)
    assert palm_per_token(m) > 6 * total_params(m) * 0.99


def test_cp_ring_hides_under_long_attention_and_fp8_is_faster() -> None:
    long = a100_spec(model={"name": "llama3-8b", "seq_len": 65536}, training={"global_batch": 8})
    est = _plan(long, "tp=8,cp=4,dp=1,micro_batch=1,recompute=full").estimate
    assert est.hidden_comm_s["cp_comm"] > 0
    assert est.time_breakdown_s["cp_comm"] < 0.1 * est.time_breakdown_s["attention"]
    h100 = a100_spec(cluster={"gpu_type": "H100", "num_gpus": 32})
    bf16 = _plan(h100, "tp=2,pp=2,dp=8,micro_batch=1").estimate
    fp8 = _plan({**h100, "precision": "fp8"}, "tp=2,pp=2,dp=8,micro_batch=1").estimate
    # faster, but well short of the 2x peak ratio: deeper tiles, casts and amax reductions
    assert 0.5 * bf16.time_breakdown_s["gemm"] < fp8.time_breakdown_s["gemm"] < 0.85 * bf16.time_breakdown_s["gemm"]
    assert math.isclose(fp8.time_breakdown_s["attention"], bf16.time_breakdown_s["attention"])


def test_slow_node_slows_compute() -> None:
    spec = a100_spec()
    spec["cluster"] = {"gpu_type": "A100", "nodes": [{"id": i, "gpus": 8, "speed": 0.5 if i == 3 else 1.0}
                                                     for i in range(4)]}
    fast = _plan(a100_spec(), "tp=1,dp=32,micro_batch=1").estimate.time_breakdown_s["gemm"]
    slow = _plan(spec, "tp=1,dp=32,micro_batch=1").estimate.time_breakdown_s["gemm"]
    assert slow == pytest.approx(2 * fast)


def test_torchtitan_recompute_modes_order_memory_and_time() -> None:
    """Op-level and layer-level checkpointing sit between none and full, in memory and in time;
    layer:N converges to no recompute as N grows; TorchTitan's names are accepted."""
    spec = {"model": {"name": "llama3-8b"}, "cluster": {"gpu_type": "H100", "num_gpus": 8},
            "training": {"global_batch": 16}}
    base = "dp=8,zero=3,micro_batch=2"
    est = {rc: _plan(spec, f"{base},recompute={rc}").estimate for rc in ("none", "op", "layer:2", "layer:4", "full")}
    act = {rc: e.memory_breakdown_gb["activations"] for rc, e in est.items()}
    assert act["full"] < act["layer:2"] < act["layer:4"] < act["none"]
    assert act["full"] < act["op"] < act["none"]
    rc_time = {rc: e.time_breakdown_s["recompute"] for rc, e in est.items()}
    assert rc_time["none"] == 0 < rc_time["op"] < rc_time["full"]
    assert rc_time["layer:2"] == pytest.approx(rc_time["full"] / 2)
    assert rc_time["layer:4"] == pytest.approx(rc_time["full"] / 4)
    assert est["op"].hfu > est["op"].mfu
    assert Layout.parse("recompute=layer").recompute == "layer:2"
    assert parse_spec({**spec, "parallel": {"recompute": "selective_op"}}).fixed["recompute"] == "op"
