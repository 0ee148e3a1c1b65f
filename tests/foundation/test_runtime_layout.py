"""The runtime's rooms stay small: no module under ``workers/runtime/`` over 600 lines, at most 12
modules at its top level (issue #36)."""

from __future__ import annotations

from pathlib import Path

import pytest

import workers.runtime as runtime

pytestmark = pytest.mark.unit

MAX_LINES = 600
MAX_TOP_LEVEL = 12
ROOT = Path(runtime.__file__).parent


def too_long(root: Path, limit: int) -> dict[str, int]:
    """Every module under ``root`` over ``limit`` lines, with its length."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        n = len(path.read_text().splitlines())
        if n > limit:
            out[str(path.relative_to(root))] = n
    return out


def top_level(root: Path) -> list[str]:
    """The modules directly in ``root`` (a subpackage is a room, not a module)."""
    return sorted(p.name for p in root.glob("*.py"))


def test_no_runtime_module_is_over_600_lines() -> None:
    assert too_long(ROOT, MAX_LINES) == {}, f"split these modules (limit {MAX_LINES} lines)"


def test_at_most_12_top_level_runtime_modules() -> None:
    found = top_level(ROOT)
    assert len(found) <= MAX_TOP_LEVEL, found


def test_the_checks_find_a_long_module_and_a_crowded_top_level(tmp_path: Path) -> None:
    (tmp_path / "room").mkdir()
    (tmp_path / "room" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "room" / "short.py").write_text("x = 1\n" * MAX_LINES)
    assert too_long(tmp_path, MAX_LINES) == {"room/long.py": MAX_LINES + 1}
    for i in range(MAX_TOP_LEVEL + 1):
        (tmp_path / f"m{i}.py").write_text("")
    assert len(top_level(tmp_path)) == MAX_TOP_LEVEL + 1
