"""One home per concept: the job and attempt state sets are defined once (``workers/states.py``).

Scans the source tree the way a reviewer's ``grep`` would: a class named like a state enum, an
assignment to one of the set names (old or new), or any module-level set/tuple literal made only of
job-state names is a definition, and each may exist in one place only. In the product code (not the
tests) any such literal counts, inline ones too (``state in ("FAILED", "CANCELLED")`` is a copy of a
set that has a name).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from workers.states import AttemptState, JobState

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("orthoplex", "service", "workers", "planner", "bench", "tests")
HOME = "workers/states.py"
#: names a job- or attempt-state set has had; only their one home may assign them
SET_NAMES = {
    "TERMINAL", "ACTIVE", "QUEUED", "RELEASING", "HOLDING", "NON_TERMINAL", "ATTEMPT_TERMINAL",
    "JOB_STATES", "TERMINAL_STATES", "ATTEMPT_STATES", "ACTIVE_STATES", "QUEUED_STATES", "RELEASING_STATES",
    "GPU_STATES", "PREEMPTIBLE_STATES", "NON_TERMINAL_STATES", "TRANSITIONS",
}
STATE_NAMES = {s.value for s in JobState} | {s.value for s in AttemptState}
#: definitions allowed outside ``workers/states.py`` (none: the runtime consolidation removed the last)
ELSEWHERE: set[tuple[str, str]] = set()


def _files() -> list[Path]:
    return sorted(p for d in SOURCES for p in (ROOT / d).rglob("*.py") if ".venv" not in p.parts)


def _state_literal(node: ast.expr) -> bool:
    """A set, tuple, list or frozenset(...) literal of two or more state names and nothing else."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "frozenset" and node.args:
        node = node.args[0]
    if not isinstance(node, ast.Set | ast.Tuple | ast.List) or len(node.elts) < 2:
        return False
    return all(isinstance(e, ast.Constant) and e.value in STATE_NAMES for e in node.elts)


def definitions() -> list[tuple[str, str]]:
    """(file, name) of every module-level state enum and state set outside tests of this file."""
    found: list[tuple[str, str]] = []
    for path in _files():
        rel = path.relative_to(ROOT).as_posix()
        if rel == "tests/foundation/test_one_home.py":
            continue
        tree = ast.parse(path.read_text(), filename=rel)
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name in ("JobState", "AttemptState"):
                found.append((rel, node.name))
            targets: list[ast.expr] = []
            value: ast.expr | None = None
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            for t in targets:
                if isinstance(t, ast.Name) and (t.id in SET_NAMES or (value is not None and _state_literal(value))):
                    found.append((rel, t.id))
        if rel != HOME and not rel.startswith("tests/"):
            found += [(rel, f"literal at line {n.lineno}") for n in ast.walk(tree)
                      if isinstance(n, ast.expr) and _state_literal(n)]
    return found


def test_each_state_set_has_one_home() -> None:
    defs = definitions()
    outside = sorted(d for d in defs if d[0] != HOME and d not in ELSEWHERE)
    assert not outside, f"job/attempt state sets defined outside {HOME}: {outside}"
    home = [name for f, name in defs if f == HOME]
    assert sorted(home) == sorted(set(home)), f"{HOME} defines a name twice: {home}"
    for name in ("JobState", "AttemptState", "TERMINAL", "ACTIVE", "QUEUED", "RELEASING", "HOLDING",
                 "NON_TERMINAL", "ATTEMPT_TERMINAL"):
        assert name in home, f"{name} missing from {HOME}"


def test_the_scan_finds_a_copy(tmp_path: Path) -> None:
    """The scan is not vacuous: a renamed copy of a set is caught by its contents."""
    tree = ast.parse('DONE = frozenset({"SUCCEEDED", "FAILED"})\nX = ("a", "b")\n')
    assigns = [n for n in tree.body if isinstance(n, ast.Assign)]
    assert [_state_literal(n.value) for n in assigns] == [True, False]


def test_api_state_names_derive_from_the_enum() -> None:
    from typing import get_args

    from service.api.schemas import JobStateName

    assert get_args(JobStateName) == tuple(s.value for s in JobState)
    assert not re.search(r'Literal\["PENDING"', (ROOT / "service/api/schemas.py").read_text())


def test_engine_rules_have_one_home() -> None:
    """The engine's limits live in ``planner/engine_rules.py``; the engine's validation and the
    planner's constraints call it and restate no rule (no modulo arithmetic of their own for it)."""
    validate = (ROOT / "workers/engine/validate.py").read_text()
    constraints = (ROOT / "planner/constraints.py").read_text()
    assert "from planner import engine_rules" in validate
    assert "from planner import engine_rules" in constraints
    tree = ast.parse(validate)
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod)]
    for path in _files():
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        if rel.startswith(("workers/", "planner/", "service/")) and rel != "planner/engine_rules.py" and any(
                marker in text for marker in ("micro-batches per step", "(zigzag split)", "(sequence parallelism)")):
            pytest.fail(f"{rel} restates an engine rule; call planner.engine_rules")


def test_nothing_points_outside_the_repository() -> None:
    """A fresh clone can follow every reference: no pointer into a sibling ``shared/`` folder."""
    pattern = re.compile(r"\.\./shared/|(?<![\w/])shared/(notes|data|DESIGN)|\bDESIGN\.md\b")
    paths = [*_files(), *(ROOT / "docs").rglob("*.md"), ROOT / "README.md", ROOT / "pyproject.toml",
             *(ROOT / "bench").rglob("*.sh")]
    bad = [p.relative_to(ROOT).as_posix() for p in paths
           if p.name != "test_one_home.py" and pattern.search(p.read_text())]
    assert not bad, f"references outside the repository in {bad}; copy what is needed into docs/"
