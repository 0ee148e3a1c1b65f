"""A local Ray cluster whose nodes live in their own network namespaces (real hosts, one machine).

Layout (``k`` is a free third octet picked at ``up``; ``id`` a short random tag)::

    root namespace   bridge oxb<id>   10.250.k.1/24   the driver's own Ray node (0 CPUs, 0 GPUs)
    ox<id>-head      eth0             10.250.k.2/24   Ray head (GCS), 1 CPU, 0 GPUs
    ox<id>-n<i>      eth0             10.250.k.(10+i)  Ray worker node i, ``gpus_per_node`` declared GPUs

Each namespace is joined to the bridge by a veth pair whose root end is ``oxv<id>head`` / ``oxv<id>n<i>``;
every fault of :mod:`workers.testbed.network_faults` acts on those links. The root namespace itself gets a
name, ``oxr<id>`` (a handle made by ``ip netns attach``: removing it removes nothing else), so a job's
supervisor, which lives in the head's namespace, can shape the bridge ends of the links for the job
spec's network faults (:func:`discover_here`). Ray runs across them as across
hosts (``ray start --node-ip-address``); the driver (a test, ``orthoplex run``) reaches the head
through the bridge. Ray's driver must run on a Ray node, so the root namespace gets a node of its
own with no resources; it never receives work.

Every namespace, link and process this makes is written to the state file *before* it is made, so
``down`` (or :func:`cleanup_record`) removes all of it even after ``up`` crashed half way: the
processes of a namespace are killed with ``ip netns pids`` (nothing in our namespaces is anybody
else's), the root-namespace node by its session id (``ray start`` runs in a session of its own,
and Ray's DashboardAgent / RuntimeEnvAgent inherit it, whatever their process titles say).

Needs root and ``ip netns`` (:func:`netns_available` says why not). Only addresses of namespaces
made here are ever reached.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.runtime.cluster import procfs
from workers.testbed.local_cluster import FAST_HEALTH_CHECK, local_env

log = logging.getLogger(__name__)

SUBNET_PREFIX = "10.250"
GCS_PORT = 6380  # in the head's own namespace: never clashes with the machine's services
BRIDGE_IP_HOST = 1
HEAD_IP_HOST = 2
NODE_IP_BASE = 10


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def netns_available() -> tuple[bool, str]:
    """Whether this process can make network namespaces, veths and bridges; the reason if not."""
    if os.geteuid() != 0:
        return False, "not root (network namespaces need CAP_NET_ADMIN)"
    if shutil.which("ip") is None:
        return False, "the `ip` command (iproute2) is missing"
    name = f"oxprobe{secrets.token_hex(3)}"
    proc = _ip("netns", "add", name, check=False)
    if proc.returncode != 0:
        return False, f"`ip netns add` failed: {proc.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return True, ""


def _used_third_octets() -> set[int]:
    out = _ip("-4", "-o", "addr", "show", check=False).stdout
    used = set()
    for line in out.splitlines():
        for tok in line.split():
            if tok.startswith(SUBNET_PREFIX + "."):
                with contextlib.suppress(ValueError, IndexError):
                    used.add(int(tok.split(".")[2]))
    return used


@dataclass
class NetnsNode:
    name: str  # "head" or "n1", "n2", ...
    netns: str
    veth: str  # the root-namespace end, on the bridge
    ip: str
    gpus: int
    cpus: float
    ray_node_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class NetnsCluster:
    """Head + ``nodes`` worker nodes, each in its own network namespace, on one bridge."""

    nodes: int = 3
    gpus_per_node: int = 4
    cpus_per_node: float = 2.0
    head_cpus: float = 1.0
    state_path: Path | None = None
    connect: bool = False
    with_ray: bool = True  # False: the namespaces and links only (network tests without Ray)
    system_config: dict[str, Any] = field(default_factory=lambda: dict(FAST_HEALTH_CHECK))
    tag: str = field(default_factory=lambda: secrets.token_hex(2))
    octet: int = 0
    temp_dir: str = ""
    head: NetnsNode | None = None
    workers: list[NetnsNode] = field(default_factory=list)
    _rec: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ names
    @property
    def bridge(self) -> str:
        return f"oxb{self.tag}"

    @property
    def bridge_ip(self) -> str:
        return f"{SUBNET_PREFIX}.{self.octet}.{BRIDGE_IP_HOST}"

    @property
    def address(self) -> str:
        assert self.head is not None
        return f"{self.head.ip}:{GCS_PORT}"

    def node(self, name_or_id: str) -> NetnsNode:
        """A node by name (``head``, ``n1``), namespace, IP or Ray node id."""
        for n in [*( [self.head] if self.head else []), *self.workers]:
            if name_or_id in (n.name, n.netns, n.ip, n.ray_node_id):
                return n
        raise KeyError(f"no node {name_or_id!r} in this cluster")

    # ------------------------------------------------------------------ state file
    def _save(self) -> None:
        if self.state_path is None:
            return
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._rec, indent=2))
        tmp.replace(self.state_path)

    def _record(self, key: str, value: Any) -> None:
        if isinstance(self._rec.get(key), list):
            self._rec[key].append(value)
        else:
            self._rec[key] = value
        self._save()

    # ------------------------------------------------------------------ up
    def start(self) -> NetnsCluster:
        ok, why = netns_available()
        if not ok:
            raise RuntimeError(f"network-namespace cluster unavailable: {why}")
        local_env()
        used = _used_third_octets()
        free = [k for k in range(1, 255) if k not in used]
        if not free:
            raise RuntimeError(f"no free {SUBNET_PREFIX}.x.0/24 subnet left")
        self.octet = free[secrets.randbelow(len(free))]
        self.temp_dir = f"/tmp/oxn{self.tag}"
        self._rec = {"mode": "netns", "tag": self.tag, "octet": self.octet, "temp_dir": self.temp_dir,
                     "bridge": "", "netns": [], "links": [], "sessions": [], "nodes": [],
                     "started_at": time.time(), "address": "", "driver_ip": ""}
        self._save()
        try:
            self._make_network()
            if self.with_ray:
                self._start_ray()
        except BaseException:
            cleanup_record(self._rec)
            if self.state_path is not None:
                self.state_path.unlink(missing_ok=True)
            raise
        if self.connect and self.with_ray:
            self.connect_driver()
        return self

    @property
    def root_handle(self) -> str:
        return f"oxr{self.tag}"

    def _make_network(self) -> None:
        self._record("root_handle", self.root_handle)  # never in "netns": its pids are the machine's
        _ip("netns", "attach", self.root_handle, str(os.getpid()))
        self._record("bridge", self.bridge)
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.bridge_ip}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        self.head = self._add_ns("head", HEAD_IP_HOST, gpus=0, cpus=self.head_cpus)
        self.workers = [self._add_ns(f"n{i}", NODE_IP_BASE + i, gpus=self.gpus_per_node, cpus=self.cpus_per_node)
                        for i in range(1, self.nodes + 1)]
        self._record("driver_ip", self.bridge_ip)

    def _add_ns(self, name: str, host: int, *, gpus: int, cpus: float) -> NetnsNode:
        node = NetnsNode(name=name, netns=f"ox{self.tag}-{name}", veth=f"oxv{self.tag}{name}",
                         ip=f"{SUBNET_PREFIX}.{self.octet}.{host}", gpus=gpus, cpus=cpus)
        self._record("netns", node.netns)
        _ip("netns", "add", node.netns)
        self._record("links", node.veth)
        _ip("link", "add", node.veth, "type", "veth", "peer", "name", "eth0", "netns", node.netns)
        _ip("link", "set", node.veth, "master", self.bridge, "up")
        _ip("-n", node.netns, "addr", "add", f"{node.ip}/24", "dev", "eth0")
        _ip("-n", node.netns, "link", "set", "eth0", "up")
        _ip("-n", node.netns, "link", "set", "lo", "up")
        _ip("-n", node.netns, "route", "add", "default", "via", self.bridge_ip)
        self._record("nodes", node.to_dict())
        return node

    def _spawn(self, netns: str | None, args: list[str]) -> subprocess.Popen[str]:
        from workers.runtime.cluster.rank_env import minimal_env

        env = minimal_env()  # the nodes and every rank process get no service secrets
        env.setdefault("RAY_AUTH_MODE", "disabled")
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        ray_bin = str(Path(sys.executable).with_name("ray"))
        cmd = [ray_bin, "start", "--disable-usage-stats", f"--temp-dir={self.temp_dir}", *args]
        if netns is not None:
            cmd = ["ip", "netns", "exec", netns, *cmd]
            # gloo (and NCCL) pick their interface from the hostname, which resolves to the machine's
            # own address, absent in a node's namespace: they would fall back to loopback and never
            # reach another node. Every process of the node (raylet, workers) inherits this.
            env["GLOO_SOCKET_IFNAME"] = "eth0"
            env["NCCL_SOCKET_IFNAME"] = "eth0"
        # A session of its own: every process ``ray start`` spawns (raylet, agents, workers) keeps its
        # session id, so ``down`` finds them even when their process titles do not name our temp dir.
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        self._record("sessions", proc.pid)
        return proc

    def _wait(self, proc: subprocess.Popen[str], where: str, timeout_s: float = 300.0) -> None:
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise RuntimeError(f"ray start in {where} did not finish in {timeout_s:.0f} s") from None
        if proc.returncode != 0:
            raise RuntimeError(f"ray start in {where} failed:\n{out[-1500:]}\n{self._raylet_log_tail()}")

    def _raylet_log_tail(self, lines: int = 15) -> str:
        logs = sorted(Path(self.temp_dir).glob("session_*/logs/raylet*.out"), key=lambda p: p.stat().st_mtime)
        if not logs:
            return "(no raylet log)"
        tail = logs[-1].read_text(errors="replace").splitlines()[-lines:]
        return f"{logs[-1].name}:\n" + "\n".join(tail)

    def _start_ray(self) -> None:
        assert self.head is not None
        self._record("address", self.address)
        head = self._spawn(self.head.netns, ["--head", f"--port={GCS_PORT}", f"--num-cpus={self.head.cpus:g}",
                                             "--num-gpus=0", "--include-dashboard=false",
                                             f"--node-ip-address={self.head.ip}",
                                             f"--system-config={json.dumps(self.system_config)}"])
        self._wait(head, self.head.netns)
        # worker nodes join one after another (parallel joins overload the GCS of a busy 2-core
        # machine: "Failed to get node info: Deadline Exceeded"); the driver's node in the root
        # namespace has no resources, so nothing is ever scheduled on it
        for n in self.workers:
            self._wait(self._spawn(n.netns, [f"--address={self.address}", f"--num-cpus={n.cpus:g}",
                                             f"--num-gpus={n.gpus}", f"--node-ip-address={n.ip}"]), n.netns)
        self._wait(self._spawn(None, [f"--address={self.address}", "--num-cpus=0", "--num-gpus=0",
                                      f"--node-ip-address={self.bridge_ip}"]), "the root namespace")
        self._resolve_node_ids()

    def _resolve_node_ids(self, timeout_s: float = 120.0) -> None:
        """Map every namespace to its Ray node id (by IP), via the GCS, without becoming a driver."""
        deadline = time.monotonic() + timeout_s
        want = {n.ip: n for n in [self.head, *self.workers] if n is not None}
        while True:
            seen = _gcs_nodes(self.address)
            for ip, node_id in seen.items():
                if ip in want:
                    want[ip].ray_node_id = node_id
            if all(n.ray_node_id for n in want.values()):
                break
            if time.monotonic() > deadline:
                missing = [n.name for n in want.values() if not n.ray_node_id]
                raise RuntimeError(f"nodes {missing} did not register with the GCS in {timeout_s:.0f} s")
            time.sleep(0.5)
        self._rec["nodes"] = [n.to_dict() for n in want.values()]
        self._save()

    def restart_node(self, name: str, timeout_s: float = 120.0) -> str:
        """Kill whatever runs in a worker node's namespace and start a fresh Ray node there (a
        replaced machine); returns its new Ray node id."""
        n = self.node(name)
        _kill_all(_pids_in_netns(n.netns), 3.0)
        old = n.ray_node_id
        self._wait(self._spawn(n.netns, [f"--address={self.address}", f"--num-cpus={n.cpus:g}",
                                         f"--num-gpus={n.gpus}", f"--node-ip-address={n.ip}"]), n.netns)
        deadline = time.monotonic() + timeout_s
        while True:
            new = _gcs_nodes(self.address).get(n.ip)
            if new and new != old:
                n.ray_node_id = new
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {name} did not re-register in {timeout_s:.0f} s")
            time.sleep(0.5)
        self._rec["nodes"] = [x.to_dict() for x in [self.head, *self.workers] if x is not None]
        self._save()
        return new

    def processes(self, name: str) -> list[int]:
        """The live processes in a node's namespace."""
        return [p for p in _pids_in_netns(self.node(name).netns) if _alive(p)]

    def connect_driver(self) -> None:
        import ray

        if ray.is_initialized():  # a driver of another cluster (one process has one driver connection)
            ray.shutdown()
        ray.init(address=self.address, _node_ip_address=self.bridge_ip, namespace="orthoplex",
                 log_to_driver=False, logging_level=logging.WARNING)

    def record(self) -> dict[str, Any]:
        return dict(self._rec)

    def worker_node_ids(self) -> list[str]:
        return [n.ray_node_id for n in self.workers]

    # ------------------------------------------------------------------ down
    def shutdown(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        cleanup_record(self._rec)
        if self.state_path is not None:
            self.state_path.unlink(missing_ok=True)


def _gcs_nodes(address: str) -> dict[str, str]:
    """ip -> node id of the alive nodes, asked from the GCS directly (no driver needed)."""
    from ray._raylet import GcsClient

    try:
        client = GcsClient(address=address)
        infos = client.get_all_node_info(timeout=5)
    except Exception:  # GCS not up yet
        return {}
    out = {}
    for info in infos.values():
        if int(info.state) == 0:  # ALIVE
            out[info.node_manager_address] = info.node_id.hex()
    return out


# ---------------------------------------------------------------------------- cleanup
def _pids_in_netns(netns: str) -> list[int]:
    proc = _ip("netns", "pids", netns, check=False)
    return [int(p) for p in proc.stdout.split() if p.strip().isdigit()]


def _pids_in_sessions(sids: set[int]) -> list[int]:
    return procfs.in_sessions(sids)


def _alive(pid: int) -> bool:
    return procfs.alive(pid)


def _kill_all(pids: list[int], grace_s: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, sig)
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.1)


