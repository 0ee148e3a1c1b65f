"""How a rank's snapshot reaches the snapshot holders: one TCP connection per (rank, holder), not
Ray's object store.

Measured on this 2-core host (``bench/snapshot_cpu.py``, and a push micro-benchmark noted in
``docs/runtime.md``): pushing a 1.9 MiB rank file to two holders through Ray (``ray.put`` once, one
actor call per holder, each holder pulling the object) cost about 22-30 ms of CPU per push, spread
over the rank (7 ms), the raylets (8-10 ms: the object transfer) and the holders (7-15 ms:
deserialising); the same bytes over a socket cost about 4 ms. With 8 ranks snapshotting every step
that is the difference between 0.2-0.5 and about 0.03 CPU seconds per step, on the cores that train.
Restores still go through Ray (``SnapshotHolder.refs``): they are rare and fetch only what they need.

The protocol is one frame per file: a fixed header (the holder's job token, the gang's fencing epoch,
the step, the world size that wrote it, the name's and the data's lengths), the name, the data. The
holder answers each frame with one byte (``ACK``, or ``NAK`` for a wrong token, then closes). A
sender sends all frames of a snapshot to every live holder, then reads the answers; a holder that
fails (refused, reset, silent for ``timeout_s``) is dropped for good: the next gang gets new links.

The copy for the holder on the rank's own node needs no network: :class:`LocalCopy` writes it into
that holder's directory in the node's memory (``/dev/shm``), which outlives the rank and goes with
the node, as the holder's memory does.

Pure Python (standard library and numpy): :class:`Receiver` runs inside a holder, :class:`Sender`
and :class:`LocalCopy` in a rank.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("orthoplex.snapshot_wire")
TOKEN_BYTES = 16
FRAME = struct.Struct(f"<{TOKEN_BYTES}sqqqIQ")  # token, epoch, step, world, name length, data length
ACK, NAK = b"\x01", b"\x00"
MAX_NAME = 4096
Store = Callable[[int, int, int, dict[str, bytearray]], Any]  # (epoch, step, world, {name: data})
Buffers = Sequence[Any]  # bytes-like parts of one file, sent back to back


@dataclass(frozen=True)
class Address:
    """Where a holder listens, and the token its frames must carry."""

    host: str
    port: int
    token: bytes

    def as_tuple(self) -> tuple[str, int, str]:
        return self.host, self.port, self.token.hex()

    @classmethod
    def of(cls, value: Address | Mapping[str, Any] | Sequence[Any]) -> Address:
        if isinstance(value, Address):
            return value
        if isinstance(value, Mapping):
            value = (value["host"], value["port"], value["token"])
        host, port, token = value
        return cls(str(host), int(port), bytes.fromhex(token) if isinstance(token, str) else bytes(token))


def _recv_exact(conn: socket.socket, n: int, *, small: bool = False) -> Any:
    """``n`` bytes from ``conn``; ``None`` if the peer closed first. ``small``: as ``bytes`` (headers,
    names, answers); else into a new uninitialised array (no zero-filling pass before the copy)."""
    buf: Any = bytearray(n) if small else np.empty(n, dtype=np.uint8)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = conn.recv_into(view[got:], n - got)
        if not k:
            return None
        got += k
    return bytes(buf) if small else buf


class Receiver:
    """Accepts senders' connections on ``host`` (an ephemeral port) and hands every complete file to
    ``store``; one daemon thread per connection. ``close`` stops accepting and drops the connections."""

    def __init__(self, store: Store, token: bytes, host: str = "127.0.0.1") -> None:
        if len(token) != TOKEN_BYTES:
            raise ValueError(f"token must be {TOKEN_BYTES} bytes")
        self.store, self.token = store, token
        self._server = socket.create_server((host, 0), backlog=64)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.address = Address(host, int(self._server.getsockname()[1]), token)
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.frames = 0
        self.rejected = 0
        threading.Thread(target=self._accept, name="orthoplex-snapwire-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:  # closed
                return
            with self._lock:
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="orthoplex-snapwire", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            while True:
                head = _recv_exact(conn, FRAME.size, small=True)
                if head is None:
                    return
                token, epoch, step, world, name_len, data_len = FRAME.unpack(head)
                if token != self.token or name_len > MAX_NAME:
                    self.rejected += 1
                    conn.sendall(NAK)
                    return
                name = _recv_exact(conn, name_len, small=True)
                data = _recv_exact(conn, data_len) if name is not None else None
                if data is None:
                    return
                self.store(epoch, step, world, {name.decode(): data})
                self.frames += 1
                conn.sendall(ACK)
        except OSError:
            return
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def close(self) -> None:
        # shutdown first: a thread blocked in accept() keeps a closed listening socket accepting
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()


def local_name(epoch: int, step: int, world: int, name: str) -> str:
    """A snapshot file's name in a holder's node-local directory (see :class:`LocalCopy`)."""
    return f"{epoch}_{step}_{world}_{name}"


def parse_local_name(fname: str) -> tuple[int, int, int, str] | None:
    """``(epoch, step, world, name)`` of a :func:`local_name`; ``None`` for anything else."""
    parts = fname.split("_", 3)
    if len(parts) != 4 or not all(p.isdigit() for p in parts[:3]):
        return None
    return int(parts[0]), int(parts[1]), int(parts[2]), parts[3]


class LocalCopy:
    """A rank's copy for the holder of its own node: files written into the holder's directory in the
    node's memory (``/dev/shm``), under :func:`local_name`, renamed into place once whole; the copies
    of a file older than the newest ``keep`` steps are removed. It outlives the rank's process (a
    crashed or re-planned rank) and goes with the node; the holder lists and serves it. No socket,
    no holder CPU: one write of the bytes."""

    def __init__(self, directory: str, keep: int) -> None:
        self.dir = Path(directory)
        self.keep = max(1, keep)
        self._written: dict[str, list[str]] = {}
        self.dead = False

    def push(self, epoch: int, step: int, world: int, files: Mapping[str, Buffers]) -> int:
        if self.dead:
            return 0
        try:
            for name, parts in files.items():
                final = self.dir / local_name(epoch, step, world, name)
                tmp = self.dir / f"tmp.{name}"
                with open(tmp, "wb") as f:
                    for p in parts:
                        f.write(p)
                os.replace(tmp, final)
                mine = self._written.setdefault(name, [])
                mine.append(final.name)
                for old in mine[:-self.keep]:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self.dir / old)
                del mine[:-self.keep]
        except OSError as e:  # the directory went (the holder closed): this copy is gone
            log.warning("snapshot copy in %s dropped: %r", self.dir, e)
            self.dead = True
            return 1
        return 0

    def close(self) -> None:
        """Nothing to release: the files are the holder's (it removes them when it closes)."""


