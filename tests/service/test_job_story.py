"""The job page's recovery ledger, rank grid and curve markers, from events shaped as the runtime
emits them (docs/runtime.md, "Events")."""

from __future__ import annotations

import pytest

from service.api.job_story import markers, rank_grid, recovery_ledger

pytestmark = pytest.mark.unit

L8 = {"tp": 2, "pp": 2, "cp": 1, "dp": 2}
L4 = {"tp": 2, "pp": 2, "cp": 1, "dp": 1}


def ev(i: int, type_: str, **payload: object) -> dict[str, object]:
    return {"id": i, "type": type_, "payload": payload, "ts": f"2026-12-01T00:00:{i:02d}Z"}


EVENTS = [
    ev(1, "plan", layout=L8, short="tp2·pp2·cp1·dp2", num_gpus=8),
    ev(2, "ranks_mapped", layout=L8, rank_to_node=["A", "A", "A", "A", "B", "B", "B", "B"]),
    ev(3, "node_lost", reason="node B died", nodes=["B"], ranks=[4, 5, 6, 7], step=10),
    ev(4, "replan", decision="replan", old_short="tp2·pp2·cp1·dp2", new_short="tp2·pp2·cp1·dp1",
       old_tokens_per_s=2.0, new_tokens_per_s=1.0),
    ev(5, "ranks_mapped", layout=L4, rank_to_node=["A", "A", "A", "A"]),
    ev(6, "resumed", from_step=8, cause="node_lost", layout=L4, short="tp2·pp2·cp1·dp1", world_size=4, steps_redone=2),
    ev(7, "recovery", cause="node_lost", total_s=6.0,
       phases={"detect": 1.0, "plan": 0.5, "place": 0.5, "start": 2.0, "load": 1.0, "first_step": 1.0}),
]


def test_ledger_has_one_row_per_recovery_with_layouts_and_phases() -> None:
    (row,) = recovery_ledger(EVENTS)
    assert row["cause"] == "node_lost" and row["reason"] == "node B died" and row["nodes"] == ["B"]
    assert (row["before"], row["after"]) == ("tp2·pp2·cp1·dp2", "tp2·pp2·cp1·dp1")
    assert (row["failed_at_step"], row["resumed_from_step"], row["steps_redone"]) == (10, 8, 2)
    assert list(row["phases"]) == ["detect", "plan", "place", "start", "load", "first_step"]
    assert row["total_s"] == 6.0


def test_two_recoveries_chain_their_layouts() -> None:
    again = [ev(8, "rank_failed", reason="rank 1 crashed", ranks=[1], nodes=["A"], step=20),
             ev(9, "replan", decision="keep", old_short="tp2·pp2·cp1·dp1", new_short="tp2·pp2·cp1·dp1"),
             ev(10, "resumed", from_step=18, cause="rank_failed", layout=L4, short="tp2·pp2·cp1·dp1", world_size=4),
             ev(11, "recovery", cause="rank_failed", total_s=1.0, phases={"detect": 1.0})]
    rows = recovery_ledger(EVENTS + again)
    assert [r["cause"] for r in rows] == ["node_lost", "rank_failed"]
    assert rows[1]["before"] == rows[0]["after"] == rows[1]["after"]
    assert rows[1]["phases"]["load"] == 0.0


def test_grid_is_the_plan_in_force_with_the_lost_node() -> None:
    g = rank_grid(EVENTS)
    assert g is not None and g["world_size"] == 4 and g["short"].startswith("tp2·pp2·cp1·dp1")
    assert [c["node"] for c in g["cells"]] == ["A"] * 4
    assert {(c["tp"], c["pp"], c["cp"], c["dp"]) for c in g["cells"]} == {(0, 0, 0, 0), (1, 0, 0, 0),
                                                                          (0, 1, 0, 0), (1, 1, 0, 0)}
    assert g["nodes"] == [{"node": "A", "status": "in use"}, {"node": "B", "status": "lost"}]


def test_grid_before_placement_and_with_a_broken_layout() -> None:
    assert rank_grid(EVENTS[:1]) is None
    assert rank_grid([ev(1, "ranks_mapped", layout={"tp": 0}, rank_to_node=[])]) is None


def test_markers_put_plan_changes_and_recoveries_on_the_step_axis() -> None:
    ms = markers(EVENTS)
    assert [(m["kind"], m["step"]) for m in ms] == [("plan", 10), ("recovery", 10)]
    assert "→" in ms[0]["label"]
