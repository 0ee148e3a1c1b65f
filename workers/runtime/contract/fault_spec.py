"""The job spec's ``faults`` list: the fault kinds, their parameters and their validation (one home).

No heavy imports: the job spec parser validates faults in the caller, before a supervisor exists.

Process faults (any cluster): ``kill_node``, ``kill_rank``, ``hang_rank``, ``slow_node`` (``factor``),
``jitter_node`` (``amplitude``), ``drop_snapshots``, ``kill_replacement`` (replica groups: the next
replacement group started once ``at_step`` was launched, in its first step).

Network faults (only on a cluster whose nodes live in their own network namespaces, ``orthoplex
cluster up --netns`` or the ``netns_ray`` test fixture; refused elsewhere). They act on the link of
the node hosting ``rank``, through :mod:`workers.testbed.network_faults`; ``duration_s`` > 0 heals the
fault by itself that many seconds later (a partition cannot be healed "at a step": steps stall while
it lasts); 0 leaves it until a ``net_heal`` or the end of the job (every link is healed then):

==================  =====================================================================
``net_partition``   the link is cut; ``peers`` (ranks): only to the nodes hosting those ranks
``net_delay``       ``ms`` latency each way, +- ``jitter_ms``
``net_rate``        bandwidth capped at ``mbit`` Mbit/s each way
``net_loss``        ``pct`` % of packets dropped each way
``net_heal``        ``what`` (``partition``, ``rate``, ``loss``, ``delay``; empty: all) healed
==================  =====================================================================
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

PROCESS_FAULT_KINDS: tuple[str, ...] = ("kill_node", "kill_rank", "hang_rank", "slow_node", "jitter_node",
                                        "drop_snapshots", "kill_replacement")
#: the spec's network fault kinds -> the link fault each sets (``netfaults.NET_FAULT_KINDS``; ``net_heal``
#: heals one or all of them)
NET_SPEC_KINDS: dict[str, str] = {"net_partition": "partition", "net_delay": "delay", "net_rate": "rate",
                                  "net_loss": "loss", "net_heal": ""}
FAULT_KINDS: tuple[str, ...] = (*PROCESS_FAULT_KINDS, *NET_SPEC_KINDS)
#: faults that fire when a gang starts (not before a step is launched)
ON_START: frozenset[str] = frozenset({"kill_replacement"})

_COMMON = ("kind", "at_step", "rank")
#: the parameters each kind takes besides ``kind``, ``at_step`` and ``rank``
PARAMS: dict[str, tuple[str, ...]] = {
    "kill_node": (), "kill_rank": (), "hang_rank": (), "drop_snapshots": (), "kill_replacement": (),
    "slow_node": ("factor",), "jitter_node": ("amplitude",),
    "net_partition": ("peers", "duration_s"), "net_delay": ("ms", "jitter_ms", "duration_s"),
    "net_rate": ("mbit", "duration_s"), "net_loss": ("pct", "duration_s"), "net_heal": ("what",),
}


@dataclass(frozen=True)
class Fault:
    kind: str
    at_step: int
    rank: int = -1
    factor: float = 1.0
    amplitude: float = 0.0
    peers: tuple[int, ...] = ()
    ms: float = 0.0
    jitter_ms: float = 0.0
    mbit: float = 0.0
    pct: float = 0.0
    what: str = ""
    duration_s: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; known: {', '.join(FAULT_KINDS)}")
        if self.at_step < 0:
            raise ValueError("fault at_step must be >= 0")
        bad = {
            "slow_node": self.factor < 1.0 and "factor must be >= 1",
            "jitter_node": not 0.0 <= self.amplitude < 1.0 and "amplitude must be in [0, 1)",
            "net_delay": (self.ms <= 0 or self.jitter_ms < 0) and "ms must be > 0 and jitter_ms >= 0",
            "net_rate": self.mbit <= 0 and "mbit must be > 0 (Mbit/s)",
            "net_loss": not 0 < self.pct < 100 and "pct must be in (0, 100)",
            "net_heal": self.what not in ("", *(k for k in NET_SPEC_KINDS.values() if k))
            and f"what must be one of partition, rate, loss, delay or empty (all), not {self.what!r}",
        }.get(self.kind)
        if bad:
            raise ValueError(f"{self.kind}: {bad}")
        if self.duration_s < 0:
            raise ValueError(f"{self.kind}: duration_s must be >= 0 (0: until healed)")
        if any(not isinstance(p, int) for p in self.peers):
            raise ValueError(f"{self.kind}: peers must be ranks (integers), got {list(self.peers)}")

    @property
    def network(self) -> bool:
        return self.kind in NET_SPEC_KINDS

    def target_rank(self, world_size: int) -> int:
        return _rank(self.rank, world_size)

    def peer_ranks(self, world_size: int) -> list[int]:
        return [_rank(p, world_size) for p in self.peers]

    def params(self) -> dict[str, Any]:
        """This kind's own parameters."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k in PARAMS[self.kind]
                for v in [getattr(self, k)]}

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "at_step": self.at_step, "rank": self.rank, "factor": self.factor,
                "amplitude": self.amplitude, **self.params()}


def _rank(rank: int, world_size: int) -> int:
    r = rank if rank >= 0 else world_size + rank
    if not 0 <= r < world_size:
        raise ValueError(f"fault targets rank {rank}, world has {world_size}")
    return r


_FIELDS = {f.name for f in fields(Fault)}


def parse_fault(item: dict[str, Any]) -> Fault:
    """One fault of a spec; ``ValueError`` naming what is wrong (an unknown kind, a field the kind does
    not take, a bad value)."""
    if not isinstance(item, dict) or "kind" not in item or "at_step" not in item:
        raise ValueError(f"fault {item!r}: needs at least kind and at_step")
    kind = item["kind"]
    if kind not in FAULT_KINDS:
        raise ValueError(f"unknown fault kind {kind!r}; known: {', '.join(FAULT_KINDS)}")
    allowed = {*_COMMON, *PARAMS[kind]}
    if kind in PROCESS_FAULT_KINDS:  # older specs carry factor/amplitude on every kind
        allowed |= {"factor", "amplitude"}
    extra = sorted(set(item) - allowed)
    if extra:
        raise ValueError(f"fault {kind}: unknown field(s) {', '.join(extra)}; {kind} takes "
                         f"{', '.join(PARAMS[kind]) or 'no parameters'} besides at_step and rank")
    data = {k: v for k, v in item.items() if k in _FIELDS}
    if "peers" in data:
        if not isinstance(data["peers"], list | tuple) or not data["peers"]:
            raise ValueError(f"fault {kind}: peers must be a non-empty list of ranks")
        data["peers"] = tuple(data["peers"])
    try:
        return Fault(**data)
    except TypeError as e:
        raise ValueError(f"fault {kind}: {e}") from None


def parse_faults(items: Iterable[dict[str, Any]] | None) -> list[Fault]:
    """A spec's faults, validated, in firing order."""
    return sorted((parse_fault(dict(i) if isinstance(i, dict) else i) for i in items or ()),
                  key=lambda f: f.at_step)
