"""Unit tests of the runtime's pure pieces: rank mapping, straggler scoring, cadence, events, faults."""

from __future__ import annotations

import json
import math
import random
import time

import pytest

from planner.layout import Layout, parse_hint
from workers.runtime.cluster.ranks import assign_ranks, spanning_groups
from workers.runtime.contract import events as ev
from workers.runtime.contract.events import EventLog
from workers.runtime.contract.job_spec import parse_job
from workers.runtime.policy.checkpoint_cadence import CheckpointCadence, young_interval_s
from workers.runtime.policy.stragglers import StragglerScorer
from workers.testbed.fault_injector import Fault, FaultInjectionDisabled, FaultPlan, parse_faults

pytestmark = pytest.mark.unit


# ------------------------------------------------------------------------------------ ranks
def test_interleaved_bundles_keep_tp_then_cp_groups_on_one_node() -> None:
    lay = Layout(tp=2, cp=2, pp=2, dp=1)  # 8 ranks, TP*CP blocks of 4
    bundles = ["a", "b", "a", "b", "a", "b", "a", "b"]  # SPREAD-style interleaving
    rm = assign_ranks(lay, bundles)
    assert sorted(rm.rank_to_bundle) == list(range(8))
    assert rm.spanning == {}
    for group in lay.groups("tp") + lay.groups("cp"):
        assert len({rm.rank_to_node[r] for r in group}) == 1
    # the naive identity mapping would have split every TP group
    assert spanning_groups(lay, bundles)["tp"]


def test_uneven_nodes_fall_back_to_tp_blocks() -> None:
    lay = Layout(tp=2, cp=2, dp=3)  # 12 ranks; nodes of 6,6 fit no 4-block evenly
    bundles = ["x"] * 6 + ["y"] * 6
    random.Random(0).shuffle(bundles)
    rm = assign_ranks(lay, bundles)
    assert "tp" not in rm.spanning
    assert [len(g) for g in lay.groups("tp")] == [2] * 6


def test_follows_the_plan_when_counts_match_and_maps_plan_nodes_onto_real_ones() -> None:
    lay = Layout(tp=2, pp=2, dp=2)
    plan_nodes = ["p0"] * 4 + ["p1"] * 4
    bundles = ["r1", "r0", "r1", "r0", "r1", "r0", "r1", "r0"]
    rm = assign_ranks(lay, bundles, plan_nodes)
    assert rm.method == "plan"
    assert len(set(rm.rank_to_node[:4])) == 1 and len(set(rm.rank_to_node[4:])) == 1
    assert rm.rank_to_node[0] != rm.rank_to_node[4]


def test_rank_map_rejects_wrong_sizes() -> None:
    with pytest.raises(ValueError):
        assign_ranks(Layout(tp=2), ["a"])


# ------------------------------------------------------------------------------------ straggler
def _run_scorer(factor_by_node: dict[str, float], steps: int, start_slow: int, noise: float = 0.02,
                window: int = 5) -> tuple[list, StragglerScorer]:
    nodes = {r: f"n{r // 4}" for r in range(12)}
    roles = {r: (0 if r < 6 else 1,) for r in range(12)}  # two pipeline stages, different work
    base = {r: (1.0 if r < 6 else 1.6) for r in range(12)}
    sc = StragglerScorer(nodes, roles, window=window, threshold=0.7)
    rng = random.Random(1)
    found = []
    for s in range(steps):
        times = {}
        for r in range(12):
            f = factor_by_node.get(nodes[r], 1.0) if s >= start_slow else 1.0
            times[r] = base[r] * f * (1 + rng.uniform(-noise, noise))
        for x in sc.observe(s, times):
            found.append((s, x))
    return found, sc


def test_slow_node_detected_within_two_windows() -> None:
    found, _ = _run_scorer({"n2": 2.0}, steps=30, start_slow=12)
    assert found, "a node at 0.5x was not detected"
    step, f = found[0]
    assert f.node == "n2" and f.score < 0.7
    assert step - 12 < 2 * 5


def test_three_percent_jitter_and_pipeline_imbalance_trigger_nothing() -> None:
    found, sc = _run_scorer({"n1": 1.03}, steps=40, start_slow=0, noise=0.03)
    assert found == []
    assert sc.windows_closed >= 6
    assert all(v > 0.85 for v in sc.last_scores.values())


def test_machine_wide_slowdown_is_not_a_straggler() -> None:
    found, _ = _run_scorer({"n0": 1.8, "n1": 1.8, "n2": 1.8}, steps=30, start_slow=10)
    assert found == []


