"""Local multi-node Ray clusters whose nodes declare GPUs (CPU torch underneath).

Two kinds:

* :class:`InProcessCluster` wraps ``ray.cluster_utils.Cluster`` for tests and ``orthoplex run``:
  a head with no GPUs and N worker nodes with G declared GPUs each; it can kill a node (SIGKILL of
  its raylet, as a crash) and add nodes back. It lives as long as the Python process.
* :func:`cluster_up` / :func:`cluster_down` start real ``ray start`` processes that outlive the
  command (``orthoplex cluster up``). Everything runs under a private ``--temp-dir`` recorded in the
  state file, so ``down`` stops exactly these processes (by pid), never anybody else's Ray.

Every node of a local cluster shares one IP, so nodes are told apart by Ray node id. Ray never gets
the default port 6379 (a local Redis may hold it); token auth is disabled for local clusters.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Any

# Fast failure detection for local clusters (defaults would take ~15 s to mark a node dead).
FAST_HEALTH_CHECK: dict[str, Any] = {
    "health_check_initial_delay_ms": 1000,
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 3,
}


def local_env() -> None:
    """Environment every local cluster needs (idempotent; never overrides what is set: an
    operator's ``RAY_AUTH_MODE`` stays; unset, the local cluster listens on 127.0.0.1 only)."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class InProcessCluster:
    """A ``cluster_utils.Cluster``: head (0 GPUs) + ``nodes`` x ``gpus_per_node`` declared GPUs."""

    nodes: int = 3
    gpus_per_node: int = 4
    cpus_per_node: float = 2.0
    head_cpus: float = 1.0
    connect: bool = True
    cluster: Any = None
    _workers: dict[str, Any] = field(default_factory=dict)  # ray node id -> cluster_utils node

    def start(self) -> InProcessCluster:
        local_env()
        from ray.cluster_utils import Cluster

        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": self.head_cpus, "num_gpus": 0,
                            "include_dashboard": False, "_system_config": dict(FAST_HEALTH_CHECK)},
        )
        for _ in range(self.nodes):
            self.add_node()
        if self.connect:
            self.connect_driver()
        self.cluster.wait_for_nodes()
        return self

    def connect_driver(self) -> None:
        """Make this process the cluster's driver, unless it already is (a driver of another cluster is
        shut down first: one process has one driver connection)."""
        import ray

        if ray.is_initialized():
            if ray.get_runtime_context().gcs_address == self.address:
                return
            ray.shutdown()
        ray.init(address=self.address, namespace="orthoplex", log_to_driver=False, logging_level=logging.WARNING)

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def add_node(self) -> str:
        node = self.cluster.add_node(num_cpus=self.cpus_per_node, num_gpus=self.gpus_per_node)
        self._workers[node.node_id] = node
        return str(node.node_id)

    def worker_node_ids(self) -> list[str]:
        return list(self._workers)

    def kill_node(self, node_id: str) -> None:
        """Crash a node (no graceful drain): its raylet and everything under it die."""
        node = self._workers.pop(node_id)
        self.cluster.remove_node(node, allow_graceful=False)

    def forget_dead_nodes(self) -> list[str]:
        """Drop nodes that died behind our back (e.g. a fault hook killed their raylet)."""
        import ray

        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        dead = [nid for nid in self._workers if nid not in alive]
        for nid in dead:
            node = self._workers.pop(nid)
            with contextlib.suppress(Exception):  # its processes are gone already
                self.cluster.remove_node(node, allow_graceful=False)
        return dead

    def restore(self) -> list[str]:
        """Back to exactly ``nodes`` alive worker nodes (dead ones replaced, extra ones removed);
        returns the ids of the nodes added."""
        self.forget_dead_nodes()
        while len(self._workers) > self.nodes:
            extra = list(self._workers)[-1]
            self.cluster.remove_node(self._workers.pop(extra))
        added = [self.add_node() for _ in range(self.nodes - len(self._workers))]
        if added:
            self.cluster.wait_for_nodes()
        return added

    def shutdown(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        if self.cluster is not None:
            self.cluster.shutdown()
            self.cluster = None
