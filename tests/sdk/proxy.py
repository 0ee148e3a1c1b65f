"""A loopback HTTP/1.1 proxy in front of a real server, for the SDK's connection tests: it
forwards each request and its answer as they are, except for the faults it was told to inject
for requests whose line starts with a given prefix: ``drop`` (forward the request, let the
server answer, then close the client's connection without the answer: a connection lost after
the server accepted) and ``status`` (answer that status itself, as a proxy in front of a
restarting service does). ``seen`` lists every request line that reached it."""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass


@dataclass
class Fault:
    prefix: bytes
    kind: str  # "drop" or "status"
    times: int
    status: int = 503


def _read_message(sock: socket.socket, buf: bytes, request: bool) -> tuple[bytes, bytes] | None:
    """One HTTP message (head and Content-Length or chunked body) from ``sock``; returns it and
    what was read beyond it, or None when the peer closed first."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
    status = 0 if request else int(lines[0].split()[1])
    if b"content-length" in headers:
        need = int(headers[b"content-length"])
        while len(rest) < need:
            chunk = sock.recv(65536)
            if not chunk:
                return None
            rest += chunk
        return head + b"\r\n\r\n" + rest[:need], rest[need:]
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        while b"0\r\n\r\n" not in rest:
            chunk = sock.recv(65536)
            if not chunk:
                return None
            rest += chunk
        end = rest.index(b"0\r\n\r\n") + 5
        return head + b"\r\n\r\n" + rest[:end], rest[end:]
    if request or status in (204, 304) or 100 <= status < 200:
        return head + b"\r\n\r\n", rest
    while chunk := sock.recv(65536):  # a body delimited by the connection's end
        rest += chunk
    return head + b"\r\n\r\n" + rest, b""


class FaultProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.faults: list[Fault] = []
        self.seen: list[str] = []
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def inject(self, prefix: str, kind: str, times: int = 1, status: int = 503) -> None:
        with self._lock:
            self.faults.append(Fault(prefix.encode(), kind, times, status))

    def count(self, prefix: str) -> int:
        return sum(1 for line in self.seen if line.startswith(prefix))

    def _fault(self, line: bytes) -> Fault | None:
        with self._lock:
            for f in self.faults:
                if f.times > 0 and line.startswith(f.prefix):
                    f.times -= 1
                    return f
        return None

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            self._open.append(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
        self._open.append(upstream)
        buf = b""
        try:
            while True:
                got = _read_message(client, buf, request=True)
                if got is None:
                    return
                request, buf = got
                line = request.split(b"\r\n", 1)[0]
                self.seen.append(line.decode())
                fault = self._fault(line)
                if fault is not None and fault.kind == "status":
                    body = b'{"detail": "service restarting"}'
                    client.sendall(b"HTTP/1.1 %d Service Unavailable\r\ncontent-type: application/json\r\n"
                                   b"retry-after: 0\r\ncontent-length: %d\r\n\r\n%s" % (fault.status, len(body), body))
                    continue
                upstream.sendall(request)
                answer = _read_message(upstream, b"", request=False)
                if answer is None:
                    return
                if fault is not None and fault.kind == "drop":
                    return  # the server answered; the client never hears it
                client.sendall(answer[0])
        except OSError:
            return
        finally:
            client.close()
            upstream.close()

    def close(self) -> None:
        self._sock.close()
        for s in self._open:
            with contextlib.suppress(OSError):
                s.close()
