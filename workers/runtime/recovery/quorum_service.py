"""The replica groups' quorum service: torchft's lighthouse protocol, with the supervisor's word.

torchft's managers (``torchft.Manager``, one ``ManagerServer`` per replica group) ask a *lighthouse*
for every step's quorum over gRPC (``torchft.LighthouseService``: ``Quorum`` and ``Heartbeat``).
torchft's own ``LighthouseServer`` decides membership by heartbeats alone: a group whose node died
still counts as healthy until its last heartbeat is ``heartbeat_timeout`` old, and the survivors'
quorum for the redo of the interrupted step waits for that. It has no call to drop a replica. In the
recovery benchmark that wait was 0.45 s of a 0.81 s stall (``docs/runtime.md``), while Orthoplex's
supervisor already knew the node was gone (its node heartbeat, every 0.1 s).

:class:`QuorumLighthouse` serves the same protocol (the managers cannot tell the difference) and
forms quorums by the same rules as torchft 0.2.0's lighthouse (healthy = heartbeat newer than the
timeout; the previous quorum's members all back = a fast quorum; ``min_replicas``; more than half of
the healthy replicas; a join timeout for healthy stragglers; ``shrink_only`` keeps joiners out; the
quorum id moves when the members change or one reports commit failures), plus one call torchft
lacks: :meth:`QuorumLighthouse.forget`, with which the supervisor drops a group it found dead. A
forgotten group is unhealthy at once, its late heartbeats are ignored and its quorum requests are
refused, so the survivors' next quorum forms as soon as they ask. The lighthouse also finds dead
groups itself: while a quorum waits for a group that still looks healthy but has not asked
(:func:`stragglers`), it connects to that group's manager (the address of its last quorum request)
every ``probe_s`` and whenever a quorum request finds it pending; a refused connection (nobody
listens: the process is gone) forgets it, as the supervisor's word would. A live manager accepts the
connection however loaded its host, so a slow group is still waited for. On this host the survivors'
redo quorum formed 0.08 s after they asked when the supervisor's node heartbeat said so, 0.03-0.06 s
with the probe every 50 ms, 0.02-0.03 s with the probe at once; the manager's port closes with its
process.

The messages are torchft's (``proto/torchft.proto``, package ``torchft``), built from a descriptor
here rather than generated code; fields this module does not name pass through untouched.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

from workers.runtime.cluster.watchdog import tcp_refused

_SERVICE = "torchft.LighthouseService"


def _messages() -> dict[str, Any]:
    """torchft's lighthouse messages (the fields of ``torchft.proto`` that the service uses)."""
    F = descriptor_pb2.FieldDescriptorProto
    f = descriptor_pb2.FileDescriptorProto(name="orthoplex/torchft_lighthouse.proto", package="torchft",
                                           syntax="proto3", dependency=["google/protobuf/timestamp.proto"])

    def msg(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        m = f.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            fd = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                fd.type_name = type_name

    one, many = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    msg("QuorumMember", ("replica_id", 1, F.TYPE_STRING, one, ""), ("address", 2, F.TYPE_STRING, one, ""),
        ("store_address", 3, F.TYPE_STRING, one, ""), ("step", 4, F.TYPE_INT64, one, ""),
        ("world_size", 5, F.TYPE_UINT64, one, ""), ("shrink_only", 6, F.TYPE_BOOL, one, ""),
        ("data", 7, F.TYPE_STRING, one, ""), ("commit_failures", 8, F.TYPE_INT64, one, ""))
    msg("Quorum", ("quorum_id", 1, F.TYPE_INT64, one, ""),
        ("participants", 2, F.TYPE_MESSAGE, many, ".torchft.QuorumMember"),
        ("created", 3, F.TYPE_MESSAGE, one, ".google.protobuf.Timestamp"))
    msg("LighthouseQuorumRequest", ("requester", 1, F.TYPE_MESSAGE, one, ".torchft.QuorumMember"))
    msg("LighthouseQuorumResponse", ("quorum", 1, F.TYPE_MESSAGE, one, ".torchft.Quorum"))
    msg("LighthouseHeartbeatRequest", ("replica_id", 1, F.TYPE_STRING, one, ""))
    msg("LighthouseHeartbeatResponse")
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(f)
    return {m.name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"torchft.{m.name}"))
            for m in f.message_type}


MSG = _messages()


def replica_name(replica_id: str) -> str:
    """A torchft replica id without the uuid its ``Manager`` appends (``rg3:4f1c...`` -> ``rg3``)."""
    return replica_id.split(":", 1)[0]


@dataclass
class Joined:
    at: float  # time.monotonic() of the request
    member: Any  # torchft.QuorumMember


