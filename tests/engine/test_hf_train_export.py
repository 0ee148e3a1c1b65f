"""Fine-tune an imported HF Llama under a 3D layout (tp x pp x dp) on text through a BPE tokenizer
with ``orthoplex train --init-hf ... --tokenizer ... --export-hf``; ``transformers`` loading the export gives the same eval loss as ``orthoplex eval``
on the run's checkpoint (1e-4), and ``orthoplex export`` of that checkpoint under another layout
writes the same tensors.
The tokenizer is a byte-level BPE trained here with ``tokenizers`` on the same local text."""

import json
from pathlib import Path

import pytest
import torch
import typer
from hf_fixtures import hf_window_loss, make_hf_llama
from typer.testing import CliRunner

from service.cli.hf import register as register_hf
from service.cli.train import register as register_train
from workers.engine.evaluate import text_stream, windows
from workers.engine.tracking import read_scalars

pytestmark = pytest.mark.timeout(1800)
SEQ = 32


def _cli(*args: str):
    app = typer.Typer()
    register_train(app)
    register_hf(app)
    return CliRunner().invoke(app, list(args))


def _bpe(text: Path, out: Path, vocab: int) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>", "</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([str(text)], trainer)
    tok.save(str(out))
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real text: the engine's own sources (a few hundred KB, present in every checkout)."""
    root = Path(__file__).resolve().parents[2] / "workers" / "engine"
    f = tmp_path_factory.mktemp("text") / "engine.txt"
    f.write_text("\n\n".join(p.read_text() for p in sorted(root.rglob("*.py"))))
    return f


@pytest.mark.engine
def test_eval_refuses_a_tokenizer_that_does_not_fit_the_vocabulary(corpus: Path, tmp_path: Path) -> None:
    ckpt = make_hf_llama(tmp_path / "hf", tied=False, layers=2)
    tok = _bpe(corpus, tmp_path / "big.json", vocab=400)
    r = _cli("eval", "--init-hf", str(ckpt), "--data", str(corpus), "--tokenizer", str(tok),
             "--seq-len", str(SEQ), "--batches", "4", "--json")
    assert r.exit_code == 2 and "tokenizer" in r.output and "vocabulary 256" in r.output, r.output
    r = _cli("train", "--init-hf", str(ckpt), "--seq-len", str(SEQ), "--data", str(corpus), "--tokenizer", str(tok))
    assert r.exit_code == 2 and "--tokenizer" in r.output and "vocab 256" in r.output, r.output


@pytest.mark.engine
def test_fine_tune_3d_export_and_eval_agree_with_transformers(corpus: Path, tmp_path: Path) -> None:
    # byte-level BPE: 256 byte symbols + 2 special tokens + merges, so a model vocabulary of 320
    ckpt = make_hf_llama(tmp_path / "hf", tied=True, layers=2, vocab_size=320)
    tok = _bpe(corpus, tmp_path / "bpe.json", vocab=320)
    ck, out = tmp_path / "ck", tmp_path / "export"
    r = _cli("train", "--init-hf", str(ckpt), "--seq-len", str(SEQ), "--layout", "tp=2,pp=2,dp=2",
             "--global-batch", "8", "--steps", "3", "--data", str(corpus), "--tokenizer", str(tok),
             "--eval-every", "2", "--val-data", str(corpus), "--checkpoint-dir", str(ck),
             "--mlflow-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
             "--stop-at-step", "3", "--export-hf", str(out))
    assert r.exit_code == 0, r.output
    assert (out / "config.json").is_file() and (out / "model.safetensors.index.json").is_file()
    # the run's TensorBoard event files (under the checkpoint dir by default) hold every step's metrics
    steps = [json.loads(line) for line in r.output.splitlines() if '"grad_norm"' in line]
    assert [s["step"] for s in steps] == [1, 2, 3]
    board = read_scalars(ck / "tensorboard")
    for name in ("loss", "lr", "grad_norm", "tokens_per_s", "mfu"):
        assert [st for st, _ in board[f"train/{name}"]] == [1, 2, 3], name
    # MFU against the declared peak (no GPU here: the planner's CPU stand-in, 0.5 TFLOP/s per rank)
    from workers.engine.config import ModelConfig

    for s, (_, mfu) in zip(steps, board["train/mfu"], strict=True):
        flops = ModelConfig(vocab=320, layers=2, hidden=64, heads=8, kv_heads=2, ffn=172, seq_len=SEQ).flops_per_token()
        assert abs(mfu - flops * s["tokens_per_s"] / (8 * 0.5e12)) <= 1e-6 * mfu and s["mfu"] == pytest.approx(mfu)
    for s, (_, v) in zip(steps, board["train/loss"], strict=True):
        assert abs(v - s["loss"]) <= 1e-6 * s["loss"]
    vals = [json.loads(line) for line in r.output.splitlines() if '"val_loss"' in line]
    assert [v["step"] for v in vals] == [2, 3] and [st for st, _ in board["train/val_loss"]] == [2, 3]
    # ... and the same metrics in an MLflow run (a local sqlite store)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("orthoplex").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["layout"] == "tp2·pp2·cp1·dp2"
    history = {m: [(h.step, h.value) for h in client.get_metric_history(run.info.run_id, m)]
               for m in ("loss", "val_loss", "lr", "grad_norm", "tokens_per_s")}
    assert [st for st, _ in history["loss"]] == [1, 2, 3] and [st for st, _ in history["val_loss"]] == [2, 3]
    assert all(abs(v - s["loss"]) <= 1e-9 * s["loss"] for (_, v), s in zip(history["loss"], steps, strict=True))
    assert len(list(out.glob("model-*.safetensors"))) == 2  # one file per pipeline stage
    assert (out / "tokenizer.json").read_bytes() == tok.read_bytes()  # the tokenizer travels along

    # the run's val_loss after step 3 is the eval loss of the first eval_batches * global_batch = 16 windows
    n = 16
    r = _cli("eval", "--checkpoint-dir", str(ck), "--data", str(corpus), "--tokenizer", str(tok),
             "--seq-len", str(SEQ), "--batches", str(n), "--batch-size", "8", "--layout", "tp=2", "--json")
    assert r.exit_code == 0, r.output
    ours = json.loads(r.output.strip().splitlines()[-1])
    assert ours["tokens"] == n * SEQ
    assert abs(ours["loss"] - vals[-1]["val_loss"]) / ours["loss"] < 1e-5, (ours, vals)
    batch = windows(text_stream(corpus, tok), SEQ, n)
    theirs = hf_window_loss(out, batch)
    assert abs(ours["loss"] - theirs) / theirs < 1e-4, (ours, theirs)
    assert abs(theirs - hf_window_loss(ckpt, batch)) > 1e-3  # training moved the weights

    again = tmp_path / "again"
    r = _cli("export", "--checkpoint-dir", str(ck), "--out", str(again), "--layout", "tp=2")  # resharded
    assert r.exit_code == 0, r.output
    from safetensors.torch import load_file

    def tensors(d: Path) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for f in sorted(d.glob("*.safetensors")):
            out.update(load_file(f))
        return out

    a, b = tensors(out), tensors(again)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
