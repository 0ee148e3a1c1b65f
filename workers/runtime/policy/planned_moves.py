"""Planned moves as a policy: a drain notice or a resize in, a typed decision out, no Ray.

A *planned* move is one the job is told of ahead of time (an operator's drain of a node, a spot
notice, the scheduler's shrink or grow), so nothing is lost and nothing is redone: the job acts at
its next step boundary. What it does is decided here; the attempt machine
(:mod:`workers.runtime.supervision.planned_moves`) carries it out.

- :func:`on_drain` -- nodes are being drained. One gang (:class:`MoveGang`): hold the state of the
  step just done (a memory snapshot, pushed before the gang goes; a checkpoint when the job keeps no
  snapshots), re-plan without the nodes and restore from that state. Replica groups
  (:class:`LeaveGroups`): drop the groups with a rank on the nodes at the boundary while the others keep
  stepping, and start replacements elsewhere that heal from a live peer. :class:`Stay`: nothing of
  the job is on the nodes (or nothing can move: every group is on them).
- :func:`on_group_resize` -- a replica job's new GPU grant, in whole groups: a shrink drops the newest
  groups at the boundary (:class:`LeaveGroups`, no replacement), a grow adds groups that heal from a
  peer (:class:`AddGroups`). A one-gang job's resize is a re-plan from its memory snapshots (the
  replanner's :meth:`~workers.runtime.policy.replanner.Replanner.on_resize`; :func:`hold_state_from`
  says what state it holds first).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from workers.runtime.contract.events import RestoreSource


@dataclass(frozen=True)
class Stay:
    """Nothing moves."""

    reason: str


@dataclass(frozen=True)
class MoveGang:
    """One gang: hold the state of the step just done (``source``: ``memory`` -- snapshot pushed
    before the gang goes; ``storage`` -- a checkpoint), tear down, re-plan without ``nodes``, restore."""

    nodes: tuple[str, ...]
    source: RestoreSource
    reason: str


@dataclass(frozen=True)
class LeaveGroups:
    """Replica groups: drop ``groups`` at this step boundary while the others keep stepping; ``replace``:
    start as many groups elsewhere (a drain), else the job keeps fewer groups (a shrink)."""

    groups: tuple[int, ...]
    replace: bool
    reason: str


@dataclass(frozen=True)
class AddGroups:
    """Replica groups: start ``count`` more groups; each heals from a live peer and joins at a boundary."""

    count: int
    reason: str


DrainDecision = Stay | MoveGang | LeaveGroups
ResizeDecision = Stay | LeaveGroups | AddGroups


def hold_state_from(snapshots: bool) -> RestoreSource:
    """Where a planned move's state comes back from: the memory snapshot of the step just done when
    the job keeps snapshots, else a checkpoint of that step (a storage read, still no step redone)."""
    return "memory" if snapshots else "storage"


def on_drain(nodes: Collection[str], *, rank_nodes: Sequence[str] = (),
             groups: Mapping[int, Sequence[str]] | None = None, snapshots: bool = True) -> DrainDecision:
    """The move for a drain of ``nodes``: ``rank_nodes`` (the node of each rank of the one gang) or
    ``groups`` (replica groups: group -> its ranks' nodes)."""
    drained = set(nodes)
    short = ", ".join(sorted(n[:8] for n in drained))
    if groups is not None:
        hit = tuple(sorted(g for g, where in groups.items() if set(where) & drained))
        if not hit:
            return Stay(f"no replica group on draining node(s) {short}")
        if len(hit) == len(groups):
            return Stay(f"every replica group is on draining node(s) {short}: none can heal the others")
        return LeaveGroups(hit, True, f"node(s) {short} draining: group(s) {list(hit)} leave at the step boundary, "
                                     f"{len(groups) - len(hit)} keep stepping; replacements heal from a peer")
    on = tuple(sorted(drained & set(rank_nodes)))
    if not on:
        return Stay(f"no rank on draining node(s) {short}")
    source = hold_state_from(snapshots)
    what = "a memory snapshot" if source == "memory" else "a checkpoint"
    return MoveGang(on, source, f"node(s) {short} draining: {what} of the step just done, then a re-plan without them")


def on_group_resize(gpus: int, *, group_size: int, live: Sequence[int], want: int) -> ResizeDecision:
    """A replica job's new grant of ``gpus``: whole groups of ``group_size`` GPUs (``live``: the live
    groups' ids, ``want``: the groups asked for so far, live or starting). A shrink drops the newest
    groups; a grow asks for more; fewer GPUs than one group keep one."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    target = gpus // group_size
    if target < 1:
        return Stay(f"{gpus} GPUs hold no whole group of {group_size}: the job keeps its groups")
    if target < len(live):
        drop = tuple(sorted(live)[target:])
        return LeaveGroups(drop, False, f"resize to {gpus} GPUs: {target} group(s) of {group_size}; group(s) "
                                       f"{list(drop)} leave at the step boundary, the others keep stepping")
    if target > want:
        return AddGroups(target - want, f"resize to {gpus} GPUs: {target} group(s) of {group_size}; "
                                        f"{target - want} more heal from a live peer")
    return Stay(f"resize to {gpus} GPUs: already {want} group(s) of {group_size}")
