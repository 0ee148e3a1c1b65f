"""``ModelOptimizerState``: the model parts + optimizers + a JSON ``extra`` dict as one DCP Stateful.

State dicts come from ``get_state_dict``-style calls with ``StateDictOptions(flatten_optimizer_state_dict=
True)``: keys are parameter FQNs (``layers.3.attention.wq.weight``, ``state.layers.3....exp_avg``), so a
checkpoint does not depend on how the model was split into pipeline stages, and DTensor/FSDP2
parameters are saved as global tensors with each rank's slice (DCP reshards on load). Without the
flattening, optimizer param groups are deduplicated across stages and a PP->PP reload fails with
``KeyError: 'betas'`` (docs/feasibility.md §2c).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful
from torch.optim import Optimizer

FLAT = StateDictOptions(flatten_optimizer_state_dict=True)
FLAT_LOOSE = StateDictOptions(flatten_optimizer_state_dict=True, strict=False)


def merge_parts(parts: Sequence[nn.Module]) -> nn.Module:
    """One module whose FQNs are the union of the parts' FQNs (same Parameter objects), so one
    optimizer spanning several pipeline stages (virtual stages) maps to parameter names. Children of
    the same name are merged if they are ``ModuleDict``s (``layers``); other children of the same name
    must be the same module or hold no parameters (e.g. each stage's rotary-embedding tables)."""
    merged = nn.Module()
    for part in parts:
        for name, child in part.named_children():
            if child is None:
                continue
            have = getattr(merged, name, None)
            if have is None:
                merged.add_module(name, child)
            elif isinstance(have, nn.ModuleDict) and isinstance(child, nn.ModuleDict):
                clash = set(have.keys()) & set(child.keys())
                if clash:
                    raise ValueError(f"model parts both hold {name}.{sorted(clash)[0]}")
                merged.add_module(name, nn.ModuleDict({**dict(have.items()), **dict(child.items())}))
            elif have is not child and any(True for _ in child.parameters()):
                raise ValueError(f"model parts both hold a different {name!r} with parameters; cannot merge them")
            # else: a parameter-less child every stage has (rotary tables): the first one stands for all
        for name, param in part.named_parameters(recurse=False):
            merged.register_parameter(name, param)
    return merged


class ModelOptimizerState(Stateful):
    """What the trainer checkpoints: ``{"model": ..., "optim": ..., "extra": json}``.

    Args:
        model_parts: the model, or this rank's pipeline stages (model chunks).
        optimizers: ``None`` (model only), one optimizer per part, or one optimizer over all parts.
        extra: JSON-serialisable trainer state (step, sampler state, RNG, LR-schedule position); it is
            replaced by the checkpoint's on load. Stored as one JSON string, so its keys may differ
            between the saving and the loading run.
        optim_aliases: ``{name here: name in the checkpoint}`` for optimizer state (a tied head's copy
            on the last pipeline stage is stored under the embedding's name, as one process stores it).
    """

    def __init__(self, model_parts: nn.Module | Sequence[nn.Module],
                 optimizers: Optimizer | Sequence[Optimizer] | None = None,
                 extra: dict[str, Any] | None = None, optim_aliases: dict[str, str] | None = None) -> None:
        self.model_parts = [model_parts] if isinstance(model_parts, nn.Module) else list(model_parts)
        if not self.model_parts:
            raise ValueError("no model parts given")
        opts = [] if optimizers is None else [optimizers] if isinstance(optimizers, Optimizer) else list(optimizers)
        if len(opts) == 1 and len(self.model_parts) > 1:
            self._pairs = [(merge_parts(self.model_parts), opts[0])]
        elif not opts or len(opts) == len(self.model_parts):
            self._pairs = list(zip(self.model_parts, opts, strict=False))
        else:
            raise ValueError(f"{len(opts)} optimizers for {len(self.model_parts)} model parts; give one per part "
                             "or one for all")
        self.extra: dict[str, Any] = dict(extra or {})
        self.optim_aliases = dict(optim_aliases or {})

    def _rename(self, optim: dict[str, Any], back: bool) -> dict[str, Any]:
        """Flat optimizer keys (``state.<param>.<field>``, ``param_groups.<param>.<field>``) renamed."""
        if not self.optim_aliases:
            return optim
        pairs = [((b, a) if back else (a, b)) for a, b in self.optim_aliases.items()]
        out: dict[str, Any] = {}
        for k, v in optim.items():
            for src, dst in pairs:
                if f".{src}." in f".{k}.":
                    k = f".{k}.".replace(f".{src}.", f".{dst}.", 1)[1:-1]
                    break
            out[k] = v
        return out

    def state_dict(self) -> dict[str, Any]:
        model: dict[str, Any] = {}
        for part in self.model_parts:
            model.update(get_model_state_dict(part, options=FLAT))
        optim: dict[str, Any] = {}
        for part, opt in self._pairs:
            optim.update(get_optimizer_state_dict(part, opt, options=FLAT))
        out: dict[str, Any] = {"model": model, "extra": json.dumps(self.extra, sort_keys=True)}
        if self._pairs:
            out["optim"] = self._rename(optim, back=False)
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for part in self.model_parts:
            set_model_state_dict(part, state_dict["model"], options=FLAT_LOOSE)
        for part, opt in self._pairs:
            set_optimizer_state_dict(part, opt, optim_state_dict=self._rename(state_dict["optim"], back=True),
                                     options=FLAT)
        self.extra = json.loads(state_dict["extra"])