def test_one_step_blip_is_not_persistent() -> None:
    nodes = {r: f"n{r // 2}" for r in range(4)}
    sc = StragglerScorer(nodes, {r: (0,) for r in range(4)}, window=5)
    hits = []
    for s in range(20):
        t = {r: 1.0 for r in range(4)}
        if s == 12:
            t[0] = t[1] = 5.0
        hits += sc.observe(s, t)
    assert hits == []


# ------------------------------------------------------------------------------------ cadence
def test_young_interval_matches_the_formula() -> None:
    assert young_interval_s(11135, 60) == pytest.approx(math.sqrt(2 * 11135 * 60))
    with pytest.raises(ValueError):
        young_interval_s(0, 1)


def test_cadence_tightens_with_failures_and_respects_bounds() -> None:
    c = CheckpointCadence(min_steps=2, max_steps=40, prior_mtbf_s=400.0)
    for _ in range(10):
        c.observe_step(1.0)
    c.observe_save(0.5)
    calm = c.interval_steps()  # sqrt(2*410*0.5) ~ 20 steps
    assert 15 <= calm <= 25
    for _ in range(20):
        c.observe_failure()
    assert c.interval_steps() < calm
    assert c.interval_steps() >= 2
    c2 = CheckpointCadence(min_steps=1, max_steps=3, prior_mtbf_s=1e6)
    c2.observe_step(0.01)
    assert c2.interval_steps() == 3 and c2.due(3) and not c2.due(2)


# ------------------------------------------------------------------------------------ events
def test_event_log_sequence_since_and_sink(tmp_path) -> None:
    sink = tmp_path / "ev.jsonl"
    log = EventLog(sink)
    log.emit(ev.PlanChosen(reason="initial", layout={"tp": 2}, short="tp2", num_gpus=2, nodes=["a"],
                           predicted_tokens_per_s=1.0, predicted_step_time_s=0.5))
    stamped = log.emit(ev.StepDone(step=0, loss=1.0, wall_s=0.1, busy_max_s=0.1, world_size=2, tokens_per_s=3.0))
    assert stamped.seq == 2 and stamped.ts > 0
    assert [e["seq"] for e in log.since(0)] == [1, 2]
    assert [e["type"] for e in log.since(1)] == ["step"]
    lines = [json.loads(x) for x in sink.read_text().splitlines()]
    assert lines[0]["type"] == "plan" and "ts" in lines[0] and lines[0]["reason"] == "initial"
    assert [ev.event_from_dict(x) for x in lines] == [ev.event_from_dict(x) for x in log.since(0)]
    assert ev.event_from_dict(lines[1]) == stamped


def test_a_steps_snapshot_wait_is_its_slowest_ranks_and_none_without_snapshots() -> None:
    from workers.runtime.supervision.attempt_machine import _snapshot_s

    assert _snapshot_s({0: {"snapshot_s": 0.004}, 1: {"snapshot_s": 0.0123456}}) == 0.0123
    assert _snapshot_s({0: {"snapshot_s": None}, 1: {}}) is None  # snapshots off (or a replica group's step)
    assert _snapshot_s({0: {"snapshot_push_s": 0.02}, 1: {"snapshot_push_s": 0.031}}, "snapshot_push_s") == 0.031
    assert ev.StepDone(step=1, loss=1.0, wall_s=0.1, busy_max_s=0.1, world_size=2, tokens_per_s=3).snapshot_s is None