@dataclass
class QuorumState:
    """What the quorum rules look at (one lock guards it in :class:`QuorumLighthouse`)."""

    heartbeats: dict[str, float] = field(default_factory=dict)  # replica id -> last heartbeat (monotonic)
    participants: dict[str, Joined] = field(default_factory=dict)  # asked for the next quorum
    prev: Any = None  # the last quorum formed (torchft.Quorum)
    quorum_id: int = 0
    forgotten: set[str] = field(default_factory=set)  # replica names the supervisor dropped: never healthy again
    addresses: dict[str, str] = field(default_factory=dict)  # replica id -> its manager's address (last request)

    def dropped(self, replica_id: str) -> bool:
        return replica_name(replica_id) in self.forgotten


@dataclass(frozen=True)
class QuorumRules:
    min_replicas: int = 1
    join_timeout_s: float = 60.0
    heartbeat_timeout_s: float = 5.0


def compute_quorum(now: float, st: QuorumState, rules: QuorumRules) -> tuple[list[Any] | None, str]:
    """The members of the quorum that can form now (sorted by replica id), or None; and why.

    torchft 0.2.0's lighthouse rules, with a forgotten replica never healthy."""
    healthy = {r for r, t in st.heartbeats.items() if now - t < rules.heartbeat_timeout_s and not st.dropped(r)}
    joined = {r: j for r, j in st.participants.items() if r in healthy}
    members = [joined[r].member for r in sorted(joined)]
    shrink_only = any(j.member.shrink_only for j in joined.values())
    why = f"[{len(joined)}/{len(st.participants)} participants healthy][{len(healthy)} heartbeating]" \
          f"[shrink_only={shrink_only}]"
    if st.prev is not None:
        before = {p.replica_id for p in st.prev.participants}
        if shrink_only:
            members = [m for m in members if m.replica_id in before]
        if before and before <= set(joined):
            return members, f"fast quorum {why}"
    if len(joined) < rules.min_replicas:
        return None, f"only {len(joined)} participants, need min_replicas {rules.min_replicas} {why}"
    if len(joined) <= len(healthy) // 2:
        return None, f"only {len(joined)} participants, need more than half of {len(healthy)} healthy {why}"
    first = min((j.at for j in joined.values()), default=now)
    if len(joined) < len(healthy) and now - first < rules.join_timeout_s:
        return None, f"waiting for {len(healthy) - len(joined)} healthy stragglers (join timeout) {why}"
    return members, f"valid quorum {why}"


def stragglers(now: float, st: QuorumState, rules: QuorumRules) -> dict[str, str]:
    """The replicas a pending quorum waits for: healthy (heartbeat newer than the timeout, not
    forgotten) but not asking, with their managers' addresses (those known: a replica that asked for a
    quorum before). Empty while no quorum is pending."""
    if not st.participants:
        return {}
    return {r: st.addresses[r] for r, t in st.heartbeats.items()
            if now - t < rules.heartbeat_timeout_s and not st.dropped(r) and r not in st.participants
            and r in st.addresses}


