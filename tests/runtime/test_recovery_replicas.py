"""The recovery benchmark's common stall window (bench/recovery_replicas.py ``stall_window``, pure)."""

from __future__ import annotations

import pytest

from bench.recovery_replicas import stall_window


@pytest.mark.unit
def test_stall_window_is_the_survivors_gap_across_the_kill_not_the_start() -> None:
    # steps 0..9 one per second, but a 9 s start (0 -> 1) and a 4 s stall across the kill at 5.5
    ts = [0.0, 9.0, 10.0, 11.0, 12.0, 13.0, 17.0, 18.0, 19.0, 20.0]
    out = stall_window({"0": [[s, t] for s, t in enumerate(ts)]}, kill_ts=13.5, full_ts=18.0)
    assert out["stall_s"] == 4.0 and out["stall_ends_step"] == 6
    assert out["steady_step_s"] == 1.0  # the start's gaps and the window's gaps left out
    assert out["kill_gap_s"] == 4.0  # the gap that spans the kill (13.0 -> 17.0)


@pytest.mark.unit
def test_stall_window_runs_to_the_end_when_never_back_and_takes_the_worst_survivor() -> None:
    a = [[s, float(s)] for s in range(8)]
    b = [[s, float(s) + (3.0 if s >= 7 else 0.0)] for s in range(8)]  # its last gap 3 s after the kill
    out = stall_window({"0": a, "1": b}, kill_ts=5.5, full_ts=None)
    assert out["stall_s"] == 4.0 and out["stall_ends_step"] == 7
    assert out["kill_gap_s"] == 1.0  # across the kill (5 -> 6) both survivors took 1 s; the 4 s gap came later


@pytest.mark.unit
def test_a_survivor_that_never_steps_again_stalls_until_the_run_ends_not_zero() -> None:
    # the peer's survivors committed steps 0..5, the kill came at 5.5, and nothing after: the stall
    # is open, from the last commit to the end of the run (seen 2026-12-05: a hung torchft run read 0.00 s)
    a = [[s, float(s)] for s in range(6)]
    out = stall_window({"0": a, "1": a}, kill_ts=5.5, full_ts=None, end_ts=65.0)
    assert out["stall_open"] and out["stall_s"] == 60.0 and out["stall_ends_step"] is None
    unbounded = stall_window({"0": a}, kill_ts=5.5, full_ts=None)
    assert unbounded["stall_open"] and unbounded["stall_s"] is None
    assert not stall_window({"0": a}, kill_ts=3.5, full_ts=None)["stall_open"]


@pytest.mark.unit
def test_peer_summary_counts_redone_steps_after_the_crash_only() -> None:
    from bench.recovery_peers import summarize

    def row(ts: float, event: str, group: int, **kw: object) -> dict[str, object]:
        return {"ts": ts, "event": event, "group": group, "pid": 1, **kw}

    rows = [row(0.5, "abort", g, step=0, participants=3) for g in range(3)]  # a redo before the crash
    rows += [row(float(s + 1), "step", g, step=s, loss=1.0, participants=3) for s in range(4) for g in range(3)]
    rows.append(row(4.5, "fault", 2, step=4))
    rows += [row(5.0, "abort", g, step=4, participants=3) for g in (0, 1)]
    rows += [row(6.0 + s, "step", g, step=s, loss=1.0, participants=2) for s in range(4, 6) for g in (0, 1)]
    out = summarize(rows, "torchft", 3, 2)
    assert out["steps_redone"] == 2 and out["steps_redone_after_fault"] == 1
    assert out["survivor_step_ts"]["0"][0] == [0, 1.0] and out["fault_ts"] == 4.5


@pytest.mark.unit
def test_a_partial_recovery_run_carries_the_parts_not_rerun_and_says_where_they_come_from(tmp_path) -> None:
    import json

    from bench.recovery import _carried

    assert _carried(["compare"], tmp_path / "none.json") == {}
    before = tmp_path / "recovery.json"
    rows = [{"system": "orthoplex runtime", "phases": {"detect": 1.0}}]
    before.write_text(json.dumps({"rows": rows, "ratio_raytrain_over_ours": 9.1, "replan": {"steps": 40},
                                  "compare": {"runs": {}}, "finished_at": "2026-11-29T14:41:15Z"}))
    out = _carried(["compare"], before)
    assert out["rows"] == rows and out["ratio_raytrain_over_ours"] == 9.1 and out["replan"] == {"steps": 40}
    assert "compare" not in out  # rerun: never carried
    assert out["carried"] == {"baseline": "2026-11-29T14:41:15Z", "replan": "2026-11-29T14:41:15Z"}
    before.write_text(json.dumps({**json.loads(before.read_text()), "carried": {"baseline": "2026-11-28T00:00:00Z"},
                                  "finished_at": "2026-12-01T00:00:00Z"}))
    assert _carried(["compare"], before)["carried"] == {"baseline": "2026-11-28T00:00:00Z",  # carried again: first date
                                                        "replan": "2026-12-01T00:00:00Z"}
    before.write_text(json.dumps({"compare": {}}))  # nothing else recorded: nothing to carry
    assert _carried(["compare"], before) == {}


