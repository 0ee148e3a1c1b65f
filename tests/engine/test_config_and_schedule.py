"""Model presets/JSON, layout validation and schedule printing (no processes)."""

import json
from pathlib import Path

import pytest

from planner.layout import Layout
from workers.engine.config import MODEL_PRESETS, DataConfig, ModelConfig, TrainConfig
from workers.engine.parallel.pipeline import format_schedule, schedule_actions
from workers.engine.validate import layout_problems

pytestmark = pytest.mark.engine


def test_presets_and_json(tmp_path: Path) -> None:
    tiny = ModelConfig.preset("tiny")
    assert (tiny.layers, tiny.hidden, tiny.heads, tiny.kv_heads, tiny.vocab, tiny.seq_len) == (4, 64, 8, 4, 256, 64)
    for name in ("llama3-8b", "llama3-70b", "llama2-7b", "llama3-405b"):
        assert name in MODEL_PRESETS
    assert 7.5e9 < ModelConfig.preset("llama3-8b").num_params() < 8.5e9
    f = tmp_path / "m.json"
    f.write_text(json.dumps({"layers": 2, "hidden": 32, "heads": 4, "kv_heads": 2, "ffn": 64, "vocab": 256,
                             "seq_len": 16}))
    m = ModelConfig.from_json(f)
    assert (m.layers, m.hidden, m.name) == (2, 32, "m")
    f.write_text(json.dumps({"preset": "tiny", "layers": 8}))
    assert ModelConfig.from_json(f).layers == 8
    with pytest.raises(ValueError, match="heads"):
        ModelConfig(hidden=64, heads=6)
    cfg = TrainConfig(model=tiny, data=DataConfig.from_path("x.txt"))
    assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_layout_problems_name_the_reason() -> None:
    tiny = ModelConfig.preset("tiny")
    assert layout_problems(tiny, Layout.parse("tp=2,cp=2,pp=2"), 8, world_size=8) == []
    assert any("world size" in p for p in layout_problems(tiny, Layout.parse("tp=2"), 8, world_size=4))
    assert any("heads 8 not divisible by tp=3" in p for p in layout_problems(tiny, Layout.parse("tp=3"), 8))
    assert any("2*cp" in p for p in layout_problems(tiny, Layout.parse("cp=3"), 6))
    assert any("layers 4 not divisible" in p for p in layout_problems(tiny, Layout.parse("pp=3"), 6))
    assert any("micro-batches" in p for p in layout_problems(tiny, Layout.parse("pp=4,micro_batch=4"), 8))
    assert any("divisible by dp*micro_batch" in p for p in layout_problems(tiny, Layout.parse("dp=3"), 8))


def test_schedules_print_per_rank_actions() -> None:
    one = schedule_actions(Layout.parse("pp=4"), 8)
    assert set(one) == {0, 1, 2, 3}
    for acts in one.values():
        assert sum("F" in a for a in acts) == 8 and sum("B" in a for a in acts) == 8
    # 1F1B: the first stage runs pp forwards before its first backward; GPipe runs all of them
    first_b = next(i for i, a in enumerate(one[0]) if "B" in a)
    assert first_b <= 4
    gp = schedule_actions(Layout.parse("pp=4,schedule=gpipe"), 8)
    assert next(i for i, a in enumerate(gp[0]) if "B" in a) == 8
    inter = schedule_actions(Layout.parse("pp=2,vpp=2"), 4)
    stages0 = {a.split("F")[0] for a in inter[0] if "F" in a}
    assert stages0 == {"0", "2"}  # looped placement: rank 0 holds stages 0 and 2
    text = format_schedule(Layout.parse("pp=2,vpp=2"), 4)
    assert text.startswith("schedule=interleaved") and "rank 1:" in text


def test_train_config_takes_the_job_specs_names_and_still_reads_a_manifest_under_the_old_ones() -> None:
    """``eval_data``, ``export`` and ``model.hf`` are the REST job spec's names; a checkpoint manifest
    written before (``val_data``, ``export_hf``, ``init_hf``) loads into the same config."""
    from workers.engine.config import ExportConfig, TrainConfig

    old = {"model": {"name": "tiny"}, "steps": 2, "global_batch": 4, "eval_every": 1, "init_hf": "/ckpt/llama",
           "export_hf": "/jobs/1/export", "val_data": {"kind": "text", "paths": ["held-out.txt"]}}
    cfg = TrainConfig.from_dict(old)
    assert cfg.model.hf == "/ckpt/llama" and cfg.export == ExportConfig("hf", "/jobs/1/export")
    assert cfg.eval_data is not None and cfg.eval_data.paths == ("held-out.txt",)
    new = cfg.to_dict()
    assert {"init_hf", "export_hf", "val_data"}.isdisjoint(new) and TrainConfig.from_dict(new) == cfg
    with pytest.raises(ValueError, match="export format"):
        TrainConfig.from_dict({**new, "export": {"format": "onnx", "dir": "/x"}})
