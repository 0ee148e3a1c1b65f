"""Warm ranks' default, ``auto`` (``planner.recovery_choice``: one rule, one home): a node's worth of the
job's ranks, so a re-plan after a node is lost starts every rank warm. Pure: the planner prices real
plans; no Ray."""

from __future__ import annotations

import pytest

from planner.api import evaluate
from planner.recovery_choice import (
    AUTO_WARM_RANKS,
    DEFAULT_WARM_RANKS,
    MAX_WARM_RANKS,
    ChoiceError,
    auto_warm_ranks,
    check_block,
    choose,
    resolve_warm_ranks,
    unplanned,
)
from planner.result import Plan
from workers.runtime.contract.job_spec import BARE_WARM_RANKS, PlacementSettings, RuntimeSettings

pytestmark = pytest.mark.unit


def _plan(layout: str, gpus: int, per_node: int) -> tuple[Plan, dict]:
    spec = {"model": {"name": "llama3-8b"}, "cluster": {"gpu_type": "H100", "num_gpus": gpus, "gpus_per_node": per_node},
            "parallel": {"global_batch": 64}}
    plan = evaluate(spec, layout)
    assert isinstance(plan, Plan), plan
    return plan, spec


def test_auto_is_the_most_ranks_on_one_node_within_bounds() -> None:
    assert auto_warm_ranks([4, 4]) == 4 and auto_warm_ranks([2, 4, 1]) == 4
    assert auto_warm_ranks([], gpus_per_node=4) == 4  # nodes unknown: a node's GPUs
    assert auto_warm_ranks([]) == 1  # nothing known: one
    assert auto_warm_ranks([16]) == MAX_WARM_RANKS


def test_the_issue_single_group_job_gets_a_node_of_warm_ranks() -> None:
    # tp=4 x pp=2 on nodes of 4 GPUs: 4 ranks per node, and a lost node's 4 ranks restart on other nodes
    plan, spec = _plan("tp=4,pp=2", 8, 4)
    c = choose(plan, None, spec)
    assert (c.policy, c.warm_ranks) == ("replan", 4)
    assert choose(plan, {"warm_ranks": AUTO_WARM_RANKS}, spec).warm_ranks == 4
    assert choose(plan, {"warm_ranks": 0}, spec).warm_ranks == 0  # named: it stands
    assert choose(plan, {"warm_ranks": 2}, spec).warm_ranks == 2


def test_a_job_on_two_gpus_of_a_node_keeps_two_warm() -> None:
    plan, spec = _plan("tp=2,recompute=full", 2, 8)
    assert choose(plan, None, spec).warm_ranks == 2


def test_a_bad_count_is_refused_naming_the_field() -> None:
    for bad in (-1, MAX_WARM_RANKS + 1, "many", True):
        with pytest.raises(ChoiceError) as e:
            check_block({"warm_ranks": bad})
        assert e.value.field == "recovery.warm_ranks"
        with pytest.raises(ChoiceError):
            resolve_warm_ranks(bad, [4])
    assert unplanned(None).warm_ranks == 1  # no plan: nothing known of the job's nodes


def test_the_runtime_default_is_the_products_rule() -> None:
    assert DEFAULT_WARM_RANKS == AUTO_WARM_RANKS
    # a bare runtime spec starts no warm pool (nor snapshots); the product writes its default, auto
    assert PlacementSettings().warm_ranks_per_node == BARE_WARM_RANKS == 0
    assert RuntimeSettings.from_dict({}).placement.warm_ranks_per_node == 0
    assert RuntimeSettings.from_dict({"warm_ranks_per_node": DEFAULT_WARM_RANKS}).placement.warm_ranks_per_node == "auto"
    assert RuntimeSettings.from_dict({"warm_ranks_per_node": 3}).placement.warm_ranks_per_node == 3
    for bad in (-1, MAX_WARM_RANKS + 1, "many", 1.5):
        with pytest.raises(ValueError, match="warm_ranks_per_node"):
            RuntimeSettings.from_dict({"warm_ranks_per_node": bad})