def manager_host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a manager address (``http://host:port``); ``None`` if it names no port."""
    try:
        parts = urlsplit(address)
        return (parts.hostname, parts.port) if parts.hostname and parts.port else None
    except ValueError:
        return None


class QuorumLighthouse:
    """A lighthouse the supervisor hosts (see the module docstring). ``address()`` is what the
    managers get as ``lighthouse_addr``; :meth:`forget` drops dead groups; :meth:`shutdown` stops it."""

    def __init__(self, *, min_replicas: int = 1, join_timeout_s: float = 60.0, heartbeat_timeout_s: float = 5.0,
                 tick_s: float = 0.1, bind: str = "[::]:0", workers: int = 32, probe_s: float = 0.05,
                 probe: Callable[[tuple[str, int], float], bool | None] = tcp_refused) -> None:
        self.rules = QuorumRules(min_replicas, join_timeout_s, heartbeat_timeout_s)
        self.state = QuorumState()
        self.formed = 0  # quorums formed so far
        self.recent: deque[tuple[int, Any]] = deque(maxlen=64)  # (number, torchft.Quorum), the last ones
        # (time.time(), reason) whenever the reason changed: the last ones (a job forms a quorum per step)
        self.log: deque[tuple[float, str]] = deque(maxlen=256)
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._probe_now = threading.Event()  # a quorum request is pending: probe its stragglers at once
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lighthouse"))
        handlers = {
            "Quorum": grpc.unary_unary_rpc_method_handler(
                self._quorum, request_deserializer=MSG["LighthouseQuorumRequest"].FromString,
                response_serializer=MSG["LighthouseQuorumResponse"].SerializeToString),
            "Heartbeat": grpc.unary_unary_rpc_method_handler(
                self._heartbeat, request_deserializer=MSG["LighthouseHeartbeatRequest"].FromString,
                response_serializer=MSG["LighthouseHeartbeatResponse"].SerializeToString),
        }
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, handlers),))
        self.port = self._server.add_insecure_port(bind)
        if not self.port:
            raise OSError(f"lighthouse: cannot bind {bind}")
        self._server.start()
        self._ticker = threading.Thread(target=self._tick_loop, args=(tick_s,), daemon=True, name="lighthouse-tick")
        self._ticker.start()
        self._prober = threading.Thread(target=self._probe_loop, args=(probe_s, probe), daemon=True,
                                        name="lighthouse-probe")
        self._prober.start()

    def address(self) -> str:
        return f"http://{socket.gethostname()}:{self.port}"

    # ------------------------------------------------------------------ the supervisor's word
    def forget(self, names: Iterable[str]) -> None:
        """Drop the replicas the supervisor found dead (by name: the replica id a ``Manager`` was
        given, before its uuid): unhealthy from now on, whatever they send."""
        with self._cond:
            self.state.forgotten |= set(names)
            for table in (self.state.heartbeats, self.state.participants, self.state.addresses):
                for r in [r for r in table if self.state.dropped(r)]:
                    del table[r]
            self._tick()

    # ------------------------------------------------------------------ the protocol
    def _heartbeat(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self._cond:
            if not self.state.dropped(request.replica_id):
                self.state.heartbeats[request.replica_id] = time.monotonic()
        return MSG["LighthouseHeartbeatResponse"]()

    def _quorum(self, request: Any, context: grpc.ServicerContext) -> Any:
        if not request.HasField("requester"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "missing requester")
        me = request.requester
        with self._cond:
            seen = self.formed
            while True:
                if self.state.dropped(me.replica_id):
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                  f"replica {me.replica_id} was dropped by the supervisor")
                now = time.monotonic()
                self.state.heartbeats[me.replica_id] = now  # asking is a heartbeat
                self.state.addresses[me.replica_id] = me.address
                self.state.participants[me.replica_id] = Joined(now, me)
                self._tick()
                if self.formed == seen:  # pending: a dead straggler is found now, not a probe period later
                    self._probe_now.set()
                while self.formed == seen:
                    if not context.is_active() or self._stop.is_set():
                        self.state.participants.pop(me.replica_id, None)
                        context.abort(grpc.StatusCode.CANCELLED, "quorum request cancelled")
                    self._cond.wait(0.1)
                    if self.state.dropped(me.replica_id):
                        break
                for n, q in self.recent:
                    if n > seen and any(p.replica_id == me.replica_id for p in q.participants):
                        return MSG["LighthouseQuorumResponse"](quorum=q)
                seen = self.formed  # formed without this replica: ask again for the next one

    def _tick(self) -> None:
        """Form a quorum if the rules allow (the caller holds the lock)."""
        members, why = compute_quorum(time.monotonic(), self.state, self.rules)
        if not self.log or self.log[-1][1] != why:
            self.log.append((time.time(), why))
        if members is None:
            return
        st = self.state
        before = [p.replica_id for p in st.prev.participants] if st.prev is not None else None
        if before != [m.replica_id for m in members] or any(m.commit_failures > 0 for m in members):
            st.quorum_id += 1
        q = MSG["Quorum"](quorum_id=st.quorum_id, participants=members)
        q.created.GetCurrentTime()
        st.prev = q
        st.participants.clear()
        self.formed += 1
        self.recent.append((self.formed, q))
        self._cond.notify_all()

    def _tick_loop(self, tick_s: float) -> None:
        while not self._stop.wait(tick_s):
            with self._cond:
                if self.state.participants:
                    self._tick()

    def _probe_loop(self, period_s: float, probe: Callable[[tuple[str, int], float], bool | None]) -> None:
        """Forget a straggler whose manager refuses a connection (see the module docstring): every
        ``period_s``, and at once when a quorum request finds the quorum pending (the redo of an
        interrupted step: its survivors ask within a few milliseconds of each other, and the dead
        group is the one straggler; waiting for the period cost up to ``period_s`` of their stall)."""
        while not self._stop.is_set():
            self._probe_now.wait(period_s)
            self._probe_now.clear()
            if self._stop.is_set():
                return
            with self._cond:
                waiting = stragglers(time.monotonic(), self.state, self.rules)
            dead = sorted(r for r, addr in waiting.items()
                          if (hp := manager_host_port(addr)) is not None and probe(hp, period_s) is True)
            if dead:
                with self._cond:
                    self.log.append((time.time(), f"the manager of {dead} refused a connection: forgotten"))
                self.forget(replica_name(r) for r in dead)

    def shutdown(self) -> None:
        self._stop.set()
        self._probe_now.set()
        with self._cond:
            self._cond.notify_all()
        self._server.stop(grace=0.5).wait(2.0)
