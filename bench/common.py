"""Helpers shared by the benchmarks: results go to ``bench/results/<name>.json``, one line per run to
``bench/results/history/<name>.jsonl``, and ``<name>.md`` is rendered from both (``bench.render``)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent


def machine() -> dict[str, Any]:
    """What the benchmark ran on (reported next to every table)."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return info


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def run_context(notes: list[str] | None = None, load_at_start: float | None = None) -> dict[str, Any]:
    """The commentary a run records about itself: host, load average (1 min) at its start and end,
    commit (and whether the tree had uncommitted changes) and the notes given on the command line."""
    end = round(os.getloadavg()[0], 2)
    return {"host": f"{platform.node()} ({os.cpu_count()} CPUs)",
            "load_1min": [round(load_at_start, 2), end] if load_at_start is not None else end,
            "commit": _git("rev-parse", "HEAD"), "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
            "notes": list(notes or [])}


def history_record(payload: dict[str, Any]) -> dict[str, Any]:
    """The line a run appends to its history: when, the run block, and the bench's ``summary(result)``."""
    from bench.render import _bench_hook

    hook = _bench_hook(payload["name"], "summary")
    summary = hook(payload) if callable(hook) else {}
    return {"name": payload["name"], "finished_at": payload["finished_at"], "run": payload.get("run", {}),
            "quick": bool(payload.get("quick")), "summary": summary}


def write_result(result: dict[str, Any], results_dir: Path | None = None, *, notes: list[str] | None = None,
                 load_at_start: float | None = None) -> tuple[Path, Path]:
    """Write ``result`` (needs ``name``; ``markdown`` unless its bench renders it) as JSON, append its
    history line, render its Markdown (and SUMMARY.md); returns the JSON and Markdown paths."""
    from bench.render import load_history, render, render_all

    out = results_dir or RESULTS_DIR
    (out / "history").mkdir(parents=True, exist_ok=True)
    name = result["name"]
    payload = {**result, "machine": machine(), "run": run_context(notes, load_at_start),
               "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    json_path = out / f"{name}.json"
    md_path = out / f"{name}.md"
    json_path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    with (out / "history" / f"{name}.jsonl").open("a") as f:
        f.write(json.dumps(history_record(payload), default=str) + "\n")
    md_path.write_text(render(payload, load_history(name, out)))
    summary = render_all(out)[out / "SUMMARY.md"]
    (out / "SUMMARY.md").write_text(summary)
    return json_path, md_path
