"""``orthoplex train`` end to end: refusals before any process starts, and a preempted run resumed
under another layout continuing the uninterrupted single-process curve."""

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from service.cli.train import register

# spawned multi-rank runs: generous on a shared/loaded box (the suite budget is for an idle one)
pytestmark = pytest.mark.timeout(1800)


def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)

    @app.command("noop")
    def noop() -> None:  # a second command keeps typer from flattening "train" into the root
        pass

    return app


def _run(*args: str):
    return CliRunner().invoke(_app(), ["train", *args])


@pytest.mark.engine
@pytest.mark.parametrize(("args", "reason"), [
    (["--layout", "tp=3"], "heads 8 not divisible by tp=3"),
    (["--layout", "cp=3"], "2*cp"),
    (["--layout", "pp=3"], "layers 4 not divisible"),
    (["--layout", "tp=2,bogus=1"], "unknown layout field"),
    (["--layout", "dp=3"], "divisible by dp*micro_batch"),
    (["--layout", "dp=4,dp_replicate=3,zero=1"], "'dp_replicate' (3) must divide dp (4)"),
    (["--layout", "dp=2,dp_replicate=2"], "'dp_replicate' > 1 needs zero=1 or zero=3"),
    (["--layout", "cp=4,cp_method=ulysses", "--model-json", "MODEL"], "ulysses"),
    (["--resume"], "need --checkpoint-dir"),
    (["--layout", "recompute=sometimes"],
     "layout field 'recompute' must be one of none, selective, op, layer:N, full (N an integer >= 2)"),
    (["--layout", "recompute=layer:1"], "layout field 'recompute' must be one of"),
])
def test_bad_layouts_are_refused_before_any_process_starts(args: list[str], reason: str, tmp_path: Path) -> None:
    if "MODEL" in args:
        f = tmp_path / "odd.json"
        f.write_text(json.dumps({"layers": 2, "hidden": 48, "heads": 6, "kv_heads": 2, "ffn": 96, "vocab": 256,
                                 "seq_len": 64}))
        args = [str(f) if a == "MODEL" else a for a in args]
    else:
        args = ["--model", "tiny", *args]
    res = _run(*args, "--global-batch", "8", "--steps", "2")
    assert res.exit_code == 2, res.output
    assert reason in res.output


@pytest.mark.engine
def test_stop_resume_under_another_layout_matches_uninterrupted(tmp_path: Path) -> None:
    common = ["--model", "tiny", "--global-batch", "4", "--steps", "4", "--seed", "3"]
    ck = tmp_path / "ck"
    a = _run(*common, "--layout", "pp=2", "--checkpoint-dir", str(ck), "--stop-at-step", "2",
             "--metrics-out", str(tmp_path / "a.jsonl"))
    assert a.exit_code == 0, a.output
    assert (ck / "step-00000002").is_dir()
    b = _run(*common, "--layout", "dp=2,zero=1", "--checkpoint-dir", str(ck), "--resume",
             "--metrics-out", str(tmp_path / "b.jsonl"))
    assert b.exit_code == 0, b.output
    c = _run(*common, "--metrics-out", str(tmp_path / "c.jsonl"))  # single process, no interruption
    assert c.exit_code == 0, c.output
    rows = {k: [json.loads(line) for line in (tmp_path / f"{k}.jsonl").read_text().splitlines()] for k in "abc"}
    assert [r["step"] for r in rows["a"]] == [1, 2]
    assert [r["step"] for r in rows["b"]] == [3, 4]
    assert set(rows["c"][0]) == {"step", "loss", "grad_norm", "lr", "tokens_per_s", "mfu"}
    for got, want in zip(rows["a"] + rows["b"], rows["c"], strict=True):
        assert got["step"] == want["step"] and got["lr"] == pytest.approx(want["lr"], rel=1e-12)
        assert abs(got["loss"] - want["loss"]) / want["loss"] < 1e-4, (got, want)
