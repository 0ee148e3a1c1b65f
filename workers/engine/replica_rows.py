"""Which rows of a step's global batch each replica group runs (pure Python: no torch).

A replica group (``workers.engine.replica_ft``) runs any layout inside itself (TP x PP x CP x DP with
ZeRO/FSDP); the rows of the step's batch are divided among the groups of the step's quorum in whole
*blocks* a group can run (:func:`share_unit`), and each group runs its rows in *passes* of its layout
(:func:`pass_rows`): one ``RankTrainer.forward_backward`` each, the gradient of the pass's mean,
weighted by ``rows / global_batch`` and summed. The sum over groups is then the gradient of the mean
over the whole global batch, whatever the layout and the number of groups.

- without pipeline parallelism a pass is ``dp * micro_batch`` rows (one micro-batch per DP rank of
  the group) and may be shorter (the last one of a share), in whole multiples of ``dp``;
- with it, the pipeline's stages are built for a fixed micro-batch shape and count: a pass is
  exactly ``dp * micro_batch * pp`` rows (``pp`` micro-batches per DP rank, the fewest a 1F1B
  schedule takes), and so is a block.

The job spec refuses a global batch that is not whole blocks (:func:`replica_problems`): no group
could carry it.
"""

from __future__ import annotations

import dataclasses

from planner.layout import Layout


def group_layout(layout: Layout) -> Layout:
    """``layout`` as a replica group's trainer is built: its micro-batch count is that of one pass
    (``pp`` with pipeline parallelism, else 1), not of the global batch."""
    return dataclasses.replace(layout, num_micro_batches=layout.pp if layout.pp > 1 else 1)


def pass_rows(layout: Layout) -> int:
    """Rows of one full pass of a group of ``layout`` (:func:`group_layout`)."""
    return layout.dp * layout.micro_batch * (layout.pp if layout.pp > 1 else 1)


def share_unit(layout: Layout) -> int:
    """The block a group's share of the rows comes in: a full pass with pipeline parallelism, else
    one row per DP rank of the group."""
    return pass_rows(layout) if layout.pp > 1 else layout.dp


def replica_problems(layout: Layout, global_batch: int) -> list[str]:
    """Why groups of ``layout`` cannot share ``global_batch`` (empty: they can)."""
    unit = share_unit(layout)
    out = []
    if global_batch % unit:
        out.append(f"global_batch {global_batch} is not a multiple of the {unit} rows a group of {layout.short()} "
                   f"runs together ({'dp * micro_batch * pp' if layout.pp > 1 else 'dp'})")
    if global_batch % (layout.dp * layout.micro_batch):
        out.append(f"global_batch {global_batch} is not a multiple of dp * micro_batch = "
                   f"{layout.dp * layout.micro_batch}")
    return out


def row_share(n_rows: int, participants: int, index: int, unit: int = 1) -> list[int]:
    """The rows (0-based) of a step's batch that participant ``index`` of ``participants`` runs:
    contiguous, in whole blocks of ``unit`` rows (:func:`share_unit`), as even as possible, the first
    ``(n_rows / unit) % participants`` participants take one block more."""
    if participants < 1 or not 0 <= index < participants:
        raise ValueError(f"participant {index} of {participants}")
    if unit < 1 or n_rows % unit:
        raise ValueError(f"{n_rows} rows are not whole blocks of {unit}")
    base, extra = divmod(n_rows // unit, participants)
    start = index * base + min(index, extra)
    return list(range(start * unit, (start + base + (1 if index < extra else 0)) * unit))


def torchft_order(groups: list[int]) -> list[int]:
    """``groups`` in the order torchft ranks them: by replica id as a string, ``rg{group}:{uuid}``
    (so ``rg10:`` sorts before ``rg1:``)."""
    return [g for _, g in sorted((f"rg{g}:", g) for g in set(groups))]


def redo_guess(group: int, expect: list[int] | None) -> tuple[int, int] | None:
    """The redo's quorum as the step set predicts it: ``(participants, this group's index)`` in
    :func:`torchft_order`; ``None`` when ``group`` is not in ``expect`` (nothing to guess)."""
    if not expect or group not in expect:
        return None
    order = torchft_order(expect)
    return len(order), order.index(group)


def steady_guess(group: int, members: list[int] | None, dead: set[int]) -> tuple[int, int] | None:
    """The step's quorum as the last committed one predicts it: ``(participants, this group's index)``
    in :func:`torchft_order` of that quorum's groups (a group that healed in it takes part now) less
    the ones the supervisor found dead; ``None`` without a last quorum (nothing to guess)."""
    if not members:
        return None
    order = torchft_order([g for g in members if g not in dead])
    return (len(order), order.index(group)) if group in order else None


def redo_extra(n_rows: int, group: int, prev: list[int], expect: list[int], unit: int = 1) -> list[int] | None:
    """The rows ``group`` adds in the redo of a voted-down step: the shares (of ``prev``'s attempt,
    :func:`row_share` in :func:`torchft_order`) of the groups missing from ``expect``, divided among
    ``expect``'s groups in whole blocks of ``unit`` rows; each keeps the gradient of its own share
    from that attempt. Every row is counted once. ``None`` when ``expect`` is not a subset of ``prev``."""
    if group not in expect or not set(expect) <= set(prev):
        return None
    before, now = torchft_order(prev), torchft_order(expect)
    lost = sorted(m for i, g in enumerate(before) if g not in now
                  for m in row_share(n_rows, len(before), i, unit))
    return [lost[k] for k in row_share(len(lost), len(now), now.index(group), unit)]
