"""Spec parsing: presets and profiles fill gaps; bad input names the field."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner import SpecError, parse_spec, plan
from planner.profiles import lookup_gpu
from tests.planner.conftest import a100_spec, tiny_spec

pytestmark = pytest.mark.unit


def test_preset_and_profile_fill_missing_fields() -> None:
    spec = parse_spec(a100_spec())
    assert spec.model.layers == 32 and spec.model.kv_heads == 8 and spec.model.gated_mlp
    assert spec.cluster.peak_tflops == 312.0 and spec.cluster.gpu_mem_gb == 80
    assert spec.cluster.inter_node_bw_Gbps_per_gpu == 200 and len(spec.cluster.nodes) == 4


def test_gpu_names_match_profiles() -> None:
    assert lookup_gpu("A100-SXM4-80GB").name == "A100"  # type: ignore[union-attr]
    assert lookup_gpu("A100-SXM4-40GB").mem_gb == 40  # type: ignore[union-attr]
    assert lookup_gpu("H800-80GB").intra_node_bw_GBps == 200  # type: ignore[union-attr]
    assert lookup_gpu("h200").mem_gb == 141  # type: ignore[union-attr]
    assert lookup_gpu("TPUv9") is None


def test_fp8_peak_defaults_to_twice_bf16() -> None:
    spec = parse_spec(a100_spec(cluster={"gpu_type": "mystery", "num_gpus": 8, "peak_tflops": 100,
                                         "gpu_mem_gb": 40}, precision="fp8"))
    assert spec.precision == "fp8" and spec.cluster.peak_tflops_fp8 == 200


def test_published_precision_strings() -> None:
    for text, want in (("fp16 mixed", "fp16"), ("fp16/bf16 mixed", "bf16"), ("amp (mixed)", "bf16"),
                       ("FP8 (TE)", "fp8"), ("bf16", "bf16")):
        assert parse_spec(a100_spec(precision=text)).precision == want


def _mutate(spec: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(spec)
    node = out
    keys = path.split(".")
    for k in keys[:-1]:
        if not isinstance(node.get(k), dict):
            node[k] = {}
        node = node[k]
    if value is _DELETE:
        node.pop(keys[-1], None)
    else:
        node[keys[-1]] = value
    return out


_DELETE = object()
BASE = {"model": {"layers": 4, "hidden": 64, "heads": 8, "kv_heads": 4, "ffn": 172, "vocab": 256, "seq_len": 64},
        "cluster": {"gpu_type": "H100", "num_gpus": 8}, "training": {"global_batch": 8}}


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("model.layers", -4, "model.layers"),
        ("model.hidden", 0, "model.hidden"),
        ("model.heads", 2.5, "model.heads"),
        ("model.heads", "eight", "model.heads"),
        ("model.heads", 7, "model.heads"),
        ("model.kv_heads", 3, "model.kv_heads"),
        ("model.vocab", _DELETE, "model.vocab"),
        ("model.layer", 4, "model.layer"),
        ("cluster.num_gpus", 0, "cluster.num_gpus"),
        ("cluster.num_gpus", -8, "cluster.num_gpus"),
        ("cluster.gpu_type", "TPUv9", "cluster.gpu_type"),
        ("cluster.gpus_per_node", True, "cluster.gpus_per_node"),
        ("cluster.peak_tflops", -1, "cluster.peak_tflops"),
        ("cluster.nodes", [{"id": "a", "gpus": 0}], "cluster.nodes[0].gpus"),
        ("cluster.nodes", [{"id": "a", "gpus": 4, "speed": 0}], "cluster.nodes[0].speed"),
        ("cluster.nodes", [{"id": "a", "gpus": 4}, {"id": "a", "gpus": 4}], "cluster.nodes[1].id"),
        ("training.global_batch", _DELETE, "parallel.global_batch"),
        ("training.global_batch", 0, "training.global_batch"),
        ("training.global_batch", 1e300, "training.global_batch"),
        ("model.layers", 10**9, "model.layers"),
        ("parallel.tp", 0, "parallel.tp"),
        ("parallel.zero", 2, "parallel.zero"),
        ("parallel.recompute", "some", "parallel.recompute"),
        ("parallel.tp_overlap", "often", "parallel.tp_overlap"),
        ("parallel.pipeline", 2, "parallel.pipeline"),
        ("precision", "int4", "precision"),
    ],
)
def test_bad_input_names_the_field(path: str, value: Any, field: str) -> None:
    with pytest.raises(SpecError) as info:
        plan(_mutate(BASE, path, value))
    assert info.value.field == field
    assert str(info.value).startswith(field)


def test_unknown_gpu_with_numbers_is_accepted() -> None:
    spec = _mutate(BASE, "cluster", {"gpu_type": "NewChip", "num_gpus": 8, "peak_tflops": 500, "gpu_mem_gb": 64})
    assert plan(spec).plans


def test_missing_sections_and_non_dict() -> None:
    with pytest.raises(SpecError) as info:
        plan({"cluster": BASE["cluster"]})
    assert info.value.field == "model"
    with pytest.raises(SpecError):
        plan([1, 2])  # type: ignore[arg-type]
    with pytest.raises(SpecError) as info:
        plan(BASE, top_k=0)
    assert info.value.field == "top_k"


def test_nodes_failed_and_speeds() -> None:
    spec = tiny_spec()
    spec["cluster"] = {**spec["cluster"], "failed_nodes": ["node-1"], "node_speeds": {"node-2": 0.5}}
    parsed = parse_spec(spec)
    assert [n.id for n in parsed.cluster.nodes] == ["node-0", "node-2"]
    assert parsed.cluster.nodes[1].speed == 0.5 and parsed.cluster.num_gpus == 8
    spec["cluster"]["failed_nodes"] = ["nope"]
    with pytest.raises(SpecError) as info:
        parse_spec(spec)
    assert info.value.field == "cluster.failed_nodes"


junk = st.one_of(st.none(), st.booleans(), st.integers(-5, 100), st.floats(allow_nan=True, allow_infinity=True),
                 st.text(max_size=5), st.lists(st.integers(0, 3), max_size=2), st.dictionaries(st.text(max_size=3),
                                                                                             st.integers(), max_size=2))
FIELDS = ["model.layers", "model.hidden", "model.heads", "model.kv_heads", "model.ffn", "model.vocab", "model.seq_len",
          "model.name", "model.attention", "cluster.num_gpus", "cluster.gpus_per_node", "cluster.gpu_type",
          "cluster.nodes", "cluster.min_gpus", "cluster.gpu_mem_gb", "parallel.tp", "parallel.pp", "parallel.sp",
          "parallel.zero", "parallel.micro_batch", "training.global_batch", "precision", "engine_only", "model",
          "cluster", "parallel"]


@settings(max_examples=60, deadline=None)
@given(changes=st.lists(st.tuples(st.sampled_from(FIELDS), junk), min_size=1, max_size=3))
def test_garbage_in_gives_a_field_error_or_a_result(changes: list[tuple[str, Any]]) -> None:
    spec = copy.deepcopy(BASE)
    for path, value in changes:
        spec = _mutate(spec, path, value) if "." in path else {**spec, path: value}
    try:
        result = plan(spec, top_k=2)
    except SpecError as exc:
        assert exc.field and str(exc).startswith(exc.field)
    else:
        assert result.searched >= 0


def test_tp_overlap_is_refused_for_engine_only_plans() -> None:
    """The engine does not pipeline TP collectives with its GEMMs: an engine plan cannot assume it."""
    spec = a100_spec(parallel={"tp_overlap": True})
    assert parse_spec(spec).tp_overlap
    with pytest.raises(SpecError) as info:
        plan(spec, engine_only=True)
    assert info.value.field == "parallel.tp_overlap"
