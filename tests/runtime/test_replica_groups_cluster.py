"""Replica groups in the Ray runtime (issue #14): survivors never stop, a replacement heals from a peer.

A job of 3 replica groups of ``tp=1`` (``runtime.replica_groups``), each group on its own node of the
session cluster plus one spare node added for the test (4 nodes x 4 declared GPUs). The last group's
node is killed in the middle of step 4 (``kill_node``: after that group's backward pass, before the
cross-group reduction). Checked, as behaviour (times are printed, not asserted):

- the two surviving groups are the same actors throughout (same pids) and no ``resumed`` event;
- the interrupted step is the only step launched twice and the only one a survivor aborted;
- every committed step's loss is the no-failure run's (1e-4 relative), the redone one too;
- ``replica_dropped`` (group 2, its node, step 4) and ``replica_joined`` (``source: "peer"``) for a
  replacement group on a node that is neither the dead one nor a survivor's, which healed from a
  survivor; the last steps run with 3 groups again (back at full strength);
- no storage read: no ``restore`` happens on this path (no ``resumed``) and the replacement's state
  came from a peer (``healed_from``);
- the job evaluates every 10 steps and exports after the last, as a one-gang job does: the
  validation losses are the one-process run's (as the losses: 1e-4 relative, 1e-3 after step 40),
  and the HF export is written.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.controller import helpers as h
from workers.testbed.reference_run import reference_losses, reference_val_losses

pytestmark = pytest.mark.cluster

# 0-based step the kill interrupts (reported as step 4). 50 steps: since the survivors' redo no longer
# waits for the dead group's heartbeat timeout (the supervisor's word, lighthouse.QuorumLighthouse.forget),
# a 10-step job of ~0.08 s tp=1 steps ended before the replacement was up (2026-12-05 evening)
STEPS, KILL_AT = 50, 3


def _spec(tmp_path: Path) -> dict[str, Any]:
    return {
        "model": "tiny", "steps": STEPS, "global_batch": 12, "seed": 5,
        "layout_hint": {"tp": 1, "micro_batch": 2}, "checkpoint_dir": str(tmp_path / "ckpt"),
        "checkpoint": {"min_every_steps": 50, "max_every_steps": 50},
        "runtime": {**h.FAST_RUNTIME, "grow": False, "replica_groups": 3, "warm_ranks_per_node": 1},
        "faults": [{"kind": "kill_node", "at_step": KILL_AT, "rank": -1}],
    }


def _run(job_id: str, spec: dict[str, Any], timeout_s: float) -> tuple[dict[str, Any], list[dict[str, Any]], float]:
    """Run ``spec`` under a supervisor with fault injection: its summary, its events and the seconds it took."""
    import ray

    from workers.runtime.supervision.launch import start_supervisor, stop_supervisor

    t0 = time.monotonic()
    sup = start_supervisor(job_id, 1, spec, enable_fault_injection=True)
    try:
        result = ray.get(sup.run.remote(), timeout=timeout_s)
        events = ray.get(sup.events.remote(0))
    finally:
        stop_supervisor(job_id, 1)
    return result, events, time.monotonic() - t0


def _steps_with_reference_losses(spec: dict[str, Any], events: list[dict[str, Any]], tmp_path: Path,
                                 bound: Callable[[int], float]) -> tuple[list[dict[str, Any]], float]:
    """The job's step events, once each in order, every loss within ``bound(step)`` relative of the
    single-process no-failure run of the same spec; and the largest relative difference."""
    steps_ev = [e for e in events if e["type"] == "step"]
    assert [e["step"] for e in steps_ev] == list(range(1, spec["steps"] + 1))
    ref = reference_losses({k: v for k, v in spec.items() if k not in ("faults", "runtime")}
                           | {"checkpoint_dir": str(tmp_path / "r")})
    rel = [abs(e["loss"] - ref[e["step"] - 1]) / abs(ref[e["step"] - 1]) for e in steps_ev]
    for e, r in zip(steps_ev, rel, strict=True):
        assert r <= bound(e["step"]), (f"step {e['step']}: loss {e['loss']} vs {ref[e['step'] - 1]}; per step (relative "
                                       "difference, groups): " + " ".join(f"{x['step']}:{q:.1e}/{x['world_size']}"
                                                                          for x, q in zip(steps_ev, rel, strict=True)))
    return steps_ev, max(rel)


@pytest.mark.timeout(600)
def test_survivors_keep_stepping_and_a_replacement_heals_from_a_peer(ray_cluster, tmp_path: Path) -> None:
    ray_cluster.add_node()  # the spare node the replacement goes to
    # the job evaluates and exports as a one-gang job does (one live group runs them after a commit)
    spec = _spec(tmp_path) | {"eval_data": {"kind": "builtin"}, "eval_every": 10, "eval_batches": 1,
                              "export": {"format": "hf", "dir": str(tmp_path / "export")}}
    result, events, took = _run("t-replicas", spec, 500)
    assert result["state"] == "SUCCEEDED", result["error"]
    reps = result["replicas"]
    groups = reps["groups"]
    kinds = [e["type"] for e in events]
    assert "resumed" not in kinds and "recovery" not in kinds, kinds

    dropped = [e for e in events if e["type"] == "replica_dropped"]
    story = [{k: v for k, v in e.items() if k not in ("layout", "cadence")} for e in events if e["type"] != "step"]
    assert [(e["group"], e["step"]) for e in dropped] == [(2, KILL_AT + 1)], (story, result["replicas"])
    dead = dropped[0]["nodes"]
    assert dead == [groups["2"]["node"]]
    joined = [e for e in events if e["type"] == "replica_joined"]
    assert len(joined) == 1 and joined[0]["source"] == "peer", (joined, story, reps)
    new = str(joined[0]["group"])
    assert joined[0]["from_group"] in (0, 1)
    assert groups[new]["healed_from"] in (0, 1)
    assert groups[new]["node"] not in {*dead, groups["0"]["node"], groups["1"]["node"]}
    assert sorted(int(g) for g in reps["live"]) == [0, 1, int(new)]

    # the survivors: same actors all along, only the interrupted step aborted and launched twice
    for g in ("0", "1"):
        assert len(groups[g]["pids"]) == 1, groups[g]
        assert set(groups[g]["aborted"]) <= {KILL_AT}, groups[g]
    assert {int(k): v for k, v in result["step_attempts"].items() if v > 1} in ({KILL_AT: 2}, {}), \
        result["step_attempts"]
    redone = sorted({s for g in ("0", "1") for s in groups[g]["aborted"]})
    assert redone == [KILL_AT], f"the interrupted step must be voted down and redone: {groups}"
    # each survivor redid the step at once, itself: it computed the lost group's rows for the
    # quorum torchft formed, or (the supervisor named the dead group first: ReplicaStepper._redo_hint)
    # for the step set while the quorum formed, and then the guess was that quorum
    redos = [a for g in ("0", "1") for a in groups[g]["attempts"].values()
             if a["step"] == KILL_AT and a["event"] == "step" and a["participants"] == 2]
    assert redos and all(a.get("guess_ok", 1.0) == 1.0 for a in redos), redos
    # ... and kept the gradient of its own 4 rows from the voted-down attempt (redo_extra)
    assert all(a.get("kept_rows") == 4.0 for a in redos), redos

    # every step once, each with the no-failure loss; the last step with 3 groups again
    # 1e-4 relative over the first 40 steps, 1e-3 after (float reassociation, as in the no-spare test)
    steps, _ = _steps_with_reference_losses(spec, events, tmp_path, lambda step: 1e-4 if step <= 40 else 1e-3)
    # the validation losses of the one-process run, on its eval steps (10, 20, ..., 50), across the
    # kill and the replacement; and the HF export after the last step
    ref_val = reference_val_losses({k: v for k, v in spec.items() if k not in ("faults", "runtime", "export")}
                                   | {"checkpoint_dir": str(tmp_path / "rv")})
    vals = {e["step"]: e["val_loss"] for e in steps if e.get("val_loss") is not None}
    assert sorted(vals) == sorted(ref_val) == [10, 20, 30, 40, 50], (vals, ref_val)
    assert all(abs(vals[st] - ref_val[st]) <= (1e-4 if st <= 40 else 1e-3) * abs(ref_val[st]) for st in vals), \
        (vals, ref_val)
    assert (tmp_path / "export" / "config.json").is_file()
    assert any(p.suffix == ".safetensors" for p in (tmp_path / "export").iterdir())
    # the redo ran on the two survivors (3 micro-batches each), or with the replacement already in when
    # it healed within the dead group's heartbeat timeout (a warm actor); either way 12 rows
    assert steps[KILL_AT]["world_size"] in (2, 3)
    assert steps[-1]["world_size"] == 3

    # measured, not asserted: the survivors' longest gap between two committed steps, and the time
    # from the drop to full strength
    ts = {e["step"]: e["ts"] for e in steps}
    gaps = [ts[s + 1] - ts[s] for s in range(1, STEPS)]
    print(json.dumps({"test_s": round(took, 1), "longest_gap_s": round(max(gaps), 3),
                      "gap_at_kill_s": round(ts[KILL_AT + 1] - ts[KILL_AT], 3),
                      "drop_to_joined_s": round(joined[0]["ts"] - dropped[0]["ts"], 3),
                      "replica_joined_seconds": joined[0]["seconds"], "joined_at_step": joined[0]["step"],
                      "warm_ranks": groups[new].get("warm_ranks"),
                      "world_sizes": [e["world_size"] for e in steps]}))


# in the CI tier again since 2026-12-05 (CI ~28 min): 20-30 s of its own on a quiet box
@pytest.mark.timeout(900)
def test_no_spare_gpus_the_job_goes_on_with_fewer_groups_and_grows_back(ray_cluster, tmp_path: Path) -> None:
    """3 groups of tp=1 on the 3 session nodes; once the job steps, the test holds every other GPU (a
    placement group of its own), then a group's node is killed: no GPUs for a replacement, so the two
    survivors go on alone (the global batch kept: the no-failure losses); the test frees its GPUs a few
    steps later and the job grows back to 3 groups (a replacement healed from a peer)."""
    import ray
    from ray.util import placement_group, remove_placement_group

    from workers.runtime.supervision.launch import start_supervisor, stop_supervisor

    # enough steps after the GPUs come back for a replacement to start (a warm actor: ~2-4 s here)
    steps, kill_at = 80, 6
    spec = _spec(tmp_path) | {"steps": steps, "faults": [{"kind": "kill_node", "at_step": kill_at, "rank": -1}]}
    spec["runtime"] = {**spec["runtime"], "warm_ranks_per_node": 1, "replica_retry_s": 1.0}
    sup = start_supervisor("t-replicas-short", 1, spec, enable_fault_injection=True)
    block = None
    try:
        run = sup.run.remote()
        deadline = time.monotonic() + 300
        while not any(e["type"] == "step" for e in ray.get(sup.events.remote(0))):
            assert time.monotonic() < deadline, "no step"
            time.sleep(0.2)
        free = int(ray.available_resources().get("GPU", 0))
        block = placement_group([{"GPU": 1, "CPU": 0.01}] * free, strategy="SPREAD")
        ray.get(block.ready(), timeout=60)
        while True:  # two steps done with 2 groups after the drop: give the GPUs back
            events = ray.get(sup.events.remote(0))
            if sum(e["type"] == "step" and e["world_size"] == 2 for e in events) >= 2:
                break
            assert time.monotonic() < deadline and not any(e["type"] == "finished" for e in events), \
                [e["type"] for e in events if e["type"] != "step"]
            time.sleep(0.1)
        remove_placement_group(block)
        block = None
        result = ray.get(run, timeout=500)
        events = ray.get(sup.events.remote(0))
    finally:
        if block is not None:
            remove_placement_group(block)
        stop_supervisor("t-replicas-short", 1)
    assert result["state"] == "SUCCEEDED", result["error"]
    # 1e-4 relative over the first 40 steps; after that float reassociation (2 or 3 groups summing
    # partial gradients vs one process) has drifted to ~1e-4 (1.1e-4 seen at step 52): 1e-3 there
    steps_ev, rel_max = _steps_with_reference_losses(spec, events, tmp_path, lambda step: 1e-4 if step <= 40 else 1e-3)
    sizes = [e["world_size"] for e in steps_ev]
    assert sizes.count(2) >= 2 and sizes[-1] == 3, sizes
    first_two, last_two = sizes.index(2), len(sizes) - 1 - sizes[::-1].index(2)
    assert set(sizes[first_two:last_two + 1]) == {2}  # fewer groups until the GPUs came back, then 3
    joined = [e for e in events if e["type"] == "replica_joined"]
    # the replacement healed in its first step without computing in it (torchft's asynchronous quorum):
    # that step still ran on 2 groups' worth of GPUs, and the next one on 3
    assert len(joined) == 1 and joined[0]["source"] == "peer" and joined[0]["step"] == last_two + 1, joined
    assert "resumed" not in {e["type"] for e in events}
    print(json.dumps({"world_sizes": sizes, "joined_at_step": joined[0]["step"], "max_rel_loss_diff": rel_max}))


# in the CI tier again since 2026-12-05 (CI ~28 min): 30-45 s of its own on a quiet box, 90 steps
@pytest.mark.timeout(900)
def test_two_failures_in_a_row_and_a_failure_during_the_replacements_join(ray_cluster, tmp_path: Path) -> None:
    """Two failures in a row, and a failure during a replacement's join, in one job (session cluster
    plus two spare nodes: 5 nodes x 4 declared GPUs; 3 groups of tp=1, 90 steps):

    - group 2's node is killed in step 4 (``kill_node``, last rank); replacement group 3 starts on a
      spare node and joins from a peer;
    - group 1's node is killed in step 25 (``kill_node``, rank 1: group 1 whether or not group 3 is in
      the step set by then; the test prints whether group 3 had joined before, the usual case);
    - the next replacement (group 4) has its node killed in its first step (``kill_replacement``):
      after it healed from a peer, before the cross-group reduction, so before any ``replica_joined``
      for it. The step the survivors ran with it is voted down and redone; group 4 is torn down and
      another replacement (group 5) starts ``replica_retry_s`` later and joins from a peer.

    Checked: the survivors (group 0 throughout, group 3 once joined) keep one actor each and there is
    no ``resumed``; exactly three step attempts are voted down on the survivors (steps 4, 9, and the
    step group 4 died in; that one may be step 25's redo, then step 25 runs three times), no other step
    runs twice; every step's loss is the no-failure run's (1e-4 relative); ``replica_dropped`` for
    groups 2 (step 4) and 1 (step 25); two ``replica_joined`` (``peer``: groups 3 and 5, healed from a
    live group) and none for group 4; the job ends with 3 groups (0, 3, 5); no storage read.

    Passed three times (2026-12-03, load 5-15): 86, 111 and 110 s with the cluster start (the test's own
    call 69, 89 and 92 s). In all three, group 3 (warm) joined in step 4's redo, group 4 (warm) was up within the dead
    group's heartbeat timeout and died in step 9's redo (step 9 launched three times), group 5 joined at
    step 15, 13 and 16; losses within 8e-7 relative. Since the supervisor's word reaches the quorum
    (2026-12-05 evening: kills at steps 4 and 25, 90 steps) group 3 joins at step 11, group 4 dies in
    step 33 and group 5 joins at step 47 (one run, 17.6 s of its own), the longest gap 0.33 s."""
    # 90 steps: on a quiet box a tp=1 step takes ~0.08 s, and 40 steps ended before the replacement
    # after group 4 (started replica_retry_s after its death) could join (seen 2026-12-05, twice). The
    # second kill at step 25, not 9: with the redo no longer waiting for the dead group's heartbeat
    # timeout, group 3 joins about step 11 rather than in step 4's redo, and a kill in its join step
    # made it the replacement killed while joining (seen 2026-12-05 evening). Not many more steps: the
    # stretch on 2 groups perturbs the float sums, and the difference from the one-process reference
    # grows with every step after it (2e-3 by step 125 in a 130-step run)
    steps, kill1, kill2 = 90, 3, 24  # 0-based steps the kills interrupt (reported as steps 4 and 25)
    ray_cluster.add_node()
    ray_cluster.add_node()
    spec = _spec(tmp_path) | {"steps": steps, "faults": [
        {"kind": "kill_node", "at_step": kill1, "rank": -1},
        {"kind": "kill_node", "at_step": kill2, "rank": 1},
        {"kind": "kill_replacement", "at_step": kill2, "rank": 0},
    ]}
    spec["runtime"] = {**spec["runtime"], "replica_retry_s": 1.0}
    result, events, took = _run("t-replicas-twice", spec, 700)
    story = [{k: v for k, v in e.items() if k not in ("layout", "cadence")} for e in events if e["type"] != "step"]
    assert result["state"] == "SUCCEEDED", (result["error"], story)
    reps = result["replicas"]
    groups = reps["groups"]
    kinds = [e["type"] for e in events]
    assert "resumed" not in kinds and "recovery" not in kinds, kinds

    dropped = [e for e in events if e["type"] == "replica_dropped"]
    assert [(e["group"], e["step"]) for e in dropped] == [(2, kill1 + 1), (1, kill2 + 1)], (story, reps)
    assert dropped[0]["nodes"] == [groups["2"]["node"]] and dropped[1]["nodes"] == [groups["1"]["node"]]
    joined = [e for e in events if e["type"] == "replica_joined"]
    # the next replacement is group 5, or a later one when group 5's try picked group 4's node before the
    # GCS marked it dead (that try fails at once: ClusterPort.reserve probes the node's raylet)
    assert [e["source"] for e in joined] == ["peer", "peer"] and joined[0]["group"] == 3, (joined, story)
    last = str(joined[1]["group"])
    assert int(last) >= 5 and all(groups[str(g)].get("error") for g in range(5, int(last))), (joined, groups)
    assert "4" in groups and groups["4"].get("error"), groups.get("4")  # killed while joining, torn down
    fired = [e for e in events if e["type"] == "fault_injected"]
    assert [e["kind"] for e in fired] == ["kill_node", "kill_node", "kill_replacement"], fired
    assert joined[0]["from_group"] in (0, 1) and groups["3"]["healed_from"] in (0, 1)
    assert joined[1]["from_group"] in (0, 3) and groups[last]["healed_from"] in (0, 3)
    assert sorted(int(g) for g in reps["live"]) == [0, 3, int(last)]

    # the survivors: one actor each all along; three attempts voted down, each redone once
    for g in ("0", "3", last):
        assert len(groups[g]["pids"]) == 1, groups[g]
    aborted0 = groups["0"]["aborted"]
    assert len(aborted0) == 3 and aborted0[:2] == [kill1, kill2] and aborted0[2] >= kill2, groups["0"]
    join_fail = aborted0[2]  # the step group 4 died in
    assert set(groups["3"]["aborted"]) <= {kill2, join_fail}, groups["3"]
    assert set(groups["1"]["aborted"]) <= {kill1}, groups["1"]
    want = {kill1: 2, kill2: 2}
    want[join_fail] = want.get(join_fail, 1) + 1
    assert {int(k): v for k, v in result["step_attempts"].items() if v > 1} == want, result["step_attempts"]

    # every step once, each with the no-failure loss; the last step with 3 groups again
    # 1e-4 relative up to the second kill, 1e-3 after (float reassociation, as in the no-spare test): the
    # sums over 2 groups round differently, AdamW turns the rounding of near-zero gradient entries into
    # whole lr-sized updates, and the difference grows from there. On the machine of 2026-12-06 evening
    # (same result with the replica code before the row shares): ~1e-7 up to step 21, 8.5e-6 at step 22,
    # 1.6e-4 at step 37 (inside the second 2-group stretch), up to 4.3e-4 by step 90
    steps_ev, rel_max = _steps_with_reference_losses(spec, events, tmp_path,
                                                     lambda step: 1e-4 if step <= kill2 + 1 else 1e-3)
    assert steps_ev[-1]["world_size"] == 3

    ts = {e["step"]: e["ts"] for e in steps_ev}
    gaps = [ts[s + 1] - ts[s] for s in range(1, steps)]
    print(json.dumps({"test_s": round(took, 1), "longest_gap_s": round(max(gaps), 3),
                      "first_replacement_joined_before_second_kill": joined[0]["step"] <= kill2 + 1,
                      "joined_at_steps": [e["step"] for e in joined], "join_failure_step": join_fail + 1,
                      "replica_joined_seconds": [e["seconds"] for e in joined], "group4": groups["4"],
                      "step_attempts": result["step_attempts"], "max_rel_loss_diff": rel_max,
                      "world_sizes": [e["world_size"] for e in steps_ev]}))