def record_pids(rec: dict[str, Any]) -> list[int]:
    """Every live process that belongs to the recorded cluster."""
    pids = set(_pids_in_sessions({int(s) for s in rec.get("sessions", [])}))
    for ns in rec.get("netns", []):
        pids |= set(_pids_in_netns(ns))
    return sorted(p for p in pids if p != os.getpid() and _alive(p))


def cleanup_record(rec: dict[str, Any], *, grace_s: float = 5.0) -> dict[str, int]:
    """Remove every process, namespace and link named in ``rec`` (idempotent); returns counts."""
    pids = record_pids(rec)
    _kill_all(pids, grace_s)
    # a process that forked while we were killing: one more sweep
    late = record_pids(rec)
    if late:
        _kill_all(late, 1.0)
    ns_removed = 0
    for ns in rec.get("netns", []):
        if _ip("netns", "del", ns, check=False).returncode == 0:
            ns_removed += 1
    if rec.get("root_handle") and _ip("netns", "del", rec["root_handle"], check=False).returncode == 0:
        ns_removed += 1
    links = 0
    for link in [*rec.get("links", []), *([rec["bridge"]] if rec.get("bridge") else [])]:
        if _ip("link", "del", link, check=False).returncode == 0:
            links += 1
    if rec.get("temp_dir"):
        shutil.rmtree(rec["temp_dir"], ignore_errors=True)
    return {"processes": len(pids) + len(late), "namespaces": ns_removed, "links": links}


