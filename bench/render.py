"""The one renderer of ``bench/results``: every ``<name>.md`` (and ``SUMMARY.md``) is rendered from
``<name>.json`` and ``history/<name>.jsonl``, never edited by hand.

A result's body is the bench module's ``render_markdown(result)`` when it defines one (rendered from the
result's data), else the ``markdown`` field the bench's own code wrote into the JSON when it ran.
Commentary is the JSON's ``run`` block (host, load, commit, notes passed with ``--note``), written by
:func:`bench.common.write_result`. The history table is one row per line of the history file, each
holding the ``summary`` the bench's ``summary(result)`` computed when the run was recorded.

``python -m bench.render`` writes every Markdown file; ``--check`` lists the files that differ from
their render and exits 1 (``orthoplex bench render --check``, and a test, run the same check).
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
HISTORY_ROWS = 30  # the newest rows shown in a history table; the jsonl keeps every run


def load_history(name: str, results_dir: Path = RESULTS_DIR) -> list[dict[str, Any]]:
    """The recorded runs of bench ``name``, oldest first (empty when none is recorded)."""
    path = results_dir / "history" / f"{name}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _bench_hook(name: str, hook: str) -> Any:
    try:
        module = importlib.import_module(f"bench.{name}")
    except ImportError:
        return None
    return getattr(module, hook, None)


def body(result: dict[str, Any]) -> str:
    """The result's own tables: the bench's ``render_markdown(result)``, or the ``markdown`` its code stored."""
    hook = _bench_hook(result["name"], "render_markdown")
    return (hook(result) if callable(hook) else result.get("markdown", "")).rstrip()


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v).replace("|", "/").replace("\n", " ")


def _load(run: dict[str, Any]) -> str:
    load = run.get("load_1min")
    if isinstance(load, list):
        return " -> ".join(_cell(x) for x in load)
    return _cell(load)


def history_markdown(name: str, records: list[dict[str, Any]]) -> str:
    """The history table of bench ``name``: the newest :data:`HISTORY_ROWS` runs, newest first."""
    if not records:
        return ""
    keys: list[str] = []
    for rec in records:
        for k in rec.get("summary", {}):
            if k not in keys:
                keys.append(k)
    shown = list(reversed(records))[:HISTORY_ROWS]
    lines = [f"### History (`history/{name}.jsonl`, {len(records)} runs; newest {len(shown)} shown)", "",
             "| finished (UTC) | commit | load (1 min) | " + " | ".join(keys) + (" | " if keys else "") + "notes |",
             "|---|---|---|" + "---|" * len(keys) + "---|"]
    for rec in shown:
        run = rec.get("run", {})
        summary = rec.get("summary", {})
        lines.append(f"| {_cell(rec.get('finished_at'))} | {_cell((run.get('commit') or '')[:10] or None)} | "
                     f"{_load(run)} | " + " | ".join(_cell(summary.get(k)) for k in keys)
                     + (" | " if keys else "") + f"{_cell('; '.join(run.get('notes') or []) or None)} |")
    return "\n".join(lines)


def _run_block(payload: dict[str, Any]) -> str:
    run = payload.get("run")
    if not run:
        return ""
    parts = [f"host {run.get('host', '-')}", f"load (1 min) {_load(run)}",
             f"commit {(run.get('commit') or '-')[:10]}{' (uncommitted changes)' if run.get('dirty') else ''}"]
    notes = run.get("notes") or []
    text = "_Run: " + ", ".join(parts) + "._"
    if notes:
        text += "\n\n" + "\n".join(f"- Note: {n}" for n in notes)
    return text


def render(payload: dict[str, Any], history: list[dict[str, Any]] | None = None) -> str:
    """The Markdown of one results JSON ``payload`` (and its ``history`` records)."""
    name = payload["name"]
    m = payload.get("machine", {})
    out = [f"## {name}", "", body(payload), ""]
    run = _run_block(payload)
    if run:
        out += [run, ""]
    out.append(f"_Machine: {m.get('cpus')} CPUs, {m.get('platform')}, Python {m.get('python')}, "
               f"torch {m.get('torch', '-')}, GPU {m.get('cuda') or 'none'}; {payload.get('finished_at')}._")
    hist = history_markdown(name, history or [])
    if hist:
        out += ["", hist]
    return "\n".join(out) + "\n"


def render_all(results_dir: Path = RESULTS_DIR) -> dict[Path, str]:
    """Every Markdown file of ``results_dir`` with the text it must hold, ``SUMMARY.md`` included."""
    texts: dict[Path, str] = {}
    for path in sorted(results_dir.glob("*.json")):
        payload = json.loads(path.read_text())
        texts[path.with_suffix(".md")] = render(payload, load_history(payload["name"], results_dir))
    texts[results_dir / "SUMMARY.md"] = "\n".join(texts.values())
    return texts


def stale(results_dir: Path = RESULTS_DIR) -> list[Path]:
    """The Markdown files that differ from their render, and any ``.md`` that has no JSON."""
    texts = render_all(results_dir)
    bad = [p for p, t in texts.items() if not p.exists() or p.read_text() != t]
    bad += [p for p in sorted(results_dir.glob("*.md")) if p not in texts]
    return bad


def write_all(results_dir: Path = RESULTS_DIR) -> list[Path]:
    """Render every Markdown file of ``results_dir``; returns the ones whose text changed."""
    changed = []
    for path, text in render_all(results_dir).items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            changed.append(path)
    return changed


def main(argv: list[str]) -> int:
    if "--check" in argv:
        bad = stale()
        for p in bad:
            print(f"{p.name}: differs from its render (run `orthoplex bench render`)", file=sys.stderr)
        return 1 if bad else 0
    for p in write_all():
        print(f"rendered {p.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