def _run(system: str, stall: float, redone: int, step: float, **kw: object) -> dict:
    return {"system": system, "group_size": 1, "stall_s": stall, "steady_step_s": step, "steps_redone": redone,
            "full_strength_s": 4.0, "final_loss": 3.0, "steps": 16, **kw}


def _round(tp2_stall: float, ft: dict) -> dict:
    tp2 = _run("Orthoplex tp=2 x 3 groups", tp2_stall, 1, 0.3, group_size=2, redone_steps=[6], resumed_events=0,
               groups_at_end=3, replacement_on_spare_node=True, max_rel_loss_diff_vs_no_fault=1e-7)
    return {"runs": {"tp2-clean": _run("clean", 0.0, 0, 0.29), "tp2-fault": tp2,
                     "tp1-fault": _run("Orthoplex tp=1 x 3 groups", 0.2, 1, 0.1), "torchft": ft,
                     "restart": _run("Ray Train restart", 20.0, 2, 0.05)}}


@pytest.mark.unit
def test_a_peer_run_that_hung_or_never_recovered_is_never_a_win() -> None:
    """Issue 37: a hung or never-recovering peer made Orthoplex 'win'. Such a peer run makes the
    comparison invalid, whatever its numbers, on every value; only a healthy peer yields yes or no."""
    from bench.recovery_replicas import as_good, peer_problem, verdict

    tp2 = _run("tp=2", 0.6, 1, 0.3)
    healthy = _run("torchft", 0.7, 1, 0.04)
    assert peer_problem(healthy) is None and as_good(tp2, healthy) and verdict(tp2, healthy) == "yes"
    assert verdict(_run("tp=2", 0.8, 1, 0.3), healthy) == "no"
    for bad, why in ((healthy | {"fit_hung": True}, "fit() hung"),
                     (healthy | {"stall_open": True, "stall_s": 40.0}, "survivors never stepped again"),
                     (healthy | {"stall_open": True, "stall_s": None}, "survivors never stepped again"),
                     (healthy | {"full_strength_s": None}, "never back at full strength")):
        assert peer_problem(bad) == why
        for value in ("stall_s", "waiting_s", "stall_window_s"):
            assert not as_good(tp2 | {"waiting_s": 0.1, "stall_window_s": 0.6},
                               bad | {"waiting_s": 9.0, "stall_window_s": 9.0}, value)
        assert verdict(tp2, bad) == f"invalid ({why})"


@pytest.mark.unit
def test_repeated_rounds_report_medians_in_seconds_and_own_steps_and_an_invalid_round_spoils_the_verdict() -> None:
    from bench.recovery_replicas import compare_markdown, compare_summary, medians

    ft = [_run("Ray Train + torchft", s, 1, 0.04) for s in (0.7, 0.9, 0.8)]
    r = {"rounds": [_round(t, f) for t, f in zip((0.6, 0.5, 0.7), ft, strict=True)], "quick": False,
         "load_average_1min": [1.0, 2.0]}
    m = medians(r)
    assert m["tp2-fault"]["stall_s"] == {"median": 0.6, "min": 0.5, "max": 0.7, "n": 3}
    assert m["tp2-fault"]["stall_steps"]["median"] == 2.0  # 0.6 s over its own 0.3 s step
    assert m["torchft"]["stall_steps"]["median"] == 20.0  # 0.8 s over its own 40 ms step
    assert m["verdict_tp2_vs_torchft"] == "yes (stall to full strength)"
    md = compare_markdown(r)
    assert "| Orthoplex tp=2 x 3 groups | 3 of 3 | 0.60 (0.50-0.70) | 2.0 (1.7-2.3) |" in md
    assert "against torchft: **yes (stall to full strength)**" in md
    r["rounds"][1]["runs"]["torchft"] |= {"fit_hung": True}
    m = medians(r)
    assert m["verdict_tp2_vs_torchft"] == "invalid (1 of 3 peer runs: fit() hung)"
    assert m["torchft"]["stall_s"]["n"] == 2  # the hung round left out of the medians
    s = compare_summary(r)
    assert s["torchft runs invalid"] == 1 and s["tp2 vs torchft"].startswith("invalid")
    assert "| Ray Train + torchft | 2 of 3 (fit() hung) |" in compare_markdown(r)


