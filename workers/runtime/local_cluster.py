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
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.runtime import procfs
from workers.runtime.rank_env import minimal_env

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


# ---------------------------------------------------------------------------- ray start clusters
def state_file(data_dir: Path | None = None) -> Path:
    if data_dir is None:
        from service.settings import get_settings

        data_dir = get_settings().storage_path.parent
    return Path(data_dir) / "cluster.json"


def _ray_bin() -> str:
    return str(Path(sys.executable).with_name("ray"))


def _ray_start(args: list[str], env: dict[str, str]) -> int:
    """Run ``ray start`` in a session of its own; returns that session id. Everything it spawns (raylet,
    GCS, DashboardAgent, RuntimeEnvAgent, workers) inherits the session, whatever its process title."""
    proc = subprocess.Popen([_ray_bin(), "start", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out, _ = proc.communicate(timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"ray start {' '.join(args)} failed:\n{out[-3000:]}")
    return proc.pid


def cluster_up(nodes: int, gpus_per_node: int, *, cpus_per_node: float = 2.0, data_dir: Path | None = None,
               port: int | None = None) -> dict[str, Any]:
    """Start a head (no GPUs) and ``nodes`` worker nodes as ``ray start`` processes; returns the record."""
    local_env()
    path = state_file(data_dir)
    check_no_cluster(data_dir)
    port = port or free_port()
    temp_dir = Path(f"/tmp/orthoplex-ray-{os.getpid()}-{port}")
    # the nodes (and every rank process) get no service secrets; the head and the workers listen on
    # 127.0.0.1 only; an operator's RAY_AUTH_MODE (e.g. token) is kept as set
    env = minimal_env()
    address = f"127.0.0.1:{port}"
    common = ["--disable-usage-stats", f"--temp-dir={temp_dir}"]
    system_config = json.dumps(FAST_HEALTH_CHECK)
    rec: dict[str, Any] = {"mode": "local", "address": address, "temp_dir": str(temp_dir), "nodes": nodes,
                           "gpus_per_node": gpus_per_node, "started_at": time.time(), "sessions": [], "pids": []}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec, indent=2))  # before anything starts: `down` works after a crash of `up`
    try:
        rec["sessions"].append(_ray_start(["--head", f"--port={port}", "--num-cpus=1", "--num-gpus=0",
                                           "--include-dashboard=false", "--node-ip-address=127.0.0.1",
                                           f"--system-config={system_config}", *common], env))
        path.write_text(json.dumps(rec, indent=2))
        for _ in range(nodes):
            rec["sessions"].append(_ray_start([f"--address={address}", f"--num-cpus={cpus_per_node:g}",
                                               f"--num-gpus={gpus_per_node}", "--node-ip-address=127.0.0.1",
                                               *common], env))
            path.write_text(json.dumps(rec, indent=2))
    except BaseException:
        cluster_down(data_dir)
        raise
    rec["pids"] = _pids_of(rec)
    path.write_text(json.dumps(rec, indent=2))
    return rec


def check_no_cluster(data_dir: Path | None = None) -> None:
    """Refuse a second cluster while the recorded one lives; clear what a crashed one left behind."""
    rec = read_record(data_dir)
    if rec is None:
        return
    if rec.get("mode") == "netns":
        from workers.runtime.netns_cluster import record_pids

        alive = record_pids(rec)
    else:
        alive = _pids_of(rec) if rec.get("temp_dir") else []
    if alive:
        raise RuntimeError(f"a local cluster is already up at {rec.get('address')} (orthoplex cluster down)")
    cluster_down(data_dir)  # namespaces, links or files a crashed `up` left


def read_record(data_dir: Path | None = None) -> dict[str, Any] | None:
    path = state_file(data_dir)
    return json.loads(path.read_text()) if path.exists() else None


def _pids_under(temp_dir: Path) -> list[int]:
    """Pids of the processes whose command line names our private temp dir (our cluster only)."""
    marker = str(temp_dir)
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd and int(entry.name) != os.getpid():
            out.append(int(entry.name))
    return sorted(out)


def _pids_alive(rec: dict[str, Any]) -> list[int]:
    return [p for p in rec.get("pids", []) if Path(f"/proc/{p}").exists() and not _zombie(p)]


def _pids_of(rec: dict[str, Any]) -> list[int]:
    """Every live process of the recorded cluster: its ``ray start`` sessions and its temp dir."""
    from workers.runtime.netns_cluster import _pids_in_sessions

    pids = set(_pids_in_sessions({int(s) for s in rec.get("sessions", [])}))
    pids |= set(_pids_under(Path(rec["temp_dir"])))
    return sorted(p for p in pids if not _zombie(p))


def cluster_down(data_dir: Path | None = None, *, timeout_s: float = 20.0) -> int:
    """Stop the recorded cluster's processes (SIGTERM, then SIGKILL) -- and for a ``--netns`` cluster its
    namespaces and links too; returns how many processes were signalled."""
    path = state_file(data_dir)
    rec = read_record(data_dir)
    if rec is None:
        return 0
    if rec.get("mode") == "netns":
        from workers.runtime.netns_cluster import cleanup_record

        n = cleanup_record(rec)["processes"]
        path.unlink(missing_ok=True)
        return n
    pids = sorted(set(_pids_alive(rec)) | set(_pids_of(rec)))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, sig)
        deadline = time.monotonic() + (timeout_s if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() and not _zombie(p) for p in pids):
            time.sleep(0.2)
    path.unlink(missing_ok=True)
    return len(pids)


def _zombie(pid: int) -> bool:
    """Gone or a zombie (not a live process)."""
    return not procfs.alive(pid)
