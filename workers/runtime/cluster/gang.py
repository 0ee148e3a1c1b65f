"""A gang: the placement group of one plan, its RankWorker actors and their process group.

``start_gang`` turns a ready reservation into running ranks: map ranks onto bundles (topology-aware,
after placement), create one actor per bundle, check every actor sits where Ray said, rendezvous on
rank 0's address and a free port, and build each rank's trainer. ``teardown`` kills every actor and
removes the placement group, whatever state they are in (no leaks).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from planner.layout import Layout
from workers.runtime.cluster.placement_groups import Reservation, raylet_unreachable, release
from workers.runtime.cluster.ranks import RankMap, assign_ranks
from workers.runtime.cluster.watchdog import Failure, classify, gather
from workers.runtime.recovery import fencing


class StartFailed(RuntimeError):
    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.reason)
        self.failure = failure


@dataclass
class Gang:
    plan: Any
    layout: Layout
    reservation: Reservation
    rank_map: RankMap
    workers: list[Any] = field(default_factory=list)  # index = rank
    timings: dict[str, Any] = field(default_factory=dict)
    watch: Any = None  # watchdog.NodeWatch: the heartbeat of the gang's nodes, while it runs

    @property
    def rank_nodes(self) -> list[str]:
        return self.rank_map.rank_to_node

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    @property
    def nodes(self) -> list[str]:
        return self.rank_map.nodes()


def worker_class(cpu_per_bundle: float) -> Any:
    import ray

    from workers.runtime.cluster.rank_worker import ACTOR_CONCURRENCY, RankWorker

    return ray.remote(num_cpus=cpu_per_bundle, num_gpus=1, **ACTOR_CONCURRENCY, max_restarts=0)(RankWorker)


def start_gang(
    plan: Any,
    reservation: Reservation,
    train_cfg: dict[str, Any],
    *,
    plan_nodes: list[str] | None,
    cpu_per_bundle: float,
    collective_timeout_s: float,
    start_timeout_s: float,
    alive_nodes: Any,
    on_created: Any = None,
    snapshot_targets: Any = None,
    snapshot_every: int = 1,
    take_warm: Any = None,
) -> Gang:
    """Actors up, ranks mapped, process group joined, trainers built; raises ``StartFailed``.
    ``snapshot_targets(node)``: the snapshot holders a rank on ``node`` pushes to (``None``: no snapshots),
    after every ``snapshot_every``-th step.
    ``take_warm(node)``: a pre-started rank actor on ``node``, or ``None`` (``warm_pool``)."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    layout: Layout = plan.layout.with_global_batch(int(train_cfg["global_batch"])) \
        if plan.layout.num_micro_batches == 0 else plan.layout
    rank_map = assign_ranks(layout, reservation.bundle_nodes, plan_nodes)
    gang = Gang(plan, layout, reservation, rank_map)
    cls = worker_class(cpu_per_bundle)
    t0 = time.monotonic()
    warm: list[int] = []
    for rank in range(layout.world_size):
        strategy = PlacementGroupSchedulingStrategy(
            reservation.pg, placement_group_bundle_index=rank_map.rank_to_bundle[rank]
        )
        got = take_warm(rank_map.rank_to_node[rank]) if take_warm is not None else None
        if got is not None:
            gang.workers.append(got)
            warm.append(rank)
        else:
            gang.workers.append(cls.options(scheduling_strategy=strategy).remote())
    if on_created is not None:
        on_created(gang)

    def failed(res: Any, what: str) -> StartFailed:
        return StartFailed(classify(res, rank_map.rank_to_node, alive_nodes=alive_nodes,
                                    unreachable=raylet_unreachable, what=what))

    infos = gather({r: w.info.remote() for r, w in enumerate(gang.workers)}, deadline_s=start_timeout_s)
    if not infos.ok:
        raise failed(infos, "actor start")
    wrong = [r for r, i in infos.results.items() if i["node_id"] != rank_map.rank_to_node[r]]
    if wrong:
        raise StartFailed(Failure("rank_failed", f"actors of ranks {wrong} are not on their bundle's node",
                                  (), tuple(wrong), time.time()))
    _hand_bundle_gpus(gang, [r for r in warm if infos.results[r].get("cuda_host")], start_timeout_s)
    t1 = time.monotonic()
    endpoint = gather({0: gang.workers[0].endpoint.remote(collective_timeout_s)}, deadline_s=start_timeout_s)
    if not endpoint.ok:
        raise failed(endpoint, "rendezvous")
    rdzv = endpoint.results[0]
    ckpt_dir = train_cfg.get("checkpoint_dir")
    # the replica groups of one job run side by side: they share the epoch the first group started
    # (a replacement must not fence its live peers out of the job's final checkpoint)
    shared = bool(getattr(plan, "shares_epoch", False))
    epoch = ((fencing.current(ckpt_dir) if shared else 0) or fencing.advance(ckpt_dir)) if ckpt_dir else None
    refs = {
        r: w.setup.remote(rdzv, train_cfg, layout.to_dict(), r, layout.world_size, collective_timeout_s,
                          fence_epoch=epoch, snapshot_every=snapshot_every,
                          snapshot_to=None if snapshot_targets is None else snapshot_targets(rank_map.rank_to_node[r]))
        for r, w in enumerate(gang.workers)
    }
    setup = gather(refs, deadline_s=start_timeout_s, workers=gang.workers)
    if not setup.ok:
        raise failed(setup, "setup")
    rss = sorted(float(infos.results[r]["rss_mb"]) for r in warm if infos.results[r].get("rss_mb") is not None)
    gang.timings = {"actors_s": t1 - t0, "setup_s": time.monotonic() - t1, "rendezvous": rdzv,
                    "fence_epoch": epoch, "warm_ranks": len(warm),
                    # what an idle warm rank holds in host memory (the median of those taken, before setup)
                    "warm_rank_rss_mb": rss[len(rss) // 2] if rss else None}
    return gang


def _hand_bundle_gpus(gang: Gang, cuda: list[int], timeout_s: float) -> None:
    """Warm ranks ``cuda`` (on hosts with an NVIDIA driver) learn their bundle's GPU ids (a zero-CPU
    probe task in the bundle) and set ``CUDA_VISIBLE_DEVICES`` as Ray would have."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from workers.runtime.cluster.warm_pool import bundle_gpu_ids

    if not cuda:
        return
    probe = ray.remote(num_cpus=0, num_gpus=1)(bundle_gpu_ids)
    refs = {r: probe.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        gang.reservation.pg, placement_group_bundle_index=gang.rank_map.rank_to_bundle[r])).remote() for r in cuda}
    ids = dict(zip(refs, ray.get(list(refs.values()), timeout=timeout_s), strict=True))
    ray.get([gang.workers[r].use_gpus.remote(ids[r]) for r in cuda], timeout=timeout_s)


def teardown(gang: Gang | None, *, graceful: bool = False, close_timeout_s: float = 15.0) -> float:
    """Kill every actor and remove the placement group; ``graceful`` closes the process group first."""
    import ray

    if gang is None:
        return 0.0
    t0 = time.monotonic()
    if gang.watch is not None:
        gang.watch.stop()
    if graceful and gang.workers:
        gather({r: w.close.remote() for r, w in enumerate(gang.workers)}, deadline_s=close_timeout_s)
    for w in gang.workers:
        with contextlib.suppress(Exception):  # already dead
            ray.kill(w, no_restart=True)
    release(gang.reservation)
    gang.workers = []
    return time.monotonic() - t0
