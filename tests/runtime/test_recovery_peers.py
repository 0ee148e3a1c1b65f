"""The recovery benchmark's outside peer (bench/recovery_peers.py): Ray Train + torchft.

1. ``summarize`` (pure): stall, steps redone and time to full strength come from the survivors' own
   step rows; the crashed group's rows and the replacement's healing step do not count.
2. Smoke (cluster, heavy, ``soak``: about 2 minutes): Ray Train's ``TorchftConfig`` trains the tiny model in 3 replica groups,
   the last group's node is crashed, the survivors keep committing steps without it, the group is
   replaced on the spare node, heals from a peer and the run finishes every step with all 3 groups.
"""

from __future__ import annotations

import math

import pytest

from bench.recovery_peers import GROUPS, summarize


def _row(ts: float, event: str, group: int, **kw: object) -> dict[str, object]:
    return {"ts": ts, "event": event, "group": group, "pid": 1, **kw}


@pytest.mark.unit
def test_summarize_counts_survivor_stall_redone_steps_and_full_strength() -> None:
    rows = []
    for s in range(3):  # steps 0..2 with all three groups, one per second
        rows += [_row(float(s), "step", g, step=s, loss=3.0 - s / 10, participants=3) for g in range(3)]
    rows.append(_row(3.0, "fault", 2, step=3))
    rows += [_row(3.5, "abort", g, step=3, participants=3) for g in (0, 1)]  # the interrupted step
    rows += [_row(7.0, "step", g, step=3, loss=2.7, participants=2) for g in (0, 1)]  # 5 s stall
    rows += [_row(8.0, "step", g, step=4, loss=2.6, participants=2) for g in (0, 1)]
    rows.append(_row(9.0, "step", 2, step=5, loss=2.5, participants=3, healing=True))  # the replacement
    rows += [_row(9.0, "step", g, step=5, loss=2.5, participants=3) for g in (0, 1)]
    out = summarize(rows, "torchft", 3, 2)
    assert out["stall_s"] == 5.0  # 2.0 -> 7.0 on the survivors, not the crashed group's gap
    assert out["steps_redone"] == 1  # the aborted attempt of step 3
    assert out["full_strength_s"] == 6.0  # 3.0 -> 9.0, first step with 3 participants
    assert out["degraded_steps"] == [3, 4]
    assert out["repeated_steps"] == [3]
    assert out["losses"] == [3.0, 2.9, 2.8, 2.7, 2.6, 2.5]
    assert out["final_loss"] == 2.5


@pytest.mark.unit
def test_summarize_restart_redoes_steps_since_the_checkpoint() -> None:
    rows = [_row(float(s), "step", g, step=s, loss=1.0, participants=3) for s in range(4) for g in range(3)]
    rows.append(_row(4.0, "fault", 2, step=4))
    # the whole group restarts from the checkpoint after step 1: steps 2 and 3 run again
    rows += [_row(18.0 + s, "step", g, step=s, loss=1.0, participants=3) for s in range(2, 6) for g in range(3)]
    out = summarize(rows, "restart", 3, 2)
    assert out["steps_redone"] == 2
    assert out["repeated_steps"] == [2, 3]
    assert out["stall_s"] == 17.0  # last step before the crash at 3.0, the first after at 20.0
    assert out["full_strength_s"] == 16.0


@pytest.mark.unit
def test_summarize_needs_exactly_one_fault() -> None:
    with pytest.raises(RuntimeError, match="one fault"):
        summarize([_row(0.0, "step", 0, step=0, loss=1.0)], "torchft", 3, 2)


@pytest.mark.unit
def test_a_peer_rank_logs_its_own_work_with_its_next_row_and_summarize_collects_it(tmp_path) -> None:
    """The peers' train functions run outside this process (Ray Train workers): their log rows, built
    here by the same ``_Run``, carry each piece of the rank's work once (the measured waiting of the
    recovery bench subtracts it), and ``summarize`` gathers a survivor's work from every row."""
    import time

    from bench.recovery_peers import _Run, _train_config

    run = _Run({"train": _train_config(4, tmp_path, "t"), "log": str(tmp_path / "log"), "kill_at": 2,
                "kill_group": GROUPS - 1}, 0, GROUPS)
    with run.working():
        run.forward_backward(0)
    run.note("step", step=0, loss=1.0, participants=GROUPS)
    with run.working():
        run.forward_backward(1)
    run.note("step", step=1, loss=1.0, participants=GROUPS)
    rows = [__import__("json").loads(x) for x in (tmp_path / "log").read_text().splitlines()]
    assert [len(r["work"]) for r in rows] == [0, 1, 1]  # "enter", then one piece each
    (a, b), = rows[2]["work"]
    assert rows[1]["ts"] <= a <= b <= rows[2]["ts"] <= time.time()
    rows.append({"ts": rows[2]["ts"] + 0.1, "event": "fault", "group": GROUPS - 1, "step": 2})
    out = summarize(rows, "torchft", GROUPS, GROUPS - 1)
    assert out["survivor_work"] == {"0": rows[1]["work"] + rows[2]["work"]}


