"""The recovery policies compared on one failure trace.

- ``restart``: the whole job restarts from a storage checkpoint with its fixed layout, after the
  failed node is back or a spare took its place (the Llama 3 baseline); its restart time is the
  published one (``restart_s``), not ours.
- ``replan_storage``: Orthoplex re-plans onto the nodes that remain (``planner.replan``) and loads the
  last storage checkpoint; grows back when nodes return and the planner says it pays.
- ``replan_memory``: the same, from in-memory snapshots kept on peer nodes (lose only the work since
  the last snapshot, load over the network).
- ``replica_group``: data-parallel replica groups survive a failure (torchft / FT-HSDP style): the
  survivors stall, drop the failed group and continue; the group rejoins from a peer's state once
  its node is back or replaced.

Each policy can run with a pool of ``k`` hot spare nodes (``<kind>+k<k>``).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.recovery_names import POLICY_NAMES, SOURCES, check_name

#: the policies' names, the runtime's (``planner.recovery_names``: one home)
KINDS: tuple[str, ...] = POLICY_NAMES


@dataclass(frozen=True)
class Policy:
    kind: str
    spares: int = 0

    def __post_init__(self) -> None:
        check_name(self.kind)
        if self.spares < 0:
            raise ValueError(f"spares: must be >= 0, got {self.spares}")

    @property
    def name(self) -> str:
        return self.kind if self.spares == 0 else f"{self.kind}+k{self.spares}"

    @property
    def source(self) -> str:
        """Where the state is restored from after a failure."""
        return SOURCES[self.kind]


def policies_for(kinds: list[str] | tuple[str, ...], spares: int) -> list[Policy]:
    """Each kind without spares and, when ``spares > 0``, with ``spares`` hot spare nodes."""
    out: list[Policy] = []
    for kind in kinds:
        out.append(Policy(kind, 0))
        if spares > 0:
            out.append(Policy(kind, spares))
    return out
