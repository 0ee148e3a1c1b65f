"""An honest in-memory cluster behind the supervisor's ``ClusterPort`` (no Ray), for unit tests.

It models what the state machine relies on: nodes with GPUs that die and come back, all-or-nothing
reservations that hold GPUs until released (other jobs can hold some too), gangs of ranks placed on
the reserved nodes, a shared checkpoint store (a gang restores the newest step saved, whatever its
layout), rank processes that die or hang, and node speed (a slow node's ranks are busy longer).
``classify`` reads the model: ranks gone with their node are ``node_lost``, ranks that died on a
live node ``rank_failed``, ranks that never answered ``hang``. Faults reach it through the same
``FaultInjector`` wrapper the supervisor uses on Ray (``inject``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workers.runtime.cluster.gang import Gang, StartFailed
from workers.runtime.cluster.placement_groups import NodeCapacity, Reservation
from workers.runtime.cluster.ranks import assign_ranks
from workers.runtime.cluster.watchdog import Failure, GatherResult
from workers.runtime.policy.planning import plan_nodes
from workers.runtime.recovery.memory_snapshots import METADATA, Choice, buddy_of


class RankDied(RuntimeError):
    """A rank's process is gone (what Ray reports as an actor death)."""


@dataclass
class Node:
    id: str
    gpus: int
    alive: bool = True
    speed: float = 1.0  # compute time multiplier (a slow node > 1)
    link_rtt_s: float = 0.01  # heartbeat round trip over the node's link (a slow link: seconds)


@dataclass
class Rank:
    node: str
    dead: bool = False
    hang_next: bool = False