@pytest.mark.unit
def test_the_unpadded_peer_runs_on_until_back_at_full_strength_for_its_settle_steps(tmp_path) -> None:
    """No step padding: a peer group trains ``steps`` steps, then on while the job is not yet back at
    full strength after the fault, then ``settle`` more steps at full strength, never past ``max_steps``."""
    from bench.recovery_peers import _Run, _train_config

    run = _Run({"train": _train_config(4, tmp_path, "t"), "log": str(tmp_path / "log"), "kill_at": 2,
                "kill_group": GROUPS - 1, "settle_steps": 2, "max_steps": 10}, 0, GROUPS)
    for step in range(4):
        assert run.keep_going(step)
        run.saw(step, GROUPS, step == 0)  # groups heal at step 0 (from the first group): not the fault's
    assert not run.degraded
    run.marker.touch()  # the fault happened (the killed group's marker)
    run.saw(4, GROUPS - 1, False)
    # past ``steps`` (4) and not yet back at full strength: on
    assert run.keep_going(5) and run.keep_going(6)
    run.saw(6, GROUPS, True)  # the replacement's healing step is not full strength yet
    assert run.keep_going(7)
    run.saw(7, GROUPS, False)  # back at full strength at step 7: two settle steps, 7 and 8
    assert run.full_at == 7 and run.keep_going(8) and not run.keep_going(9)
    assert not run.keep_going(10)
    late = _Run({"train": _train_config(4, tmp_path, "t"), "log": str(tmp_path / "log"), "kill_at": 2,
                 "kill_group": GROUPS - 1, "settle_steps": 2, "max_steps": 10}, 2, GROUPS)
    late.marker.touch()
    late.saw(6, GROUPS, True)  # a replacement heals at step 6 and is in at 7: it stops with the survivors
    late.saw(7, GROUPS, False)
    assert late.full_at == 7 and late.keep_going(8) and not late.keep_going(9)
    run.done.touch()  # a survivor finished: a late replacement stops at once
    assert not run.keep_going(0)


@pytest.mark.soak
@pytest.mark.cluster
def test_torchft_peer_replaces_a_lost_replica_group(ray_cluster) -> None:  # type: ignore[no-untyped-def]
    from bench.recovery_peers import run_peer

    ray_cluster.add_node()  # the spare node the lost group is placed on (session cluster: 3 -> 4 nodes)
    out = run_peer("torchft", steps=60, kill_at=3, cluster=ray_cluster, gpus_per_group=ray_cluster.gpus_per_node)
    assert not out["fit_hung"], out.get("hang_diagnosis")
    assert out["last_step"] >= 59 and len(out["losses"]) == out["last_step"] + 1
    assert out["degraded_steps"], "the survivors never committed a step without the lost group"
    assert out["full_strength_s"] is not None, f"never back at {GROUPS} groups: {out}"
    assert all(math.isfinite(x) for x in out["losses"])


@pytest.mark.unit
def test_fit_with_deadline_interrupts_a_hung_fit_and_leaves_a_quick_one_alone() -> None:
    """The benchmark's guard around Ray Train's ``fit()``: past the deadline it sends SIGINT to the main
    thread as Ctrl-C would (Ray Train's handler then aborts the run); a fit that ignores the first
    SIGINT gets another; one that returns in time is untouched and its errors propagate."""
    import signal
    import time

    from bench.recovery_peers import fit_with_deadline

    calls: list[str] = []
    interrupts: list[float] = []

    def handler(_sig: int, _frame: object) -> None:
        interrupts.append(time.monotonic())
        if len(interrupts) >= 2:  # like Ray Train's handler, the first does not end fit() at once
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handler)
    try:
        t0 = time.monotonic()

        def hung() -> None:
            while True:
                time.sleep(0.01)

        assert fit_with_deadline(hung, timeout_s=0.3, grace_s=0.2) is False
        assert len(interrupts) == 2 and interrupts[0] - t0 >= 0.3
        assert fit_with_deadline(lambda: calls.append("ran"), timeout_s=5.0) is True and calls == ["ran"]
        with pytest.raises(ValueError):
            fit_with_deadline(lambda: (_ for _ in ()).throw(ValueError("boom")), timeout_s=5.0)
        time.sleep(0.3)
        assert len(interrupts) == 2  # no stray SIGINT after a fit that returned
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.soak
@pytest.mark.timeout(600)
def test_torchft_used_directly_replaces_a_lost_group_in_plain_processes(tmp_path) -> None:
    """The second torchft peer (bench/recovery_torchft.py): torchft's Manager and lighthouse in plain
    processes, the last group's process killed mid-step, a replacement process healed from a survivor;
    the run ends by itself, back at full strength, with the survivors' stall measured."""
    from bench.recovery_torchft import run_direct

    out = run_direct(steps=30, kill_at=4, work=tmp_path, deadline_s=420.0)
    assert not out["fit_hung"], out
    assert out["degraded_steps"], "the survivors never committed a step without the lost group"
    assert out["full_strength_s"] is not None, f"never back at {GROUPS} groups: {out}"
    assert out["last_step"] >= 29 and all(math.isfinite(x) for x in out["losses"])
    assert out["stall_s"] > 0 and out["system"] == "torchft Manager, plain processes"
