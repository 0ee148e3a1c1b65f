"""Goodput curves of elastic jobs: which sizes are predicted, and what the scheduler gets."""

from __future__ import annotations

import pytest

from service.controller.curves import MAX_POINTS, curve_sizes, goodput_curve

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("lo", "hi", "per_node"), [(1, 4, 4), (8, 512, 8), (5, 100, 8), (3, 3, 4), (2, 9, 4)])
def test_sizes_keep_the_range_ends_and_powers_of_two_within_a_budget(lo: int, hi: int, per_node: int) -> None:
    sizes = curve_sizes(lo, hi, per_node)
    assert sizes == sorted(set(sizes)) and sizes[0] == lo and sizes[-1] == hi
    assert len(sizes) <= MAX_POINTS and all(lo <= n <= hi for n in sizes)
    powers = [2**k for k in range(12) if lo < 2**k < hi]
    assert set(powers[: MAX_POINTS - 2]) <= set(sizes)


def test_curve_is_the_planners_prediction_and_errors_mean_no_curve() -> None:
    curve = goodput_curve({"model": "tiny", "global_batch": 4}, 1, 4, gpu_type="CPU", gpus_per_node=4)
    assert curve is not None and sorted(curve) == [1, 2, 4]
    assert curve[1] < curve[2] < curve[4]  # the planner predicts more tokens/s on more GPUs here
    # a layout hint the sizes must honour: tp=2 leaves out the odd count
    hinted = goodput_curve({"model": "tiny", "global_batch": 4, "layout_hint": {"tp": 2}}, 1, 4,
                           gpu_type="CPU", gpus_per_node=4)
    assert hinted is not None and 1 not in hinted and set(hinted) <= {2, 4}
    assert goodput_curve({"model": "tiny", "global_batch": 4}, 2, 2, gpu_type="CPU", gpus_per_node=4) is None
    assert goodput_curve({"model": "no-such-model", "global_batch": 4}, 1, 4, gpu_type="CPU",
                         gpus_per_node=4) is None
    assert goodput_curve({"model": "tiny"}, 1, 4, gpu_type="CPU", gpus_per_node=4) is None  # no global_batch
