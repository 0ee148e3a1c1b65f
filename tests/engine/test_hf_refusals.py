"""``orthoplex train --init-hf``: bad HF checkpoints are refused with exit 2 naming the field or the
file, before any rank starts (no processes are spawned here)."""

import json
from pathlib import Path

import pytest
import typer
from hf_fixtures import make_hf_llama
from typer.testing import CliRunner

from service.cli.train import register
from workers.engine.hf import HFConfigError, model_config_from_hf


def _train(*args: str):
    app = typer.Typer()
    register(app)

    @app.command("noop")
    def noop() -> None:  # keeps typer from flattening "train" into the root
        pass

    return CliRunner().invoke(app, ["train", *args])


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_hf_llama(tmp_path_factory.mktemp("hf") / "llama", tied=False, layers=2)


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


@pytest.mark.engine
def test_other_architecture_is_refused_naming_model_type(ckpt: Path, tmp_path: Path) -> None:
    d = _copy(ckpt, tmp_path / "gpt2")
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "gpt2"
    (d / "config.json").write_text(json.dumps(cfg))
    r = _train("--init-hf", str(d), "--seq-len", "64")
    assert r.exit_code == 2 and "model_type" in r.output and "gpt2" in r.output, r.output
    del cfg["model_type"]
    (d / "config.json").write_text(json.dumps(cfg))
    r = _train("--init-hf", str(d), "--seq-len", "64")
    assert r.exit_code == 2 and "model_type" in r.output, r.output


@pytest.mark.engine
def test_missing_config_and_corrupt_safetensors_are_refused(ckpt: Path, tmp_path: Path) -> None:
    r = _train("--init-hf", str(tmp_path), "--seq-len", "64")
    assert r.exit_code == 2 and "config.json" in r.output, r.output
    d = _copy(ckpt, tmp_path / "corrupt")
    f = d / "model.safetensors"
    f.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    r = _train("--init-hf", str(d), "--seq-len", "64")
    assert r.exit_code == 2 and "model.safetensors" in r.output and "corrupt" in r.output, r.output
    f.write_bytes((ckpt / "model.safetensors").read_bytes()[:-1000])  # truncated data
    r = _train("--init-hf", str(d), "--seq-len", "64")
    assert r.exit_code == 2 and "model.safetensors" in r.output, r.output


@pytest.mark.engine
def test_shape_mismatch_and_unsupported_fields_name_the_field(ckpt: Path, tmp_path: Path) -> None:
    d = _copy(ckpt, tmp_path / "shape")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 176}))
    r = _train("--init-hf", str(d), "--seq-len", "64")
    assert r.exit_code == 2 and "gate_proj" in r.output and "176" in r.output, r.output
    base = json.loads((ckpt / "config.json").read_text())
    for field, value in (("hidden_act", "gelu"), ("attention_bias", True), ("rope_parameters", {"rope_type": "yarn"})):
        with pytest.raises(HFConfigError, match=field.split("_")[0] if field != "rope_parameters" else "rope_type"):
            model_config_from_hf({**base, field: value}, 64)
    with pytest.raises(HFConfigError, match="max_position_embeddings"):
        model_config_from_hf(base, 4096)


@pytest.mark.engine
def test_both_rotary_spellings_give_the_same_shape(ckpt: Path) -> None:
    base = json.loads((ckpt / "config.json").read_text())
    new = model_config_from_hf(base, 64)
    hub = dict(base)
    params = hub.pop("rope_parameters")
    hub["rope_theta"] = params["rope_theta"]
    hub["rope_scaling"] = {"type": "llama3", **{k: v for k, v in params.items() if k not in ("rope_theta", "rope_type")}}
    assert model_config_from_hf(hub, 64) == new
    assert new.rope_scaling_factor == 8.0 and new.rope_theta == 500000.0 and new.kv_heads == 2
