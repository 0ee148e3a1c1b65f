"""The job spec's network faults (``net_*`` kinds of :mod:`workers.runtime.contract.fault_spec`), executed by the
fault injector through :class:`~workers.testbed.network_faults.NetFaults`.

The supervisor learns the cluster from the namespace it runs in (:func:`netns_cluster.discover_here`:
the head's namespace of a cluster made by ``orthoplex cluster up --netns`` or the ``netns_ray``
fixture). Anywhere else (an in-process or single-IP cluster) a spec with network faults is refused
with :class:`NetFaultsUnavailable` when the supervisor is made. Targets arrive as Ray node ids and
are matched to namespaces by their IP. A fault with ``duration_s`` heals itself on a timer; every
link this made faulty is healed, and every delay line stopped, when the job ends (:meth:`close`).
"""

from __future__ import annotations

import threading
from typing import Any

from workers.runtime.contract.fault_spec import NET_SPEC_KINDS, Fault
from workers.testbed.network_faults import NetFaults


class NetFaultsUnavailable(RuntimeError):
    """A spec carries network faults but the job does not run on a namespaced cluster."""


class _LiveNodes:
    """The discovered namespaces; a Ray node id is matched to its namespace by the node's IP."""

    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        from workers.testbed.netns_cluster import NetnsNode

        self.nodes = [NetnsNode(**n) for n in nodes]

    def node(self, key: str) -> Any:
        for n in self.nodes:
            if key in (n.name, n.netns, n.ip):
                return n
        import ray

        ip = next((x["NodeManagerAddress"] for x in ray.nodes() if x["NodeID"] == key), None)
        for n in self.nodes:
            if ip is not None and n.ip == ip:
                return n
        raise KeyError(f"node {key!r} is not a node of this namespaced cluster")


class SpecNetFaults:
    """Fires ``net_*`` faults on the links of the namespaced cluster this process runs in."""

    def __init__(self, rec: dict[str, Any]) -> None:
        self.net = NetFaults(_LiveNodes(rec["nodes"]), root_netns=rec.get("root_handle"))
        self._lock = threading.Lock()
        self._timers: list[threading.Timer] = []

    @classmethod
    def discover(cls, kinds: list[str]) -> SpecNetFaults:
        from workers.testbed.netns_cluster import discover_here

        rec = discover_here()
        if rec is None:
            raise NetFaultsUnavailable(
                f"network fault kinds ({', '.join(sorted(set(kinds)))}) need a cluster whose nodes live in "
                "their own network namespaces (`orthoplex cluster up --netns`, then `orthoplex run --address "
                "...`); this job runs on an in-process or single-IP cluster")
        return cls(rec)

    def fire(self, fault: Fault, node_id: str, peer_ids: list[str], on_heal: Any = None) -> str:
        """Apply ``fault`` to the link of ``node_id`` (cut from ``peer_ids`` only, for a partition to
        some peers); returns the namespace node's name. ``on_heal(name)`` runs after a timed heal."""
        kind = NET_SPEC_KINDS[fault.kind]
        with self._lock:
            name = self.net.cluster.node(node_id).name
            if fault.kind == "net_partition":
                peers = [self.net.cluster.node(p).name for p in peer_ids]
                peers = [p for p in peers if p != name] if fault.peers else None
                if peers == []:
                    raise ValueError(f"net_partition: peers {list(fault.peers)} all live on the target node {name}")
                self.net.partition(name, peers)
            elif fault.kind == "net_delay":
                self.net.delay(name, fault.ms, fault.jitter_ms)
            elif fault.kind == "net_rate":
                self.net.rate(name, fault.mbit)
            elif fault.kind == "net_loss":
                self.net.loss(name, fault.pct)
            else:
                self.net.heal(name, fault.what or None)
        if fault.duration_s > 0:
            t = threading.Timer(fault.duration_s, self._heal, (name, kind, on_heal))
            t.daemon = True
            self._timers.append(t)
            t.start()
        return name

    def _heal(self, name: str, kind: str, on_heal: Any) -> None:
        with self._lock:
            self.net.heal(name, kind)
        if on_heal is not None:
            on_heal(name, kind)

    def close(self) -> None:
        """Heal every link this made faulty and stop the delay lines (the job ended)."""
        for t in self._timers:
            t.cancel()
        with self._lock:
            for name, st in list(self.net.state.items()):
                if st.down or st.shaped():
                    self.net.heal(name)
            self.net.close()
