"""Which TCP sockets a set of processes listens on, and whether each answers a client that carries no
token: the probe of issue 43, for tests and for an operator checking a cluster.

:func:`listening` reads ``/proc/net/tcp`` and ``/proc/net/tcp6`` (the listening rows, state ``0A``) and
keeps those whose inode is an open fd of one of the pids. :func:`probe` speaks to one socket without
credentials: an HTTP/1.1 ``GET /`` first (Ray's HTTP agents, metrics servers), then, for HTTP/2-only
(gRPC) servers, an empty unary call to each method in :data:`GRPC_PROBES` (one per Ray gRPC service:
GCS, raylet node manager, object manager, core worker, Ray client). Its verdict is ``refused``
(``UNAUTHENTICATED``, HTTP 401/403), ``open`` (an answer: HTTP 2xx-4xx other than those, or a gRPC
method that ran) or ``silent`` (no method known here; it neither refused nor answered).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass

#: Ray 2.60 gRPC services, one method each that takes an empty request
GRPC_PROBES = (
    "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo",
    "/ray.rpc.JobInfoGcsService/GetAllJobInfo",
    "/ray.rpc.NodeManagerService/GetNodeStats",
    "/ray.rpc.ObjectManagerService/Pull",
    "/ray.rpc.CoreWorkerService/NumPendingTasks",
    "/ray.rpc.RayletDriver/ClusterInfo",
    "/ray.rpc.ReporterService/HealthCheck",
)


@dataclass(frozen=True)
class Listener:
    pid: int
    host: str
    port: int

    @property
    def loopback(self) -> bool:
        return ipaddress.ip_address(self.host).is_loopback

    @property
    def wildcard(self) -> bool:
        return ipaddress.ip_address(self.host).is_unspecified


def _parse_addr(hexaddr: str) -> tuple[str, int]:
    host_hex, port_hex = hexaddr.split(":")
    raw = bytes.fromhex(host_hex)
    if len(raw) == 4:
        host = socket.inet_ntop(socket.AF_INET, raw[::-1])
    else:  # four little-endian 32-bit words
        host = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
        mapped = ipaddress.IPv6Address(host).ipv4_mapped
        host = str(mapped) if mapped else host
    return host, int(port_hex, 16)


def _socket_inodes(pid: int) -> set[int]:
    out = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out


def listening(pids: list[int]) -> list[Listener]:
    """The listening TCP sockets (v4 and v6) held by ``pids``."""
    owner = {inode: pid for pid in pids for inode in _socket_inodes(pid)}
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] != "0A":
                continue
            inode = int(cols[9])
            if inode in owner:
                host, port = _parse_addr(cols[1])
                out.append(Listener(owner[inode], host, port))
    return sorted(set(out), key=lambda item: (item.port, item.host))


def reach_host(listener: Listener, routable_ip: str) -> str:
    """The address a remote client would use for ``listener``: a wildcard socket via ``routable_ip``."""
    return routable_ip if listener.wildcard else listener.host


def _http_status(host: str, port: int, timeout_s: float) -> int | None:
    """The HTTP status a plain ``GET /`` gets, or ``None`` when the server does not speak HTTP/1.1."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as s:
            s.sendall(f"GET / HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
            data = s.recv(64)
    except OSError:
        return None
    if not data.startswith(b"HTTP/1."):
        return None
    try:
        return int(data.split()[1])
    except (IndexError, ValueError):
        return None


def probe(host: str, port: int, *, timeout_s: float = 5.0) -> str:
    """``refused``, ``open`` or ``silent`` for a client without a token (see the module doc)."""
    import grpc

    status = _http_status(host, port, timeout_s)
    if status is not None:
        return "refused" if status in (401, 403) else "open"
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    channel = grpc.insecure_channel(target)
    verdict = "silent"
    try:
        for method in GRPC_PROBES:
            call = channel.unary_unary(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)
            try:
                call(b"", timeout=timeout_s)
                return "open"
            except grpc.RpcError as exc:
                code = exc.code()
                if code == grpc.StatusCode.UNAUTHENTICATED:
                    verdict = "refused"
                elif code not in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAVAILABLE,
                                  grpc.StatusCode.DEADLINE_EXCEEDED):
                    return "open"  # the method ran and failed on the empty request: it answered
    finally:
        channel.close()
    return verdict
