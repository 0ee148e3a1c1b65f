"""Snapshots in memory on two nodes, and which one a re-planned gang restores from.

Every rank snapshots its shard after every step (``workers.engine.checkpoint.snapshot``) and pushes
the bytes to two :class:`SnapshotHolder` actors: the one on its own node and the one on the next
node of the ring (:func:`buddy_of`), so a snapshot survives the loss of any one node. The bytes do
not go through Ray (``workers.runtime.recovery.snapshot_transport``: a fraction of the CPU Ray's object store costs
per push): to the buddy over a TCP link per (rank, holder), to the own node's holder as files in its
directory in node memory (:func:`local_dir`); :meth:`SnapshotHolder.address` says where. Holders are
plain Ray actors, one per node per job, owned by the job's supervisor (they die with it) and killed
at the job's end; they keep the newest ``keep`` snapshots (by step).

A snapshot is identified by ``(epoch, step)``: the gang's fencing epoch (a snapshot never mixes
ranks of two gangs) and the steps completed. It is *complete* when the surviving holders have
together every rank's file (``__<rank>_0.distcp``) and rank 0's ``.metadata``. A restoring rank
asks the holders for handles (:meth:`SnapshotHolder.refs`: Ray objects the holder owns) and fetches
only the files its new layout's pieces overlap (``workers.engine.checkpoint.snapshot``); Ray moves
each fetched object to a node once, the node's other ranks read that copy. :func:`choose` picks the newest complete
one that is at least as new as the newest storage checkpoint; the supervisor falls back to storage
only when no such snapshot exists (both copies of some shard gone, or snapshots off).

Pure Python apart from :class:`SnapshotHolder`'s Ray wrapping and :class:`Holders` (no torch).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

METADATA = ".metadata"
_SHARD = re.compile(r"^__(\d+)_\d+\.distcp$")


@dataclass(frozen=True)
class SnapshotKey:
    epoch: int
    step: int


@dataclass(frozen=True)
class Choice:
    """The snapshot to restore: its key, the world size that wrote it, and where each file is."""

    key: SnapshotKey
    world: int
    sources: dict[str, str]  # file name -> node id of a holder that has it

    def by_node(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for name, node in sorted(self.sources.items()):
            out.setdefault(node, []).append(name)
        return out


def complete(names: Iterable[str], world: int) -> bool:
    """Every rank's shard and the metadata are there."""
    names = set(names)
    ranks = {int(m.group(1)) for n in names if (m := _SHARD.match(n))}
    return METADATA in names and ranks >= set(range(world))


def choose(inventories: Mapping[str, Sequence[dict[str, Any]]], *, not_before: int = 0,
           not_after: int | None = None) -> Choice | None:
    """The newest complete snapshot over the holders' inventories (node -> ``[{"epoch", "step",
    "world", "files"}]``) whose step is ``>= not_before`` (the newest storage checkpoint) and
    ``<= not_after`` (the last step the supervisor saw completed: every rank finished it); ``None``:
    restore from storage. Ties on the step go to the newest epoch."""
    found: dict[SnapshotKey, tuple[int, dict[str, str]]] = {}
    for node in sorted(inventories):
        for entry in inventories[node]:
            key = SnapshotKey(int(entry["epoch"]), int(entry["step"]))
            world, sources = found.setdefault(key, (int(entry["world"]), {}))
            for name in entry["files"]:
                sources.setdefault(name, node)
    for key in sorted(found, key=lambda k: (k.step, k.epoch), reverse=True):
        world, sources = found[key]
        if key.step >= not_before and (not_after is None or key.step <= not_after) and complete(sources, world):
            return Choice(key, world, dict(sources))
    return None


def buddy_of(node: str, nodes: Iterable[str]) -> str | None:
    """The next node after ``node`` in the sorted ring of ``nodes`` (``None`` when it is alone)."""
    ring = sorted(set(nodes) | {node})
    if len(ring) < 2:
        return None
    return ring[(ring.index(node) + 1) % len(ring)]


def local_dir(holder_id: str) -> Path:
    """The node-local directory (in memory: ``/dev/shm`` where there is one) of the holder whose
    Ray actor id is ``holder_id``: its own node's ranks write their copies there."""
    shm = Path("/dev/shm")
    return (shm if shm.is_dir() else Path(tempfile.gettempdir())) / f"orthoplex-snap-{holder_id}"


