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
def test_a_partial_recovery_run_keeps_the_restart_rows_and_says_where_they_come_from(tmp_path) -> None:
    import json

    from bench.recovery import _carried_baseline

    assert _carried_baseline(tmp_path / "none.json") == {}
    before = tmp_path / "recovery.json"
    rows = [{"system": "orthoplex runtime", "phases": {"detect": 1.0}}]
    before.write_text(json.dumps({"rows": rows, "ratio_raytrain_over_ours": 9.1, "finished_at": "2026-11-29T14:41:15Z"}))
    out = _carried_baseline(before)
    assert out["rows"] == rows and out["ratio_raytrain_over_ours"] == 9.1
    assert out["baseline_rows_from"] == "the run finished 2026-11-29T14:41:15Z (not rerun)"
    before.write_text(json.dumps({**json.loads(before.read_text()), "baseline_rows_from": "2026-11-29 run"}))
    assert _carried_baseline(before)["baseline_rows_from"] == "2026-11-29 run"  # carried again: the first date
    before.write_text(json.dumps({"compare": {}}))  # a record without restart rows: nothing to carry
    assert _carried_baseline(before) == {}


def _run(system: str, stall: float, redone: int, step: float, **kw: object) -> dict:
    return {"system": system, "group_size": 1, "stall_s": stall, "steady_step_s": step, "steps_redone": redone,
            "full_strength_s": 4.0, "final_loss": 3.0, "steps": 16, **kw}


@pytest.mark.unit
def test_goal_verdicts_name_each_torchft_run_and_the_step_it_was_padded_to() -> None:
    """The goals table judges tp=2 against every torchft run of the invocation, the step-matched one
    included (its padding stated), on the stall (the longest gap) with the wait's verdict (the stall
    beyond the system's own steady step) beside it; a verdict follows the numbers, not the row order."""
    from bench.recovery_replicas import compare_markdown

    tp2 = _run("Orthoplex tp=2 x 3 groups", 2.2, 1, 0.8, group_size=2, redone_steps=[6], stall_ends_step=6,
               resumed_events=0, groups_at_end=3, replacement_on_spare_node=True, healed_from=0,
               max_rel_loss_diff_vs_no_fault=1e-7, aborted_before_kill=[])
    runs = {"tp2-fault": tp2, "tp2-clean": _run("clean", 0.0, 0, 0.79),
            "tp1-fault": _run("Orthoplex tp=1 x 3 groups", 1.0, 1, 0.07, aborted_before_kill=[]),
            "torchft": _run("Ray Train + torchft", 3.0, 2, 0.3, min_step_s=0.3),
            "torchft-fast": _run("torchft 0.5 s", 1.4, 3, 0.3, min_step_s=0.3, heartbeat_timeout_ms=500),
            "torchft-matched": _run("torchft 0.5 s matched", 2.5, 3, 0.8, min_step_s=0.79, heartbeat_timeout_ms=500),
            "torchft-matched-compute": _run("torchft 0.5 s compute", 2.1, 1, 0.6, min_step_s=0.79, pad="compute",
                                            heartbeat_timeout_ms=500),
            "restart": _run("restart", 15.0, 2, 0.28, min_step_s=0.3)}
    md = compare_markdown({"runs": runs, "quick": False, "load_average_1min": [1.0]})
    goals = md[md.index("#### Goals"):]
    rows = [line for line in goals.splitlines() if "torchft" in line]
    assert len(rows) == 4
    # waits: tp=2 2.2 - 0.8 = 1.4 s; torchft 2.7, fast 1.1, matched 1.7, compute 1.5 s
    assert "steps slept to 0.30 s" in rows[0] and rows[0].endswith("| yes (wait: yes) (tp=1: yes) |")
    assert "tp=2: stall 2.20 vs 3.00 s; wait beyond a steady step 1.40 vs 2.70 s" in rows[0]
    assert "(2.8 vs 10.0 steady steps)" in rows[0]  # each stall in the system's own steady steps
    assert "tp=2: stall 2.20 vs 1.40 s; wait beyond a steady step 1.40 vs 1.10 s" in rows[1]
    assert rows[1].endswith("| **no** (wait: **no**) (tp=1: yes) |")  # tp=1: 1.0 s, its wait 0.93 s
    assert "slept to tp=2's own no-fault step (0.79 s)" in rows[2] and rows[2].endswith("| yes (wait: yes) |")
    # a shorter wait (1.4 <= 1.5 s) behind a longer stall (2.2 > 2.1 s): the goal's verdict is on the
    # stall, the wait's is stated beside it
    assert "spent computing to tp=2's own no-fault step (0.79 s" in rows[3]
    assert rows[3].endswith("| **no** (wait: yes) |")
    assert "torchft 0.5 s matched" in md[:md.index("#### Goals")] and "torchft 0.5 s compute" in md
    assert "| 2.20 | 0.800 | 2.8 | 1.40 | 0.52x |" in md  # tp=2's row: gap, step, steps, wait, wait / torchft's

    # a torchft run whose survivors never stepped again after the kill: an open stall, never "0.00"
    # and never better than tp=2's
    runs["torchft"] = _run("Ray Train + torchft", 0.0, 2, 0.3, min_step_s=0.3) | {"stall_s": None, "stall_open": True}
    runs["torchft-fast"] = _run("torchft 0.5 s", 40.0, 3, 0.3, min_step_s=0.3, heartbeat_timeout_ms=500,
                                stall_open=True)
    md = compare_markdown({"runs": runs, "quick": False, "load_average_1min": [1.0]})
    rows = [line for line in md[md.index("#### Goals"):].splitlines() if "torchft" in line]
    assert "tp=2: stall 2.20 vs never stepped again s; wait beyond a steady step 1.40 vs never stepped again s" \
        in rows[0] and "| yes (wait: yes) (tp=1: yes)" in rows[0]
    assert "stall 2.20 vs >= 40.00 (never stepped again) s; wait beyond a steady step 1.40 vs >= 39.70 (never " \
        "stepped again) s" in rows[1] and "| yes (wait: yes) (tp=1: yes)" in rows[1]
    assert "| never stepped again |" in md[:md.index("#### Goals")]


