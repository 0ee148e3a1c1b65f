"""Network faults on the links of a :class:`~workers.testbed.netns_cluster.NetnsCluster`.

Every node's link is a veth pair: ``eth0`` inside the node's namespace and ``oxv<id><node>`` on the
bridge in the root namespace. A fault is shaped on the *egress of both ends*, so it hits traffic
from the node and traffic to it alike:

===================  ==========================================================================
``partition(node)``  the bridge end is set down: nothing in or out (the node's processes live on)
``partition(node,    only traffic between ``node`` and those peers is dropped (a u32 filter on the
peers=[...])``       peer's address into a drop class); everybody else still reaches it
``rate(node, mbit)`` an HTB class capped at ``mbit`` (ceil = rate) carries all of the link's traffic
``loss(node, pct)``  a classic-BPF filter (``ld rand``) sends ``pct`` % of packets into the drop class
``delay(node, ms,    every packet held ``ms`` +- ``jitter_ms`` by a userspace delay line
jitter_ms)``         (``workers.testbed.delay_line``: a TAP the packets are redirected to)
``heal(node)``       every fault of that node is removed (``heal(node, "loss")`` just one kind)
===================  ==========================================================================

The drop class is an HTB leaf whose queue is a ``pfifo`` of length 0: everything classified into it
is dropped on enqueue. Nothing here needs iptables or nftables (not installed on our machines), or
netem (``CONFIG_NET_SCH_NETEM`` is off in the kernel our CI runs on, and so are fq and etf, which an
EDT program would need): ``delay`` redirects each end's packets (a cBPF filter on the mark, with
``action mirred``) to a TAP read by a delay line process per end, which sends them back out marked,
through the rest of the link's faults. It needs ``/dev/net/tun``; without it ``delay`` raises
:class:`NetFaultUnsupported`. The delay line processes are children of the process that made the
fault and die with it.

The state of every node's faults is kept here and each change re-renders that node's queueing
discipline from scratch, so faults combine (a slow *and* lossy link) and heal independently.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Protocol

NET_FAULT_KINDS: tuple[str, ...] = ("partition", "rate", "loss", "delay")
LINE_RATE = "10gbit"  # the pass-through class when no cap is set
QUEUE_PACKETS = 100  # the link's queue: at 1 Mbit/s about 1.2 s of delay when full
SKF_AD_RANDOM = 0xFFFFF000 + 56  # classic BPF ancillary load: a random u32
SKF_AD_MARK = 0xFFFFF000 + 20  # classic BPF ancillary load: skb->mark


class NetFaultUnsupported(RuntimeError):
    """The kernel lacks what this fault needs (``/dev/net/tun`` for delay)."""


class NodeLink(Protocol):
    name: str
    netns: str
    veth: str
    ip: str


class ClusterLike(Protocol):
    def node(self, name_or_id: str) -> Any: ...


def _run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")
    return proc


def _tc(netns: str | None, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    base = ["ip", "netns", "exec", netns, "tc"] if netns else ["tc"]
    return _run([*base, *args], check=check)


def _in(netns: str | None, cmd: list[str]) -> list[str]:
    return ["ip", "netns", "exec", netns, *cmd] if netns else cmd


def delay_supported() -> bool:
    """Whether delay lines can be made here (``/dev/net/tun`` opens)."""
    try:
        os.close(os.open("/dev/net/tun", os.O_RDWR))
    except OSError:
        return False
    return True


@dataclass
class LinkFaults:
    """What is wrong with one node's link now."""

    down: bool = False
    drop_peers: set[str] = field(default_factory=set)
    rate_mbit: float | None = None
    loss_pct: float = 0.0
    delay_ms: float = 0.0
    jitter_ms: float = 0.0

    def shaped(self) -> bool:
        return bool(self.drop_peers or self.rate_mbit or self.loss_pct or self.delay_ms)

    def to_dict(self) -> dict[str, Any]:
        return {"down": self.down, "drop_peers": sorted(self.drop_peers), "rate_mbit": self.rate_mbit,
                "loss_pct": self.loss_pct, "delay_ms": self.delay_ms, "jitter_ms": self.jitter_ms}


def _unmarked_bytecode() -> str:
    """cBPF: match every packet whose mark is not the delay line's (those it sent back are done)."""
    from workers.testbed.delay_line import MARK

    prog = [(0x20, 0, 0, SKF_AD_MARK),  # ld [mark]
            (0x15, 0, 1, MARK),  # jeq MARK -> no match
            (0x06, 0, 0, 0),  # ret 0: no match
            (0x06, 0, 0, 0xFFFFFFFF)]  # ret -1: match
    return f"{len(prog)}," + ",".join(" ".join(str(x) for x in ins) for ins in prog)


