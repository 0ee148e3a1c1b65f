"""RNG state as JSON (for the manifest and the trainer's ``extra``): torch CPU/CUDA, numpy, random."""

from __future__ import annotations

import base64
import random
from typing import Any

import numpy as np
import torch


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode("ascii")


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def capture_rng_state() -> dict[str, Any]:
    """This process's RNG states, JSON-serialisable."""
    np_state = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    out: dict[str, Any] = {
        "torch": _b64(torch.get_rng_state()),
        "numpy": {"kind": np_state[0], "keys": base64.b64encode(np_state[1].tobytes()).decode("ascii"),
                  "pos": int(np_state[2]), "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "python": {"version": py_version, "state": list(py_state), "gauss": py_gauss},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return out


def restore_rng_state(state: dict[str, Any]) -> None:
    """Set the RNGs from ``capture_rng_state()`` output (keys that are absent are left alone)."""
    if "torch" in state:
        torch.set_rng_state(_unb64(state["torch"]))
    if "numpy" in state:
        n = state["numpy"]
        keys = np.frombuffer(base64.b64decode(n["keys"]), dtype=np.uint32).copy()
        np.random.set_state((n["kind"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    if "python" in state:
        p = state["python"]
        random.setstate((p["version"], tuple(p["state"]), p["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_unb64(s) for s in state["cuda"]])
