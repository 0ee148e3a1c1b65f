"""Small network probes run inside a node's namespace (a Python child under ``ip netns exec``)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from tests.controller.helpers import wait_for

SERVER = """
import socket, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('0.0.0.0', 7000)); s.listen()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(('0.0.0.0', 7001))
u.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
def udp():
    n = 0
    while True:
        d, a = u.recvfrom(100)
        if d.startswith(b'count'):
            u.sendto(d + b' ' + str(n).encode(), a)
        else:
            n += 1
threading.Thread(target=udp, daemon=True).start()
print('ready', flush=True)
while True:
    c, _ = s.accept()
    while c.recv(65536):
        pass
    c.sendall(b'k'); c.close()
"""


def ns_python(netns: str, code: str, timeout_s: float = 120) -> str:
    proc = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=timeout_s)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


@contextmanager
def server(netns: str) -> Iterator[None]:
    """TCP sink on :7000 and UDP counter on :7001 inside ``netns``."""
    proc = subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, "-u", "-c", SERVER],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield
    finally:
        proc.kill()
        proc.wait(10)


def connects(netns: str, ip: str, timeout_s: float = 2.0) -> bool:
    code = (f"import socket\ntry:\n    socket.create_connection(('{ip}', 7000), timeout={timeout_s}).close(); "
            "print('ok')\nexcept OSError:\n    print('fail')")
    return ns_python(netns, code) == "ok"


def send_seconds(netns: str, ip: str, nbytes: int) -> float:
    """Seconds to push ``nbytes`` over TCP to the sink and get its acknowledgement."""
    code = (f"import socket, time\ns = socket.create_connection(('{ip}', 7000), timeout=60); t = time.time()\n"
            f"s.sendall(b'x' * {nbytes}); s.shutdown(socket.SHUT_WR); s.recv(1); print(time.time() - t)")
    return float(ns_python(netns, code))


def udp_delivered(netns: str, ip: str, packets: int) -> int:
    """Send ``packets`` UDP datagrams; how many the counter got (asked until a reply comes back)."""
    code = f"""
import socket, time
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(1)
asked = 0
def count():
    global asked
    for _ in range(60):
        asked += 1
        tag = b'count%d' % asked
        u.sendto(tag, ('{ip}', 7001))
        try:
            while True:
                reply = u.recvfrom(100)[0].split()
                if reply[0] == tag:
                    return int(reply[1])
        except OSError:
            pass
    raise SystemExit('no reply')
before = count()
for i in range({packets}):
    u.sendto(b'p', ('{ip}', 7001)); time.sleep(0.0005)
time.sleep(0.5)
print(count() - before)
"""
    return int(ns_python(netns, code))


def rtts_ms(netns: str, ip: str, samples: int) -> list[float]:
    """Round trips (ms) of UDP requests to the server's counter, one at a time, sorted."""
    code = f"""
import socket, time
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(2)
out = []
for i in range({samples}):
    tag = b'count-rtt%d' % i
    t = time.monotonic(); u.sendto(tag, ('{ip}', 7001))
    try:
        while u.recvfrom(100)[0].split()[0] != tag:
            pass
        out.append((time.monotonic() - t) * 1000)
    except OSError:
        pass
    time.sleep(0.01)
print(' '.join('%.3f' % x for x in out))
"""
    return sorted(float(x) for x in ns_python(netns, code).split())


def wait_until(pred, timeout_s: float, what: str, poll_s: float = 0.5):  # type: ignore[no-untyped-def]
    """The controller tests' ``wait_for``, polled every half second."""
    return wait_for(pred, timeout_s, what, interval_s=poll_s)