@dataclass
class MemoryCluster:
    machines: dict[str, Node] = field(default_factory=dict)
    held: dict[int, Reservation] = field(default_factory=dict)  # live reservations, by id
    checkpoint_step: int = 0  # newest checkpoint (steps completed), shared by every gang of the job
    step_s: float = 0.1  # busy time of one step on a node of speed 1
    gangs_started: int = 0
    _ids: Any = field(default_factory=lambda: itertools.count(1))
    _gang_steps: dict[int, int] = field(default_factory=dict)  # id(gang) -> steps completed
    snapshots_on: bool = True  # ranks push a snapshot after every step to their node and its ring buddy
    holders: dict[str, dict[tuple[int, int], dict[str, Any]]] = field(default_factory=dict)  # node -> snapshots
    restored_from: list[str] = field(default_factory=list)  # "memory" | "storage", one per restore
    closed: bool = False
    forgotten_replicas: list[int] = field(default_factory=list)  # what forget_replicas was told

    @classmethod
    def of(cls, *gpus: int) -> MemoryCluster:
        return cls({f"node{i}": Node(f"node{i}", g) for i, g in enumerate(gpus)})

    # ------------------------------------------------------------------ the model
    def used(self, node: str) -> int:
        return sum(1 for r in self.held.values() for n in r.bundle_nodes if n == node)

    def free(self, node: str) -> int:
        n = self.machines[node]
        return max(0, n.gpus - self.used(node)) if n.alive else 0

    def hold(self, gpus: int, nodes: Sequence[str] | None = None, name: str = "other-job") -> Reservation | None:
        """Reserve like a placement group (PACK: fullest fit first); ``None`` when it does not fit."""
        allowed = [n for n in (nodes or sorted(self.machines)) if n in self.machines and self.machines[n].alive]
        if sum(self.free(n) for n in allowed) < gpus:
            return None
        bundles: list[str] = []
        for n in sorted(allowed, key=lambda n: (-self.free(n), n)):
            take = min(self.free(n), gpus - len(bundles))
            bundles += [n] * take
        res = Reservation(pg=next(self._ids), bundle_nodes=bundles, seconds=0.0, strategy="PACK", name=name)
        self.held[res.pg] = res
        return res

    def kill_node(self, node: str) -> None:
        self.machines[node].alive = False
        self.holders.pop(node, None)  # its memory is gone with it
        for pg in [pg for pg, r in self.held.items() if node in r.bundle_nodes]:
            self.held.pop(pg)  # a dead node's bundles are gone (the group is dead with it)

    def add_node(self, node: str, gpus: int) -> None:
        self.machines[node] = Node(node, gpus)

    # ------------------------------------------------------------------ ClusterPort
    def nodes(self, *, exclude: Iterable[str] = (), held: Mapping[str, int] | None = None) -> list[NodeCapacity]:
        skip = set(exclude)
        out = []
        for n in sorted(self.machines.values(), key=lambda n: n.id):
            if not n.alive or n.id in skip:
                continue
            free = min(n.gpus, self.free(n.id) + int((held or {}).get(n.id, 0)))
            out.append(NodeCapacity(n.id, n.gpus, free, 8.0, False))
        return out

    def reserve(self, gpus: int, *, nodes: Sequence[str], name: str,
                per_node: Mapping[str, int] | None = None) -> Reservation | None:
        if not per_node:
            return self.hold(gpus, nodes, name)
        if any(not self.machines[n].alive or self.free(n) < k for n, k in per_node.items()):
            return None
        bundles = [n for n, k in sorted(per_node.items()) for _ in range(k)]
        res = Reservation(pg=next(self._ids), bundle_nodes=bundles, seconds=0.0, strategy="PACK", name=name)
        self.held[res.pg] = res
        return res

    def release(self, reservation: Reservation) -> None:
        self.held.pop(reservation.pg, None)

    def start_gang(self, plan: Any, reservation: Reservation, *, on_created: Callable[[Gang], None]) -> Gang:
        layout = plan.layout.with_global_batch(12) if plan.layout.num_micro_batches == 0 else plan.layout
        rank_map = assign_ranks(layout, reservation.bundle_nodes, plan_nodes(plan))
        gang = Gang(plan, layout, reservation, rank_map, workers=[Rank(n) for n in rank_map.rank_to_node])
        gang.timings = {"actors_s": 0.0, "setup_s": 0.0, "rendezvous": {"backend": "memory"},
                        "epoch": self.gangs_started + 1}
        on_created(gang)
        dead = sorted({n for n in rank_map.rank_to_node if not self.machines[n].alive})
        if dead or reservation.pg not in self.held:
            ranks = tuple(r for r, n in enumerate(rank_map.rank_to_node) if n in dead)
            raise StartFailed(Failure("node_lost", f"actor start: node(s) {dead} dead", tuple(dead), ranks, 0.0))
        self.gangs_started += 1
        return gang

    def gather(self, gang: Gang, call: str, *, deadline_s: float, step: int | None = None,
               kwargs: dict[str, Any] | None = None) -> GatherResult:
        out = GatherResult()
        for r, rank in enumerate(gang.workers):
            if rank.dead or not self.machines[rank.node].alive:
                out.errors[r] = RankDied(f"rank {r} died")
            elif rank.hang_next and call == "step":
                out.pending.append(r)
        if out.pending and not out.errors:
            out.timed_out = True
        if not out.ok:
            return out
        done = self._gang_steps.get(id(gang), 0)
        for r, rank in enumerate(gang.workers):
            if call == "restore":
                out.results[r] = self.checkpoint_step
            elif call == "step":
                busy = self.step_s * self.machines[rank.node].speed
                out.results[r] = {"loss": 10.0 / (done + 1), "grad_norm": 1.0, "lr": 1e-3, "tokens": 12 * 64,
                                  "wall_s": busy, "busy_s": busy}
            else:
                out.results[r] = {"step": done, "path": f"/ckpt/step-{done:08d}", "seconds": 0.01, "bytes": 1000}
        if call == "restore":
            self._gang_steps[id(gang)] = self.checkpoint_step
        elif call == "step":
            self._gang_steps[id(gang)] = done + 1
            out.hb_rtt = {r: self.machines[rank.node].link_rtt_s for r, rank in enumerate(gang.workers)}
            wall = max(o["busy_s"] for o in out.results.values())
            for o in out.results.values():
                o["wall_s"] = wall
            if self.snapshots_on:
                self._snapshot(gang, done + 1)
        elif call == "save":
            self.checkpoint_step = done
        return out

    def classify(self, result: GatherResult, gang: Gang, what: str) -> Failure:
        nodes = gang.rank_nodes
        gone = sorted({nodes[r] for r in result.errors if not self.machines[nodes[r]].alive})
        if gone:
            ranks = tuple(r for r, n in enumerate(nodes) if n in gone)
            return Failure("node_lost", f"{what}: node(s) {gone} dead", tuple(gone), ranks, 0.0)
        if result.errors:
            died = tuple(sorted(result.errors))
            return Failure("rank_failed", f"{what}: rank process(es) {list(died)} died on live node(s)",
                           tuple(sorted({nodes[r] for r in died})), died, 0.0, died=True)
        return Failure("hang", f"{what}: ranks {result.pending} still pending", tuple(sorted(set(nodes))),
                       tuple(result.pending), 0.0)

    def _snapshot(self, gang: Gang, step: int) -> None:
        alive = [n for n, m in self.machines.items() if m.alive]
        for r, rank in enumerate(gang.workers):
            files = [f"__{r}_0.distcp"] + ([METADATA] if r == 0 else [])
            for node in {rank.node, buddy_of(rank.node, alive)} - {None}:
                snap = self.holders.setdefault(node, {}).setdefault((gang.timings["epoch"], step),
                                                                    {"world": gang.world_size, "files": set()})
                snap["files"].update(files)

    def snapshots(self) -> dict[str, list[dict[str, Any]]]:
        return {n: [{"epoch": e, "step": s, "world": v["world"], "files": sorted(v["files"])}
                    for (e, s), v in snaps.items()] for n, snaps in self.holders.items()}

    def restore(self, gang: Gang, choice: Choice | None, *, deadline_s: float) -> GatherResult:
        if choice is None:
            self.restored_from.append("storage")
            return self.gather(gang, "restore", deadline_s=deadline_s)
        out = GatherResult()
        for r, rank in enumerate(gang.workers):
            if rank.dead or not self.machines[rank.node].alive:
                out.errors[r] = RankDied(f"rank {r} died")
        if out.ok:
            out.results = {r: choice.key.step for r in range(len(gang.workers))}
            self._gang_steps[id(gang)] = choice.key.step
            self.restored_from.append("memory")
        return out

    def drop_snapshots(self) -> None:
        self.holders.clear()

    def refill_pool(self) -> int:
        return 0  # no warm pool in memory

    def forget_replicas(self, groups: Sequence[int]) -> None:
        self.forgotten_replicas.extend(groups)  # no quorum service in memory: the call is only recorded

    def close(self) -> None:
        self.closed = True
        self.holders.clear()

    def teardown(self, gang: Gang | None, *, graceful: bool = False) -> float:
        if gang is None:
            return 0.0
        for rank in gang.workers:
            rank.dead = True
        self.release(gang.reservation)
        gang.workers = []
        return 0.0

    def inject(self, gang: Gang, ranks: Sequence[int], kind: str, value: float = 0.0, *, wait: bool = False) -> None:
        for r in ranks:
            rank = gang.workers[r]
            if kind == "kill_node":
                self.kill_node(rank.node)
            elif kind == "exit":
                rank.dead = True
            elif kind == "hang":
                rank.hang_next = True
            elif kind == "slow":
                self.machines[rank.node].speed = float(value)
            elif kind == "jitter":
                pass  # a few percent of noise: nothing the model needs to show
            else:
                raise ValueError(f"unknown fault kind {kind!r}")
