"""A userspace delay line for one end of a node's link: latency and jitter without netem.

Our kernels have no netem (nor fq or etf, which an EDT program setting ``skb->tstamp`` would need),
so packets are delayed in userspace. For one device ``dev`` (a veth end) in the current namespace:

1. a TAP device ``tap`` is made (``/dev/net/tun``, ``IFF_TAP | IFF_NO_PI``) and set up;
2. ``NetFaults`` attaches a classic-BPF filter to ``dev``'s root HTB that sends every packet *not*
   carrying the mark :data:`MARK` to the TAP (``action mirred egress redirect``);
3. this process reads each frame from the TAP, holds it for ``delay_ms`` (+- ``jitter_ms``, uniform;
   release times never go backwards, so the link stays FIFO as a real wire does) and sends it out of
   ``dev`` through an ``AF_PACKET`` socket whose ``SO_MARK`` is :data:`MARK`: the frame then passes
   ``dev``'s queueing discipline again, unredirected, so a rate cap, loss or a peer partition on the
   same link still apply to it (after the delay).

The process exits when its parent dies (``PR_SET_PDEATHSIG``) or on SIGTERM; the TAP goes with it.
Run as ``python -m workers.testbed.delay_line DEV TAP DELAY_MS JITTER_MS`` inside the namespace; it
prints ``ready`` once the TAP is up.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import fcntl
import os
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import time

MARK = 0x0DE1  # frames the delay line has already held
TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
SO_MARK = 36
PR_SET_PDEATHSIG = 1


def open_tap(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    subprocess.run(["ip", "link", "set", name, "up"], check=True, capture_output=True, timeout=30)
    return fd


def run(dev: str, tap: str, delay_ms: float, jitter_ms: float, seed: int | None = None) -> None:
    """Hold every frame the TAP receives for ``delay_ms`` +- ``jitter_ms``, then send it out of ``dev``."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    rng = random.Random(seed)
    fd = open_tap(tap)
    out = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    out.setsockopt(socket.SOL_SOCKET, SO_MARK, MARK)
    out.bind((dev, 0))
    held: collections.deque[tuple[float, bytes]] = collections.deque()
    last = 0.0
    print("ready", flush=True)
    while True:
        now = time.monotonic()
        while held and held[0][0] <= now:
            with contextlib.suppress(OSError):  # the link is down (a partition): the frame is lost
                out.send(held.popleft()[1])
        timeout = max(0.0, held[0][0] - now) if held else 1.0
        ready, _, _ = select.select([fd], [], [], timeout)
        if ready:
            frame = os.read(fd, 65536)
            hold = max(0.0, delay_ms + (rng.uniform(-jitter_ms, jitter_ms) if jitter_ms else 0.0)) / 1000.0
            last = max(last, time.monotonic() + hold)
            held.append((last, frame))


def main(argv: list[str]) -> None:
    dev, tap, delay_ms, jitter_ms = argv[0], argv[1], float(argv[2]), float(argv[3])
    run(dev, tap, delay_ms, jitter_ms)


if __name__ == "__main__":
    main(sys.argv[1:])
