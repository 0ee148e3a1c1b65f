"""Replica groups in the Ray runtime (runtime option ``replica_groups``, issue #14).

A job with ``replica_groups: R >= 2`` runs R *replica groups*, each a gang of rank actors holding a
full copy of the model in any layout (the layout hint: TP x PP x CP x DP with ZeRO/FSDP inside the
group), on one node, or on several when the layout needs more GPUs than a node has (one placement
group per group either way), with torchft between
the groups (``workers.engine.replica_ft.ReplicaStepper``: a per-step quorum on a lighthouse the
cluster port hosts, a fault-tolerant gloo process group across the groups, the step's micro-batches
split among the groups of the quorum so the global batch is kept, healing from a live peer).

:class:`ReplicaSet` is the attempt machine's book of the groups: which group runs on which gang,
the combined view a step is gathered over (one ``Gang`` whose ranks are every live group's ranks,
group-major), which groups a failure hit, and the replacement groups starting in the background
(through the same ``ClusterPort``) while the survivors keep stepping. A replacement joins at the
next step boundary after its actors are up: its first quorum heals it from a peer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from planner.layout import Layout
from workers.runtime.cluster.gang import Gang, StartFailed
from workers.runtime.cluster.ranks import RankMap
from workers.runtime.cluster.watchdog import Failure


@dataclass(frozen=True)
class ReplicaGroupPlan:
    """What ``ClusterPort.start_gang`` starts for one replica group (a plan of the group's ranks on
    ``spot``: node -> GPUs)."""

    layout: Layout
    replica_group: int
    spot: tuple[tuple[str, int], ...]
    min_replicas: int = 1

    @property
    def node(self) -> str:
        return self.spot[0][0]

    @property
    def num_gpus(self) -> int:
        return self.layout.world_size

    @property
    def shares_epoch(self) -> bool:
        """Every group but the first joins the fence epoch group 0 started (``gang.start_gang``)."""
        return self.replica_group != 0

    @property
    def nodes_used(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.spot)


class _AnyDown:
    """The node heartbeat of several gangs as one (what ``watchdog.gather`` asks: ``down()``)."""

    def __init__(self, watches: list[Any]) -> None:
        self.watches = [w for w in watches if w is not None]

    def down(self) -> set[str]:
        out: set[str] = set()
        for w in self.watches:
            out |= w.down()
        return out


@dataclass
class _Joining:
    group: int
    spot: dict[str, int]
    t0: float
    gang: Gang | None = None
    error: str = ""
    done: bool = False
    stepping: bool = False  # started, in its first step (waiting for the live groups' quorum)
    first: dict[int, Any] = field(default_factory=dict)  # rank -> its first (healed) step's row
    lost_nodes: list[str] = field(default_factory=list)  # its node heartbeat found these down (kept out after)

    @property
    def node(self) -> str:
        return next(iter(self.spot))


@dataclass
class ReplicaSet:
    """The live replica groups of one job, and the replacements starting."""

    layout: Layout  # one group's layout (tp ranks)
    want: int  # groups asked for
    name: str
    groups: dict[int, Gang] = field(default_factory=dict)
    next_id: int = 0
    joining: dict[int, _Joining] = field(default_factory=dict)  # started, not yet in the step set
    last_try: float = 0.0
    first_step_s: float = 120.0  # a replacement's first step (its quorum wait and the healing) must end by then
    dropped: list[dict[str, Any]] = field(default_factory=list)
    at_end: list[int] | None = None  # the live groups when the job ended (before the tear-down)
    raised: dict[int, int] = field(default_factory=dict)  # group -> attempts in a row in which a rank raised
    fruitless: int = 0  # gathers in a row in which no group committed
    excused: set[int] = field(default_factory=set)  # stepping with a group when it was lost: raises not held
    # against them until a step commits again (``raised_to_drop``)
    history: dict[int, dict[str, Any]] = field(default_factory=dict)  # group -> what it did (summary)
    lock: threading.Lock = field(default_factory=threading.Lock)

    # ------------------------------------------------------------------ placement
    def gpus_per_node(self) -> dict[str, int]:
        """The GPUs the job holds per node: every live group's and every starting replacement's
        (what the control plane records as the job's placement)."""
        out: dict[str, int] = {}
        with self.lock:
            for gang in self.groups.values():
                for n in gang.rank_nodes:
                    out[n] = out.get(n, 0) + 1
            for j in self.joining.values():
                for n, k in j.spot.items():
                    out[n] = out.get(n, 0) + int(k)
        return out

    def plan(self, group: int, spot: dict[str, int]) -> ReplicaGroupPlan:
        return ReplicaGroupPlan(self.layout, group, tuple(spot.items()))

    def pick_spots(self, port: Any, n: int, exclude: set[str]) -> list[dict[str, int]]:
        """Where up to ``n`` new groups go (node -> GPUs each): a node of its own per group while nodes
        holding no group are left (a node death then takes one group at most), then the freest node
        with the group's GPUs free, even one holding a group (a job granted one node's GPUs runs all
        its groups there); a group whose layout needs more GPUs than any node has spans nodes (the
        fewest: the freest first, nodes holding no group first)."""
        world = self.layout.world_size
        with self.lock:
            busy = {n for g in self.groups.values() for n in g.rank_nodes} | \
                {n for j in self.joining.values() for n in j.spot}
        views = port.nodes(exclude=exclude)
        free = {v.id: v.free_gpus for v in views}
        spans = views and all(v.gpus < world for v in views)
        out: list[dict[str, int]] = []
        taken: set[str] = set()

        def first(v: Any) -> tuple[bool, int, str]:  # a node holding no group, then the freest
            return v.id in busy or v.id in taken, -free[v.id], v.id

        while len(out) < n:
            spot: dict[str, int] = {}
            if not spans:
                # several groups on one node rather than fewer groups than the job's GPUs hold
                one = min((v for v in views if free[v.id] >= world), key=first, default=None)
                if one is None:
                    break
                spot = {one.id: world}
            else:
                need = world
                for v in sorted(views, key=first):
                    if need and free[v.id] > 0:
                        spot[v.id] = min(free[v.id], need)
                        need -= spot[v.id]
                if need:
                    break
            for node, k in spot.items():
                free[node] -= k
            taken |= set(spot)
            out.append(spot)
        return out

    # ------------------------------------------------------------------ the step set
    def add(self, group: int, gang: Gang) -> None:
        with self.lock:
            self.groups[group] = gang
            self.history.setdefault(group, {"node": gang.rank_nodes[0], "pids": [], "committed": [],
                                            "aborted": [], "healed_from": None})
            self.next_id = max(self.next_id, group + 1)

    def view(self, exclude: Iterable[int] = ()) -> tuple[Gang, list[tuple[int, int]]]:
        """One ``Gang`` over every live group's ranks but ``exclude``'s (group-major) and, per combined
        rank, ``(group, rank in group)``."""
        with self.lock:
            items = sorted((g, gang) for g, gang in self.groups.items() if g not in set(exclude))
        workers: list[Any] = []
        nodes: list[str] = []
        owners: list[tuple[int, int]] = []
        for g, gang in items:
            for r, w in enumerate(gang.workers):
                workers.append(w)
                nodes.append(gang.rank_nodes[r])
                owners.append((g, r))
        tp = self.layout.world_size
        first = items[0][1]
        view = Gang(first.plan, Layout(tp=tp, dp=len(items), micro_batch=self.layout.micro_batch),
                    first.reservation, RankMap(list(range(len(workers))), nodes, "replica-groups"), workers,
                    timings=dict(first.timings), watch=_AnyDown([gang.watch for _, gang in items]))
        return view, owners

    def hit(self, failure: Failure, owners: list[tuple[int, int]], unresponsive: list[int]) -> list[int]:
        """The groups ``failure`` took: the groups on a lost node, the groups of rank processes that
        died, or (a hang) of ranks that stopped answering heartbeats. A rank that only *raised* (a
        torchft quorum or collective error: a peer group died, or the box is slow) is alive: its
        group stays and redoes the step."""
        if failure.kind == "node_lost":
            return self.on_nodes(failure.nodes)
        ranks = failure.ranks if failure.kind == "rank_failed" and failure.died else unresponsive
        return sorted({owners[r][0] for r in ranks if r < len(owners)})

    def on_nodes(self, nodes: Iterable[str]) -> list[int]:
        """The live groups with a rank on one of ``nodes``."""
        with self.lock:
            return sorted(g for g, gang in self.groups.items() if set(gang.rank_nodes) & set(nodes))

    def snapshot_group(self) -> int | None:
        """The group that takes the job's in-memory snapshots (one: every group holds the same state
        after a commit, so more would only multiply the pushes and the holders' memory): the lowest live
        group with a copy on a node no live group runs on (``snapshot_nodes``: where its ranks' holders
        are), so the snapshot outlives the loss of every group, which is when a re-plan needs it;
        else the lowest live group."""
        with self.lock:
            live = sorted(self.groups.items())
        if not live:
            return None
        busy = {n for _, gang in live for n in gang.rank_nodes}
        for g, gang in live:
            if set(gang.timings.get("snapshot_nodes") or ()) - busy:
                return g
        return live[0][0]

    def drop(self, group: int) -> Gang | None:
        with self.lock:
            return self.groups.pop(group, None)

    @property
    def size(self) -> int:
        with self.lock:
            return len(self.groups)

    def ranks(self) -> int:
        return self.size * self.layout.world_size

    # ------------------------------------------------------------------ replacements
    def start_replacements(self, port: Any, exclude: set[str], retry_s: float, on_created: Any) -> list[int]:
        """Start groups in the background up to ``want`` (at most one try per ``retry_s``); the ids."""
        with self.lock:
            missing = self.want - len(self.groups) - len(self.joining)
        if missing <= 0 or time.monotonic() - self.last_try < retry_s:
            return []
        self.last_try = time.monotonic()
        started = []
        for spot in self.pick_spots(port, missing, exclude):
            with self.lock:
                gid = self.next_id
                self.next_id += 1
                job = self.joining[gid] = _Joining(gid, spot, time.time())
            threading.Thread(target=self._start_one, args=(port, job, on_created), daemon=True,
                             name=f"orthoplex-replica-{gid}").start()
            started.append(gid)
        return started

    def _start_one(self, port: Any, job: _Joining, on_created: Any) -> None:
        tp = self.layout.world_size
        res = None
        try:
            res = port.reserve(tp, nodes=list(job.spot), name=f"{self.name}-rg{job.group}", per_node=dict(job.spot))
            if res is None:
                job.error = f"{tp} GPUs on node(s) {', '.join(n[:8] for n in job.spot)} not ready"
            else:
                def created(gang: Gang) -> None:
                    job.gang = gang
                    on_created(gang)

                job.gang = port.start_gang(self.plan(job.group, job.spot), res, on_created=created)
                # its first step at once: it waits in the quorum, the live groups' next step takes it
                # in, it heals from one of them and steps with them (so it never holds their quorum up)
                job.stepping = True
                first = port.gather(job.gang, "step", deadline_s=self.first_step_s)
                if not first.ok or any(r["event"] != "step" for r in first.results.values()):
                    job.lost_nodes = list(first.lost_nodes)
                    job.error = (f"first step failed: node(s) {', '.join(n[:8] for n in first.lost_nodes)} down"
                                 if first.lost_nodes else
                                 f"first step failed: {first.errors or first.pending or first.results}")
                else:
                    job.first = dict(first.results)
        except StartFailed as exc:
            job.error = f"start failed: {exc.failure.reason}"
        except Exception as exc:  # anything else: the job goes on with the groups it has
            job.error = f"start failed: {type(exc).__name__}: {exc}"
        finally:
            if job.error:
                port.forget_replicas([job.group])  # a quorum the live groups ask for must not wait for it
            if job.error and res is not None and job.gang is None:
                port.release(res)
            job.done = True

    def wait_stepping(self, timeout_s: float) -> None:
        """Wait until no replacement is in its first step (one that took part in the step just done
        ends with it; left out, it would hold the next quorum up for the join timeout)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                if not any(j.stepping and not j.done for j in self.joining.values()):
                    return
            time.sleep(0.02)

    def ready(self) -> tuple[list[_Joining], list[_Joining]]:
        """Replacements done starting since the last call: (up, failed); the up ones join the step set."""
        with self.lock:
            done = [j for j in self.joining.values() if j.done]
            for j in done:
                del self.joining[j.group]
        up = [j for j in done if not j.error and j.gang is not None]
        for j in up:
            self.add(j.group, j.gang)  # type: ignore[arg-type]
        return up, [j for j in done if j not in up]

    def wait_joining(self, timeout_s: float) -> list[_Joining]:
        """At the end: the replacements still starting (their gangs must be torn down too)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                if all(j.done for j in self.joining.values()):
                    break
            time.sleep(0.05)
        with self.lock:
            out, self.joining = list(self.joining.values()), {}
        return out

    def summary(self) -> dict[str, Any]:
        with self.lock:
            live = self.at_end if self.at_end is not None else sorted(self.groups)
            return {"want": self.want, "live": live, "dropped": list(self.dropped),
                    "groups": {str(g): dict(h) for g, h in sorted(self.history.items())}}


#: gathers in a row without any commit after which an excused group that raised in each is dropped anyway
FRUITLESS_LIMIT = 4


def raised_to_drop(reps: ReplicaSet, raised: set[int], committed: set[int], lost: list[int]) -> list[int]:
    """The groups to drop after a gather in which the ranks of ``raised`` raised (a torchft quorum,
    commit or collective timeout on a loaded box), the groups ``committed`` committed and the groups
    ``lost`` were lost (a node death; still in ``reps.groups``).

    "My peer died" is not "I am broken": the groups that were stepping with a group when it was lost
    are excused: their raises do not count until a step commits again (the redo of the interrupted
    step waits for torchft to leave the dead group out), unless no step commits for
    :data:`FRUITLESS_LIMIT` gathers in a row. Otherwise (and for a replacement, which joined after the
    loss) a group whose ranks raised in two attempts in a row is dropped, as before."""
    reps.fruitless = 0 if committed else reps.fruitless + 1
    if lost:
        reps.excused = set(reps.groups) - set(lost)
    if committed:
        reps.excused = set()
    for g in committed:
        reps.raised.pop(g, None)
    if lost:
        return []  # this gather's raises are the dead group's doing
    for g in raised:
        if g not in reps.excused or reps.fruitless >= FRUITLESS_LIMIT:
            reps.raised[g] = reps.raised.get(g, 0) + 1
    return sorted(g for g in raised if reps.raised.get(g, 0) >= 2)
