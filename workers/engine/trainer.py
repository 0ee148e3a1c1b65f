"""``RankTrainer``: one rank of a 4D-parallel training run (see docs/contracts.md).

The caller owns the default process group; the trainer builds its sub-groups, model parts,
optimizer and pipeline schedule from the layout, and tears them down in :meth:`close`, so a
process can build another trainer with another layout afterwards.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from planner.layout import Layout
from workers.engine.checkpoint.dcp_io import CheckpointInfo
from workers.engine.config import TrainConfig
from workers.engine.data.hf_tokenizer import tokenizer_files
from workers.engine.groups import ParallelGroups
from workers.engine.optim import build_adamw, clip_grads, global_grad_norm, lr_at
from workers.engine.parallel.context import zigzag_split
from workers.engine.parallel.data import ZeroOneShards, allreduce_grads, fix_partial_grads
from workers.engine.parallel.pipeline import InFlightCounter, build_schedule
from workers.engine.parallel.tensor import vocab_parallel_cross_entropy
from workers.engine.parallelize import ModelParts, build_parts
from workers.engine.validate import layout_problems


@dataclass(frozen=True)
class StepResult:
    """One optimizer step, as every rank reports it (the loss is identical on every rank).

    ``step`` counts completed steps (1 for the first), the number a checkpoint taken right after it
    carries; ``restore()`` returns the same number as the next step to run.
    """

    step: int
    loss: float
    grad_norm: float
    lr: float
    tokens: int
    seconds: float


class RankTrainer:
    """One rank's share of model, optimizer and schedule for ``layout``."""

    def __init__(self, cfg: TrainConfig, layout: Layout, rank: int, world_size: int,
                 collective_timeout_s: float = 60.0, async_checkpoints: bool | None = None) -> None:
        """``async_checkpoints``: :meth:`start_save` writes and commits in the background (DCP async
        save); ``None`` = on CUDA only, where the host CPU is otherwise idle (docs/checkpoints.md)."""
        if layout.num_micro_batches == 0:
            layout = layout.with_global_batch(cfg.global_batch)
        problems = layout_problems(cfg.model, layout, cfg.global_batch, world_size)
        if problems:
            raise ValueError(f"layout {layout.short()} cannot train {cfg.model.name}: " + "; ".join(problems))
        self.cfg = cfg
        self.layout = layout
        self.rank = rank
        self.world_size = world_size
        self.groups = ParallelGroups(layout, rank, world_size, collective_timeout_s)
        self.device = (torch.device("cuda", torch.cuda.current_device()) if self.groups.backend == "nccl"
                       else torch.device("cpu"))
        self.coords = self.groups.coords
        self.n_micro = layout.num_micro_batches
        torch.manual_seed(cfg.seed)
        self.parts: ModelParts = build_parts(cfg.model, cfg.seed, layout, self.groups, self.device,
                                                  hf=cfg.model.hf)
        self.params = self.parts.parameters()
        named = self.parts.named_parameters()
        # tied embeddings over pipeline stages: the first stage's embedding and the last stage's head
        # are copies of one parameter, kept identical by summing their gradients before the update;
        # the global norm counts the parameter once (the head's copy is left out of it)
        self.embed_group: dist.ProcessGroup | None = None
        self.tied_copies: list[torch.nn.Parameter] = []
        self._norm_params = self.params
        if cfg.model.tie_embeddings and layout.pp > 1:
            from workers.engine.hf.weights import engine_name
            from workers.engine.model import TIED_EMBEDDING, TIED_HEAD

            self.embed_group = self.groups.embedding_group()
            self.tied_copies = [p for n, p in named if engine_name(n) in (TIED_EMBEDDING, TIED_HEAD)]
            heads = {id(p) for n, p in named if engine_name(n) == TIED_HEAD}
            self._norm_params = [p for p in self.params if id(p) not in heads]
        self.zero1: ZeroOneShards | None = None
        if layout.zero == 1:
            self.zero1 = ZeroOneShards([n for n, _ in named], self.params, self.groups)
            owned = set(self.zero1.owned())
            named = [nt for i, nt in enumerate(named) if i in owned]
        self.optimizer = build_adamw(named, cfg)
        self.tp_group = self.groups.tp if layout.tp > 1 else None
        self.vocab_start = self.coords.tp * (cfg.model.vocab // layout.tp)
        self.schedule = None
        self.in_flight: InFlightCounter | None = None
        if layout.pp > 1:
            self.schedule, _ = build_schedule(layout, self.parts.modules, self.parts.stages, self.groups.pp,
                                              self.device, self.n_micro, self._loss_fn)
            if self.coords.pp == 0:
                self.in_flight = InFlightCounter(self.parts.modules[0])
        self.next_step = 0  # the step step() runs next
        self._sampler: Any = None
        self._val: list[torch.Tensor] | None = None
        self._closed = False
        self.async_checkpoints = self.device.type == "cuda" if async_checkpoints is None else async_checkpoints
        self._ckpt: Any = None  # Checkpointer, built by the first save (a collective point on every rank)
        self._in_flight: Any = None  # the background save started by start_save()
        self._committed: list[CheckpointInfo] = []

    # ------------------------------------------------------------------ numerics
    def _loss_fn(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_cross_entropy(logits, target, self.vocab_start, self.tp_group)

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def local_inputs(self, batch: torch.Tensor, already_dp_local: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's (inputs, targets) from the global batch ``[B, S+1]`` (DP rows, CP zigzag)."""
        if not already_dp_local:
            per = batch.shape[0] // self.layout.dp
            batch = batch[self.coords.dp * per:(self.coords.dp + 1) * per]
        x, y = batch[:, :-1], batch[:, 1:]
        x = zigzag_split(x, self.coords.cp, self.layout.cp).contiguous().to(self.device)
        y = zigzag_split(y, self.coords.cp, self.layout.cp).contiguous().to(self.device)
        return x, y

    def forward_backward(self, batch: torch.Tensor, already_dp_local: bool = False) -> float:
        """Gradients of the mean loss of ``batch`` (global, or this DP rank's rows) in ``.grad``;
        returns the loss, identical on every rank. Gradients are fully reduced afterwards (zero=1: on
        the parameter's owner only; the other ranks hold none)."""
        for p in self.params:
            p.grad = None
        x, y = self.local_inputs(batch, already_dp_local)
        loss_sum = torch.zeros((), dtype=torch.float64)
        if self.schedule is not None:
            if self.in_flight is not None:
                self.in_flight.reset()
            loss_sum += self._run_pipeline(self.schedule.step, x, y)
        else:
            model = self.parts.modules[0]
            for xm, ym in zip(x.chunk(self.n_micro), y.chunk(self.n_micro), strict=True):
                with self._autocast():
                    loss = self._loss_fn(model(xm), ym) / self.n_micro
                loss.backward()
                loss_sum += float(loss.detach())
        fix_partial_grads(self.params)
        self._sum_tied_grads()
        if self.zero1 is not None:
            self.zero1.reduce_grads()
        elif self.layout.zero == 0:
            allreduce_grads(self.params, self.groups.dp_cp)
        return self._global_loss(loss_sum)

    @torch.no_grad()
    def _sum_tied_grads(self) -> None:
        """Tied embeddings under PP: the embedding's and the head's gradients summed between the first
        and the last stage (each partial over DP as it is; the DP reduction follows)."""
        if self.embed_group is None:
            return
        for p in self.tied_copies:
            g = p.grad
            if g is None:
                g = p.grad = torch.zeros_like(p)
            dist.all_reduce(g._local_tensor if isinstance(g, DTensor) else g, group=self.embed_group)

    @torch.no_grad()
    def forward_loss(self, batch: torch.Tensor) -> float:
        """The mean loss of the global ``batch`` ``[B, S+1]`` with no backward pass and no autograd
        graph (evaluation): the same micro-batches and reductions as :meth:`forward_backward`, the
        pipeline through its schedule's forward-only ``eval``; identical on every rank."""
        x, y = self.local_inputs(batch)
        loss_sum = torch.zeros((), dtype=torch.float64)
        if self.schedule is not None:
            loss_sum += self._run_pipeline(self.schedule.eval, x, y)
        else:
            model = self.parts.modules[0]
            for xm, ym in zip(x.chunk(self.n_micro), y.chunk(self.n_micro), strict=True):
                with self._autocast():
                    loss_sum += float(self._loss_fn(model(xm), ym)) / self.n_micro
        return self._global_loss(loss_sum)

    def _run_pipeline(self, run: Any, x: torch.Tensor, y: torch.Tensor) -> float:
        """One pass of the pipeline schedule (``schedule.step`` trains, ``schedule.eval`` only runs
        forward): the mean micro-batch loss on the last stage, 0.0 on the others."""
        losses: list[torch.Tensor] = []
        with self._autocast():
            if self.coords.pp == 0:
                run(x)
            elif self.coords.pp == self.layout.pp - 1:
                run(target=y, losses=losses)
            else:
                run()
        return sum(float(t.detach()) for t in losses) / len(losses) if losses else 0.0

    def _global_loss(self, loss_sum: torch.Tensor) -> float:
        """This rank's loss sum -> the step's loss, identical on every rank: the last stage's value
        to all stages (sum over pp), then the mean over dp*cp."""
        loss_t = loss_sum.to(self.device if self.device.type == "cuda" else "cpu").reshape(1)
        if self.layout.pp > 1:
            dist.all_reduce(loss_t, group=self.groups.pp)
        if dist.get_world_size(self.groups.dp_cp) > 1:
            dist.all_reduce(loss_t, group=self.groups.dp_cp)
            loss_t /= dist.get_world_size(self.groups.dp_cp)
        return float(loss_t.item())

    def optimizer_step(self, step: int) -> tuple[float, float]:
        """Clip by the global norm, set the step's lr, AdamW, and (zero=1) re-broadcast parameters."""
        norm = global_grad_norm(self._norm_params, self.groups, owned_over_dp=self.zero1 is not None)
        clip_grads(self.params, norm, self.cfg.grad_clip)
        lr = lr_at(step, self.cfg)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        self.optimizer.step()
        if self.zero1 is not None:
            self.zero1.broadcast_params()
        return norm, lr

    def train_batch(self, batch: torch.Tensor, already_dp_local: bool = False) -> StepResult:
        """One optimizer step on a given batch (tests feed fresh random batches through this)."""
        t0 = time.perf_counter()
        loss = self.forward_backward(batch, already_dp_local)
        norm, lr = self.optimizer_step(self.next_step)
        self.next_step += 1
        return StepResult(step=self.next_step, loss=loss, grad_norm=norm, lr=lr,
                          tokens=self.cfg.global_batch * self.cfg.model.seq_len,
                          seconds=time.perf_counter() - t0)

    # ------------------------------------------------------------------ data
    def _data(self) -> Any:
        if self._sampler is None:
            from workers.engine.data import GlobalBatchSampler, build_dataset

            dataset = build_dataset(self.cfg.data, self.cfg.model.seq_len)
            self._sampler = GlobalBatchSampler(dataset, self.cfg.global_batch, self.cfg.seed)
        return self._sampler

    def step(self) -> StepResult:
        """One optimizer step on the data sampler's batch for ``next_step``."""
        local = self._data().local_batch(self.next_step, self.coords.dp, self.layout.dp)
        if int(local.max()) >= self.cfg.model.vocab:
            raise ValueError(f"token id {int(local.max())} outside the model vocabulary {self.cfg.model.vocab}")
        return self.train_batch(local, already_dp_local=True)

    def val_loss(self) -> float:
        """Mean loss over the first ``eval_batches * global_batch`` windows of ``eval_data`` (window
        ``i`` = tokens ``[i*S, i*S+S]``, as ``orthoplex eval``); forward only (:meth:`forward_loss`),
        nothing is updated. Call between steps."""
        if self.cfg.eval_data is None:
            raise ValueError("val_loss() needs cfg.eval_data")
        if self._val is None:
            from workers.engine.data import build_dataset

            ds = build_dataset(self.cfg.eval_data, self.cfg.model.seq_len)
            n = self.cfg.eval_batches * self.cfg.global_batch
            if len(ds) < n:
                raise ValueError(f"eval_data has {len(ds)} windows of {self.cfg.model.seq_len} tokens, "
                                 f"eval_batches * global_batch = {n} needed")
            rows = torch.stack([torch.from_numpy(ds[i]) for i in range(n)])
            self._val = list(rows.split(self.cfg.global_batch))
        return sum(self.forward_loss(b) for b in self._val) / len(self._val)

    # ------------------------------------------------------------------ checkpoints
    def app_state(self) -> Any:
        """Model parts + optimizer (+ the step and data position) as one DCP ``Stateful``; parameters
        and optimizer state are keyed by global parameter name, so any layout can load them."""
        from workers.engine.checkpoint import ModelOptimizerState
        from workers.engine.model import TIED_EMBEDDING, TIED_HEAD

        # tied under PP: the last stage's copy keeps the optimizer state under the parameter's one name
        aliases = {TIED_HEAD: TIED_EMBEDDING} if self.embed_group is not None and self.coords.pp > 0 else None
        return ModelOptimizerState(self.parts.modules, self.optimizer, extra=self._trainer_state(),
                                   optim_aliases=aliases)

    def _trainer_state(self) -> dict[str, Any]:
        return {"next_step": self.next_step, "consumed_samples": self.next_step * self.cfg.global_batch,
                "seed": self.cfg.seed, "global_batch": self.cfg.global_batch}

    def _manifest_extra(self) -> dict[str, Any]:
        from workers.engine.checkpoint import capture_rng_state

        return {"layout": self.layout.to_dict(), "train": self.cfg.to_dict(),
                "data": {"step": self.next_step, "consumed_samples": self.next_step * self.cfg.global_batch,
                         "seed": self.cfg.seed, "global_batch": self.cfg.global_batch},
                "rng": capture_rng_state()}

    def _checkpointer(self) -> Any:
        if not self.cfg.checkpoint_dir:
            raise ValueError("saving a checkpoint needs cfg.checkpoint_dir")
        if self._ckpt is None:
            from workers.engine.checkpoint import Checkpointer

            self._ckpt = Checkpointer(self.cfg.checkpoint_dir, rank=self.rank, world_size=self.world_size,
                                      keep=self.cfg.keep_checkpoints, async_save=self.async_checkpoints)
        return self._ckpt

    def save(self) -> CheckpointInfo:
        """Checkpoint of the state after the last step, committed when this returns (collective over
        all ranks). A background save must have been finished (:meth:`finish_saves`) first."""
        if self._in_flight is not None:
            raise RuntimeError("a background checkpoint is in flight; call finish_saves() first")
        t0 = time.perf_counter()
        res = self._checkpointer().save(self.next_step, self.app_state(), manifest_extra=self._manifest_extra())
        return CheckpointInfo(step=self.next_step, path=str(res.path), seconds=time.perf_counter() - t0,
                              bytes=int(res.bytes))

    def start_save(self) -> list[CheckpointInfo]:
        """Begin a checkpoint of the state after the last step (collective); returns the checkpoints
        committed since the last call. With ``async_checkpoints`` the loop is blocked only while the
        state is copied to host memory; the write and the commit run in the background and come back
        from the next :meth:`start_save` or :meth:`finish_saves`. Otherwise it is :meth:`save`."""
        done = self.finish_saves()
        if not self.async_checkpoints:
            return [*done, self.save()]
        self._in_flight = self._checkpointer().save(self.next_step, self.app_state(),
                                                    manifest_extra=self._manifest_extra(), async_save=True)
        return done

    def finish_saves(self) -> list[CheckpointInfo]:
        """Wait for the background checkpoint in flight (collective: raises on every rank if it
        failed); returns the checkpoints committed since the last call."""
        if self._in_flight is not None:
            pending, self._in_flight = self._in_flight, None
            res = pending.wait()
            self._committed.append(CheckpointInfo(step=res.step, path=str(res.path), seconds=res.seconds,
                                                  bytes=int(res.bytes)))
        done, self._committed = self._committed, []
        return done

    def restore(self) -> int:
        """Load the newest verified checkpoint (any layout); returns the next step to run (0 if none).

        The learning rate is a function of the step and the sampler is addressed by step, so the
        step is the data position. The RNG states the checkpoint carries (rank 0's torch, numpy and
        Python generators at save time; every rank seeds them alike) are restored on every rank, so
        whatever draws random numbers after a resume sees what the uninterrupted run would have."""
        if not self.cfg.checkpoint_dir:
            return 0
        from workers.engine.checkpoint import load_latest

        state = self.app_state()
        res = load_latest(self.cfg.checkpoint_dir, state)
        if res is None:
            return 0
        return self.resume_position(state.extra, res.manifest.rng, f"checkpoint {res.path}", default_step=res.step)

    def resume_position(self, extra: dict[str, Any], rng: dict[str, Any] | None, source: str,
                        default_step: int | None = None) -> int:
        """After ``source`` (a checkpoint or a snapshot) was loaded into :meth:`app_state`: refuse another
        global batch (the sample order would differ), set the data position (``next_step``; from
        ``default_step`` when the saved state has none) and restore the RNG states; the next step."""
        from workers.engine.checkpoint import restore_rng_state

        saved_batch = extra.get("global_batch", self.cfg.global_batch)
        if saved_batch != self.cfg.global_batch:
            raise ValueError(f"{source} was written with global_batch {saved_batch}, "
                             f"this run has {self.cfg.global_batch}; the sample order would differ")
        self.next_step = int(extra["next_step"] if default_step is None else extra.get("next_step", default_step))
        if rng:
            restore_rng_state(rng)
        return self.next_step

    def export_hf(self, out: str, base_config: dict[str, Any] | None = None) -> str:
        """Write the current weights as an HF Llama checkpoint directory (collective over all ranks;
        one gathered tensor at a time: ``workers.engine.hf.export``). ``base_config``: the imported
        ``config.json`` whose other fields (token ids, ...) the export keeps (default: ``model.hf``'s)."""
        from workers.engine.hf.config import read_hf_config
        from workers.engine.hf.export import export_hf

        if base_config is None and self.cfg.model.hf:
            base_config = read_hf_config(self.cfg.model.hf)
        return str(export_hf(self.parts, self.cfg.model, self.layout, self.coords, out, base_config=base_config,
                             extra_files=tokenizer_files(self.cfg.data.tokenizer)))

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Barrier, then destroy this trainer's sub-groups (not the default group)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._ckpt is not None:
                self._ckpt.close()  # finishes a background save, destroys its group
        finally:
            self._ckpt = self._in_flight = None
            if self.in_flight is not None:
                self.in_flight.remove()
            self.schedule = None
            self.groups.close()