class Sender:
    """A rank's links to its holders; :meth:`push` sends one snapshot to every live one."""

    def __init__(self, addresses: Sequence[Address | Sequence[Any]], timeout_s: float = 60.0,
                 connect_timeout_s: float = 10.0) -> None:
        self.addresses = [Address.of(a) for a in addresses]
        self.timeout_s, self.connect_timeout_s = timeout_s, connect_timeout_s
        self._socks: list[socket.socket | None] = [None] * len(self.addresses)
        self._dead = [False] * len(self.addresses)

    def live(self) -> int:
        return self._dead.count(False)

    def _sock(self, i: int) -> socket.socket:
        s = self._socks[i]
        if s is None:
            a = self.addresses[i]
            s = socket.create_connection((a.host, a.port), timeout=self.connect_timeout_s)
            s.settimeout(self.timeout_s)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
            self._socks[i] = s
        return s

    def _drop(self, i: int, err: BaseException) -> None:
        log.warning("snapshot holder %s:%d dropped: %r", self.addresses[i].host, self.addresses[i].port, err)
        self._dead[i] = True
        s, self._socks[i] = self._socks[i], None
        if s is not None:
            s.close()

    def push(self, epoch: int, step: int, world: int, files: Mapping[str, Buffers]) -> int:
        """Send ``files`` (name -> bytes-like parts) to every live holder and wait for each to store
        them; returns how many holders failed (each is dropped)."""
        failed = 0
        sent: list[int] = []
        for i, a in enumerate(self.addresses):
            if self._dead[i]:
                continue
            try:
                s = self._sock(i)
                for name, parts in files.items():
                    raw = name.encode()
                    views = [memoryview(p).cast("B") for p in parts]
                    s.sendall(FRAME.pack(a.token, epoch, step, world, len(raw), sum(v.nbytes for v in views)) + raw)
                    for v in views:
                        s.sendall(v)
                sent.append(i)
            except OSError as e:
                self._drop(i, e)
                failed += 1
        for i in sent:
            try:
                for _ in files:
                    answer = _recv_exact(self._sock(i), 1, small=True)
                    if answer != ACK:
                        raise ConnectionError("holder refused the snapshot" if answer == NAK else "holder closed")
            except OSError as e:
                self._drop(i, e)
                failed += 1
        return failed

    def close(self) -> None:
        for i, s in enumerate(self._socks):
            if s is not None:
                s.close()
                self._socks[i] = None