def test_events_round_trip_and_refuse_what_their_type_does_not_allow() -> None:
    step = ev.StepDone(seq=3, ts=1.5, step=0, loss=1.0, wall_s=0.1, busy_max_s=0.1, world_size=2, tokens_per_s=3)
    wire = step.to_dict()
    assert wire["type"] == "step" and ev.event_from_dict(wire) == step
    assert ev.event_from_dict(json.loads(json.dumps(wire))) == step
    with pytest.raises(ValueError, match="unknown event type"):
        ev.event_from_dict({**wire, "type": "nonsense"})
    with pytest.raises(ValueError, match="'loss' missing"):
        ev.event_from_dict({k: v for k, v in wire.items() if k != "loss"})
    with pytest.raises(ValueError, match="unknown field"):
        ev.event_from_dict({**wire, "final_loss": 1.0})
    with pytest.raises(ValueError, match="'step'"):
        ev.event_from_dict({**wire, "step": "7"})
    with pytest.raises(ValueError, match="'step'"):
        ev.event_from_dict({**wire, "step": True})
    with pytest.raises(TypeError):
        EventLog().emit(ev.Event(reason="untyped"))  # type: ignore[arg-type]
    # every registered class knows its own type and its endings their attempt outcome
    assert all(cls.type == name for name, cls in ev.EVENTS.items())
    assert {c.outcome for c in ev.ENDINGS} == {"SUCCEEDED", "FAILED", "CANCELLED", "PREEMPTED"}
    placed = ev.Placed(gpus=3, placement_group="orthoplex-1-a1", gpus_per_node={"a": 2, "b": 1},
                       bundle_nodes=["a", "a", "b"], seconds=0.1, strategy="PACK")
    assert ev.event_from_dict(placed.to_dict()) == placed
    keep = ev.Replanned(decision="keep", old={}, new={}, old_short="a", new_short="b", old_tokens_per_s=1,
                        new_tokens_per_s=1, switch_cost_s=0, change={}, nodes=["n"])
    assert keep.in_force() is None
    assert ev.Replanned.from_dict({**keep.to_dict(), "decision": "replan"}).in_force().short == "b"


def test_recovery_fields_sum_the_phases() -> None:
    body = ev.Recovered.of({"detect": 1, "plan": 0.1, "place": 0.5, "start": 5, "load": 1, "first_step": 2},
                           "node_lost", teardown_s=0.3)
    assert body.total_s == pytest.approx(9.6) and body.cause == "node_lost"
    with pytest.raises(ValueError):
        ev.Recovered.of({"detect": 1}, "x", 0.0)


# ------------------------------------------------------------------------------------ faults / spec
def test_faults_need_the_explicit_hook_and_fire_once() -> None:
    faults = parse_faults([{"kind": "kill_node", "at_step": 5}, {"kind": "slow_node", "at_step": 2, "factor": 2}])
    with pytest.raises(FaultInjectionDisabled):
        FaultPlan(faults, enabled=False)
    FaultPlan([], enabled=False)  # a normal run: nothing to fire, nothing refused
    plan = FaultPlan(faults, enabled=True)
    assert plan.due(1) == []
    assert [f.kind for f in plan.due(5)] == ["slow_node", "kill_node"]
    assert plan.due(6) == [] and plan.pending == []
    # kill_replacement fires when a replica group starts, never before a step is launched
    plan = FaultPlan(parse_faults([{"kind": "kill_replacement", "at_step": 3, "rank": 0},
                                   {"kind": "kill_node", "at_step": 3}]), enabled=True)
    assert [f.kind for f in plan.due(3)] == ["kill_node"] and plan.due(2, on_start=True) == []
    assert [f.kind for f in plan.due(4, on_start=True)] == ["kill_replacement"] and plan.pending == []
    assert Fault("kill_rank", 0, rank=-1).target_rank(8) == 7
    with pytest.raises(ValueError):
        Fault("explode", 1)


def test_job_spec_parsing(tmp_path) -> None:
    job = parse_job({"model": "tiny", "steps": 7, "global_batch": 12, "checkpoint_dir": str(tmp_path),
                     "layout_hint": "tp=2,pp=2", "min_gpus": 4, "runtime": {"hang_timeout_s": 5}})
    assert job.steps == 7 and job.layout_hint == {"tp": 2, "pp": 2} and job.runtime.detection.hang_timeout_s == 5
    assert job.train["save_every"] == 0
    assert parse_hint({"tp": 2}) == {"tp": 2}
    with pytest.raises(ValueError, match="checkpoint_dir"):
        parse_job({"model": "tiny", "steps": 1, "global_batch": 4})
    with pytest.raises(ValueError, match="runtime"):
        parse_job({"model": "tiny", "steps": 1, "global_batch": 4, "checkpoint_dir": "x", "runtime": {"bogus": 1}})


