"""The production :class:`~workers.runtime.cluster.port.ClusterPort`: Ray placement groups and
``RankWorker`` actors, the warm pool, the snapshot holders and the replica groups' quorum service."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from planner.recovery_choice import AUTO_WARM_RANKS, resolve_warm_ranks
from workers.runtime.cluster import placement_groups as placement
from workers.runtime.cluster.gang import Gang, StartFailed, start_gang, teardown
from workers.runtime.cluster.port import RankCall
from workers.runtime.cluster.warm_pool import WarmPool
from workers.runtime.cluster.watchdog import Failure, GatherResult, NodeWatch, classify, gather
from workers.runtime.contract.job_spec import RuntimeSettings
from workers.runtime.policy.planning import plan_nodes
from workers.runtime.recovery.memory_snapshots import Choice, Holders
from workers.runtime.recovery.quorum_service import QuorumLighthouse, new_secret


class RayCluster:
    """The production port: Ray placement groups and ``RankWorker`` actors."""

    def __init__(self, job_train: dict[str, Any], settings: RuntimeSettings) -> None:
        self.train = job_train
        self.settings = settings
        self.holders = Holders(keep=settings.snapshots.keep) if settings.snapshots.enabled else None
        warm = settings.placement.warm_ranks_per_node
        # a number: the pool now; ``auto``: sized on the job's first gang (its most ranks on one node)
        self._warm_auto = warm == AUTO_WARM_RANKS
        self.pool = WarmPool(int(warm)) if not self._warm_auto and int(warm) > 0 else None
        self.down: set[str] = set()  # nodes a gang's node heartbeat found down (the GCS may still list them)
        self._refill: set[str] = set()  # nodes whose warm pool waits for refill_pool()
        self._pool_filled = False
        self._spare: str | None = None  # the node outside the job that the warm pool keeps ranks on
        self._replica_nodes: dict[int, set[str]] = {}  # id(gang) -> nodes, of live replica-group gangs
        self._pool_lock = threading.Lock()  # replacement replica groups start from a background thread
        self._lighthouse_secret = ""  # the job's quorum secret: the quorum service answers only calls with it
        self._lighthouse: QuorumLighthouse | None = None  # replica groups' quorums, in this (the supervisor's) process

    def nodes(self, *, exclude: Iterable[str] = (), held: Mapping[str, int] | None = None) -> list[placement.NodeCapacity]:
        return placement.cluster_nodes(exclude=exclude, held=held)

    def reserve(self, gpus: int, *, nodes: Sequence[str], name: str,
                per_node: Mapping[str, int] | None = None) -> placement.Reservation | None:
        s = self.settings
        if per_node and any(placement.raylet_unreachable(n) for n in per_node):
            # a node that just died (the GCS marks it dead seconds later): its bundles would wait for
            # the whole placement timeout; a replacement replica group picks again at its next try
            return None
        return placement.reserve(gpus, nodes=nodes, cpu_per_bundle=s.placement.cpu_per_bundle, timeout_s=s.placement.timeout_s,
                                 strategy=s.placement.strategy, name=name, per_node=per_node)

    def release(self, reservation: placement.Reservation) -> None:
        placement.release(reservation)

    def start_gang(self, plan: Any, reservation: placement.Reservation, *,
                   on_created: Callable[[Gang], None]) -> Gang:

        s = self.settings
        targets = None
        views = self.nodes(exclude=self.down)  # the live nodes: the holders' and the warm pool's
        nodes = sorted(set(reservation.bundle_nodes) | {n.id for n in views})
        if self.holders is not None:  # a holder on every node with GPUs (a rank's buddy may be outside the gang)
            self.holders.forget(self.down)
            self.holders.ensure(nodes, needed=reservation.bundle_nodes)
            targets = self.holders.targets
        gang = start_gang(plan, reservation, self.train, plan_nodes=plan_nodes(plan), cpu_per_bundle=s.placement.cpu_per_bundle,
                          collective_timeout_s=s.detection.collective_timeout_s, start_timeout_s=s.detection.start_timeout_s,
                          alive_nodes=placement.alive_node_ids, on_created=on_created, snapshot_targets=targets,
                          snapshot_every=s.snapshots.every,
                          take_warm=self.pool.take if self.pool is not None else None)
        if self.holders is not None:  # where its snapshots are kept (a replica job picks the group that snapshots by it)
            gang.timings["snapshot_nodes"] = sorted({n for node in set(gang.rank_nodes) for n in self.holders.copy_nodes(node)})
        replica = getattr(plan, "replica_group", None) is not None
        if replica:  # a replica group's node needs no warm ranks: a replacement goes to a free node
            with self._pool_lock:
                self._replica_nodes[id(gang)] = set(gang.nodes)
        if self._warm_auto and self.pool is None:
            self.pool = WarmPool(resolve_warm_ranks(AUTO_WARM_RANKS, Counter(gang.rank_nodes).values()))
        if self.pool is not None:  # filled at the job's first start; later refilled once the gang steps
            with self._pool_lock:  # replacement groups start from background threads
                where = self._pool_nodes(set(gang.nodes).union(*self._replica_nodes.values()), views)
                self._refill |= where
                first, self._pool_filled = not self._pool_filled, True
            self.pool.drop(set(self.pool.idle) - where)  # nodes that went away, or the job left
            if first:  # the job's nodes too: a replacement with no free node left goes to a group's node
                self._fill_pool(skip_busy=False)
        if replica:
            self._setup_replica(gang, plan)
        if s.detection.node_heartbeat_s > 0:
            period = s.replicas.node_heartbeat_s if replica else s.detection.node_heartbeat_s
            gang.watch = NodeWatch(placement.raylet_addresses(gang.nodes), period_s=period,
                                   timeout_s=s.detection.node_heartbeat_timeout_s, silent_s=s.detection.heartbeat_timeout_s).start()
        return gang

    def refill_pool(self) -> int:
        """Start the warm ranks the last gang starts took (new processes importing torch: seconds of
        CPU each), on the pool's nodes (:meth:`_pool_nodes`). The supervisor calls it once a new gang
        has stepped, so the refill does not compete with a recovery's load, first step or a
        replacement's join; how many started. The job's first gang start fills the pool at once (a
        replica job's later groups take from it); later refills skip the nodes a replica group runs
        on (a replacement starts on a node no group uses)."""
        return self._fill_pool(skip_busy=True)

    def _pool_nodes(self, job_nodes: set[str], live: Sequence[placement.NodeCapacity]) -> set[str]:
        """Where the warm pool keeps ranks, among the ``live`` nodes with GPUs: the job's (a re-plan
        starts a new gang, so their ranks start anew) and one spare node outside the job (a lost
        node's ranks, or a replacement group, go there): the spare of the last fill while it lives
        and the job is not on it, else the freest other node. Not every node of the cluster: each
        warm rank holds host memory."""
        gpu_nodes = [v for v in live if v.gpus > 0]
        alive = {v.id for v in gpu_nodes}
        spare = self._spare if self._spare in alive and self._spare not in job_nodes else None
        if spare is None:
            pick = min((v for v in gpu_nodes if v.id not in job_nodes), key=lambda v: (-v.free_gpus, v.id), default=None)
            spare = pick.id if pick is not None else None
        self._spare = spare
        return (job_nodes & alive) | ({spare} if spare else set())

    def _fill_pool(self, *, skip_busy: bool) -> int:
        if self.pool is None:
            return 0
        with self._pool_lock:
            nodes, self._refill = self._refill, set()
            busy = set().union(*self._replica_nodes.values()) if skip_busy else set()
        if not nodes:  # the usual case (it is asked after every step): no GCS call
            return 0
        alive = {n.id for n in self.nodes(exclude=self.down)}
        return self.pool.fill(sorted((nodes & alive) - busy))

    def lighthouse(self) -> str:
        """The address of the job's quorum service (torchft's lighthouse protocol; started on first
        use, in this process: the supervisor's, on the head node); replica groups' managers ask it."""
        if self._lighthouse is None:
            s = self.settings
            # join_timeout: a quorum waits for every group that still heartbeats (a slow live group is
            # not left out); a dead group drops out when the supervisor says so (forget_replicas), or
            # after the heartbeat timeout
            # bound to this node's cluster address (not every interface), answering the job's secret only
            import ray

            self._lighthouse_secret = new_secret()
            self._lighthouse = QuorumLighthouse(secret=self._lighthouse_secret, host=ray.util.get_node_ip_address(),
                                                min_replicas=1, heartbeat_timeout_s=s.replicas.heartbeat_timeout_s,
                                                join_timeout_s=s.replicas.join_timeout_s)
        return self._lighthouse.address()

    def forget_replicas(self, groups: Sequence[int]) -> None:
        if self._lighthouse is not None and groups:
            # the replica id the engine gives group g's manager (``replica_ft.make_manager``)
            self._lighthouse.forget(f"rg{g}" for g in groups)

    def _setup_replica(self, gang: Gang, plan: Any) -> None:

        s = self.settings
        address = self.lighthouse()
        refs = {r: w.setup_replica.remote(int(plan.replica_group), address, int(plan.min_replicas),
                                          s.replicas.timeout_s, self._lighthouse_secret)
                for r, w in enumerate(gang.workers)}
        res = gather(refs, deadline_s=s.detection.start_timeout_s, workers=gang.workers, heartbeat_s=s.detection.heartbeat_s,
                     heartbeat_timeout_s=s.detection.heartbeat_timeout_s)
        if not res.ok:
            raise StartFailed(self.classify(res, gang, "replica setup"))

    def gather(self, gang: Gang, call: RankCall, *, deadline_s: float, step: int | None = None,
               kwargs: dict[str, Any] | None = None) -> GatherResult:
        s = self.settings
        refs = {r: getattr(w, call).remote(**(kwargs or {})) for r, w in enumerate(gang.workers)}
        replica = getattr(gang.plan, "replica_group", None) is not None
        return gather(refs, deadline_s=deadline_s, workers=gang.workers, heartbeat_s=s.detection.heartbeat_s,
                      heartbeat_timeout_s=s.detection.heartbeat_timeout_s, watch=gang.watch,
                      poll_s=s.replicas.node_heartbeat_s if replica else 0.25)

    def classify(self, result: GatherResult, gang: Gang, what: str) -> Failure:
        return classify(result, gang.rank_nodes, alive_nodes=placement.alive_node_ids,
                        unreachable=placement.raylet_unreachable, confirm_s=self.settings.detection.node_confirm_s, what=what)

    def teardown(self, gang: Gang | None, *, graceful: bool = False) -> float:
        if gang is not None and gang.watch is not None:
            self.down |= gang.watch.down()
        with self._pool_lock:
            self._replica_nodes.pop(id(gang), None)
        return teardown(gang, graceful=graceful)

    def snapshots(self) -> dict[str, list[dict[str, Any]]]:
        if self.holders is None:
            return {}
        self.holders.forget(self.down)
        return self.holders.inventories()

    def restore(self, gang: Gang, choice: Choice | None, *, deadline_s: float) -> GatherResult:
        if choice is None or self.holders is None:
            return self.gather(gang, "restore", deadline_s=deadline_s)
        actors = self.holders.actors
        sources = [(actors[node], names) for node, names in choice.by_node().items() if node in actors]
        refs = {r: w.restore_snapshot.remote(sources, choice.key.epoch, choice.key.step)
                for r, w in enumerate(gang.workers)}
        s = self.settings
        return gather(refs, deadline_s=deadline_s, workers=gang.workers, heartbeat_s=s.detection.heartbeat_s,
                      heartbeat_timeout_s=s.detection.heartbeat_timeout_s, watch=gang.watch)

    def close(self) -> None:
        if self.holders is not None:
            self.holders.kill()
        if self.pool is not None:
            self.pool.kill()
        if self._lighthouse is not None:
            self._lighthouse.shutdown()
            self._lighthouse = None

    # -------------------------------------------------------------- used by the fault-injection wrapper only
    def inject(self, gang: Gang, ranks: Sequence[int], kind: str, value: float = 0.0, *, wait: bool = False) -> None:
        """Arm ``kind`` (``RankWorker.inject``) on ``ranks``; ``wait`` until every rank armed it."""
        import ray

        refs = [gang.workers[r].inject.remote(kind, factor=value, amplitude=value) for r in ranks]
        if wait:
            ray.get(refs)

    def drop_snapshots(self) -> None:
        """Kill every snapshot holder: both memory copies of every shard are gone."""
        if self.holders is not None:
            self.holders.kill()