def _loss_bytecode(pct: float) -> str:
    """cBPF: match (return -1 = the filter's class) when a random u32 is below pct% of 2**32."""
    threshold = min(int(pct / 100.0 * 2**32), 2**32 - 1)
    prog = [(0x20, 0, 0, SKF_AD_RANDOM),  # ld [rand]
            (0x35, 1, 0, threshold),  # jge threshold -> no match
            (0x06, 0, 0, 0xFFFFFFFF),  # ret -1: match
            (0x06, 0, 0, 0)]  # ret 0: no match
    return f"{len(prog)}," + ",".join(" ".join(str(x) for x in ins) for ins in prog)


class NetFaults:
    """Partition, slow down, cap or make lossy the links of a namespaced cluster's nodes.

    ``cluster`` is anything with ``node(name_or_ray_node_id)`` returning an object with ``name``,
    ``netns``, ``veth`` and ``ip`` (a :class:`NetnsCluster`, or :meth:`from_record`). ``root_netns``:
    the name under which the root namespace (the bridge's) is reachable when this process lives in
    another one (a supervisor in the head's namespace: the cluster's root handle); None: here."""

    def __init__(self, cluster: ClusterLike, *, root_netns: str | None = None) -> None:
        self.cluster = cluster
        self.root_netns = root_netns
        self.state: dict[str, LinkFaults] = {}
        self.log: list[dict[str, Any]] = []
        self.lines: dict[str, list[subprocess.Popen[str]]] = {}  # node -> its delay line processes

    @classmethod
    def from_record(cls, rec: dict[str, Any], *, root_netns: str | None = None) -> NetFaults:
        """For a cluster started by ``orthoplex cluster up --netns`` (its state file's record)."""
        from workers.testbed.netns_cluster import NetnsNode

        nodes = [NetnsNode(**n) for n in rec["nodes"]]

        class _Rec:
            def node(self, key: str) -> NetnsNode:
                for n in nodes:
                    if key in (n.name, n.netns, n.ip, n.ray_node_id):
                        return n
                raise KeyError(f"no node {key!r} in this cluster")

        return cls(_Rec(), root_netns=root_netns)

    # ------------------------------------------------------------------ the faults
    def partition(self, node: str, peers: list[str] | None = None) -> None:
        """Cut ``node`` off: from everybody (link down), or only from ``peers`` (names, ids or IPs)."""
        n = self.cluster.node(node)
        st = self.state.setdefault(n.name, LinkFaults())
        if peers is None:
            st.down = True
            _run(_in(self.root_netns, ["ip", "link", "set", n.veth, "down"]))
        else:
            st.drop_peers |= {self.cluster.node(p).ip for p in peers}
            self._render(n, st)
        self._note("partition", n, peers=peers)

    def rate(self, node: str, mbit: float) -> None:
        """Cap ``node``'s link at ``mbit`` Mbit/s each way."""
        if mbit <= 0:
            raise ValueError("rate: mbit must be > 0")
        n = self.cluster.node(node)
        st = self.state.setdefault(n.name, LinkFaults())
        st.rate_mbit = float(mbit)
        self._render(n, st)
        self._note("rate", n, mbit=mbit)

    def loss(self, node: str, pct: float) -> None:
        """Drop ``pct`` % of ``node``'s packets, each way, at random."""
        if not 0 < pct < 100:
            raise ValueError("loss: pct must be in (0, 100)")
        n = self.cluster.node(node)
        st = self.state.setdefault(n.name, LinkFaults())
        st.loss_pct = float(pct)
        self._render(n, st)
        self._note("loss", n, pct=pct)

    def delay(self, node: str, ms: float, jitter_ms: float = 0.0) -> None:
        """Add ``ms`` (+- ``jitter_ms``) latency each way: a delay line at each end of the link (refused
        without /dev/net/tun)."""
        if ms <= 0 or jitter_ms < 0:
            raise ValueError("delay: ms must be > 0 and jitter_ms >= 0")
        if not delay_supported():
            raise NetFaultUnsupported("delay needs /dev/net/tun (CONFIG_TUN) for its delay line")
        n = self.cluster.node(node)
        st = self.state.setdefault(n.name, LinkFaults())
        st.delay_ms, st.jitter_ms = float(ms), float(jitter_ms)
        self._stop_lines(n.name)
        self._start_lines(n, st)
        self._render(n, st)
        self._note("delay", n, ms=ms, jitter_ms=jitter_ms)

    def heal(self, node: str, kind: str | None = None) -> None:
        """Remove ``node``'s faults (all, or one kind of :data:`NET_FAULT_KINDS`)."""
        if kind is not None and kind not in NET_FAULT_KINDS:
            raise ValueError(f"unknown network fault kind {kind!r}; known: {', '.join(NET_FAULT_KINDS)}")
        n = self.cluster.node(node)
        st = self.state.setdefault(n.name, LinkFaults())
        if kind in (None, "partition"):
            st.down, st.drop_peers = False, set()
            _run(_in(self.root_netns, ["ip", "link", "set", n.veth, "up"]))
        if kind in (None, "rate"):
            st.rate_mbit = None
        if kind in (None, "loss"):
            st.loss_pct = 0.0
        if kind in (None, "delay"):
            st.delay_ms = st.jitter_ms = 0.0
        self._render(n, st)
        if not st.delay_ms:
            self._stop_lines(n.name)
        self._note("heal", n, what=kind or "all")

    def heal_all(self) -> None:
        for name in list(self.state):
            self.heal(name)

    def close(self) -> None:
        """Stop every delay line (the links may be gone already: nothing else is touched)."""
        for name in list(self.lines):
            self._stop_lines(name)

    def faults(self) -> dict[str, dict[str, Any]]:
        return {k: v.to_dict() for k, v in self.state.items()}

    # ------------------------------------------------------------------ delay lines
    @staticmethod
    def tap_name(n: Any) -> str:
        """The TAP of ``n``'s delay lines (the same name at both ends: each end has its namespace)."""
        return "oxd" + str(n.veth).removeprefix("oxv")

    def _start_lines(self, n: Any, st: LinkFaults) -> None:
        args = ["-m", "workers.testbed.delay_line"]
        procs = []
        for netns, dev in ((self.root_netns, n.veth), (n.netns, "eth0")):
            cmd = _in(netns, [sys.executable, *args, dev, self.tap_name(n), f"{st.delay_ms:g}", f"{st.jitter_ms:g}"])
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            procs.append(proc)
            self.lines[n.name] = procs
            line = proc.stdout.readline().strip() if proc.stdout else ""
            if line != "ready":
                err = proc.stderr.read()[-2000:] if proc.stderr and proc.poll() is not None else ""
                self._stop_lines(n.name)
                raise RuntimeError(f"delay line on {dev} of {n.name} did not start: {line!r} {err}")

    def _stop_lines(self, name: str) -> None:
        for proc in self.lines.pop(name, []):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    # ------------------------------------------------------------------ tc
    def _note(self, kind: str, n: Any, **kw: Any) -> None:
        import time

        self.log.append({"ts": time.time(), "kind": kind, "node": n.name, **kw})

    def _render(self, n: Any, st: LinkFaults) -> None:
        # bridge end (traffic to the node) in the root namespace, eth0 (from the node) in its own
        for netns, dev, direction in ((self.root_netns, n.veth, "to"), (n.netns, "eth0", "from")):
            _tc(netns, "qdisc", "del", "dev", dev, "root", check=False)
            if not st.shaped():
                continue
            rate = f"{st.rate_mbit:g}mbit" if st.rate_mbit else LINE_RATE
            _tc(netns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10")
            burst = "64kb" if st.rate_mbit else "1mb"
            _tc(netns, "class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb", "rate", rate,
                "ceil", rate, "burst", burst, "cburst", burst)
            _tc(netns, "class", "add", "dev", dev, "parent", "1:", "classid", "1:99", "htb", "rate", "8kbit")
            _tc(netns, "qdisc", "add", "dev", dev, "parent", "1:99", "handle", "99:", "pfifo", "limit", "0")
            # a switch-sized buffer, not the veth's 1000 packets (seconds of queue on a slow link)
            _tc(netns, "qdisc", "add", "dev", dev, "parent", "1:10", "handle", "10:", "pfifo",
                "limit", str(QUEUE_PACKETS))
            if st.delay_ms:  # first: unmarked packets to the delay line; what it sends back goes on below
                _tc(netns, "filter", "add", "dev", dev, "parent", "1:", "protocol", "all", "prio", "1", "bpf",
                    "bytecode", _unmarked_bytecode(), "action", "mirred", "egress", "redirect", "dev",
                    self.tap_name(n))
            for peer in sorted(st.drop_peers):
                ipaddress.IPv4Address(peer)
                match = "dst" if direction == "from" else "src"
                _tc(netns, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "2", "u32",
                    "match", "ip", match, f"{peer}/32", "flowid", "1:99")
            if st.loss_pct:
                _tc(netns, "filter", "add", "dev", dev, "parent", "1:", "protocol", "all", "prio", "3", "bpf",
                    "bytecode", _loss_bytecode(st.loss_pct), "flowid", "1:99")