# ------------------------------------------------------------------------------------ watchdog
def test_classify_tells_node_loss_rank_crash_raise_and_hang_apart() -> None:
    from ray.exceptions import ActorDiedError

    from workers.runtime.cluster.watchdog import GatherResult, classify

    nodes = ["a", "a", "b", "b"]
    died = GatherResult(errors={2: ActorDiedError(), 3: ActorDiedError(), 0: RuntimeError("Connection closed")})
    f = classify(died, nodes, alive_nodes=lambda: {"a"}, confirm_s=0.2)
    assert f.kind == "node_lost" and f.nodes == ("b",) and f.ranks == (2, 3)
    one = GatherResult(errors={3: ActorDiedError()})
    f = classify(one, nodes, alive_nodes=lambda: {"a", "b"}, confirm_s=0.2)
    assert f.kind == "rank_failed" and f.ranks == (3,)
    raised = GatherResult(errors={1: ValueError("token id 999 outside the vocabulary")})
    f = classify(raised, nodes, alive_nodes=lambda: {"a", "b"}, confirm_s=0.2)
    assert f.kind == "rank_failed" and "vocabulary" in f.reason
    hung = GatherResult(results={0: 1}, pending=[1, 2, 3], timed_out=True)
    f = classify(hung, nodes, alive_nodes=lambda: {"a", "b"})
    assert f.kind == "hang" and f.ranks == (1, 2, 3)
    silent = GatherResult(unresponsive=[0, 1], pending=[0, 1, 2, 3])
    f = classify(silent, nodes, alive_nodes=lambda: {"b"}, confirm_s=0.2)
    assert f.kind == "node_lost" and f.nodes == ("a",)
    with pytest.raises(ValueError):
        classify(GatherResult(results={0: 1}), nodes, alive_nodes=lambda: {"a", "b"})


def test_classify_trusts_a_dead_raylet_before_the_gcs_notices() -> None:
    """Every rank of node b died and b's raylet refuses connections while the GCS still lists b alive
    (its health checks lag by seconds): that is a node loss, reported without waiting for the GCS.
    A node whose raylet answers stays a rank failure."""
    from ray.exceptions import ActorDiedError

    from workers.runtime.cluster.watchdog import GatherResult, classify

    nodes = ["a", "a", "b", "b"]
    died = GatherResult(errors={2: ActorDiedError(), 3: ActorDiedError()})
    probed: list[str] = []

    def unreachable(node: str) -> bool:
        probed.append(node)
        return node == "b"

    t0 = time.monotonic()
    f = classify(died, nodes, alive_nodes=lambda: {"a", "b"}, confirm_s=30.0, unreachable=unreachable)
    assert f.kind == "node_lost" and f.nodes == ("b",) and f.ranks == (2, 3)
    assert time.monotonic() - t0 < 5.0  # did not sit out confirm_s
    assert probed == ["b"]  # only a node where a rank died is probed
    # the first death seen while the node's other rank still hangs in a collective: same answer
    first = GatherResult(errors={3: ActorDiedError()}, pending=[0, 1, 2])
    f = classify(first, nodes, alive_nodes=lambda: {"a", "b"}, confirm_s=30.0, unreachable=unreachable)
    assert f.kind == "node_lost" and f.nodes == ("b",) and f.ranks == (2, 3)
    f = classify(died, nodes, alive_nodes=lambda: {"a", "b"}, confirm_s=0.3, unreachable=lambda n: False)
    assert f.kind == "rank_failed" and f.ranks == (2, 3)


def test_a_node_where_ranks_keep_dying_becomes_suspect_and_nothing_else_does() -> None:
    from ray.exceptions import ActorDiedError

    from workers.runtime.cluster.watchdog import Failure, GatherResult, classify
    from workers.runtime.policy.recovery import NodeDeaths

    nodes = ["a", "a", "b", "b"]
    live = {"alive_nodes": lambda: {"a", "b"}, "confirm_s": 0.2, "unreachable": lambda n: False}
    death_on_b = classify(GatherResult(errors={3: ActorDiedError()}), nodes, **live)
    assert death_on_b.kind == "rank_failed" and death_on_b.died and death_on_b.nodes == ("b",)
    raised = classify(GatherResult(errors={0: RuntimeError("x"), 3: RuntimeError("x")}), nodes, **live)
    assert raised.kind == "rank_failed" and not raised.died
    both = classify(GatherResult(errors={0: ActorDiedError(), 3: ActorDiedError()}), nodes, **live)
    assert both.died and both.nodes == ("a", "b")

    deaths = NodeDeaths(limit=2)
    # errors raised (a bug, bad data), deaths on several nodes at once (a layout out of memory
    # everywhere), a node loss or a hang count against no node
    for f in (raised, raised, both, both, Failure("node_lost", "x", ("b",), (2, 3)), Failure("hang", "x", ("b",))):
        assert deaths.record(f) is None
    assert deaths.record(death_on_b) is None  # once is bad luck
    assert deaths.record(death_on_b) == "b"  # twice on the same live node: suspect
    assert deaths.record(death_on_b) is None  # reported once
    assert NodeDeaths(limit=0).record(death_on_b) is None  # off


