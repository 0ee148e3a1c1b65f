"""``orthoplex plan``: table, exact JSON shape, exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from service.cli.plan import register
from tests.planner.conftest import tiny_spec

pytestmark = pytest.mark.unit

PLAN_KEYS = {"tp", "pp", "cp", "dp", "vpp", "micro_batch", "num_micro_batches", "sp", "zero", "recompute",
             "estimate"}
ESTIMATE_KEYS = {"step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "memory_gb_per_gpu"}


def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)

    @app.callback()
    def main() -> None:  # a group, as in orthoplex
        pass

    return app


def _run(tmp_path: Path, spec: Any, *args: str) -> Any:
    path = tmp_path / "spec.json"
    path.write_text(spec if isinstance(spec, str) else json.dumps(spec))
    return CliRunner().invoke(_app(), ["plan", "--spec", str(path), *args])


def test_json_shape_exact(tmp_path: Path) -> None:
    res = _run(tmp_path, tiny_spec(), "--json", "--top", "2")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert set(data) == {"plans", "rejected", "searched", "search_time_s", "recovery"}
    assert 1 <= len(data["plans"]) <= 2
    # what --recovery (default auto) comes to on the best plan, and why (planner.recovery_choice)
    assert data["recovery"]["policy"] in ("replica_groups", "replan") and data["recovery"]["reason"]
    for p in data["plans"]:
        assert set(p) == PLAN_KEYS
        assert set(p["estimate"]) >= ESTIMATE_KEYS
    steps = [p["estimate"]["step_time_s"] for p in data["plans"]]
    assert steps == sorted(steps)
    for r in data["rejected"]:
        assert set(r) == {"layout", "reason"}
    assert data["searched"] > 0 and data["search_time_s"] >= 0


def test_table_output(tmp_path: Path) -> None:
    res = _run(tmp_path, tiny_spec())
    assert res.exit_code == 0, res.output
    assert "tp" in res.output and "MFU" in res.output and "searched" in res.output
    assert "recovery (auto):" in res.output and "because" in res.output
    restart = _run(tmp_path, tiny_spec(), "--recovery", "restart")
    assert "recovery (restart): restart; no snapshots" in restart.output, restart.output
    bad = _run(tmp_path, tiny_spec(), "--recovery", "sometimes")
    assert bad.exit_code == 2 and "--recovery" in bad.output, bad.output


def test_nothing_fits_exits_1_with_reasons(tmp_path: Path) -> None:
    spec = {"model": {"name": "llama3-70b"}, "cluster": {"gpu_type": "A100", "num_gpus": 8},
            "parallel": {"tp": 1, "pp": 1}, "training": {"global_batch": 8}}
    res = _run(tmp_path, spec)
    assert res.exit_code == 1
    assert "memory" in res.output and "GiB" in res.output
    res = _run(tmp_path, spec, "--json")
    assert res.exit_code == 1
    assert json.loads(res.stdout)["plans"] == []


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"model": {"name": "llama3-8b", "heads": 2.5}, "cluster": {"gpu_type": "A100", "num_gpus": 8},
          "training": {"global_batch": 8}}, "model.heads"),
        ({"model": {"name": "llama3-8b", "layers": -1}, "cluster": {"gpu_type": "A100", "num_gpus": 8},
          "training": {"global_batch": 8}}, "model.layers"),
        ({"model": {"name": "llama3-8b"}, "cluster": {"gpu_type": "A100", "num_gpus": 0},
          "training": {"global_batch": 8}}, "cluster.num_gpus"),
        ({"model": {"name": "llama3-8b"}, "cluster": {"gpu_type": "Z9000", "num_gpus": 8},
          "training": {"global_batch": 8}}, "cluster.gpu_type"),
        ("{not json", "--spec"),
        ({"model": {"name": "llama3-8b"}, "cluster": {"gpu_type": "A100", "num_gpus": 8},
          "parallel": {"recompute": "layer:1"}, "training": {"global_batch": 8}}, "parallel.recompute"),
        ({"model": {"name": "llama3-8b"}, "cluster": {"gpu_type": "A100", "num_gpus": 8},
          "parallel": {"recompute": "sometimes"}, "training": {"global_batch": 8}}, "parallel.recompute"),
        ({"model": {"name": "llama3-8b"}, "cluster": {"gpu_type": "A100", "num_gpus": 8},
          "parallel": {"recompute": "layer:33"}, "training": {"global_batch": 8}}, "parallel.recompute"),
    ],
)
def test_bad_input_exits_2_naming_the_field(tmp_path: Path, spec: Any, field: str) -> None:
    res = _run(tmp_path, spec, "--json")
    assert res.exit_code == 2
    assert field in res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)


def test_missing_file_exits_2(tmp_path: Path) -> None:
    res = CliRunner().invoke(_app(), ["plan", "--spec", str(tmp_path / "nope.json")])
    assert res.exit_code == 2 and "--spec" in res.output


def test_unknown_recompute_lists_the_known_modes(tmp_path: Path) -> None:
    spec = {"model": {"name": "llama3-8b"}, "cluster": {"gpu_type": "A100", "num_gpus": 8},
            "parallel": {"recompute": "sometimes"}, "training": {"global_batch": 8}}
    res = _run(tmp_path, spec)
    assert res.exit_code == 2
    for known in ("none", "selective", "op", "layer:N", "full"):
        assert known in res.output


@pytest.mark.parametrize("mode,planned", [("op", "op"), ("selective_op", "op"), ("layer", "layer:2"),
                                          ("selective_layer", "layer:2"), ("layer:4", "layer:4")])
def test_torchtitan_recompute_names_are_planned(tmp_path: Path, mode: str, planned: str) -> None:
    spec = {"model": {"name": "llama3-8b"}, "cluster": {"gpu_type": "H100", "num_gpus": 8},
            "parallel": {"recompute": mode, "tp": 1, "pp": 1}, "training": {"global_batch": 8}}
    res = _run(tmp_path, spec, "--json")
    assert res.exit_code == 0, res.output
    plans = json.loads(res.output)["plans"]
    assert plans and all(p["recompute"] == planned for p in plans)


def test_tp_overlap_must_be_a_boolean(tmp_path: Path) -> None:
    spec = {"model": {"name": "llama3-8b"}, "cluster": {"gpu_type": "H100", "num_gpus": 8},
            "parallel": {"tp_overlap": "sometimes"}, "training": {"global_batch": 8}}
    res = _run(tmp_path, spec, "--json")
    assert res.exit_code == 2 and "parallel.tp_overlap" in res.output


def test_layer_n_beyond_a_stage_is_refused_with_its_reason(tmp_path: Path) -> None:
    """layer:N is accepted up to the busiest stage's layers (the free search explores all of them);
    past them the layout is refused for that reason (exit 1, nothing fits), not priced."""
    base = {"model": {"name": "llama3-8b"}, "cluster": {"gpu_type": "H100", "num_gpus": 8},
            "training": {"global_batch": 8}}
    ok = _run(tmp_path, {**base, "parallel": {"recompute": "layer:16", "pp": 2, "vpp": 1}}, "--json")
    assert ok.exit_code == 0 and all(p["recompute"] == "layer:16" for p in json.loads(ok.output)["plans"])
    res = _run(tmp_path, {**base, "parallel": {"recompute": "layer:17", "pp": 2, "vpp": 1}}, "--json")
    assert res.exit_code == 1
    data = json.loads(res.stdout)
    assert data["plans"] == [] and data["rejected"]
    assert all(r["reason"].startswith("recompute layer:17 checkpoints every 17-th layer")
               and "busiest stage has 16 layer(s): N must be 2..16" in r["reason"] for r in data["rejected"])
