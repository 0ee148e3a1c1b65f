"""The recorded local cluster of ``orthoplex cluster up`` / ``down``: plain ``ray start`` processes or
namespaced nodes (``--netns``), its record file (``cluster.json`` beside the service's storage), the
refusal of a second cluster and the clean-up of whatever a crashed one left behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from service.settings import DATA_DIR, get_settings
from workers.runtime.cluster import procfs, ray_auth
from workers.runtime.cluster.rank_env import minimal_env
from workers.testbed.local_cluster import FAST_HEALTH_CHECK, free_port, local_env
from workers.testbed.netns_cluster import NetnsCluster, cleanup_record, record_pids


def state_file(data_dir: Path | None = None) -> Path:
    if data_dir is None:
        storage = get_settings().storage_path  # an s3:// storage path: the record stays in the data dir
        data_dir = storage.parent if isinstance(storage, Path) else DATA_DIR
    return Path(data_dir) / "cluster.json"


def token_file(data_dir: Path | None = None) -> Path:
    """The recorded cluster's Ray token (``0600``, beside its record; fresh for every ``up``)."""
    return state_file(data_dir).with_name("cluster.token")


def head_env(env: dict[str, str], gcs_port: int) -> dict[str, str]:
    """The head's environment: Ray 2.60's autoscaler monitor serves Prometheus metrics, with no auth, on
    every interface (``AUTOSCALER_METRIC_PORT``, 44217) unless the head's address is loopback, which
    ``ray start`` never leaves it (it rewrites 127.0.0.1 to the routable IP). There is no switch to turn
    it off: it is pointed at the GCS's own port, so its bind fails and the monitor carries on without
    it (it logs "An exception occurred while starting the metrics server")."""
    return {**env, "AUTOSCALER_METRIC_PORT": str(gcs_port)}


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
    # the nodes (and every rank process) get no service secrets, and token auth with a fresh token
    tokens = ray_auth.new_token_file(token_file(data_dir))
    env = dict(ray_auth.token_env(tokens, minimal_env()))
    address = f"127.0.0.1:{port}"
    common = ["--disable-usage-stats", f"--temp-dir={temp_dir}"]
    system_config = json.dumps(FAST_HEALTH_CHECK)
    rec: dict[str, Any] = {"mode": "local", "address": address, "temp_dir": str(temp_dir), "nodes": nodes,
                           "gpus_per_node": gpus_per_node, "started_at": time.time(), "sessions": [], "pids": [],
                           "auth": "token", "token_file": str(tokens)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec, indent=2))  # before anything starts: `down` works after a crash of `up`
    try:
        # no dashboard (so no job-submission API; Orthoplex's Ray has no aiohttp for it anyway), and were
        # it there, loopback only; Ray's gRPC servers bind every interface whatever --node-ip-address
        # says: the token guards them
        rec["sessions"].append(_ray_start(["--head", f"--port={port}", "--num-cpus=1", "--num-gpus=0",
                                           "--include-dashboard=false", "--dashboard-host=127.0.0.1",
                                           "--node-ip-address=127.0.0.1",
                                           f"--system-config={system_config}", *common], head_env(env, port)))
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
    pids = set(procfs.in_sessions({int(s) for s in rec.get("sessions", [])}))
    pids |= set(_pids_under(Path(rec["temp_dir"])))
    return sorted(p for p in pids if not _zombie(p))


def cluster_pids(rec: dict[str, Any]) -> list[int]:
    """Every live process of a recorded cluster (plain or ``--netns``)."""
    return record_pids(rec) if rec.get("mode") == "netns" else _pids_of(rec)


def cluster_down(data_dir: Path | None = None, *, timeout_s: float = 20.0) -> int:
    """Stop the recorded cluster's processes (SIGTERM, then SIGKILL) -- and for a ``--netns`` cluster its
    namespaces and links too; returns how many processes were signalled."""
    path = state_file(data_dir)
    rec = read_record(data_dir)
    if rec is None:
        return 0
    if rec.get("mode") == "netns":
        n = cleanup_record(rec)["processes"]
        path.unlink(missing_ok=True)
        token_file(data_dir).unlink(missing_ok=True)
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
    token_file(data_dir).unlink(missing_ok=True)
    return len(pids)


def _zombie(pid: int) -> bool:
    """Gone or a zombie (not a live process)."""
    return not procfs.alive(pid)


def netns_cluster_up(nodes: int, gpus_per_node: int, *, cpus_per_node: float = 2.0,
                     data_dir: Path | None = None) -> dict[str, Any]:
    """``orthoplex cluster up --netns``: start a namespaced cluster that outlives the command."""
    check_no_cluster(data_dir)
    saved = ray_auth.saved_env()
    try:
        cluster = NetnsCluster(nodes=nodes, gpus_per_node=gpus_per_node, cpus_per_node=cpus_per_node,
                               state_path=state_file(data_dir)).start()
        rec = cluster.record()
        rec.update({"nodes_count": nodes, "gpus_per_node": gpus_per_node})
        cluster._rec = rec
        cluster._save()
    finally:
        # the cluster outlives the command, its token stays in its file: this process (a CLI run in
        # another program, a test) gets its own Ray auth variables back
        ray_auth.restore_env(saved)
    return rec
