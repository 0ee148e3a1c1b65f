"""Training data through a real tokenizer (a BPE trained here with ``tokenizers``): text, jsonl
(``text`` field) and parquet (``text`` column) give the same EOS-separated stream; bad inputs are
refused naming the field. No processes are spawned."""

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

from service.cli.train import register
from workers.engine.data import build_dataset
from workers.engine.data.hf_tokenizer import check_sources, eos_id, load_tokenizer

DOCS = [p.read_text() for p in sorted((Path(__file__).resolve().parents[2] / "workers" / "engine" / "data").glob("*.py"))]


def _bpe(out: Path, vocab: int, files: list[Path]) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train([str(f) for f in files], trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["<unk>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(out))
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("docs")
    txt = root / "txt"
    txt.mkdir()
    for i, d in enumerate(DOCS):
        (txt / f"{i:03d}.txt").write_text(d)
    jsonl = root / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(DOCS)))
    parquet = root / "docs.parquet"
    pq.write_table(pa.table({"text": DOCS, "id": list(range(len(DOCS)))}), parquet, row_group_size=3)
    bad = root / "bad.parquet"
    pq.write_table(pa.table({"body": DOCS}), bad)
    tok = _bpe(root / "tokenizer.json", 512, sorted(txt.iterdir()))
    return {"txt": txt, "jsonl": jsonl, "parquet": parquet, "bad": bad, "tok": tok}


@pytest.mark.engine
def test_text_jsonl_and_parquet_give_the_same_stream(files: dict[str, Path]) -> None:
    tok = load_tokenizer(files["tok"])
    eos = eos_id(tok, files["tok"])
    assert eos == tok.token_to_id("</s>")
    streams = []
    for kind in ("txt", "jsonl", "parquet"):
        ds = build_dataset({"kind": "text", "paths": [str(files[kind])], "tokenizer": str(files["tok"])}, 64)
        assert ds.vocab_size == 512
        streams.append(ds.tokens(0, ds.num_tokens))
    assert all(np.array_equal(streams[0], s) for s in streams[1:])
    expected = [i for d in DOCS for i in [*tok.encode(d, add_special_tokens=False).ids, eos]]
    assert streams[0].tolist() == expected  # every document, then the tokenizer's EOS
    first = tok.encode(DOCS[0], add_special_tokens=False).ids
    assert tok.decode(first) == DOCS[0]  # byte-level BPE round-trips the text


@pytest.mark.engine
def test_missing_text_column_or_field_is_refused_naming_it(files: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no column 'text'"):
        check_sources([str(files["bad"])])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"body": "x"}) + "\n")
    with pytest.raises(ValueError, match="field 'text'"):
        check_sources([str(bad)])


def _train(*args: str):
    app = typer.Typer()
    register(app)

    @app.command("noop")
    def noop() -> None:
        pass

    return CliRunner().invoke(app, ["train", *args])


@pytest.mark.engine
def test_train_refuses_bad_tokenizer_inputs_before_starting(files: dict[str, Path]) -> None:
    r = _train("--model", "tiny", "--data", str(files["jsonl"]), "--tokenizer", str(files["tok"]))
    assert r.exit_code == 2 and "tokenizer" in r.output and "512" in r.output and "256" in r.output, r.output
    (files["tok"].parent / "m.json").write_text(json.dumps({"preset": "tiny", "vocab": 512}))
    r = _train("--model-json", str(files["tok"].parent / "m.json"), "--data", str(files["bad"]),
               "--tokenizer", str(files["tok"]))
    assert r.exit_code == 2 and "column 'text'" in r.output, r.output


@pytest.mark.engine
def test_data_prepare_writes_token_files_with_a_validation_split(files: dict[str, Path], tmp_path: Path) -> None:
    from service.cli.main import app  # the real command line: one `data` group holds prepare and upload
    from workers.engine.data import open_token_file

    listed = CliRunner().invoke(app, ["data", "--help"]).output
    assert "prepare" in listed and "upload" in listed, listed
    out = tmp_path / "prepared"
    r = CliRunner().invoke(app, ["data", "prepare", "--tokenizer", str(files["tok"]), "--input",
                                 str(files["parquet"]), "--out", str(out), "--val-fraction", "0.25"])
    assert r.exit_code == 0, r.output
    tok = load_tokenizer(files["tok"])
    eos = eos_id(tok, files["tok"])
    enc = [[*tok.encode(d, add_special_tokens=False).ids, eos] for d in DOCS]
    val = [i for i in range(len(DOCS)) if i % 4 == 3]
    for split, idx in (("train", [i for i in range(len(DOCS)) if i not in val]), ("val", val)):
        tf = open_token_file(out / f"{split}.tok")
        assert tf.vocab_size == 512
        assert np.asarray(tf.tokens).tolist() == [t for i in idx for t in enc[i]], split
    meta = json.loads((out / "prepare.json").read_text())
    assert meta["val_docs"] == len(val) and meta["train_docs"] == len(DOCS) - len(val)
    r = CliRunner().invoke(app, ["data", "prepare", "--tokenizer", str(files["tok"]), "--input",
                                 str(files["bad"]), "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "column 'text'" in r.output, r.output
