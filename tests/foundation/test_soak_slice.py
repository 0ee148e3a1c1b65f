"""The soak rotation (tests/soak_slice.py): every soak test is in exactly one slice, the slices are
balanced by estimated time, and every collected soak test has an estimate."""

from __future__ import annotations

import pytest

from tests.soak_slice import DEFAULT_S, ESTIMATED_S, collect_soak, split


@pytest.mark.unit
def test_every_test_lands_in_exactly_one_slice_and_the_split_is_deterministic() -> None:
    tests = [f"t{i}" for i in range(14)]
    est = {t: float(10 * (i + 1)) for i, t in enumerate(tests)}
    slices = split(tests, 5, est)
    assert sorted(t for s in slices for t in s) == sorted(tests)
    assert split(list(reversed(tests)), 5, est) == slices  # the order pytest lists them in does not matter
    loads = [sum(est[t] for t in s) for s in slices]
    assert max(loads) - min(loads) <= max(est.values())  # greedy longest-first: within one test
    assert split(["a"], 3, {}) == [["a"], [], []] and DEFAULT_S > 0
    with pytest.raises(ValueError):
        split(tests, 0, est)


@pytest.mark.unit
def test_every_soak_test_is_estimated_and_the_five_slices_cover_the_tier() -> None:
    soak = collect_soak()
    assert set(soak) <= set(ESTIMATED_S), f"give these soak tests an estimate: {set(soak) - set(ESTIMATED_S)}"
    slices = split(soak, 5)
    assert sorted(t for s in slices for t in s) == sorted(soak) and all(slices)
    assert max(sum(ESTIMATED_S[t] for t in s) for s in slices) <= 15 * 60  # a slice fits the CI budget's slack
