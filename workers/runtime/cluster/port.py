"""The one narrow port through which a job's supervisor acts on the cluster: :class:`ClusterPort`.

Everything the state machine (``workers.runtime.supervision.attempt_machine``) and the replanner do to
the cluster goes through it: see the nodes, reserve a gang's GPUs, start the gang, gather one call per
rank (restore, step, save), tell what a failed gather was, tear the gang down.
:class:`~workers.runtime.cluster.ray_port.RayCluster` is the production port (placement groups,
``RankWorker`` actors, ``watchdog.gather``). Tests drive the same machine with an in-memory cluster
model, and fault injection is a wrapper of any port (``workers.testbed.fault_injector.FaultInjector``),
so the production loop carries no test hooks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol

from workers.runtime.cluster import placement_groups as placement
from workers.runtime.cluster.gang import Gang
from workers.runtime.cluster.watchdog import Failure, GatherResult
from workers.runtime.recovery.memory_snapshots import Choice

#: the per-rank calls a supervisor gathers (``RankWorker`` methods)
RankCall = Literal["restore", "step", "save", "replica_peers_lost", "flush_snapshot", "after_step"]


class ClusterPort(Protocol):
    def nodes(self, *, exclude: Iterable[str] = (), held: Mapping[str, int] | None = None) -> list[placement.NodeCapacity]:
        """Alive nodes with GPUs, minus ``exclude``; ``held`` GPUs per node count as free."""
        ...

    def reserve(self, gpus: int, *, nodes: Sequence[str], name: str,
                per_node: Mapping[str, int] | None = None) -> placement.Reservation | None:
        """All-or-nothing reservation of ``gpus`` GPUs on ``nodes`` (exactly ``per_node`` GPUs on each
        node when given); ``None`` when not ready in time."""
        ...

    def release(self, reservation: placement.Reservation) -> None:
        """Give back a reservation no gang was started on."""
        ...

    def start_gang(self, plan: Any, reservation: placement.Reservation, *,
                   on_created: Callable[[Gang], None]) -> Gang:
        """Rank actors up, process group joined, trainers built; raises ``gang.StartFailed``.
        ``on_created`` gets the gang as soon as its actors exist (so an error tears them down)."""
        ...

    def gather(self, gang: Gang, call: RankCall, *, deadline_s: float, step: int | None = None,
               kwargs: dict[str, Any] | None = None) -> GatherResult:
        """Run ``call`` on every rank (with ``kwargs``) and wait (deadline, heartbeats); ``step`` is
        the global step index a ``"step"`` call runs."""
        ...

    def classify(self, result: GatherResult, gang: Gang, what: str) -> Failure:
        """What a failed gather was: ``node_lost``, ``rank_failed`` or ``hang``."""
        ...

    def teardown(self, gang: Gang | None, *, graceful: bool = False) -> float:
        """Kill the gang's actors and release its reservation (seconds spent)."""
        ...

    def snapshots(self) -> dict[str, list[dict[str, Any]]]:
        """The in-memory snapshots the job's live holders have: node -> ``[{"epoch", "step", "world",
        "files"}]`` (empty when snapshots are off); ``memsnap.choose`` picks one."""
        ...

    def restore(self, gang: Gang, choice: Choice | None, *, deadline_s: float) -> GatherResult:
        """Every rank loads the snapshot ``choice`` (resharded), or the newest storage checkpoint
        when ``None``; each rank's result is the next step to run."""
        ...

    def refill_pool(self) -> int:
        """Start the warm ranks gang starts took since the last call, on the job's nodes and one
        spare (how many)."""
        ...

    def forget_replicas(self, groups: Sequence[int]) -> None:
        """Replica groups the supervisor found dead: the job's quorum service drops them at once
        (``lighthouse.QuorumLighthouse.forget``), so the survivors' next quorum does not wait for them."""
        ...

    def close(self) -> None:
        """The job is over: free what outlives gangs (the snapshot holders)."""
        ...
