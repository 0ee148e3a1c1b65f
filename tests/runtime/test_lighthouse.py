"""The replica groups' quorum service (``workers.runtime.recovery.quorum_service``): torchft 0.2.0's lighthouse
rules, checked pure, and the gRPC protocol, checked with torchft's own client (the Rust one its
managers use), plus the one thing torchft's lighthouse cannot do: drop a replica the supervisor
found dead, so the survivors' quorum does not wait for its heartbeat to time out."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest

from workers.runtime.recovery.quorum_service import (
    MSG,
    Joined,
    QuorumLighthouse,
    QuorumRules,
    QuorumState,
    compute_quorum,
    manager_host_port,
    stragglers,
)

RULES = QuorumRules(min_replicas=1, join_timeout_s=60.0, heartbeat_timeout_s=5.0)


def member(rid: str, *, step: int = 1, shrink_only: bool = False) -> Any:
    return MSG["QuorumMember"](replica_id=rid, address=f"http://{rid}", store_address="s:1", step=step,
                               world_size=1, shrink_only=shrink_only)


def state(beating: list[str], asking: list[str], prev: list[str] | None = None, *, now: float = 100.0,
          shrink_only: bool = False) -> QuorumState:
    st = QuorumState(heartbeats=dict.fromkeys(beating, now))
    st.participants = {r: Joined(now, member(r, shrink_only=shrink_only)) for r in asking}
    if prev is not None:
        st.prev = MSG["Quorum"](quorum_id=1, participants=[member(r) for r in prev])
    return st


def ids(members: list[Any] | None) -> list[str] | None:
    return None if members is None else [m.replica_id for m in members]


def test_rules_match_torchft_lighthouse() -> None:
    # everyone healthy asked: a quorum, sorted by replica id
    got, why = compute_quorum(100.0, state(["b", "a"], ["b", "a"]), RULES)
    assert ids(got) == ["a", "b"], why
    # a healthy replica has not asked yet: wait for it until the join timeout
    st = state(["a", "b", "c"], ["a", "b"])
    assert compute_quorum(100.0, st, RULES)[0] is None
    assert "join timeout" in compute_quorum(100.0, st, RULES)[1]
    later = 100.0 + RULES.join_timeout_s
    st.heartbeats = dict.fromkeys(st.heartbeats, later)  # all still heartbeating
    assert ids(compute_quorum(later, st, RULES)[0]) == ["a", "b"]
    st.heartbeats = dict.fromkeys(st.heartbeats, 100.0)
    # a silent replica stops counting once its heartbeat is older than the timeout
    st.heartbeats["c"] = 100.0 - RULES.heartbeat_timeout_s
    assert ids(compute_quorum(100.0, st, RULES)[0]) == ["a", "b"]
    # split brain: no more than half of the healthy replicas cannot form a quorum
    got, why = compute_quorum(100.0, state(["a", "b"], ["a"]), RULES)
    assert got is None and "more than half" in why
    # min_replicas
    got, why = compute_quorum(100.0, state(["a"], ["a"]), QuorumRules(min_replicas=2))
    assert got is None and "min_replicas" in why
    # fast quorum: every member of the previous quorum asked (a healthy newcomer is not waited for)
    assert ids(compute_quorum(100.0, state(["a", "b", "c"], ["a", "b"], prev=["a", "b"]), RULES)[0]) == ["a", "b"]
    # shrink_only keeps a newcomer out of the quorum
    got, _ = compute_quorum(100.0, state(["a", "c"], ["a", "c"], prev=["a", "b"], shrink_only=True), RULES)
    assert ids(got) == ["a"]


def test_a_forgotten_replica_is_never_healthy() -> None:
    st = state(["rg0:u0", "rg1:u1", "rg2:u2"], ["rg0:u0", "rg1:u1"], prev=["rg0:u0", "rg1:u1", "rg2:u2"],
               shrink_only=True)
    assert compute_quorum(100.0, st, RULES)[0] is None  # the dead group still heartbeats (fresh): wait
    st.forgotten.add("rg2")  # the supervisor's word, by name (any uuid the manager appended)
    got, why = compute_quorum(100.0, st, RULES)
    assert ids(got) == ["rg0:u0", "rg1:u1"], why
    assert "[2 heartbeating]" in why


def test_stragglers_are_the_healthy_replicas_a_pending_quorum_waits_for() -> None:
    st = state(["a", "b", "c", "d"], [], prev=["a", "b", "c"])
    st.addresses = {r: f"http://h:{i + 1}" for i, r in enumerate("abc")}
    assert stragglers(100.0, st, RULES) == {}  # no quorum pending
    st.participants = {r: Joined(100.0, member(r)) for r in ("a", "b")}
    assert stragglers(100.0, st, RULES) == {"c": "http://h:3"}  # d: no address known (never asked)
    st.heartbeats["c"] = 100.0 - RULES.heartbeat_timeout_s  # silent: no longer waited for
    assert stragglers(100.0, st, RULES) == {}
    st.heartbeats["c"] = 100.0
    st.forgotten.add("c")
    assert stragglers(100.0, st, RULES) == {}
    assert manager_host_port("http://node-1:29510") == ("node-1", 29510)
    assert manager_host_port("http://[::1]:7") == ("::1", 7)
    assert manager_host_port("http://rg2:c") is None and manager_host_port("") is None


@contextmanager
def _two_live_one_dead(**lighthouse_kw: Any) -> Iterator[tuple[QuorumLighthouse, Any, dict[str, str]]]:
    """A lighthouse and torchft's client, three groups that formed their first quorum together: rg0
    and rg1, whose managers listen (their processes are alive; a quorum request probes the
    stragglers at once, so whichever of them asks first has the other probed before it asks), and
    rg2, whose manager's port refuses connections (its process died). Yields (lighthouse, client,
    manager addresses)."""
    import socket

    from torchft._torchft import LighthouseClient

    live = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    gone = socket.create_server(("127.0.0.1", 0))
    gone_port = gone.getsockname()[1]
    gone.close()  # its process died: connections are refused
    lh = QuorumLighthouse(min_replicas=1, join_timeout_s=600.0, heartbeat_timeout_s=600.0, tick_s=0.05,
                          **lighthouse_kw)
    try:
        client = LighthouseClient(lh.address(), timedelta(seconds=10))
        addr = {"rg0:a": f"http://127.0.0.1:{live[0].getsockname()[1]}",
                "rg1:b": f"http://127.0.0.1:{live[1].getsockname()[1]}",
                "rg2:c": f"http://127.0.0.1:{gone_port}"}
        for rid in addr:
            client.heartbeat(rid)
        first = _ask_all(client, list(addr), step=1, addresses=addr)
        assert set(first.values()) == {(1, ("rg0:a", "rg1:b", "rg2:c"))}, first
        yield lh, client, addr
    finally:
        lh.shutdown()
        for sock in live:
            sock.close()


def test_a_straggler_whose_manager_refuses_connections_is_forgotten_and_a_live_one_waited_for() -> None:
    """The lighthouse finds a dead group itself (its manager's port closed with its process): the
    survivors' redo forms without it, no supervisor's word and no timeout; a live straggler, whose
    manager accepts, is still waited for."""
    with _two_live_one_dead() as (lh, client, addr):
        # rg2 died: the others' shrink-only redo forms without it
        redo = _ask_all(client, ["rg0:a", "rg1:b"], step=1, shrink_only=True, addresses=addr)
        assert set(redo.values()) == {(2, ("rg0:a", "rg1:b"))}, redo
        assert lh.state.forgotten == {"rg2"}
        assert any("rg2:c" in why and "refused" in why for _, why in lh.log), list(lh.log)
        # rg1 is slow but alive: rg0's quorum waits for it (its manager accepts the probe)
        waited: list[str] = []

        def later() -> None:
            threading.Event().wait(0.6)
            waited.append(lh.log[-1][1])
            _ask_all(client, ["rg1:b"], step=2, addresses=addr)

        again = _ask_all(client, ["rg0:a"], step=2, addresses=addr, before_join=later)
        assert again == {"rg0:a": (2, ("rg0:a", "rg1:b"))}, again
        assert "[2 heartbeating]" in waited[0] and lh.state.forgotten == {"rg2"}, waited  # rg1 waited for


def test_a_pending_quorum_probes_its_stragglers_at_once_not_a_probe_period_later() -> None:
    """The survivors' redo quorum does not wait for the prober's period: a quorum request that finds
    the quorum pending triggers the probe. The period here (an hour) is far beyond the test, so a
    quorum without the dead group can only come from that probe."""
    with _two_live_one_dead(probe_s=3600.0) as (lh, client, addr):
        redo = _ask_all(client, ["rg0:a", "rg1:b"], step=1, shrink_only=True, addresses=addr)
        assert set(redo.values()) == {(2, ("rg0:a", "rg1:b"))}, redo
        assert lh.state.forgotten == {"rg2"}


@pytest.fixture
def lighthouse() -> Any:
    # join and heartbeat timeouts far longer than the test: a quorum without a live-looking replica
    # can only come from the supervisor's word
    lh = QuorumLighthouse(min_replicas=1, join_timeout_s=600.0, heartbeat_timeout_s=600.0, tick_s=0.05)
    yield lh
    lh.shutdown()


def _ask_all(client: Any, rids: list[str], *, step: int, shrink_only: bool = False,
             before_join: Any = None, addresses: dict[str, str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def ask(rid: str) -> None:
        try:
            q = client.quorum(replica_id=rid, timeout=timedelta(seconds=60),
                              address=(addresses or {}).get(rid, f"http://{rid}"),
                              store_address="s:1", step=step, world_size=1, shrink_only=shrink_only)
            out[rid] = (q.quorum_id, tuple(p.replica_id for p in q.participants))
        except Exception as exc:
            out[rid] = exc

    threads = [threading.Thread(target=ask, args=(r,)) for r in rids]
    for t in threads:
        t.start()
    if before_join is not None:
        before_join()
    for t in threads:
        t.join(120)
    return out


def test_torchft_client_quorums_and_the_supervisors_word(lighthouse: QuorumLighthouse) -> None:
    from torchft._torchft import LighthouseClient

    client = LighthouseClient(lighthouse.address(), timedelta(seconds=10))
    for rid in ("rg0:a", "rg1:b", "rg2:c"):
        client.heartbeat(rid)
    first = _ask_all(client, ["rg0:a", "rg1:b", "rg2:c"], step=1)
    assert set(first.values()) == {(1, ("rg0:a", "rg1:b", "rg2:c"))}, first

    # group 2 dies; the survivors' redo (shrink-only) waits while it still looks alive, and forms
    # without it once the supervisor says it is gone
    waited: list[str] = []

    def supervisor() -> None:
        threading.Event().wait(0.3)
        waited.append(lighthouse.log[-1][1])
        lighthouse.forget(["rg2"])

    redo = _ask_all(client, ["rg0:a", "rg1:b"], step=1, shrink_only=True, before_join=supervisor)
    assert set(redo.values()) == {(2, ("rg0:a", "rg1:b"))}, redo
    assert "waiting for 1 healthy stragglers" in waited[0], waited

    # the dead group's late heartbeat is ignored and its quorum request refused, with a reason
    client.heartbeat("rg2:c")
    assert "rg2:c" not in lighthouse.state.heartbeats
    with pytest.raises(RuntimeError, match="dropped by the supervisor"):
        client.quorum(replica_id="rg2:c", timeout=timedelta(seconds=10), step=1, world_size=1)

    # the same members again: the quorum id stays (torchft's managers read a change from it)
    again = _ask_all(client, ["rg0:a", "rg1:b"], step=2)
    assert set(again.values()) == {(2, ("rg0:a", "rg1:b"))}, again
    # a replacement that asked first joins the next quorum (not shrink-only): a new id. (One that asks
    # after the live groups is not waited for: they form a fast quorum, as torchft's lighthouse does.)
    def then_the_live_groups() -> None:
        for _ in range(600):
            if "rg3:d" in lighthouse.state.participants:
                break
            threading.Event().wait(0.05)
        _ask_all(client, ["rg0:a", "rg1:b"], step=3)

    late = _ask_all(client, ["rg3:d"], step=0, before_join=then_the_live_groups)
    assert set(late.values()) == {(3, ("rg0:a", "rg1:b", "rg3:d"))}, late


def test_quorum_request_without_requester_is_refused(lighthouse: QuorumLighthouse) -> None:
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{lighthouse.port}") as channel:
        call = channel.unary_unary("/torchft.LighthouseService/Quorum",
                                   request_serializer=MSG["LighthouseQuorumRequest"].SerializeToString,
                                   response_deserializer=MSG["LighthouseQuorumResponse"].FromString)
        with pytest.raises(grpc.RpcError) as err:
            call(MSG["LighthouseQuorumRequest"](), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "missing requester" in err.value.details()
