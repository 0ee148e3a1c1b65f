"""A partition from some peers only, without Ray: the exclusion rule on reachability matrices, the
TCP probe a node runs (real sockets on this host), and the state machine turning a failure whose
probe finds a cut pair into ``peer_unreachable`` + ``node_lost`` and a re-plan without the node."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from workers.runtime.cluster.gang import Gang, StartFailed
from workers.runtime.cluster.reachability import Matrix, Verdict, connect_all, cut_pairs, judge, to_exclude
from workers.runtime.cluster.watchdog import Failure
from workers.runtime.contract import events as ev
from workers.runtime.contract.events import EventLog
from workers.runtime.contract.job_spec import parse_job
from workers.runtime.recovery import fencing
from workers.runtime.supervision.attempt_machine import AttemptMachine, Phase
from workers.testbed.fault_injector import FaultInjector, FaultPlan, parse_faults

from .memory_cluster import MemoryCluster

pytestmark = pytest.mark.unit


def full(nodes: Sequence[str], cut: Sequence[tuple[str, str]] = (), one_way: bool = False) -> Matrix:
    """A matrix over ``nodes`` where the pairs of ``cut`` fail (both ways, or only a -> b)."""
    bad = {(a, b) for a, b in cut} | (set() if one_way else {(b, a) for a, b in cut})
    return {s: {d: (s, d) not in bad for d in nodes if d != s} for s in nodes}


# ---------------------------------------------------------------------------------- the rule
def test_no_cut_pair_excludes_nothing() -> None:
    assert to_exclude(["a", "b", "c"], []) == []
    assert judge(full("abc"), list("aabbcc")).exclude == []


def test_one_cut_pair_leaves_out_the_node_without_rank_0() -> None:
    # rank 0 on b: a goes, whatever the ids say
    assert judge(full("ab", [("a", "b")]), ["b", "b", "a", "a"]).exclude == ["a"]
    assert judge(full("ab", [("a", "b")]), ["a", "a", "b", "b"]).exclude == ["b"]


def test_a_one_way_failure_is_a_cut_pair() -> None:
    m = full("abc", [("c", "a")], one_way=True)
    assert cut_pairs(m) == [("a", "c")]
    assert judge(m, list("aabbcc")).exclude == ["c"]


def test_a_node_cut_from_two_peers_is_the_only_one_left_out() -> None:
    # c cannot reach a nor b: leaving out c alone (1 node) beats leaving out a and b (2)
    m = full("abcd", [("c", "a"), ("c", "b")])
    assert judge(m, list("aabbccdd")).exclude == ["c"]


def test_the_node_with_fewer_ranks_goes_when_rank_0_is_on_neither() -> None:
    m = full("abc", [("b", "c")])
    assert judge(m, ["a", "b", "b", "b", "c"]).exclude == ["c"]
    assert judge(m, ["a", "c", "c", "c", "b"]).exclude == ["b"]


def test_equal_nodes_break_the_tie_by_id_whatever_the_order() -> None:
    assert to_exclude(["x", "y"], [("x", "y")], ranks={"x": 2, "y": 2}) == ["y"]
    assert to_exclude(["y", "x"], [("y", "x")], ranks={"y": 2, "x": 2}) == ["y"]


def test_two_disjoint_cuts_need_two_nodes_and_keep_rank_0() -> None:
    m = full("abcd", [("a", "b"), ("c", "d")])
    out = judge(m, list("aabbccdd")).exclude
    assert len(out) == 2 and "a" not in out and out[0] == "b"


def test_a_node_split_from_everyone_goes_even_when_it_hosts_rank_0_if_that_is_smaller() -> None:
    # a (rank 0) cut from b, c and d: keeping a would cost three nodes
    m = full("abcd", [("a", "b"), ("a", "c"), ("a", "d")])
    assert judge(m, list("aabbccdd")).exclude == ["a"]


def test_unknown_rows_still_count_their_columns() -> None:
    m = full("abc", [("a", "c")], one_way=True)
    m["c"] = {"a": None, "b": None}  # c's probe did not answer
    assert judge(m, list("aabbcc"), unanswered=["c"]).exclude == ["c"]


def test_the_greedy_rule_above_the_exact_size_still_leaves_a_connected_set() -> None:
    nodes = [f"n{i:02d}" for i in range(20)]
    cut = [(nodes[i], nodes[j]) for i in range(20) for j in range(i + 1, 20) if (i * j) % 7 == 3]
    out = set(to_exclude(nodes, cut, first=nodes[0]))
    assert out and all(a in out or b in out for a, b in cut)


def test_the_verdict_names_the_pairs_and_the_node() -> None:
    v = judge(full("ab", [("a", "b")]), ["a", "b"], seconds=1.25)
    assert v.reason().startswith("peer_unreachable:") and "1.2s" in v.reason()


# ---------------------------------------------------------------------------------- the probe
def test_connect_all_tells_a_listening_port_from_a_closed_one() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    closed = socket.create_server(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    try:
        got = connect_all({"up": ("127.0.0.1", server.getsockname()[1]), "gone": ("127.0.0.1", closed_port)}, 1.0)
    finally:
        server.close()
    assert got == {"up": True, "gone": False}


# ---------------------------------------------------------------------------------- the machine
def _machine(tmp_path: Path, cluster: MemoryCluster, faults: list[dict[str, Any]]) -> AttemptMachine:
    job = parse_job({
        "model": "tiny", "steps": 8, "global_batch": 12, "checkpoint_dir": str(tmp_path / "ckpt"), "min_gpus": 1,
        "checkpoint": {"min_every_steps": 1, "max_every_steps": 2},
        "runtime": {"placement_retry_s": 0.01, "placement_give_up_s": 60.0, "grow": False, "snapshots": False},
        "faults": faults,
    })
    log = EventLog()
    port = FaultInjector(cluster, FaultPlan(parse_faults(job.faults), enabled=True), log, settle_s=0.0)
    return AttemptMachine(job, port, log, name="orthoplex-t-a1")


def test_a_cut_pair_found_after_a_failure_is_declared_lost_fenced_and_replanned_around(tmp_path: Path) -> None:
    c = MemoryCluster.of(4, 4, 4)
    m = _machine(tmp_path, c, [{"kind": "hang_rank", "at_step": 3, "rank": -1}])
    asked: list[list[str]] = []
    victim: list[str] = []

    def probe(rank_nodes: Sequence[str]) -> Verdict:
        asked.append(list(rank_nodes))
        nodes = sorted(set(rank_nodes))
        victim[:] = [rank_nodes[-1]]  # the node of the last rank is cut from the node of rank 0
        return judge(full(nodes, [(rank_nodes[-1], rank_nodes[0])]), rank_nodes, seconds=0.5)

    m.peer_probe = probe
    assert m.run() is Phase.FINISHED, m.error
    events = [ev.event_from_dict(e) for e in m.log.since(0)]
    assert sorted(m.losses) == list(range(1, 9)) and c.held == {}
    (peer,) = [e for e in events if isinstance(e, ev.PeerUnreachable)]
    lost = [e for e in events if isinstance(e, ev.NodeLost)]
    assert len(asked) == 1 and peer.nodes == victim and lost[0].nodes == victim and lost[0].seq > peer.seq
    assert lost[0].reason.startswith("peer_unreachable:")
    replan = next(e for e in events if isinstance(e, ev.Replanned) and e.seq > lost[0].seq)
    assert victim[0] not in replan.nodes and replan.change["lost_nodes"] == victim
    assert fencing.current(tmp_path / "ckpt") >= 1  # the fence moved at the declaration


def test_a_failure_whose_probe_finds_every_pair_connected_is_unchanged(tmp_path: Path) -> None:
    c = MemoryCluster.of(4, 4, 4)
    m = _machine(tmp_path, c, [{"kind": "hang_rank", "at_step": 3, "rank": -1}])
    m.peer_probe = lambda rank_nodes: judge(full(sorted(set(rank_nodes))), rank_nodes)
    assert m.run() is Phase.FINISHED, m.error
    events = [ev.event_from_dict(e) for e in m.log.since(0)]
    assert not [e for e in events if isinstance(e, ev.PeerUnreachable | ev.NodeLost)]
    assert [e for e in events if isinstance(e, ev.Hang)]


class CutCluster(MemoryCluster):
    """An in-memory cluster where node1 and node2 cannot reach each other: a gang on both fails its
    rendezvous (a rank raises a store timeout; no node is dead)."""

    cut = ("node1", "node2")

    def start_gang(self, plan: Any, reservation: Any, *, on_created: Any) -> Gang:
        gang = super().start_gang(plan, reservation, on_created=on_created)
        if set(self.cut) <= set(gang.rank_nodes):
            ranks = tuple(r for r, n in enumerate(gang.rank_nodes) if n in self.cut)
            raise StartFailed(Failure("rank_failed", "rendezvous: rank raised: store client timeout",
                                      tuple(sorted(set(self.cut))), ranks, 0.0))
        return gang


def test_a_rendezvous_that_fails_across_a_cut_pair_leaves_one_node_out_and_starts_without_it(tmp_path: Path) -> None:
    c = CutCluster.of(4, 4, 4)
    m = _machine(tmp_path, c, [])
    m.peer_probe = lambda rank_nodes: judge(
        full(sorted(set(rank_nodes)), [c.cut] if set(c.cut) <= set(rank_nodes) else []), rank_nodes)
    assert m.run() is Phase.FINISHED, m.error
    events = [ev.event_from_dict(e) for e in m.log.since(0)]
    (peer,) = [e for e in events if isinstance(e, ev.PeerUnreachable)]
    assert len(peer.nodes) == 1 and peer.nodes[0] in c.cut and peer.pairs == [list(c.cut)]
    started = [e for e in events if isinstance(e, ev.RanksMapped)]
    assert not set(c.cut) <= set(started[-1].rank_to_node) and sorted(m.losses) == list(range(1, 9))


def test_a_probe_that_cannot_run_leaves_the_failure_as_it_was(tmp_path: Path) -> None:
    c = MemoryCluster.of(4, 4, 4)
    m = _machine(tmp_path, c, [{"kind": "hang_rank", "at_step": 3, "rank": -1}])

    def broken(rank_nodes: Sequence[str]) -> Verdict:
        raise RuntimeError("no worker could start")

    m.peer_probe = broken
    assert m.run() is Phase.FINISHED, m.error
    events = [ev.event_from_dict(e) for e in m.log.since(0)]
    assert [e for e in events if isinstance(e, ev.Hang)] and not [e for e in events if isinstance(e, ev.NodeLost)]