@pytest.mark.unit
def test_the_common_window_is_the_same_length_for_every_system_of_a_round() -> None:
    from bench.recovery_replicas import add_common_window

    # kill at 10.0; tp=2 back after 2 s, torchft after 5 s: both measured over 5 s after the kill
    tp2 = _run("tp=2", 0.9, 1, 0.3, kill_ts=10.0, full_strength_s=2.0,
               survivor_commit_ts={"0": [[s, t] for s, t in enumerate([8.8, 9.1, 9.4, 9.7, 10.6, 10.9, 11.2, 16.0])]})
    ft = _run("torchft", 3.0, 1, 0.5, kill_ts=10.0, full_strength_s=5.0,
              survivor_commit_ts={"0": [[s, t] for s, t in enumerate([9.0, 9.5, 10.5, 11.0, 14.0, 14.5])]})
    runs = {"tp2-fault": tp2, "torchft": ft}
    add_common_window(runs)
    assert tp2["window_s"] == ft["window_s"] == 5.0
    assert ft["stall_window_s"] == 3.0 and ft["stall_window_steps"] == 6.0
    assert tp2["stall_window_s"] == 4.8  # 11.2 -> 16.0 starts inside the common window: it counts


def test_the_in_job_snapshot_estimate_charges_the_copy_and_the_push_against_the_clean_steps_around() -> None:
    from bench.recovery import in_job_overhead

    # a job snapshotting after every 3rd step: the snapshot step costs +0.02 s, the step its push
    # overlaps +0.01 s, on a host drifting from 1.00 to 1.12 s a step (the drift must cancel)
    steps = list(range(1, 31))
    walls = [1.0 + 0.004 * s + (0.02 if s % 3 == 0 else 0.01 if s % 3 == 1 else 0.0) for s in steps]
    est = in_job_overhead(steps, walls)
    assert len(est) == 7  # snapshots at 9 .. 27 (6's clean step before it, 5, is in the warm-up)
    for x in est:
        assert abs(x - 0.03 / 1.0) < 0.004, est  # 3 % of a step, to within the drift's 0.4 %
    with pytest.raises(ValueError, match="every must be >= 3"):
        in_job_overhead(steps, walls, every=2)


def test_the_overhead_goal_reads_the_in_job_measure_and_refuses_a_push_that_outlasts_its_step() -> None:
    from bench.recovery import _goals_markdown

    run = {"runs": {"memory": {"node_lost_to_resumed_s": 2.5, "steps_redone": 0, "max_rel_loss_diff_vs_no_fault": 1e-7},
                    "storage": {"node_lost_to_resumed_s": 3.5, "steps_redone": 5, "max_rel_loss_diff_vs_no_fault": 1e-7}},
           "snapshot_overhead": 0.09, "overhead_pairs": [{"overhead": 0.09}, {"overhead": -0.02}, {"overhead": 0.12}],
           "in_job": {"every": 3, "estimates": [0.02, 0.03, 0.04], "median": 0.03, "pushes_longer_than_their_step": 0}}
    md = _goals_markdown([run])
    assert "job vs job | off/on pairs +9.0%, -2.0%, +12.0% | **no** (median +9.0%)" in md
    assert "median of 3 snapshots +3.0%; pushes outlasting their step: 0 | yes |" in md
    run["in_job"]["pushes_longer_than_their_step"] = 1
    assert "pushes outlasting their step: 1 | **no** |" in _goals_markdown([run])


@pytest.mark.unit
def test_waiting_is_each_gap_minus_the_survivors_own_work_inside_it() -> None:
    """The measured waiting: over the stall window's gaps, the gap minus the survivor's own work
    intervals inside it (clipped to the gap); a survivor that never committed again waits until the
    run's end minus what it still computed; without work intervals there is no waiting."""
    from bench.recovery_replicas import worked

    assert worked([[0.0, 1.0], [2.0, 3.0]], 0.5, 2.5) == pytest.approx(1.0)
    commits = [[0, 0.0], [1, 1.0], [2, 2.0], [3, 3.5], [4, 4.0]]
    work = [[0.1, 0.9], [1.1, 1.9], [2.1, 2.6], [2.9, 3.4], [3.6, 3.9]]
    out = stall_window({"0": commits}, kill_ts=2.5, full_ts=4.0, work={"0": work})
    assert out["stall_s"] == 1.5 and out["stall_ends_step"] == 3
    assert out["waiting_s"] == 0.5 and out["waiting_ends_step"] == 3  # 1.5 s gap, 1.0 s of it computing
    gone = stall_window({"0": [[0, 0.0], [1, 1.0]]}, kill_ts=1.5, full_ts=None, end_ts=3.0,
                        work={"0": [[1.2, 1.6]]})
    assert gone["stall_open"] and gone["waiting_s"] == 1.6
    assert "waiting_s" not in stall_window({"0": commits}, kill_ts=2.5, full_ts=4.0)
