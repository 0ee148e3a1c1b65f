"""bench/results is written only by code: every Markdown file is the render of its JSON and history
(``orthoplex bench render --check``), a run appends its history line, and recovery.json holds only keys
that the recovery bench writes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "service.cli", "bench", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.unit
def test_every_results_markdown_is_its_render() -> None:
    out = _cli("render", "--check")
    assert out.returncode == 0, out.stderr + out.stdout


@pytest.mark.unit
def test_render_check_fails_on_a_hand_edit_and_render_repairs_it(tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results)
    (results / "engine.md").write_text((results / "engine.md").read_text() + "\nA number typed in: 5.22 s\n")
    (results / "orphan.md").write_text("## orphan\n")  # a Markdown file with no JSON behind it
    out = _cli("render", "--check", "--out", str(results))
    assert out.returncode == 1
    assert "engine.md: differs from its render" in out.stderr and "orphan.md" in out.stderr
    (results / "orphan.md").unlink()
    assert _cli("render", "--out", str(results)).returncode == 0
    assert _cli("render", "--check", "--out", str(results)).returncode == 0
    assert "5.22" not in (results / "engine.md").read_text()


@pytest.mark.unit
def test_a_run_appends_its_history_with_its_commentary_and_the_history_table_is_rendered(tmp_path: Path) -> None:
    from bench.common import write_result
    from bench.render import load_history, stale

    for i in range(2):
        write_result({"name": "data", "rows": [], "markdown": f"| x |\n|---|\n| {i} |"}, tmp_path,
                     notes=[f"run {i}"], load_at_start=1.5)
    hist = load_history("data", tmp_path)
    assert [h["run"]["notes"] for h in hist] == [["run 0"], ["run 1"]]
    payload = json.loads((tmp_path / "data.json").read_text())
    assert payload["run"]["load_1min"][0] == 1.5 and payload["run"]["commit"]
    md = (tmp_path / "data.md").read_text()
    assert "- Note: run 1" in md and "### History (`history/data.jsonl`, 2 runs" in md
    assert md.index("| run 1 |") < md.index("| run 0 |")  # newest first
    assert stale(tmp_path) == []


@pytest.mark.unit
def test_recovery_json_holds_only_keys_the_recovery_bench_writes() -> None:
    payload = json.loads((RESULTS / "recovery.json").read_text())
    written = {"name", "quick", "parts", "rows", "ratio_raytrain_over_ours", "compare", "replan", "product", "carried",
               "machine", "run", "finished_at"}
    assert set(payload) <= written, set(payload) - written
    # the tool that reads the history of the compare runs runs (it failed with a KeyError before)
    out = subprocess.run([sys.executable, "-m", "bench.recovery_replicas"], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "invalid" in out.stdout  # the compare runs whose torchft peer hung are invalid, never a win