@pytest.mark.unit
def test_the_wait_is_the_stall_beyond_a_steady_step_and_the_tally_counts_each_torchft_run() -> None:
    from bench.recovery_replicas import across_runs_markdown, stall_window, waited

    assert waited(0.67, 0.491) == 0.179 and waited(0.2, 0.3) == 0.0 and waited(None, 0.3) is None
    ts = [0.0, 9.0, 10.0, 11.0, 12.0, 13.0, 17.0, 18.0, 19.0, 20.0]
    assert stall_window({"0": [[s, t] for s, t in enumerate(ts)]}, kill_ts=13.5, full_ts=18.0)["wait_s"] == 3.0

    def compare(tp2_stall: float, ft_stall: float, waiting: tuple[float, float] | None = None) -> dict:
        w = {} if waiting is None else {"waiting_s": waiting[0]}
        tp2 = _run("tp=2", tp2_stall, 1, 0.49, **w)
        w = {} if waiting is None else {"waiting_s": waiting[1]}
        peers = {k: _run(k, ft_stall, 1, 0.3, **w) for k in ("torchft", "torchft-fast", "torchft-matched")}
        peers["torchft-matched-compute"] = _run("compute", 3.0, 21, 0.37, **w)
        return {"started": "2026-12-06 02:00", "runs": {"tp2-fault": tp2, "tp1-fault": _run("tp=1", 0.15, 1, 0.06),
                                                         **peers}}
    # run a: tp=2 0.67 s (wait 0.18) against torchft's 0.60 s (wait 0.30): as good on the wait, not on the stall;
    # run c: the waiting measured, tp=2 0.12 s against torchft's 0.25 s
    md = across_runs_markdown({"a": compare(0.67, 0.60), "b": compare(0.5, 0.9), "c": compare(0.67, 0.60, (0.12, 0.25))},
                              ["a", "b", "c"])
    assert "| 2026-12-06 02:00 | 0.67 (0.18; -) | 0.15 (0.09; -) | 0.60 (0.30; -) |" in md
    assert "| 2026-12-06 02:00 | 0.67 (0.18; 0.12) | 0.15 (0.09; -) | 0.60 (0.30; 0.25) |" in md
    assert md.count("| 1 of 4 | 4 of 4 | not measured | 4 of 4 |") == 1
    assert md.count("| 4 of 4 | 4 of 4 | not measured | 4 of 4 |") == 1
    assert md.count("| 1 of 4 | 4 of 4 | 4 of 4 | 4 of 4 |") == 1
    assert "in **6 of 12** torchft runs; on the wait and steps redone in 12 of 12; on the measured waiting " \
           "and steps redone in 4 of 4 (the runs that measured it)" in md
    assert "tp=1 (torchft's group size) on the stall and steps redone: 12 of 12." in md


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
