"""The product part of the recovery benchmark reads a run from its REST metrics and events
(bench/recovery_product.py ``measure``, ``goal_rows``: pure)."""

from __future__ import annotations

import datetime as dt

import pytest

from bench.recovery_product import goal_rows, measure


def _at(s: float) -> str:
    return dt.datetime.fromtimestamp(1_800_000_000 + s, dt.UTC).isoformat()


def _metric(step: int, t: float, loss: float, epoch: int = 1) -> dict:
    return {"step": step, "epoch": epoch, "loss": loss, "ts": _at(t)}


def _event(i: int, type_: str, t: float, **payload: object) -> dict:
    return {"id": i, "type": type_, "ts": _at(t), "payload": payload}


@pytest.mark.unit
def test_a_re_planned_run_counts_the_steps_measured_again_and_its_storage_read() -> None:
    metrics = [_metric(s, float(s), 1.0 / s) for s in range(1, 7)]
    metrics += [_metric(5, 12.0, 0.2, 2), _metric(6, 13.0, 1.0 / 6 + 2e-4, 2), _metric(7, 14.0, 1.0 / 7, 2)]
    events = [_event(1, "node_lost", 7.0), _event(2, "resumed", 11.5, cause="node_lost", source="storage",
                                                  from_step=4, steps_redone=2)]
    ref = {s: 1.0 / s for s in range(1, 8)}
    row = measure({"state": "SUCCEEDED", "attempt": 1}, events, metrics, ref)
    assert row["steps_measured_again"] == 2 and row["steps_redone"] == 2 and row["storage_reads"] == 1
    assert row["node_lost_to_resumed_s"] == 4.5 and row["resume_source"] == "storage"
    assert row["longest_gap_s"] == 6.0  # step 6 at 6 s, then step 5 again at 12 s (steps 1-2 left out)
    assert abs(row["max_abs_loss_diff"] - 2e-4) < 1e-9  # the last run of step 6 against the no-fault run


@pytest.mark.unit
def test_a_replica_run_counts_the_lost_groups_step_and_the_peer_heal() -> None:
    metrics = [_metric(s, float(s), 1.0) for s in range(1, 9)]
    events = [_event(1, "replica_dropped", 4.5, group=2, step=5, groups_left=2, cause="lost"),
              _event(2, "replica_joined", 7.0, group=3, source="peer", from_group=0, groups=3, seconds=2.0)]
    row = measure({"state": "SUCCEEDED", "attempt": 1}, events, metrics, {s: 1.0 for s in range(1, 9)})
    assert (row["steps_redone"], row["storage_reads"], row["groups_at_end"], row["healed_from"]) == (1, 0, 3, ["peer"])
    assert row["max_abs_loss_diff"] == 0.0


@pytest.mark.unit
def test_a_goal_without_its_run_says_not_run_and_why() -> None:
    rows = goal_rows({"drain_deadline_s": 60, "replica": {}, "single": {}, "not_run": {"single": "RuntimeError('x')"}})
    assert all(ok is None and measured.startswith("not run: ") for _, _, measured, ok in rows)
    assert any("RuntimeError" in measured for case, _, measured, _ in rows if case.startswith("single"))


@pytest.mark.unit
def test_a_run_of_one_job_keeps_the_others_runs_saying_when_they_ran() -> None:
    from bench.recovery_product import merge, product_markdown

    before = {"replica": {"kill": {"run": "replica-kill"}}, "single": {"kill": {"run": "old"}},
              "not_run": {"replica-resize": "RuntimeError('r')", "single-drain": "RuntimeError('s')"}}
    now = {"steps": 40, "kill_at_step": 15, "global_batch": 12, "drain_deadline_s": 60, "replica": {},
           "single": {"kill": {"run": "new"}}, "not_run": {}, "ran": ["single"]}
    p = merge(before, now, "2026-12-07T13:03:51Z")
    assert p["single"]["kill"]["run"] == "new" and p["replica"]["kill"]["run"] == "replica-kill"
    assert p["carried"] == {"replica": "2026-12-07T13:03:51Z"} and p["not_run"] == {"replica-resize": "RuntimeError('r')"}
    assert "the replica runs, from the run finished 2026-12-07T13:03:51Z" in product_markdown(
        {**p, "replica": {}, "single": {}})
