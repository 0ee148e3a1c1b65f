"""Helpers shared by the benchmarks: results go to ``bench/results/<name>.json`` and ``.md``."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


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


def write_result(result: dict[str, Any], results_dir: Path | None = None) -> tuple[Path, Path]:
    """Write ``result`` (needs ``name`` and ``markdown``) as JSON and markdown; returns both paths."""
    out = results_dir or RESULTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    name = result["name"]
    payload = {**result, "machine": machine(), "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    json_path = out / f"{name}.json"
    md_path = out / f"{name}.md"
    json_path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    m = payload["machine"]
    md_path.write_text(
        f"## {name}\n\n{result['markdown'].rstrip()}\n\n"
        f"_Machine: {m.get('cpus')} CPUs, {m.get('platform')}, Python {m.get('python')}, "
        f"torch {m.get('torch', '-')}, GPU {m.get('cuda') or 'none'}; {payload['finished_at']}._\n"
    )
    return json_path, md_path