class SnapshotHolder:
    """One node's memory for a job's snapshots (a Ray actor; see :class:`Holders`): what ranks of
    other nodes push over the wire (``snapshot_wire.Receiver``, kept in this process) and what this
    node's own ranks write into its directory in the node's memory (``snapshot_wire.LocalCopy``)."""

    def __init__(self, keep: int = 3, directory: str | None = None) -> None:
        import threading

        self.keep = keep
        self.snaps: dict[SnapshotKey, dict[str, Any]] = {}
        self._lock = threading.Lock()  # a threaded actor: pushes of several ranks arrive at once
        self._receiver: Any = None
        self._dir = Path(directory) if directory else None
        self._refs: dict[SnapshotKey, dict[str, Any]] = {}  # handles already put, per snapshot

    def _directory(self) -> Path:
        if self._dir is None:
            import ray

            self._dir = local_dir(ray.get_runtime_context().get_actor_id())
        self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        return self._dir

    def address(self, host: str | None = None) -> dict[str, Any]:
        """Where ranks push to this holder: ``host``/``port``/``token`` (hex) of its listener
        (``snapshot_wire``: a fresh random token, so only a rank given the address through Ray can
        store into it), its ``node`` and the ``dir`` its own node's ranks write into. The listener
        starts on the first call, on this node's IP (``host`` overrides)."""
        import secrets

        from workers.runtime.recovery.snapshot_transport import TOKEN_BYTES, Receiver

        with self._lock:
            if self._receiver is None:
                if host is None:
                    import ray

                    host = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
                self._receiver = Receiver(self.put, secrets.token_bytes(TOKEN_BYTES), host)
            host, port, token = self._receiver.address.as_tuple()
        return {"host": host, "port": port, "token": token, "node": self.node(), "dir": str(self._directory()),
                "keep": self.keep}

    def close(self) -> None:
        """Stop listening and drop the node-local copies (an actor's exit stops the listener too, but
        leaves the directory: :class:`Holders` removes it)."""
        if self._receiver is not None:
            self._receiver.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def node(self) -> str:
        try:
            import ray

            return ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"
        except Exception:
            return "local"

    def put(self, epoch: int, step: int, world: int, files: dict[str, Any]) -> int:
        key = SnapshotKey(epoch, step)
        with self._lock:
            entry = self.snaps.setdefault(key, {"world": world, "files": {}})
            entry["files"].update(files)
            for old in sorted(self.snaps, key=lambda k: (k.step, k.epoch))[:-self.keep]:
                del self.snaps[old]
        return sum(len(b) for b in files.values())

    def _local(self) -> dict[SnapshotKey, dict[str, Any]]:
        """The node-local copies: key -> ``{"world", "files": {name: path}}`` (the newest ``keep``)."""
        from workers.runtime.recovery.snapshot_transport import parse_local_name

        found: dict[SnapshotKey, dict[str, Any]] = {}
        if self._dir is None or not self._dir.is_dir():
            return found
        for f in self._dir.iterdir():
            parsed = parse_local_name(f.name)
            if parsed is not None:
                epoch, step, world, name = parsed
                found.setdefault(SnapshotKey(epoch, step), {"world": world, "files": {}})["files"][name] = f
        newest = sorted(found, key=lambda k: (k.step, k.epoch))[-self.keep:]
        return {k: found[k] for k in newest}

    def _merged(self) -> dict[SnapshotKey, dict[str, Any]]:
        out = {k: {"world": e["world"], "files": dict(e["files"])} for k, e in self._local().items()}
        for k, e in self.snaps.items():
            out.setdefault(k, {"world": e["world"], "files": {}})["files"].update(e["files"])
        return out

    def inventory(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"epoch": k.epoch, "step": k.step, "world": e["world"], "files": sorted(e["files"])}
                    for k, e in self._merged().items()]

    def get(self, epoch: int, step: int, names: list[str]) -> dict[str, Any]:
        with self._lock:
            files = self._merged()[SnapshotKey(epoch, step)]["files"]
        return {n: (files[n].read_bytes() if isinstance(files[n], Path) else files[n]) for n in names}

    def refs(self, epoch: int, step: int, names: list[str]) -> dict[str, Any]:
        """Handles (Ray ``ObjectRef``s owned by this holder) to files of a snapshot: a restoring rank
        takes the handles of every file and fetches (``ray.get``) only those its new layout needs;
        Ray moves an object once per node, ranks on that node share the copy. Each file is put
        into this node's object store on its first request (never while snapshots only arrive)."""
        import ray

        key = SnapshotKey(epoch, step)
        with self._lock:
            cache = self._refs.setdefault(key, {})
        missing = [n for n in names if n not in cache]
        for n, data in self.get(epoch, step, missing).items():
            cache[n] = ray.put(data)
        return {n: cache[n] for n in names}


