"""Every benchmark number in README.md, and every number in README or docs that cites a results file,
is the value in that file (issue 37: numbers are written by code, and the Markdown names where).

Two forms are checked:

* README's benchmark table: the numbers of a row's *measured* cell, in order, are the keys its
  *source* cell lists (`` `file.json`: `key`, `key` ``);
* inline anywhere in README or docs: ``NUMBER ... (`file.json`: `key`)``.

A key is a dotted path into the JSON (list items by index), optionally ``*FACTOR`` (a unit: ``*100``
for a percentage), ``A/B`` (a ratio of two paths) or ending in ``.length`` (a list's length). A
number matches when it equals the value rounded to the decimals it is shown with.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
#: a shown number: not part of a word, a layout (tp=2), a version or a code span's identifier
NUMBER = re.compile(r"(?<![\w=.`/-])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?![a-wyzA-Z0-9_=`]|\.\d)")
INLINE = re.compile(r"(?<![\w=.`/-])(\d[\d,]*(?:\.\d+)?)[^\d()|`]{0,40}\(`(\w+\.json)`:\s+`([^`]+)`\)")


def resolve(data: Any, key: str) -> float:
    if "/" in key:
        a, b = key.split("/", 1)
        return resolve(data, a) / resolve(data, b)
    factor = 1.0
    if "*" in key:
        key, f = key.split("*", 1)
        factor = float(f)
    x = data
    parts = key.split(".")
    for i, part in enumerate(parts):
        if part == "length" and i == len(parts) - 1:
            return float(len(x))
        x = x[int(part)] if isinstance(x, list) else x[part]
    return float(x) * factor


def matches(shown: str, value: float) -> bool:
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    return abs(float(shown.replace(",", "")) - value) <= 0.5 * 10 ** -decimals + 1e-9


def numbers(cell: str) -> list[str]:
    cell = re.sub(r"`[^`]*`", "", cell)  # code spans (names, layouts) hold no measured number
    return [m.group(1) + (m.group(2) or "") for m in NUMBER.finditer(cell)]


def _json(name: str) -> Any:
    return json.loads((RESULTS / name).read_text())


def benchmark_rows() -> list[tuple[str, str, str]]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Benchmarks"):]
    section = section[:section.index("\n## ", 4)] if "\n## " in section[4:] else section
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[2].startswith("`") and ".json`:" in cells[2]:
            rows.append((cells[0], cells[1], cells[2]))
    return rows


@pytest.mark.unit
def test_readme_benchmark_numbers_are_their_results_files_values() -> None:
    rows = benchmark_rows()
    assert len(rows) >= 10, "README's benchmark table is missing or no longer cites its sources"
    bad = []
    for name, measured, source in rows:
        m = re.match(r"`(\w+\.json)`:\s*(.*)", source)
        assert m, f"{name}: source cell must be `file.json`: `key`, ...: {source}"
        data = _json(m.group(1))
        keys = re.findall(r"`([^`]+)`", m.group(2))
        shown = numbers(measured)
        if len(shown) != len(keys):
            bad.append(f"{name}: {len(shown)} numbers {shown} but {len(keys)} keys {keys}")
            continue
        for s, k in zip(shown, keys, strict=True):
            value = resolve(data, k)
            if not matches(s, value):
                bad.append(f"{name}: README says {s}, {m.group(1)} {k} is {value:g}")
    assert not bad, "\n".join(bad)


@pytest.mark.unit
def test_numbers_citing_a_results_file_inline_are_its_values() -> None:
    bad, seen = [], 0
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for m in INLINE.finditer(path.read_text()):
            seen += 1
            value = resolve(_json(m.group(2)), m.group(3))
            if not matches(m.group(1), value):
                bad.append(f"{path.name}: {m.group(0)!r}: {m.group(2)} {m.group(3)} is {value:g}")
    assert not bad, "\n".join(bad)
    assert seen, "no inline citation found: the pattern no longer matches the docs"


@pytest.mark.unit
def test_the_checker_catches_a_wrong_number_and_reads_units() -> None:
    data = {"rows": [{"x": 0.0423, "y": 2.0}], "faults": [1, 2, 3]}
    assert matches("4.2", resolve(data, "rows.0.x*100")) and not matches("4.3", resolve(data, "rows.0.x*100"))
    assert resolve(data, "faults.length") == 3 and resolve(data, "rows.0.x/rows.0.y") == pytest.approx(0.02115)
    assert matches("1,677", 1677.0) and matches("364", 363.67) and not matches("0.59", 0.6)
    assert numbers("dp=2 1.82x, `tp=4,pp=2` 2.66 s, tp2 0.5 %") == ["1.82", "2.66", "0.5"]
