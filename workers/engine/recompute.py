"""Activation recompute in the engine: which blocks are checkpointed, and how.

The modes are the planner's (``planner.layout.RECOMPUTE_MODES``; the list the engine runs is
``planner.engine_rules.ENGINE_RECOMPUTE``):

- ``none``: autograd keeps everything;
- ``selective`` (Korthikanti et al.): each block keeps the attention core's inputs and runs the core
  (scores, softmax, the CP ring or all-to-all) again in the backward (``Attention.recompute_core``);
- ``op`` (TorchTitan's op-level selective AC): each block runs under
  ``torch.utils.checkpoint.checkpoint`` with a :func:`create_selective_checkpoint_contexts` policy
  (:func:`op_policy`). Saved: the outputs of the block's 1st, 3rd and 5th matmul (``wq``, ``wv``,
  ``w1``), of the attention kernel (output and LSE) and of TP's reduce-scatters (sequence
  parallelism). Recomputed in the backward: the 2nd, 4th and 6th matmul (``wk``, ``wo``, ``w3``),
  the norms, rotary, SiLU and products, and SP's all-gathers. The 7th (``w2``) is not saved:
  the backward never reads its output, so the recompute (which stops once it has rebuilt what the
  backward needs) never runs it either. TorchTitan's "save every other mm" also saves ``w2``'s
  output; the planner's ``op`` (``planner/memory.py``, ``planner/flops.py``) counts it as not kept,
  and so does this engine. Where the engine's ``op`` costs more than ``planner/timing.py`` counts:
  SP's all-gathers (without SP, TP's all-reduces) run again in the backward, as in TorchTitan; and
  under CP the ring / Ulysses attention is no single kernel, so it runs again (p2p / all-to-all
  included) and its output and LSE are not kept (less memory than the planner counts);
- ``layer:N``: every N-th block this rank holds is fully checkpointed, counting the rank's blocks
  1, 2, ... in order across its pipeline chunks (TorchTitan's ``selective_ac_option=N``: a
  per-process counter, block ``c`` checkpointed when ``c % N == 0``). The planner's
  ``layer:N`` memory is the per-layer average ``(full + (N-1) * none) / N``: exact when N divides
  the layers a rank holds, otherwise the rank checkpoints ``floor(layers / N)`` of them;
- ``full``: every block is checkpointed (``layer:1``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from planner.layout import checkpoint_interval

#: the matmuls of one block, in order: wq, wk, wv, wo, w1, w3, w2
MMS_PER_BLOCK = 7


def _save_list() -> set[Any]:
    """Ops whose outputs ``op`` keeps (besides every other matmul): the attention kernels and TP's
    reduce-scatter, as TorchTitan's ``_save_list``."""
    ops: set[Any] = {torch.ops._c10d_functional.reduce_scatter_tensor.default}
    for name in ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu"):
        if hasattr(torch.ops.aten, name):
            ops.add(getattr(torch.ops.aten, name).default)
    return ops


SAVE_LIST = _save_list()


def op_policy() -> Callable[..., CheckpointPolicy]:
    """A fresh policy for one checkpointed block (its matmul counters start at 0; one for the forward
    and one for the recompute: torch releases that call the policy again in the recompute number the
    same matmuls the same way, later ones replay the forward's decisions)."""
    mm_count = {False: 0, True: 0}

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if func == torch.ops.aten.mm.default:
            mm_count[ctx.is_recompute] += 1
            n = mm_count[ctx.is_recompute]
            save = n % 2 == 1 and n < MMS_PER_BLOCK
        else:
            save = func in SAVE_LIST
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _op_contexts() -> Any:
    return create_selective_checkpoint_contexts(op_policy())


def op_checkpoint(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> torch.Tensor:
    """``fn(*args)`` under op-level selective activation checkpointing."""
    return checkpoint(fn, *args, use_reentrant=False, context_fn=_op_contexts)


def checkpointed_positions(num_blocks: int, recompute: str) -> list[bool]:
    """For a rank's blocks in order (1-based count ``c``): fully checkpointed when ``c % N == 0``
    (``N`` = 1 for ``full``, N for ``layer:N``; none for other modes)."""
    every = checkpoint_interval(recompute)
    return [bool(every) and c % every == 0 for c in range(1, num_blocks + 1)]


def apply_recompute(modules: list[torch.nn.Module], recompute: str) -> None:
    """Set ``recompute`` on this rank's model parts (all its pipeline chunks, in order)."""
    blocks = [(m, name) for m in modules for name in m.layers]
    full = checkpointed_positions(len(blocks), recompute)
    for m in modules:
        m.checkpointed = set()
    for (m, name), ckpt in zip(blocks, full, strict=True):
        block = m.layers[name]
        block.attention.recompute_core = recompute == "selective"
        block.recompute_ops = recompute == "op"
        if ckpt:
            m.checkpointed.add(name)
