"""Which nodes of a gang reach each other, and which to leave out when some pairs cannot.

A node cut from *some* peers only (``netfaults.partition(node, peers=[...])``) still answers the
head: its raylet passes the GCS's health checks and the node heartbeat, so it is never ``node_lost``;
its ranks only *raise* (gloo: connection closed, reset or timed out, within
``collective_timeout_s``), and an error a rank raised blames no node. Restarting on the same nodes
then fails at rendezvous for as long as the cut lasts.

So after a failure without a dead node the supervisor asks each node of the gang, by a small Ray
task pinned to it (``NodeAffinitySchedulingStrategy``, zero CPUs), to open a TCP connection to every
other node's raylet (its node-manager port, which listens on the address the ranks use), all in
parallel with a short timeout: a :data:`Matrix` ``reach[src][dst]``. A pair is *cut* when either
direction failed; a node whose task did not answer has an unknown row (its column still counts).

:func:`to_exclude` then picks the nodes to leave out: the smallest set whose removal leaves every
remaining pair connected (a minimum vertex cover of the cut pairs, tried exhaustively up to
:data:`EXACT_UP_TO` nodes, greedily above), ties broken by, in order: keep the node of rank 0, remove
the fewest ranks, remove the node with the larger id (deterministic). Pure Python and small; the Ray
part is :class:`RayPeerProbe`.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workers.runtime.cluster.watchdog import tcp_refused

#: ``reach[src][dst]``: ``True`` connected, ``False`` refused or no answer, ``None`` not probed
Matrix = dict[str, dict[str, bool | None]]

#: exhaustive search of the smallest cover up to this many nodes with a cut pair (2^n subsets)
EXACT_UP_TO = 16


def connect_all(targets: Mapping[str, tuple[str, int]], timeout_s: float) -> dict[str, bool]:
    """Run on a node: try every target at once; node -> connected. Takes at most about ``timeout_s``."""
    out: dict[str, bool] = {}
    lock = threading.Lock()

    def one(node: str, addr: tuple[str, int]) -> None:
        ok = tcp_refused(addr, timeout_s) is False  # refused, unreachable or silent: not connected
        with lock:
            out[node] = ok

    threads = [threading.Thread(target=one, args=(n, tuple(a)), daemon=True) for n, a in targets.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 1.0)
    return {n: out.get(n, False) for n in targets}


def cut_pairs(matrix: Matrix) -> list[tuple[str, str]]:
    """The unordered pairs (sorted, each once) of which at least one direction failed."""
    pairs: set[tuple[str, str]] = set()
    for src, row in matrix.items():
        for dst, ok in row.items():
            if ok is False and src != dst:
                a, b = sorted((src, dst))
                pairs.add((a, b))
    return sorted(pairs)


def to_exclude(nodes: Sequence[str], cut: Iterable[tuple[str, str]], *, ranks: Mapping[str, int] | None = None,
               first: str | None = None) -> list[str]:
    """The nodes to leave out so that every remaining pair of ``nodes`` is connected.

    ``cut``: the pairs that cannot connect; ``ranks``: node -> how many of the job's ranks it hosts;
    ``first``: the node of rank 0. The smallest such set; among sets of that size, the one without
    ``first``, then the one removing the fewest ranks, then the one whose sorted ids compare larger
    (so the result never depends on the order of ``nodes``). Empty when no pair is cut."""
    edges = {tuple(sorted(p)) for p in cut if p[0] != p[1] and p[0] in nodes and p[1] in nodes}
    if not edges:
        return []
    ranks = ranks or {}
    involved = sorted({n for e in edges for n in e})

    def key(removed: tuple[str, ...]) -> tuple[int, int, int, list[str]]:
        return (len(removed), int(first in removed), sum(ranks.get(n, 0) for n in removed),
                [_neg(n) for n in sorted(removed, reverse=True)])

    def covers(removed: set[str]) -> bool:
        return all(a in removed or b in removed for a, b in edges)

    if len(involved) <= EXACT_UP_TO:
        for size in range(1, len(involved) + 1):
            found = [c for c in itertools.combinations(involved, size) if covers(set(c))]
            if found:
                return sorted(min(found, key=key))
    removed: set[str] = set()  # greedy: the node on most remaining cut pairs, ties as above
    left = set(edges)
    while left:
        degree = {n: sum(n in e for e in left) for n in involved if n not in removed}
        node = min(degree, key=lambda n: (-degree[n], int(n == first), ranks.get(n, 0), _neg(n)))
        removed.add(node)
        left = {e for e in left if node not in e}
    return sorted(removed)


def _neg(node: str) -> tuple[int, ...]:
    """Sorts node ids in reverse (larger ids first), for the last tie-break."""
    return tuple(-ord(c) for c in node)


@dataclass
class Verdict:
    """What one probe found: the matrix, the cut pairs, the nodes to leave out and how long it took."""

    matrix: Matrix
    cut: list[tuple[str, str]]
    exclude: list[str]
    seconds: float
    unanswered: list[str] = field(default_factory=list)  # nodes whose probe task did not answer

    def reason(self) -> str:
        pairs = ", ".join(f"{a[:8]}x{b[:8]}" for a, b in self.cut)
        left = ", ".join(n[:8] for n in self.exclude)
        return (f"peer_unreachable: node pair(s) {pairs} cannot connect while both answer the head; "
                f"leaving out {left} (probe {self.seconds:.1f}s)")


def judge(matrix: Matrix, rank_nodes: Sequence[str], seconds: float = 0.0,
          unanswered: Sequence[str] = ()) -> Verdict:
    """The :class:`Verdict` for ``matrix`` over a gang whose rank ``r`` runs on ``rank_nodes[r]``."""
    nodes = sorted(set(rank_nodes))
    counts = {n: sum(1 for m in rank_nodes if m == n) for n in nodes}
    cut = cut_pairs(matrix)
    first = rank_nodes[0] if rank_nodes else None
    return Verdict(matrix, cut, to_exclude(nodes, cut, ranks=counts, first=first), seconds, sorted(unanswered))


#: what the state machine calls: the gang's rank -> node list in, a verdict (or None: nothing probed) out
PeerProbe = Callable[[Sequence[str]], Verdict | None]


class RayPeerProbe:
    """Probes a gang's nodes over Ray: one zero-CPU task pinned to each node connects to every other
    node's raylet. ``connect_timeout_s`` per connection (all at once), ``timeout_s`` for the whole
    probe (a node whose task has not answered by then has an unknown row)."""

    def __init__(self, *, connect_timeout_s: float = 1.5, timeout_s: float = 20.0) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.timeout_s = timeout_s

    def __call__(self, rank_nodes: Sequence[str]) -> Verdict | None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from workers.runtime.cluster.placement_groups import raylet_addresses

        t0 = time.monotonic()
        addresses = raylet_addresses(rank_nodes)
        if len(addresses) < 2:
            return None
        task = ray.remote(num_cpus=0, max_retries=0)(connect_all)
        refs: dict[Any, str] = {}
        for node in addresses:
            targets = {n: a for n, a in addresses.items() if n != node}
            strategy = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
            refs[task.options(scheduling_strategy=strategy).remote(targets, self.connect_timeout_s)] = node
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=self.timeout_s)
        matrix: Matrix = {n: {m: None for m in addresses if m != n} for n in addresses}
        for ref in ready:
            try:
                matrix[refs[ref]].update(ray.get(ref))
            except Exception:  # the task failed: an unknown row
                continue
        unanswered = [n for n, row in matrix.items() if all(v is None for v in row.values())]
        return judge(matrix, rank_nodes, time.monotonic() - t0, unanswered)
