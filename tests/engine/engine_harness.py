"""Shared pieces of the engine tests: the single-process reference and per-rank comparison.

The reference is written with plain torch (``F.cross_entropy`` over the whole batch,
``torch.nn.utils.clip_grad_norm_``, ``torch.optim.AdamW``), not with the engine's own helpers,
so an engine bug cannot hide in both.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from planner.layout import Layout
from workers.engine.config import ModelConfig, TrainConfig
from workers.engine.model import build_model

TINY = ModelConfig.preset("tiny")


def tiny_cfg(steps: int = 10, global_batch: int = 8, seed: int = 1234, model: ModelConfig = TINY,
             **kw: Any) -> TrainConfig:
    return TrainConfig(model=model, steps=steps, global_batch=global_batch, seed=seed, lr=3e-3, min_lr=3e-4,
                       warmup_steps=2, weight_decay=0.1, grad_clip=1.0, **kw)


def random_batches(cfg: TrainConfig, n: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, cfg.model.vocab, (cfg.global_batch, cfg.model.seq_len + 1), generator=g)
            for _ in range(n)]


def _lr(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    p = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps))
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * p))


def text_batches(cfg: TrainConfig, n: int, seed: int) -> list[torch.Tensor]:
    """``n`` global batches of real text: the built-in corpus (the first 256 KiB of the Python
    standard library's sources, byte tokens) through the run's sampler. Real text, unlike uniform
    random tokens, gives gradients large enough that clipping is active."""
    from workers.engine.data import GlobalBatchSampler, builtin_dataset

    sampler = GlobalBatchSampler(builtin_dataset(cfg.model.seq_len, max_bytes=256 * 1024), cfg.global_batch, seed)
    return [sampler.batch(step) for step in range(n)]


def reference(cfg: TrainConfig, batches: list[torch.Tensor]) -> dict[str, Any]:
    """Single-process run: first-batch loss and gradients, then the loss and (pre-clipping) global
    gradient-norm curves over ``batches``."""
    model = build_model(cfg.model, cfg.seed)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr,
                            betas=(cfg.beta1, cfg.beta2), eps=1e-8)
    losses: list[float] = []
    norms: list[float] = []
    grads: dict[str, torch.Tensor] = {}
    for step, batch in enumerate(batches):
        opt.zero_grad()
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        loss.backward()
        if step == 0:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)))
        for gr in opt.param_groups:
            gr["lr"] = _lr(step, cfg)
        opt.step()
        losses.append(float(loss.detach()))
    return {"losses": losses, "norms": norms, "grads": grads}


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def grad_errors(trainer: Any, ref_grads: dict[str, torch.Tensor]) -> tuple[float, int]:
    """Max relative-to-scale gradient error over this rank's parameters (collective: full_tensor)."""
    worst = 0.0
    n = 0
    for name, p in trainer.parts.named_parameters():
        name = name.replace("_checkpoint_wrapped_module.", "")
        if p.grad is None:  # zero=1: the gradient lives on the parameter's owner (checked there)
            assert trainer.layout.zero == 1, f"{name}: no gradient"
            continue
        g = full(p.grad)
        r = ref_grads[name]
        err = float((g - r).abs().max()) / max(float(r.abs().max()), 1e-6)
        worst = max(worst, err)
        n += 1
    return worst, n


def check_layout_equivalence(layout: Layout, cfg: TrainConfig, batches: list[torch.Tensor],
                             ref: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    from workers.engine.trainer import RankTrainer

    trainer = RankTrainer(cfg, layout, rank, world, collective_timeout_s=60)
    try:
        # step 1 by hand: the gradients are compared before clipping and the optimizer step
        loss0 = trainer.forward_backward(batches[0])
        gerr, nparams = grad_errors(trainer, ref["grads"])
        norm0, _ = trainer.optimizer_step(0)
        trainer.next_step = 1
        steps = [trainer.train_batch(b) for b in batches[1:]]
        curve = [loss0] + [s.loss for s in steps]
        norms = [norm0] + [s.grad_norm for s in steps]
        peak = trainer.in_flight.peak if trainer.in_flight is not None else None
    finally:
        trainer.close()
    loss_err = abs(loss0 - ref["losses"][0]) / abs(ref["losses"][0])
    curve_err = max(abs(a - b) / abs(b) for a, b in zip(curve, ref["losses"], strict=True))
    norm_err = max(abs(a - b) / abs(b) for a, b in zip(norms, ref["norms"], strict=True))
    return {"layout": dataclasses.asdict(layout), "loss_err": loss_err, "grad_err": gerr, "nparams": nparams,
            "curve_err": curve_err, "norm_err": norm_err, "curve": curve, "in_flight_peak": peak}


def fast_layout(spec: str) -> Layout:
    """``spec`` with a micro-batch that keeps tests fast: one micro-batch per step without PP,
    ``pp`` micro-batches with PP (the 1F1B minimum), unless the spec sets ``micro_batch``."""
    layout = Layout.parse(spec)
    if "micro_batch" in spec:
        return layout
    per_replica = 8 // layout.dp
    mb = per_replica // layout.pp if layout.pp > 1 else per_replica
    return dataclasses.replace(layout, micro_batch=max(1, mb))


RANDOM_STEPS = 6
TEXT_STEPS = 4


def equivalence_inputs(model: ModelConfig = TINY) -> tuple[TrainConfig, list[torch.Tensor], dict[str, Any]]:
    """The config, the batches -- 6 of fresh uniform random tokens, then 4 of real text (the
    built-in corpus) -- and the single-process reference (computed once, in the pytest process, and
    shipped to the ranks). Every layout is built once and trains through both, so real text costs
    4 steps per layout, no extra build (10 steps, not 16 as before: the CI budget; every text step
    clips). The text steps must clip (checked here): that is where a
    wrong global norm shows (the TP x zero=3 norm missed FSDP's strided shards)."""
    cfg = tiny_cfg(steps=RANDOM_STEPS + TEXT_STEPS, model=model)
    batches = random_batches(cfg, RANDOM_STEPS, seed=99) + text_batches(cfg, TEXT_STEPS, seed=7)
    ref = reference(cfg, batches)
    text_norms = ref["norms"][RANDOM_STEPS:]
    assert min(text_norms) > cfg.grad_clip, f"clipping inactive on the text steps: norms {text_norms}"
    return cfg, batches, ref


def run_equivalence(rank: int, world: int, specs: list[str], inputs: tuple) -> list[dict[str, Any]]:
    """Rank body: every layout in ``specs`` built, checked and torn down in turn."""
    import time

    cfg, batches, ref = inputs
    out = []
    for spec in specs:
        t0 = time.perf_counter()
        r = check_layout_equivalence(fast_layout(spec), cfg, batches, ref, rank, world)
        r["spec"] = spec
        r["seconds"] = time.perf_counter() - t0
        out.append(r)
    return out


def assert_equivalent(results: list[list[dict[str, Any]]]) -> None:
    """Every rank, every layout: loss 1e-5 rel, gradients 1e-4, and over the 10 steps (random, then
    clipped real text) the loss curve and the global gradient norm 1e-4 rel."""
    failures = []
    keys = ("loss_err", "grad_err", "curve_err", "norm_err")
    for i, r in enumerate(results[0]):  # one line per layout, shown with -rP / -s
        worst = [max(rows[i][k] for rows in results) for k in keys]
        print(f"{r['spec']:<45} loss {worst[0]:.1e}  grad {worst[1]:.1e}  curve {worst[2]:.1e}  "
              f"norm {worst[3]:.1e}  {r['seconds']:.1f}s")
    for rank, rows in enumerate(results):
        for r in rows:
            if not (r["loss_err"] < 1e-5 and r["grad_err"] < 1e-4 and r["curve_err"] < 1e-4
                    and r["norm_err"] < 1e-4):
                failures.append((rank, r["spec"], *(r[k] for k in keys)))
    assert not failures, failures
    # the loss is identical on every rank
    for i in range(len(results[0])):
        assert len({round(rows[i]["curve"][-1], 12) for rows in results}) == 1


def _local_bytes(t: object) -> int:
    if isinstance(t, DTensor):
        t = t.to_local()
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def measure_sp_memory(rank: int, world: int) -> dict[str, tuple[int, int]]:
    """Per-rank activation bytes in the norm regions (inputs + outputs of every RMSNorm) and all
    saved-for-backward bytes, for ``tp=world`` with and without sequence parallelism."""
    from workers.engine.model import RMSNorm
    from workers.engine.trainer import RankTrainer

    cfg = tiny_cfg()
    batch = random_batches(cfg, 1, seed=3)[0]
    out = {}
    for sp in (True, False):
        trainer = RankTrainer(cfg, Layout(tp=world, sp=sp, micro_batch=8), rank, world)
        region = {"bytes": 0}
        saved = {"bytes": 0}

        def hook(_m: torch.nn.Module, args: tuple, result: torch.Tensor, region: dict = region) -> None:
            region["bytes"] += _local_bytes(args[0]) + _local_bytes(result)

        def pack(t: torch.Tensor, saved: dict = saved) -> torch.Tensor:
            saved["bytes"] += _local_bytes(t)
            return t

        handles = [m.register_forward_hook(hook) for m in trainer.parts.modules[0].modules()
                   if isinstance(m, RMSNorm)]
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            trainer.forward_backward(batch)
        for h in handles:
            h.remove()
        trainer.close()
        out["sp" if sp else "no_sp"] = (region["bytes"], saved["bytes"])
    return out


def count_tp_collectives(rank: int, world: int) -> dict[str, dict[str, int]]:
    """The collectives one micro-batch's forward and backward issues per transformer block under
    ``tp=world``, with and without SP (``CommDebugMode``'s counts of a 4-block model minus a 2-block
    one, halved: the embedding, output and loss collectives cancel out)."""
    from torch.distributed.tensor.debug import CommDebugMode

    from workers.engine.trainer import RankTrainer

    counts: dict[tuple[int, bool], dict[str, int]] = {}
    for layers in (2, 4):
        cfg = tiny_cfg(model=dataclasses.replace(TINY, layers=layers))
        batch = random_batches(cfg, 1, seed=3)[0]
        for sp in (True, False):
            trainer = RankTrainer(cfg, Layout(tp=world, sp=sp, micro_batch=8), rank, world)
            mode = CommDebugMode()
            with mode:
                trainer.forward_backward(batch)
            counts[(layers, sp)] = {str(k).rsplit(".", 1)[-1]: v for k, v in mode.get_comm_counts().items()}
            trainer.close()
    return {("sp" if sp else "no_sp"): {op: (counts[(4, sp)].get(op, 0) - n) // 2
                                        for op, n in counts[(2, sp)].items()}
            for sp in (True, False)}


def tp_structure(rank: int, world: int) -> dict[str, Any]:
    """Under ``tp=world`` (SP on and off): each parameter's placements, and the modules whose forward
    took or returned a DTensor in one micro-batch's forward and backward (the split runs on local shards)."""
    from workers.engine.trainer import RankTrainer

    cfg = tiny_cfg()
    batch = random_batches(cfg, 1, seed=3)[0]
    out: dict[str, Any] = {}
    for sp in (True, False):
        trainer = RankTrainer(cfg, Layout(tp=world, sp=sp, micro_batch=8), rank, world)
        model = trainer.parts.modules[0]
        dtensor_io: list[str] = []
        hooks = [m.register_forward_hook(lambda m, a, o, n=n, seen=dtensor_io: seen.append(n)
                                         if any(isinstance(t, DTensor) for t in (o, *a)) else None) for n, m in model.named_modules()]
        trainer.forward_backward(batch)
        for h in hooks:
            h.remove()
        out["sp" if sp else "no_sp"] = {
            "placements": {n: [str(pl) for pl in p.placements] if isinstance(p, DTensor) else None
                           for n, p in model.named_parameters()},
            "dtensor_io": dtensor_io}
        trainer.close()
    return out


def equivalence_and_sp_body(rank: int, world: int, specs: list[str], inputs: tuple) -> dict[str, Any]:
    return {"eq": run_equivalence(rank, world, specs, inputs), "sp": measure_sp_memory(rank, world),
            "comm": count_tp_collectives(rank, world),
            "tp": tp_structure(rank, world) if world == 2 else None}  # checked by the 2-rank module


def assert_sp_memory_drops(results: list[dict[str, Any]], tp: int) -> None:
    for r in results:
        sp_region, sp_saved = r["sp"]["sp"]
        full_region, full_saved = r["sp"]["no_sp"]
        assert sp_region * tp == full_region, (sp_region, full_region)
        assert sp_saved < full_saved


def assert_recompute_changes_nothing(results: list[list[dict[str, Any]]]) -> list[str]:
    """Every layout run with ``recompute=...`` trains exactly as the same layout without it (when the
    list holds that one too): the 10-step loss curve (clipped text steps included) to 1e-6 relative
    on every rank, the first gradients as close to the reference as without recompute. Returns the
    specs compared."""
    compared = []
    for rows in results:
        by_spec = {r["spec"]: r for r in rows}
        for spec, r in by_spec.items():
            parts = spec.split(",")
            base = ",".join(p for p in parts if not p.startswith("recompute="))
            if base == spec or base not in by_spec:
                continue
            ref = by_spec[base]
            worst = max(abs(a - b) / abs(b) for a, b in zip(r["curve"], ref["curve"], strict=True))
            assert worst < 1e-6, (spec, worst)
            assert r["grad_err"] <= max(2 * ref["grad_err"], 1e-6), (spec, r["grad_err"], ref["grad_err"])
            compared.append(spec)
    return sorted(set(compared))