def leftovers(rec: dict[str, Any]) -> dict[str, list[Any]]:
    """What of ``rec`` still exists (empty lists: nothing)."""
    existing_ns = set(_ip("netns", "list", check=False).stdout.split())
    links = [lk for lk in [*rec.get("links", []), rec.get("bridge", "")]
             if lk and _ip("link", "show", lk, check=False).returncode == 0]
    named = [*rec.get("netns", []), *([rec["root_handle"]] if rec.get("root_handle") else [])]
    return {"processes": record_pids(rec), "namespaces": [n for n in named if n in existing_ns],
            "links": links}


def subnet_of(rec: dict[str, Any]) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(f"{SUBNET_PREFIX}.{rec['octet']}.0/24")


def _own_netns_name() -> str | None:
    """The name (under /run/netns) of this process's network namespace, None if it has none."""
    try:
        own = os.stat("/proc/self/ns/net")
        names = os.listdir("/run/netns")
    except OSError:
        return None
    for name in sorted(names):
        with contextlib.suppress(OSError):
            st = os.stat(f"/run/netns/{name}")
            if (st.st_ino, st.st_dev) == (own.st_ino, own.st_dev) and not name.startswith("oxr"):
                return name
    return None


def discover_here() -> dict[str, Any] | None:
    """The cluster record of the namespaced cluster this process runs in (a supervisor in the head's
    namespace, a rank in a node's): ``root_handle`` and ``nodes`` (name, netns, veth, ip), read from
    the namespaces themselves; None when this process is in no namespace of such a cluster (an
    in-process or single-IP cluster). Ray node ids are left to the caller (they change on restart)."""
    own = _own_netns_name()
    m = re.fullmatch(r"ox([0-9a-f]+)-(head|n\d+)", own or "")
    if m is None:
        return None
    tag = m.group(1)
    root = f"oxr{tag}"
    if not Path(f"/run/netns/{root}").exists():
        return None
    nodes = []
    for ns in sorted(_ip("netns", "list", check=False).stdout.split()):
        mm = re.fullmatch(rf"ox{tag}-(head|n\d+)", ns)
        if mm is None:
            continue
        addr = _ip("-n", ns, "-4", "-o", "addr", "show", "dev", "eth0", check=False).stdout.split()
        ip = next((a.split("/")[0] for a in addr if a.startswith(SUBNET_PREFIX + ".")), "")
        nodes.append({"name": mm.group(1), "netns": ns, "veth": f"oxv{tag}{mm.group(1)}", "ip": ip,
                      "gpus": 0, "cpus": 0.0})
    return {"root_handle": root, "nodes": nodes, "tag": tag}
