"""The parallel layout: the one type the planner, the engine and the runtime all share.

``world = DP x PP x TP x CP``. Ranks follow Megatron's order: **tp fastest, then cp, then dp,
then pp**, so ``rank = tp_i + TP * (cp_i + CP * (dp_i + DP * pp_i))``. A TP group is therefore a
run of consecutive ranks, which is what lets the runtime keep it on one node.

Replica groups (HSDP, TorchTitan's ``dp = dp_replicate x dp_shard``): with ``dp_replicate = R > 1``
the DP dimension is split into R replica groups of ``dp_shard = DP / R`` ranks. ZeRO (zero=1 or 3)
shards model/optimizer state over ``dp_shard x cp`` inside a replica group; the groups hold full,
identical copies and all-reduce gradients across each other. The replica index is the *slowest*
part of the DP index, ``dp_i = shard_i + dp_shard * replica_i``, so the ranks of one replica group
(for one pp stage) are contiguous: ``replica_i`` ranges over blocks of ``TP * CP * dp_shard`` ranks.
``DP`` still counts both, and the data split is unchanged (by ``dp_i``).

Pure Python: no torch, no ray.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Dim = Literal["tp", "cp", "dp", "pp"]
DIMS: tuple[Dim, ...] = ("tp", "cp", "dp", "pp")  # fastest-varying first
Schedule = Literal["gpipe", "1f1b", "interleaved"]
CpMethod = Literal["ring", "ulysses"]
Recompute = str  # one of RECOMPUTE_MODES, "layer:N" with an integer N >= 2

SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved")
CP_METHODS: tuple[str, ...] = ("ring", "ulysses")
RECOMPUTE_MODES: tuple[str, ...] = ("none", "selective", "op", "layer:N", "full")
"""Activation recomputation: ``selective`` is Megatron's (the attention core again), ``op`` and
``layer:N`` are TorchTitan's selective modes (op-level: every other matmul and the cheap ops are
recomputed; layer-level: every N-th layer is fully checkpointed; ``layer`` means ``layer:2``)."""


def recompute_error(value: object) -> str | None:
    """Why ``value`` is not a recompute mode (listing the known ones), or None."""
    if isinstance(value, str):
        if value in ("none", "selective", "op", "full"):
            return None
        m = re.fullmatch(r"layer:(\d+)", value)
        if m and int(m.group(1)) >= 2:
            return None
    return f"must be one of {', '.join(RECOMPUTE_MODES)} (N an integer >= 2), got {value!r}"


def normalise_recompute(value: object) -> object:
    """TorchTitan-style aliases: ``layer`` is ``layer:2``, ``selective_op`` is ``op``."""
    return {"layer": "layer:2", "selective_op": "op", "selective_layer": "layer:2"}.get(value, value) \
        if isinstance(value, str) else value


def checkpoint_interval(recompute: str) -> int:
    """Every how many layers one is fully recomputed: 1 for ``full``, N for ``layer:N``, 0 otherwise."""
    if recompute == "full":
        return 1
    if recompute.startswith("layer:"):
        return int(recompute.split(":", 1)[1])
    return 0
ZERO_STAGES: tuple[int, ...] = (0, 1, 3)


class LayoutError(ValueError):
    """A layout that is malformed in itself (the message names the field)."""


@dataclass(frozen=True, slots=True)
class RankCoords:
    """Where one rank sits in the 4D grid."""

    pp: int
    dp: int
    cp: int
    tp: int


@dataclass(frozen=True, slots=True)
class Layout:
    """A TP/PP/CP/DP factorization plus the knobs that go with it.

    ``num_micro_batches`` is derived from the global batch by :meth:`with_global_batch`; a layout
    parsed from a CLI string leaves it at 0 (meaning "global_batch / (dp * micro_batch)").
    """

    tp: int = 1
    pp: int = 1
    cp: int = 1
    dp: int = 1
    vpp: int = 1
    micro_batch: int = 1
    num_micro_batches: int = 0
    sp: bool = False
    zero: int = 0
    recompute: Recompute = "none"
    schedule: Schedule = "1f1b"
    cp_method: CpMethod = "ring"
    dp_replicate: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "cp", "dp", "vpp", "micro_batch", "dp_replicate"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise LayoutError(f"layout field '{name}' must be an integer >= 1, got {value!r}")
        if not isinstance(self.num_micro_batches, int) or self.num_micro_batches < 0:
            raise LayoutError(f"layout field 'num_micro_batches' must be >= 0, got {self.num_micro_batches!r}")
        if self.zero not in ZERO_STAGES:
            raise LayoutError(f"layout field 'zero' must be one of {ZERO_STAGES}, got {self.zero!r}")
        if self.dp % self.dp_replicate:
            raise LayoutError(f"layout field 'dp_replicate' ({self.dp_replicate}) must divide dp ({self.dp})")
        if self.dp_replicate > 1 and self.zero == 0:
            raise LayoutError("layout field 'dp_replicate' > 1 needs zero=1 or zero=3: with zero=0 every DP rank "
                              "already holds a full replica (replica groups split ZeRO sharding)")
        bad = recompute_error(self.recompute)
        if bad:
            raise LayoutError(f"layout field 'recompute' {bad}")
        if self.schedule not in SCHEDULES:
            raise LayoutError(f"layout field 'schedule' must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.cp_method not in CP_METHODS:
            raise LayoutError(f"layout field 'cp_method' must be one of {CP_METHODS}, got {self.cp_method!r}")
        if self.vpp > 1 and self.schedule != "interleaved":
            raise LayoutError("layout field 'vpp' > 1 needs schedule=interleaved")
        if self.schedule == "interleaved" and self.pp == 1:
            raise LayoutError("layout field 'schedule': interleaved needs pp > 1")

    # ----------------------------------------------------------------- sizes
    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    def size(self, dim: Dim) -> int:
        return int(getattr(self, dim))

    @property
    def dp_shard(self) -> int:
        """DP ranks per replica group (ZeRO shards over ``dp_shard * cp``)."""
        return self.dp // self.dp_replicate

    @property
    def zero_shard(self) -> int:
        """How many ranks one ZeRO shard group has: ``dp_shard * cp`` (1 without ZeRO)."""
        return self.dp_shard * self.cp if self.zero else 1

    # ----------------------------------------------------------------- replica groups
    def replica_of(self, rank: int) -> int:
        """The replica group (0..dp_replicate-1) ``rank`` belongs to."""
        return self.coords(rank).dp // self.dp_shard

    def replica_groups(self) -> list[list[int]]:
        """The ranks of each replica group, in replica order (each a full copy of model+optimizer)."""
        out: list[list[int]] = [[] for _ in range(self.dp_replicate)]
        for rank in range(self.world_size):
            out[self.replica_of(rank)].append(rank)
        return out

    def shard_groups(self) -> list[list[int]]:
        """Groups that share one ZeRO shard set: same pp, tp and replica; vary over dp_shard and cp."""
        by_key: dict[tuple[int, int, int], list[int]] = {}
        for rank in range(self.world_size):
            c = self.coords(rank)
            by_key.setdefault((c.pp, c.tp, c.dp // self.dp_shard), []).append(rank)
        return sorted(by_key.values(), key=lambda g: g[0])

    def replicate_groups(self) -> list[list[int]]:
        """Groups that all-reduce gradients across replicas: same pp, tp, cp and shard index."""
        by_key: dict[tuple[int, int, int, int], list[int]] = {}
        for rank in range(self.world_size):
            c = self.coords(rank)
            by_key.setdefault((c.pp, c.tp, c.cp, c.dp % self.dp_shard), []).append(rank)
        return sorted(by_key.values(), key=lambda g: g[0])

    def micro_batches_for(self, global_batch: int) -> int:
        """Micro-batches per step for one data-parallel replica (raises when it does not divide)."""
        per_replica = self.dp * self.micro_batch
        if global_batch < 1 or global_batch % per_replica:
            raise LayoutError(
                f"global_batch {global_batch} is not divisible by dp*micro_batch = {self.dp}*{self.micro_batch}"
            )
        return global_batch // per_replica

    def with_global_batch(self, global_batch: int) -> Layout:
        return dataclasses.replace(self, num_micro_batches=self.micro_batches_for(global_batch))

    # ----------------------------------------------------------------- grid
    def coords(self, rank: int) -> RankCoords:
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"rank {rank} outside world of size {self.world_size}")
        tp_i = rank % self.tp
        rest = rank // self.tp
        cp_i = rest % self.cp
        rest //= self.cp
        dp_i = rest % self.dp
        pp_i = rest // self.dp
        return RankCoords(pp=pp_i, dp=dp_i, cp=cp_i, tp=tp_i)

    def rank_of(self, *, pp: int = 0, dp: int = 0, cp: int = 0, tp: int = 0) -> int:
        return tp + self.tp * (cp + self.cp * (dp + self.dp * pp))

    def groups(self, *dims: Dim) -> list[list[int]]:
        """Rank groups that vary along ``dims`` and agree on every other dimension.

        ``groups("tp")`` are the TP groups, ``groups("dp", "cp")`` the groups that share the
        gradient reduction of parameters replicated over DP and CP. Every rank is in exactly one
        group; groups are listed in ascending order of their smallest rank, and ranks within a
        group ascend.
        """
        if not dims:
            raise LayoutError("groups() needs at least one dimension")
        for d in dims:
            if d not in DIMS:
                raise LayoutError(f"unknown dimension {d!r}; expected one of {DIMS}")
        by_key: dict[tuple[int, ...], list[int]] = {}
        for rank in range(self.world_size):
            c = self.coords(rank)
            key = tuple(getattr(c, d) for d in DIMS if d not in dims)
            by_key.setdefault(key, []).append(rank)
        return sorted(by_key.values(), key=lambda g: g[0])

    def group_of(self, rank: int, *dims: Dim) -> list[int]:
        for g in self.groups(*dims):
            if rank in g:
                return g
        raise LayoutError(f"rank {rank} outside world of size {self.world_size}")  # pragma: no cover

    # ----------------------------------------------------------------- text
    def short(self) -> str:
        """Compact label such as ``tp2·pp2·cp1·dp3``."""
        s = f"tp{self.tp}·pp{self.pp}·cp{self.cp}·dp{self.dp}"
        if self.dp_replicate > 1:
            s += f"·rep{self.dp_replicate}"
        if self.vpp > 1:
            s += f"·vpp{self.vpp}"
        return s

    def spec(self) -> str:
        """The CLI layout string (what :meth:`parse` reads back): every field that differs from
        the defaults, e.g. ``tp=2,dp=4,dp_replicate=2,zero=3``."""
        parts = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "sp" and value == (self.tp > 1):
                continue  # parse() makes sp the default companion of tp
            if f.name == "schedule" and self.vpp > 1 and value == "interleaved":
                continue
            if value != f.default:
                parts.append(f"{f.name}={str(value).lower() if isinstance(value, bool) else value}")
        return ",".join(parts) or "dp=1"

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Layout:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise LayoutError(f"unknown layout field(s): {', '.join(unknown)}")
        return cls(**data)  # type: ignore[arg-type]

    @classmethod
    def parse(cls, text: str) -> Layout:
        """Parse ``"tp=2,cp=2,pp=2,dp=1,vpp=2,micro_batch=1,zero=1,cp_method=ring"`` (and
        ``dp_replicate=R`` for replica groups, e.g. ``"tp=2,dp=4,dp_replicate=2,zero=3"``).

        ``vpp > 1`` implies ``schedule=interleaved`` unless a schedule is given.
        """
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, object] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            if "=" not in part:
                raise LayoutError(f"layout item {part!r} is not of the form key=value")
            key, raw = (s.strip() for s in part.split("=", 1))
            if key not in fields:
                raise LayoutError(f"unknown layout field {key!r}; known: {', '.join(fields)}")
            if key in ("schedule", "cp_method"):
                values[key] = raw
            elif key == "recompute":
                values[key] = normalise_recompute(raw)
            elif key == "sp":
                if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
                    raise LayoutError(f"layout field 'sp' must be true/false, got {raw!r}")
                values[key] = raw.lower() in ("1", "true", "yes")
            else:
                try:
                    values[key] = int(raw)
                except ValueError:
                    raise LayoutError(f"layout field {key!r} must be an integer, got {raw!r}") from None
        if int(values.get("vpp", 1)) > 1 and "schedule" not in values:  # type: ignore[call-overload]
            values["schedule"] = "interleaved"
        if int(values.get("tp", 1)) > 1 and "sp" not in values:  # type: ignore[call-overload]
            values["sp"] = True  # sequence parallelism is the default companion of TP

        return cls(**values)  # type: ignore[arg-type]


def parse_hint(hint: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """``"tp=2,pp=2"`` or a dict -> the parallel fields it fixes (validated through ``Layout``)."""
    if not hint:
        return {}
    if isinstance(hint, str):
        parsed = Layout.parse(hint)
        keys = [p.split("=", 1)[0].strip() for p in hint.split(",") if "=" in p]
        return {k: getattr(parsed, k) for k in keys}
    Layout.from_dict(dict(hint))  # validates field names and values
    return dict(hint)
