"""Deterministic sampling addressed by global sample index.

Global position ``p`` (the ``p``-th sample the run consumes; step ``s`` reads positions
``[s*B, (s+1)*B)``) maps to dataset index ``perm_epoch(p % N)`` with ``epoch = p // N``, where
``perm_epoch`` is a keyed pseudo-random permutation of ``[0, N)`` (a balanced Feistel network with
cycle walking, keys derived from ``(seed, epoch)``). It is a pure function of ``(seed, N, p)``: no
state to carry, O(1) memory, independent of numpy's RNG streams, identical on every rank and every
layout. A data-parallel rank reads the rows ``[r*B/dp, (r+1)*B/dp)`` of the global batch, so any
split of the same global batch concatenates back to it. Resuming only needs the step.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch

_M64 = (1 << 64) - 1
_ROUNDS = 4
STATE_VERSION = 1


class SampleSource(Protocol):
    seq_len: int

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> np.ndarray: ...


def _mix_int(x: int) -> int:
    """splitmix64 finaliser on a Python int."""
    x &= _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, vectorised (uint64 arithmetic wraps)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def permute(indices: np.ndarray, n: int, seed: int, epoch: int) -> np.ndarray:
    """The image of ``indices`` (all in ``[0, n)``) under the permutation of ``[0, n)`` for ``(seed, epoch)``."""
    if n < 1:
        raise ValueError("cannot permute an empty range")
    bits = max(2, (n - 1).bit_length())
    bits += bits % 2
    half = np.uint64(bits // 2)
    mask = np.uint64((1 << (bits // 2)) - 1)
    keys = [np.uint64(_mix_int(_mix_int(seed * 0x9E3779B97F4A7C15 + epoch) + r)) for r in range(_ROUNDS)]

    def once(x: np.ndarray) -> np.ndarray:
        left, right = x >> half, x & mask
        for k in keys:
            left, right = right, left ^ (_mix(right ^ k) & mask)
        return (left << half) | right

    x = np.asarray(indices, dtype=np.uint64).copy()
    todo = np.ones(x.shape, dtype=bool)
    while todo.any():  # cycle walking: re-apply until the value lands back inside [0, n)
        x[todo] = once(x[todo])
        todo = x >= np.uint64(n)
    return x.astype(np.int64)


class GlobalBatchSampler:
    """The same ``[global_batch, seq_len+1]`` batch for a step on every rank and under every layout."""

    def __init__(self, dataset: SampleSource, global_batch: int, seed: int, *, shuffle: bool = True) -> None:
        if global_batch < 1:
            raise ValueError(f"global_batch must be >= 1, got {global_batch}")
        if len(dataset) < 1:
            raise ValueError("the dataset has no samples")
        self.dataset = dataset
        self.global_batch = int(global_batch)
        self.seed = int(seed)
        self.shuffle = shuffle
        self.num_samples = len(dataset)
        self.seq_len = int(dataset.seq_len)
        self.step = 0  # the next step next_batch() returns

    def indices(self, positions: np.ndarray) -> np.ndarray:
        """Dataset indices of global sample positions."""
        pos = np.asarray(positions, dtype=np.int64)
        if pos.size and pos.min() < 0:
            raise ValueError("sample positions must be >= 0")
        epochs, within = pos // self.num_samples, pos % self.num_samples
        if not self.shuffle:
            return within
        out = np.empty_like(within)
        for e in np.unique(epochs):
            sel = epochs == e
            out[sel] = permute(within[sel], self.num_samples, self.seed, int(e))
        return out

    def epoch_of(self, step: int) -> int:
        return step * self.global_batch // self.num_samples

    def _rows(self, step: int, first: int, count: int) -> torch.Tensor:
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        base = step * self.global_batch + first
        idx = self.indices(np.arange(base, base + count, dtype=np.int64))
        rows = np.stack([self.dataset[int(i)] for i in idx]) if count else np.zeros((0, self.seq_len + 1))
        return torch.from_numpy(rows.astype(np.int64, copy=False))

    def batch(self, step: int) -> torch.Tensor:
        """The global batch of ``step``: ``LongTensor [global_batch, seq_len+1]`` (inputs ``[:, :-1]``,
        targets ``[:, 1:]``)."""
        return self._rows(step, 0, self.global_batch)

    def local_batch(self, step: int, dp_rank: int, dp_size: int) -> torch.Tensor:
        """Rows ``[dp_rank*b, (dp_rank+1)*b)`` of ``batch(step)`` with ``b = global_batch // dp_size``,
        read without materialising the other ranks' rows."""
        if dp_size < 1 or not 0 <= dp_rank < dp_size:
            raise ValueError(f"bad data-parallel coordinates rank={dp_rank} size={dp_size}")
        if self.global_batch % dp_size:
            raise ValueError(f"global_batch {self.global_batch} is not divisible by dp={dp_size}")
        b = self.global_batch // dp_size
        return self._rows(step, dp_rank * b, b)

    def next_batch(self) -> torch.Tensor:
        """``batch(self.step)``, then advance."""
        out = self.batch(self.step)
        self.step += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        """JSON-able position: the next step, and what the order depends on (checked on load)."""
        return {"version": STATE_VERSION, "step": self.step, "consumed_samples": self.step * self.global_batch,
                "seed": self.seed, "global_batch": self.global_batch, "num_samples": self.num_samples,
                "seq_len": self.seq_len, "shuffle": self.shuffle}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` left off; refuses a state of a different order (names the field)."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"sampler state version {state.get('version')!r} != {STATE_VERSION}")
        for key in ("seed", "global_batch", "num_samples", "seq_len", "shuffle"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(f"sampler state was saved with {key}={state[key]!r}, this sampler has "
                                 f"{key}={getattr(self, key)!r}; the sample order would differ")
        step = int(state["step"])
        if step < 0:
            raise ValueError(f"sampler state has a negative step {step}")
        self.step = step