def test_raylet_probe_tells_a_listening_port_from_a_closed_one(monkeypatch) -> None:
    import socket

    import ray

    from workers.runtime.cluster import placement_groups as placement

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    open_port = server.getsockname()[1]
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    table = [
        {"NodeID": "up", "Alive": True, "NodeManagerAddress": "127.0.0.1", "NodeManagerPort": open_port},
        {"NodeID": "crashed", "Alive": True, "NodeManagerAddress": "127.0.0.1", "NodeManagerPort": closed_port},
        {"NodeID": "marked", "Alive": False, "NodeManagerAddress": "127.0.0.1", "NodeManagerPort": open_port},
    ]
    monkeypatch.setattr(ray, "nodes", lambda: table)
    try:
        assert not placement.raylet_unreachable("up")
        assert placement.raylet_unreachable("crashed")
        assert placement.raylet_unreachable("marked")
        assert placement.raylet_unreachable("unknown")
    finally:
        server.close()


def test_every_event_the_runtime_emits_is_a_registered_class() -> None:
    import re
    from pathlib import Path

    import workers.runtime as runtime

    emitted = {m for f in Path(runtime.__file__).parent.rglob("*.py")
               for m in re.findall(r"\bev\.([A-Z][A-Za-z]+)\(", f.read_text())}
    registered = {cls.__name__ for cls in ev.EVENTS.values()}
    assert {"NodeExcluded", "WaitingForGpus", "RankFailed"} <= emitted
    assert emitted - {"Event"} <= registered, emitted - registered


def test_the_log_refuses_an_event_whose_fields_do_not_fit_its_type() -> None:
    log = EventLog()
    with pytest.raises(ValueError, match="'nodes'"):
        log.emit(ev.NodeLost(reason="x", nodes=[1, 2], ranks=[0], step=3))  # node ids are strings
    assert log.last_seq == 0


def test_memsnap_choose_takes_the_newest_complete_snapshot_over_the_surviving_holders() -> None:
    from workers.runtime.recovery.memory_snapshots import SnapshotKey, buddy_of, choose

    def entry(epoch: int, step: int, world: int, *files: str) -> dict:
        return {"epoch": epoch, "step": step, "world": world, "files": list(files)}

    # step 5: rank 1's shard survives on no holder (both copies gone) -> step 4, which b and c have together
    inv = {"b": [entry(1, 4, 2, ".metadata", "__0_0.distcp"), entry(1, 5, 2, ".metadata", "__0_0.distcp")],
           "c": [entry(1, 4, 2, "__1_0.distcp")]}
    got = choose(inv)
    assert got is not None and got.key == SnapshotKey(1, 4) and got.world == 2
    assert got.by_node() == {"b": [".metadata", "__0_0.distcp"], "c": ["__1_0.distcp"]}
    assert choose(inv, not_before=5) is None  # a newer storage checkpoint wins
    assert choose(inv, not_after=3) is None
    assert choose({"b": [entry(1, 4, 2, "__0_0.distcp", "__1_0.distcp")]}) is None  # no metadata
    # the same step from two gangs: the newer gang's
    both = {"a": [entry(1, 6, 1, ".metadata", "__0_0.distcp"), entry(2, 6, 1, ".metadata", "__0_0.distcp")]}
    assert choose(both).key == SnapshotKey(2, 6)
    assert buddy_of("b", ["a", "b", "c"]) == "c" and buddy_of("c", ["a", "b", "c"]) == "a"
    assert buddy_of("a", ["a"]) is None


def test_node_watch_marks_a_node_down_when_its_port_refuses_or_stays_silent() -> None:
    import socket
    import time

    from workers.runtime.cluster.watchdog import NodeWatch

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    addr = srv.getsockname()
    watch = NodeWatch({"n1": addr}, period_s=0.05, timeout_s=0.5).start()
    try:
        time.sleep(0.3)
        assert watch.down() == set()  # listening: alive
        srv.close()  # the "raylet" is gone: the next probe is refused
        deadline = time.monotonic() + 5
        while not watch.down() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert watch.down() == {"n1"} and "n1" in watch.down_at
    finally:
        watch.stop()
    # a silent node (probe times out) is down once it stayed silent for silent_s, not at the first miss;
    # an answer in between starts the count again (a short partition that heals is ridden out)
    answers = iter([None, False, None, None, None])
    silent = NodeWatch({"n2": ("x", 1)}, silent_s=0.2, probe=lambda a, t: next(answers))
    assert silent.check_once() == set() and silent.check_once() == set() and silent.check_once() == set()
    assert silent.check_once() == set()
    time.sleep(0.25)
    assert silent.check_once() == {"n2"}


