"""The product page and the runtime guide stay readable (issue #37): README.md at most 15,000 bytes,
docs/runtime.md at most 600 lines."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.unit
def test_readme_is_at_most_15000_bytes_and_the_runtime_guide_at_most_600_lines() -> None:
    readme = len((ROOT / "README.md").read_bytes())
    runtime = len((ROOT / "docs" / "runtime.md").read_text().splitlines())
    assert readme <= 15_000, f"README.md is {readme} bytes (at most 15,000: a product page, not a lab notebook)"
    assert runtime <= 600, f"docs/runtime.md is {runtime} lines (at most 600)"