@dataclass
class Holders:
    """The job's holders, one per node (created on demand, pinned to their node, owned by the caller)."""

    keep: int = 3
    actors: dict[str, Any] = field(default_factory=dict)

    def ensure(self, nodes: Iterable[str], *, needed: Iterable[str] = (), timeout_s: float = 60.0) -> dict[str, Any]:
        """A live holder on each of ``nodes`` (dead ones dropped and replaced); node -> actor. Waits up
        to ``timeout_s`` for the holders of the ``needed`` nodes (the gang's) only: the others come up
        in the background (a rank's push to one waits for it)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        cls = ray.remote(num_cpus=0, max_concurrency=8, max_restarts=0)(SnapshotHolder)
        alive = self.alive(timeout_s=2.0)
        for node in nodes:
            if node not in alive and node not in self.actors:
                self.actors[node] = cls.options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(self.keep)
        deadline = time.monotonic() + timeout_s
        for n in needed:
            if n not in self.actors:
                continue
            try:
                ray.get(self.actors[n].node.remote(), timeout=max(0.1, deadline - time.monotonic()))
            except Exception:  # its node is going away: no holder there
                with contextlib.suppress(Exception):
                    ray.kill(self.actors[n], no_restart=True)
                self.actors.pop(n, None)
        return dict(self.actors)

    def forget(self, nodes: Iterable[str]) -> None:
        """Drop the holders of ``nodes`` without asking them (known down: asking would wait)."""
        import ray

        for n in set(nodes) & set(self.actors):
            with contextlib.suppress(Exception):
                ray.kill(self.actors[n], no_restart=True)
            _drop_local_dir(self.actors.pop(n))

    def alive(self, timeout_s: float = 2.0) -> dict[str, Any]:
        """The holders that answer within ``timeout_s`` (a dead node's holder is dropped)."""
        import ray

        refs = {n: a.node.remote() for n, a in self.actors.items()}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
        ok = {}
        for n, ref in refs.items():
            if ref in ready:
                with contextlib.suppress(Exception):
                    ray.get(ref)
                    ok[n] = self.actors[n]
        for n in set(self.actors) - set(ok):  # dead, or too slow to trust: replaced by a fresh one
            with contextlib.suppress(Exception):
                ray.kill(self.actors[n], no_restart=True)
            _drop_local_dir(self.actors.pop(n))
        return ok

    def inventories(self, timeout_s: float = 5.0) -> dict[str, list[dict[str, Any]]]:
        import ray

        out: dict[str, list[dict[str, Any]]] = {}
        for n, a in self.alive(timeout_s=timeout_s).items():
            with contextlib.suppress(Exception):
                out[n] = ray.get(a.inventory.remote(), timeout=timeout_s)
        return out

    def targets(self, node: str) -> list[Any]:
        """Where a rank on ``node`` pushes: its own node's holder and its buddy's."""
        return [self.actors[n] for n in self.copy_nodes(node)]

    def copy_nodes(self, node: str) -> list[str]:
        """The nodes whose holders keep the copies of a rank on ``node`` (:meth:`targets`)."""
        out = [node] if node in self.actors else []
        buddy = buddy_of(node, self.actors)
        if buddy is not None and buddy != node:
            out.append(buddy)
        return out

    def kill(self) -> None:
        """Close every holder (its node-local copies go), then kill it."""
        import ray

        closing = [a.close.remote() for a in self.actors.values()]
        with contextlib.suppress(Exception):
            ray.wait(closing, num_returns=len(closing), timeout=5.0)
        for a in self.actors.values():
            with contextlib.suppress(Exception):
                ray.kill(a, no_restart=True)
            _drop_local_dir(a)
        self.actors = {}


def _drop_local_dir(actor: Any) -> None:
    """Remove a killed holder's node-local directory where this process can see it. On a real cluster
    a lost node's memory is gone with it; nodes simulated on one host share ``/dev/shm``, and a
    holder killed without :meth:`SnapshotHolder.close` would leave its copies there."""
    with contextlib.suppress(Exception):
        shutil.rmtree(local_dir(actor._actor_id.hex()), ignore_errors=True)
