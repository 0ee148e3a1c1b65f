"""Watching a gang of rank actors: deadlines, heartbeats, and what a failure was.

``gather`` waits for one call per rank (a step, a save, a setup) with ``ray.wait`` and a deadline.
While it waits it pings every pending rank's ``heartbeat()``; a rank that does not answer within
``heartbeat_timeout_s`` is dead or wedged. The first error ends the wait after a short grace (so
the other ranks of a dead node report too); a deadline with ranks still pending is a *hang* (a
collective that makes no progress), never waited on forever.

``classify`` turns the outcome into a :class:`Failure`: ``node_lost`` (every actor of a node died
and its raylet no longer answers, or the GCS marks the node dead), ``rank_failed`` (a process died or
raised on a live node) or ``hang``. The raylet probe matters: the GCS's health checks take seconds
to mark a crashed node dead, and a node that is still "alive" to the GCS would otherwise be
reported as a rank failure and planned onto again.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class GatherResult:
    results: dict[int, Any] = field(default_factory=dict)
    errors: dict[int, BaseException] = field(default_factory=dict)
    pending: list[int] = field(default_factory=list)
    unresponsive: list[int] = field(default_factory=list)
    timed_out: bool = False
    seconds: float = 0.0
    first_error_at: float | None = None  # time.time() of the first error seen
    hb_rtt: dict[int, float] = field(default_factory=dict)  # rank -> slowest heartbeat round trip seen
    lost_nodes: list[str] = field(default_factory=list)  # nodes the node heartbeat found down meanwhile

    @property
    def ok(self) -> bool:
        return not self.errors and not self.pending and not self.unresponsive and not self.lost_nodes


@dataclass(frozen=True)
class Failure:
    kind: str  # node_lost | rank_failed | hang
    reason: str
    nodes: tuple[str, ...] = ()
    ranks: tuple[int, ...] = ()
    detected_at: float = 0.0
    died: bool = False  # rank_failed: the rank processes died (not: raised an error)

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "reason": self.reason, "nodes": list(self.nodes), "ranks": list(self.ranks)}


def gather(
    refs: Mapping[int, Any],
    *,
    deadline_s: float,
    workers: Sequence[Any] | None = None,
    heartbeat_s: float = 2.0,
    heartbeat_timeout_s: float = 10.0,
    error_grace_s: float = 2.0,
    poll_s: float = 0.25,
    on_poll: Callable[[], None] | None = None,
    watch: NodeWatch | None = None,
) -> GatherResult:
    """Wait for ``refs`` (rank -> ObjectRef) until all are done, an error (+grace), or the deadline.
    With ``watch`` (the gang's node heartbeat) the wait ends at once when a node of a pending rank is
    found down (``lost_nodes``): no grace, no collective timeout."""
    import ray

    t0 = time.monotonic()
    out = GatherResult()
    by_ref = {ref: rank for rank, ref in refs.items()}
    remaining = list(by_ref)
    hb_refs: dict[int, tuple[Any, float]] = {}
    last_hb = t0
    stop_at = t0 + deadline_s
    while remaining:
        now = time.monotonic()
        if now >= stop_at:
            out.timed_out = out.first_error_at is None
            break
        wait_s = min(poll_s, stop_at - now)
        in_flight = [hb for hb, _ in hb_refs.values()]
        if in_flight:
            # wake when a heartbeat comes back too, so its round trip is timed at its return: timed at
            # the next poll, a 5 ms and a 200 ms round trip both read one poll (0.25-0.50 s)
            ray.wait(remaining + in_flight, num_returns=1, timeout=wait_s)
            ready, remaining = ray.wait(remaining, num_returns=len(remaining), timeout=0)
        else:
            ready, remaining = ray.wait(remaining, num_returns=len(remaining), timeout=wait_s)
        for ref in ready:
            rank = by_ref[ref]
            try:
                out.results[rank] = ray.get(ref)
            except Exception as exc:  # RayActorError, RayTaskError(...), ...
                out.errors[rank] = exc
                if out.first_error_at is None:
                    out.first_error_at = time.time()
                    stop_at = min(stop_at, time.monotonic() + error_grace_s)
        if on_poll is not None:
            on_poll()
        if watch is not None and remaining:
            down = watch.down()
            if down:
                out.lost_nodes = sorted(down)
                break
        if workers is not None and remaining:
            now = time.monotonic()
            pending_ranks = {by_ref[r] for r in remaining}
            if now - last_hb >= heartbeat_s:
                last_hb = now
                for rank in pending_ranks:
                    if rank not in hb_refs:
                        hb_refs[rank] = (workers[rank].heartbeat.remote(), now)
            for rank, (hb, sent) in list(hb_refs.items()):
                done, _ = ray.wait([hb], timeout=0)
                if done:
                    del hb_refs[rank]
                    out.hb_rtt[rank] = max(out.hb_rtt.get(rank, 0.0), time.monotonic() - sent)
                    try:
                        ray.get(hb)
                    except Exception as exc:
                        out.errors.setdefault(rank, exc)
                        if out.first_error_at is None:
                            out.first_error_at = time.time()
                            stop_at = min(stop_at, time.monotonic() + error_grace_s)
                elif now - sent > heartbeat_timeout_s and rank in pending_ranks:
                    out.unresponsive.append(rank)
                    del hb_refs[rank]
                    if out.first_error_at is None:
                        out.first_error_at = time.time()
                        stop_at = min(stop_at, time.monotonic() + error_grace_s)
    end = time.monotonic()
    for rank, (_, sent) in hb_refs.items():  # still out when the call ended: at least this long
        out.hb_rtt[rank] = max(out.hb_rtt.get(rank, 0.0), end - sent)
    out.pending = sorted(by_ref[r] for r in remaining)
    out.seconds = end - t0
    return out


def tcp_refused(address: tuple[str, int], timeout_s: float) -> bool | None:
    """``True``: connection refused (nobody listens: the process is gone); ``None``: no answer within
    ``timeout_s``; ``False``: it answered."""
    try:
        with socket.create_connection(address, timeout=timeout_s):
            return False
    except TimeoutError:
        return None
    except OSError:
        return True


class NodeWatch:
    """The heartbeat of a gang's nodes: a background thread connects to every node's raylet
    (node-manager port) every ``period_s``. A refused connection marks the node down at once (the host
    answers but no raylet listens: it crashed); a node that stays silent (every probe unanswered for
    ``silent_s``: a partitioned or powered-off host) is down too, but only then, so a short partition
    that heals is ridden out as before. A kernel accepts a TCP connection for a busy but live process,
    so load does not trip it. A crashed node is known within about ``period_s`` of its death, before
    the GCS health checks or any collective timeout."""

    def __init__(self, addresses: Mapping[str, tuple[str, int]], *, period_s: float = 0.5, timeout_s: float = 0.5,
                 silent_s: float = 15.0,
                 probe: Callable[[tuple[str, int], float], bool | None] = tcp_refused) -> None:
        self.addresses = dict(addresses)
        self.period_s, self.timeout_s, self.silent_s = period_s, timeout_s, silent_s
        self.probe = probe
        self._down: set[str] = set()
        self._silent_since: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.down_at: dict[str, float] = {}  # node -> time.time() it was found down

    def start(self) -> NodeWatch:
        if self.addresses and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="orthoplex-nodewatch", daemon=True)
            self._thread.start()
        return self

    def check_once(self) -> set[str]:
        for node, addr in self.addresses.items():
            if node in self._down:
                continue
            t = time.monotonic()
            refused = self.probe(addr, self.timeout_s)
            if refused is None:
                self._silent_since.setdefault(node, t)
            else:
                self._silent_since.pop(node, None)
            if refused or (refused is None and t - self._silent_since[node] >= self.silent_s):
                with self._lock:
                    self._down.add(node)
                    self.down_at[node] = time.time()
        return self.down()

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.check_once()

    def down(self) -> set[str]:
        with self._lock:
            return set(self._down)

    def stop(self) -> None:
        self._stop.set()


def is_actor_death(exc: BaseException) -> bool:
    from ray.exceptions import RayActorError

    return isinstance(exc, RayActorError)


def classify(
    res: GatherResult,
    rank_nodes: Sequence[str],
    *,
    alive_nodes: Callable[[], set[str]],
    confirm_s: float = 3.0,
    what: str = "step",
    unreachable: Callable[[str], bool] | None = None,
) -> Failure:
    """What went wrong in a failed ``gather`` (which must not be ``ok``)."""
    now = time.time()
    if res.lost_nodes:  # the node heartbeat saw them go: no need to wait for errors or the GCS
        lost = sorted(set(res.lost_nodes) & set(rank_nodes))
        ranks = tuple(r for r, n in enumerate(rank_nodes) if n in lost)
        if lost:
            return Failure("node_lost", f"{what}: node(s) {', '.join(x[:8] for x in lost)} stopped answering "
                           f"the node heartbeat ({len(ranks)} rank actors gone)", tuple(lost), ranks, now)
    died = sorted(r for r, e in res.errors.items() if is_actor_death(e)) + sorted(res.unresponsive)
    nodes = sorted(set(rank_nodes))
    if died or res.errors:
        # Which nodes are gone? Actor deaths name suspects; wait briefly for the GCS to agree. A
        # rank that only *raised* (peer connection closed) may also mean a peer's node died.
        suspect = sorted({rank_nodes[r] for r in died}) or nodes
        whole = [n for n in suspect if all(r in died for r, m in enumerate(rank_nodes) if m == n)]
        deadline = time.monotonic() + (confirm_s if whole or not died else 0.0)

        def gone() -> set[str]:
            out = set(suspect) - alive_nodes()
            if unreachable is not None and died:  # a rank died there: is the node's raylet still up?
                # (the node's other ranks may still be "pending" in a collective when the first
                # death is seen, so this does not wait for every rank of the node to report)
                out |= {n for n in suspect if n not in out and unreachable(n)}
            return out

        dead = gone()
        while (set(whole) - dead or (not died and not dead)) and time.monotonic() < deadline:
            time.sleep(0.1)
            dead = gone()
        lost = sorted(n for n in suspect if n in dead)
        if lost:
            ranks = tuple(r for r, n in enumerate(rank_nodes) if n in lost)
            return Failure("node_lost", f"{what}: node(s) {', '.join(x[:8] for x in lost)} dead "
                           f"({len(ranks)} rank actors gone)", tuple(lost), ranks, now)
        if died:
            return Failure("rank_failed", f"{what}: rank process(es) {died} died on live node(s)",
                           tuple(sorted({rank_nodes[r] for r in died})), tuple(died), now, died=True)
    if res.errors:
        first = min(res.errors)
        msg = str(res.errors[first]).strip().splitlines()
        detail = msg[-1][:200] if msg else type(res.errors[first]).__name__
        return Failure("rank_failed", f"{what}: rank {first} raised: {detail}",
                       tuple(sorted({rank_nodes[r] for r in res.errors})), tuple(sorted(res.errors)), now)
    if res.timed_out or res.pending:
        return Failure("hang", f"{what}: no progress within the deadline; ranks {res.pending} still pending",
                       tuple(nodes), tuple(res.pending), now)
    raise ValueError("classify() called on a successful gather")
