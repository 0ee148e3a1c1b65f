"""The control plane's header-only HF check (``workers.engine.hf.headers``): the parameter shapes it
computes in pure Python are the engine model's, its header reader agrees with ``safetensors`` on a
real checkpoint, and a bad header is refused naming the file."""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path

import pytest
import torch
from hf_fixtures import make_hf_llama

from workers.engine.config import MODEL_PRESETS, ModelConfig
from workers.engine.hf.headers import HFWeightsError, check_checkpoint, expected_shapes, read_header
from workers.engine.hf.weights import HFCheckpoint
from workers.engine.model import Transformer

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("name", ["tiny", "small", "llama3-8b", "llama2-70b"])
@pytest.mark.parametrize("tied", [False, True])
def test_expected_shapes_are_the_models_parameters(name: str, tied: bool) -> None:
    cfg = dataclasses.replace(ModelConfig.preset(name), tie_embeddings=tied)
    if name not in ("tiny", "small"):  # a few layers are enough to compare the names and shapes
        cfg = dataclasses.replace(cfg, layers=2)
    with torch.device("meta"):
        model = Transformer(cfg)
    assert expected_shapes(cfg) == {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert name in MODEL_PRESETS


def test_header_reader_agrees_with_safetensors(tmp_path: Path) -> None:
    hf = make_hf_llama(tmp_path / "sharded", tied=False, layers=2, shard_size="100KB")
    ours: dict[str, tuple[tuple[int, ...], str]] = {}
    for f in sorted(hf.glob("*.safetensors")):
        ours.update({n: (t.shape, t.dtype) for n, t in read_header(f).items()})
    theirs = HFCheckpoint(hf)
    assert {n: ours[n][0] for n in theirs.where} == theirs.shapes
    assert {n: ours[n][1] for n in theirs.where} == theirs.dtypes


def test_bad_headers_are_refused_naming_the_file(tmp_path: Path) -> None:
    f = tmp_path / "model.safetensors"
    cases = {
        b"\x03\x00": "8-byte",
        struct.pack("<Q", 10**12) + b"{}": "header length",
        struct.pack("<Q", 9) + b"{not json": "corrupt",
        _file({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}, 12): "offsets",
        _file({"w": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 2]}}, 2): "dtype",
        _file({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, 16): "the file holds",
    }
    for blob, words in cases.items():
        f.write_bytes(blob)
        with pytest.raises(HFWeightsError, match=words) as e:
            read_header(f)
        assert "model.safetensors" in str(e.value)
    f.write_bytes(_file({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                         "__metadata__": {"format": "pt"}}, 16))
    assert read_header(f)["w"].shape == (2, 2)


def test_check_checkpoint_names_the_missing_or_wrong_tensor(tmp_path: Path) -> None:
    hf = make_hf_llama(tmp_path / "llama", tied=False, layers=2)
    cfg = ModelConfig(layers=2, hidden=64, heads=8, kv_heads=2, ffn=172, vocab=256, seq_len=32)
    check_checkpoint(hf, cfg, tied=False)
    with pytest.raises(HFWeightsError, match=r"gate_proj.*176"):
        check_checkpoint(hf, dataclasses.replace(cfg, ffn=176), tied=False)
    with pytest.raises(HFWeightsError, match=r"model\.layers\.2"):
        check_checkpoint(hf, dataclasses.replace(cfg, layers=3), tied=False)


def _file(header: dict, data_len: int) -> bytes:
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + b"\0" * data_len