def test_classify_trusts_the_node_heartbeat() -> None:
    from workers.runtime.cluster.watchdog import GatherResult, classify

    res = GatherResult(pending=[2, 3], lost_nodes=["b"])
    assert not res.ok
    f = classify(res, ["a", "a", "b", "b"], alive_nodes=lambda: {"a", "b"})  # the GCS has not noticed yet
    assert f.kind == "node_lost" and f.nodes == ("b",) and f.ranks == (2, 3)


def test_snapshot_holder_keeps_the_newest_snapshots_by_step() -> None:
    from workers.runtime.recovery.memory_snapshots import SnapshotHolder, choose

    h = SnapshotHolder(keep=2)
    for step in (1, 2, 3):
        h.put(1, step, 1, {"__0_0.distcp": b"x" * step})
    h.put(1, 3, 1, {".metadata": b"m"})
    inv = h.inventory()
    assert sorted(e["step"] for e in inv) == [2, 3]
    assert h.get(1, 3, ["__0_0.distcp"]) == {"__0_0.distcp": b"xxx"}
    assert choose({"n": inv}).key.step == 3  # step 2 has no metadata on this holder


def test_replica_groups_take_any_layout_and_refuse_a_batch_no_group_can_carry() -> None:
    """``runtime.replica_groups``: any layout inside a group (the hint is one group's layout); refused
    when the spec is parsed, naming the option: a global batch that is not whole blocks of the rows a
    group runs together (``replica_rows.share_unit``), and ``dp_replicate`` inside a group."""
    from workers.runtime.contract.job_spec import parse_job

    base = {"model": "tiny", "steps": 2, "global_batch": 12, "checkpoint_dir": "/nonexistent/ckpt",
            "runtime": {"replica_groups": 3}}
    for hint in ("tp=2,micro_batch=2", "pp=2", "tp=2,cp=2", "dp=2,zero=1", "tp=2,pp=2,dp=2,zero=3"):
        assert parse_job({**base, "layout_hint": hint}).runtime.replicas.groups == 3
    # one group snapshots (the fallback re-plan restores from memory)
    assert parse_job({**base, "runtime": {"replica_groups": 3, "snapshots": True}}).runtime.snapshots.enabled
    with pytest.raises(ValueError, match="replica_groups: global_batch 12 is not a multiple of the 8 rows"):
        parse_job({**base, "layout_hint": "pp=2,dp=2,micro_batch=2"})
    with pytest.raises(ValueError, match="micro_batch"):
        parse_job({**base, "layout_hint": "micro_batch=5"})
    with pytest.raises(ValueError, match="dp_replicate"):
        parse_job({**base, "layout_hint": "dp=2,dp_replicate=2,zero=1"})
    assert parse_job({**base, "layout_hint": "pp=2", "runtime": {}}).runtime.replicas.groups == 0


# ------------------------------------------------------------------------------------ rank actor threads
def test_a_ranks_torch_work_runs_in_a_one_thread_concurrency_group_and_its_heartbeat_beside_it() -> None:
    """DTensor's sharding cache is per thread: every RankWorker method that runs torch work is in the
    ``torch`` concurrency group (one thread, so a new rank warms one cache, not four), and what must
    answer while a step runs (heartbeat, a peer group's loss, fault hooks, close) stays in the default
    group's threads."""
    from workers.runtime.cluster.rank_worker import ACTOR_CONCURRENCY, TORCH_GROUP, RankWorker

    assert ACTOR_CONCURRENCY["concurrency_groups"] == {TORCH_GROUP: 1} and ACTOR_CONCURRENCY["max_concurrency"] > 1
    group = {name: getattr(getattr(RankWorker, name), "__ray_concurrency_group__", None)
             for name in dir(RankWorker) if not name.startswith("_") and callable(getattr(RankWorker, name))}
    torch_work = {"setup", "setup_replica", "step", "replica_step", "save", "restore", "restore_snapshot",
                  "flush_snapshot", "after_step"}
    assert {n for n, g in group.items() if g == TORCH_GROUP} == torch_work
    assert all(group[n] is None for n in ("heartbeat", "replica_peers_lost", "inject", "close", "info"))
