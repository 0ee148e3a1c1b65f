"""Replica groups that keep going (issue #14), engine level: the cross-replica (``dp_replicate``)
gradient reduction of the engine done through torchft.

One *replica group* is ``tp`` processes holding one copy of the model, laid out by the engine
(``RankTrainer`` with ``Layout(tp=tp)`` on the group's own default process group). Between groups,
torchft does the fault tolerance:

- a torchft ``Manager`` per rank (group rank 0 hosts the group's ``ManagerServer``, which heartbeats
  to a lighthouse: torchft's ``LighthouseServer``, or the Ray runtime's ``QuorumLighthouse``, which
  speaks the same protocol), a per-step quorum of the live groups, asynchronous (torchft's default):
  it forms on the manager's thread while each group computes the share it had in the last quorum
  (checked once the quorum is there); a joining group heals on that thread and joins the step's
  reduction with zeros (the survivors' rows cover the batch), takes the healed state at the
  commit and computes from its next step on, so the survivors never wait for a heal;
- a fault-tolerant ``ProcessGroupGloo`` per group rank across the groups (TP rank ``r`` of every
  group reduces with TP rank ``r`` of the others), reconfigured by the manager on every new quorum;
- ``should_commit``: a step whose cross-group all-reduce failed (a group died in it) is voted down
  and the survivors redo it with the next quorum, a shrink-only one (no group joins in the redo: a
  replacement heals at the next step);
- healing: a group that joins behind receives the user state (parameters, AdamW state, RNG, data
  position) from a healthy group over that process group (``PGTransport``); no storage is read.

What is ours, not torchft's: the global batch is kept. The rows of the step's batch (the engine's
``GlobalBatchSampler``) are divided among the groups of the step's quorum, contiguous and as even
as possible (:func:`row_share`: 12 rows over 3 groups, 4 each; a lost group's 4 rows over the 2
survivors, 2 each); each group runs its rows in passes of at most ``micro_batch`` rows (the
activation-memory bound), back-propagates ``loss_p * rows_p / global_batch`` for each pass ``p``,
and the groups SUM (not torchft's average over participants), so the gradient is the mean over all
rows of the global batch whatever the number of groups and however the rows fall into passes.
Sharing rows rather than micro-batches lets a group run its whole share in one pass (as torchft's
groups do) and still hand a lost group's rows evenly to the survivors. Clipping, the lr schedule and
AdamW are the engine's (``RankTrainer.optimizer_step``), after the reduction.

Run a rank with ``python -m workers.engine.replica_ft '<json ReplicaRankSpec>'`` (or a JSON list of
them: run one after the other, e.g. one group layout each); the test
(``tests/engine/test_replica_ft.py``) drives it. Each rank appends one JSON line per
event to ``spec.log`` (``up``, ``step``, ``abort``, ``fault``, ``healed``, ``done``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from workers.engine.parallel.data import flatten, local, unflatten_into
from workers.engine.replica_rows import (  # noqa: F401  (row_share, redo_extra: the tests' names here too)
    redo_extra,
    redo_guess,
    row_share,
    share_unit,
    steady_guess,
    torchft_order,
)


@dataclass(frozen=True)
class ReplicaRankSpec:
    """One rank of one replica group."""

    group: int  # replica group index (the torchft replica id is ``rg{group}``)
    rank: int  # rank inside the group (= TP rank)
    tp: int  # tensor parallel inside the group
    store_port: int  # the group's TCPStore (hosted by group rank 0)
    lighthouse: str  # torchft lighthouse address
    log: str  # JSON-lines event log shared by all ranks of the run
    out: str  # directory for the final parameter dump of each rank
    steps: int = 12
    global_batch: int = 12
    micro_batch: int = 2
    seed: int = 1234
    init_seed: int | None = None  # model init seed (a replacement gets another: only healing can match)
    min_replicas: int = 2
    timeout_s: float = 20.0
    start_groups: int = 0  # wait until this many groups logged ``up`` before the first quorum
    kill_at: int = -1  # this group dies in the middle of step kill_at (after backward, before the reduction)
    gate_at: int = -1  # before step gate_at, wait until group ``gate_group`` logged ``up`` (choreography)
    gate_group: int = -1
    min_step_s: float = 0.0  # pad each step (a stand-in for a real step time)
    redo_expect: list[int] | None = None  # the step set a redo is asked with (ReplicaStepper.step_once)
    pp: int = 1  # the rest of the group's layout: pipeline, context and data parallel, ZeRO stage
    cp: int = 1
    dp: int = 1
    zero: int = 0

    @property
    def size(self) -> int:
        """Ranks per group."""
        return self.tp * self.pp * self.cp * self.dp


class _Log:
    def __init__(self, path: str, group: int, rank: int) -> None:
        self.path = Path(path)
        self.group, self.rank = group, rank

    def __call__(self, event: str, **kw: Any) -> None:
        line = json.dumps({"ts": time.time(), "event": event, "group": self.group, "rank": self.rank,
                           "pid": os.getpid(), **kw}) + "\n"
        with self.path.open("a") as f:  # one short O_APPEND write per line
            f.write(line)

    def rows(self) -> list[dict[str, Any]]:
        return read_log(self.path)


def read_log(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The event rows of a run's log (a torn last line of a killed rank is skipped)."""
    rows = []
    for line in Path(path).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def make_manager(*, group: int, rank: int, size: int, store_addr: str, store_port: int, lighthouse: str,
                 min_replicas: int, timeout_s: float, state_dict: Any, load_state_dict: Any) -> Any:
    """The torchft ``Manager`` of one rank of replica group ``group`` (replica id ``rg{group}``) over a
    fault-tolerant ``ProcessGroupGloo`` across the groups, healing over that group (``PGTransport``).
    ``store_addr:store_port`` is the group's ``TCPStore`` (hosted by group rank 0; the manager is a
    client of it)."""
    from torchft import Manager, ProcessGroupGloo
    from torchft.checkpointing.pg_transport import PGTransport

    timeout = timedelta(seconds=timeout_s)
    pg = ProcessGroupGloo(timeout=timeout)
    return Manager(
        pg=pg, min_replica_size=min_replicas, load_state_dict=load_state_dict,
        state_dict=state_dict, use_async_quorum=True, init_sync=False,
        timeout=timeout, quorum_timeout=timeout * 3, connect_timeout=timeout,
        rank=rank, world_size=size, store_addr=store_addr, store_port=store_port,
        lighthouse_addr=lighthouse, replica_id=f"rg{group}",
        checkpoint_transport=PGTransport(pg, timeout=timeout, device=torch.device("cpu")),
        quorum_retries=3,  # a group dropped by a late heartbeat asks again instead of exiting
    )


def forward_backward(trainer: Any, sampler: Any, step: int, rows: list[int], global_batch: int) -> float:
    """Gradients of ``sum_p loss_p * rows_p / global_batch`` over rows ``rows`` of step ``step``'s
    global batch, run in passes ``p`` of the group's layout (``replica_rows.pass_rows``: one
    ``RankTrainer.forward_backward`` each, with the group's own TP/PP/CP/DP collectives and its ZeRO
    or FSDP reduction), in ``.grad`` (:func:`fill_grads`: zeros where nothing was computed); returns
    that partial loss."""
    from workers.engine.replica_rows import pass_rows

    for p in trainer.params:
        p.grad = None
    size = pass_rows(trainer.layout)
    batch = sampler.batch(step) if rows else None
    kept: list[torch.Tensor | None] | None = None
    part = 0.0
    for i in range(0, len(rows), size):
        assert batch is not None
        rows_p = batch[rows[i:i + size]]
        w = rows_p.shape[0] / global_batch
        part += trainer.forward_backward(rows_p) * w  # the pass's mean loss and gradient (the group's)
        with torch.no_grad():
            for j, p in enumerate(trainer.params):
                if p.grad is None:
                    continue
                g = local(p.grad)
                g.mul_(w)
                if kept is not None and kept[j] is not None:
                    g.add_(kept[j])
        kept = [local(p.grad) if p.grad is not None else None for p in trainer.params]
    fill_grads(trainer)
    return part


def holds_grad(trainer: Any) -> list[bool]:
    """Which of this rank's parameters hold a gradient after a pass: all, but with ZeRO-1 only the
    ones whose optimizer state this rank owns. The same for the same rank of every group (the same
    layout), so the cross-group reduction's flat buffers line up."""
    zero1 = getattr(trainer, "zero1", None)
    if zero1 is None or zero1.size == 1:
        return [True] * len(trainer.params)
    owned = set(zero1.owned())
    return [i in owned for i in range(len(trainer.params))]


def fill_grads(trainer: Any) -> None:
    """Zeros for the gradients this rank holds (:func:`holds_grad`) that no pass computed (a group
    with no rows in the step: healing, or a share of none), ``None`` for the others."""
    for p, held in zip(trainer.params, holds_grad(trainer), strict=True):
        if not held:
            p.grad = None
        elif p.grad is None:
            p.grad = torch.zeros_like(p)


def warm_up(trainer: Any, sampler: Any, global_batch: int) -> float:
    """One forward and backward pass over step 0's first pass of rows, thrown away (parameters, RNG and the
    optimizer untouched, gradients cleared), on every rank of a group together (the pass runs the
    group's TP collectives), before the group's torchft manager exists. A new rank's first pass
    (allocator, autograd, the first TP collectives) took about twice a steady one here, and a
    replacement's first pass is part of its first step with a share (the one after its heal), which
    the survivors wait for. Before
    the manager: a manager heartbeats to the lighthouse at once, and a group that heartbeats but has
    not asked for a quorum holds every changed quorum (a redo's too) up to the join timeout.
    Then one optimizer step at learning rate 0 on zero gradients (the parameters do not move), whose
    state is dropped after it (the first real step starts AdamW afresh, or the healing replaces the
    state): a rank's first optimizer step computed DTensor's sharding decisions for every ``_foreach``
    op (0.3 s of CPU for tp=2 tiny here), in the step a replacement heals in. Seconds spent."""
    t0, rng = time.perf_counter(), torch.get_rng_state()
    from workers.engine.replica_rows import pass_rows

    forward_backward(trainer, sampler, 0, list(range(pass_rows(trainer.layout))), global_batch)
    opt = trainer.optimizer
    lrs = [g["lr"] for g in opt.param_groups]
    with torch.no_grad():
        for p in trainer.params:
            if p.grad is not None:
                p.grad.zero_()
        for g in opt.param_groups:
            g["lr"] = 0.0
        opt.step()
    for g, lr in zip(opt.param_groups, lrs, strict=True):
        g["lr"] = lr
    opt.state.clear()
    for p in trainer.params:
        p.grad = None
    torch.set_rng_state(rng)
    return time.perf_counter() - t0


class ReplicaStepper:
    """One rank of one replica group: the engine's ``RankTrainer`` (its group's TP layout, on the
    group's default process group) and a torchft manager between groups. Shared by the OS-process
    path (:class:`ReplicaGroupTrainer`) and the Ray runtime (``RankWorker.setup_replica``).

    ``sampler.batch(step)`` is the step's whole global batch (``GlobalBatchSampler``); ``log`` gets
    ``("healed", step=, from_group=)`` when this rank healed from a peer."""

    def __init__(self, trainer: Any, sampler: Any, *, group: int, rank: int, global_batch: int,
                 store_addr: str, store_port: int, lighthouse: str, min_replicas: int,
                 timeout_s: float, log: Any = None) -> None:
        self.trainer = trainer
        self.model = trainer.parts.modules[0]
        self.sampler = sampler
        self.group, self.rank, self.size = group, rank, int(trainer.world_size)  # size: the group's ranks
        self.global_batch = global_batch
        self.unit = share_unit(trainer.layout)  # a share of the rows comes in blocks of this many
        if global_batch % self.unit:
            raise ValueError(f"global batch {global_batch} is not a multiple of the {self.unit} rows a group of "
                             f"{trainer.layout.short()} runs together")
        self.log = log or (lambda *a, **k: None)
        self.manager = make_manager(group=group, rank=rank, size=self.size, store_addr=store_addr, store_port=store_port,
                                    lighthouse=lighthouse, min_replicas=min_replicas, timeout_s=timeout_s,
                                    state_dict=self.state_dict, load_state_dict=self.load_state_dict)
        self.healed_from: int | None = None
        self._healed_now = False
        self._rng = torch.get_rng_state()
        self._redo = False  # the last attempt was voted down: the next one is its redo
        self._kept: dict[str, Any] | None = None  # the voted-down attempt's own gradient sum (redo_extra)
        self._dead_groups: set[int] = set()  # groups the supervisor found down (peers_lost)
        self._wake: threading.Event | None = None  # set to stop waiting for the running reduction
        self._members: list[int] | None = None  # the groups of the last committed attempt's quorum
        self._work: list[list[float]] = []  # the running attempt's own work intervals (step_once)

    def current_step(self) -> int:
        return int(self.manager.current_step())

    def quorum_groups(self) -> list[int]:
        """The groups of this rank's last quorum, in torchft's order. torchft configures the cross-group
        process group with the quorum's global ranks (a replica id's trailing digits times the group
        size plus the group rank, in replica-id order: ``Manager._async_quorum``) and keeps them on it."""
        ranks = getattr(self.manager._pg, "_global_ranks", None) or []
        return [(int(r) - self.rank) // self.size for r in ranks]

    # ------------------------------------------------------------------ state over the network
    def state_dict(self) -> dict[str, Any]:
        """What a joining group needs: parameters and AdamW state (this rank's local shards, plain
        tensors), the RNG and the data position."""
        opt = self.trainer.optimizer
        optim = []
        for p in self.trainer.params:
            st = opt.state.get(p, {})
            optim.append({k: (local(v).detach().clone() if isinstance(v, torch.Tensor) else v)
                          for k, v in st.items()})
        step = self.manager.current_step()
        return {"params": [local(p).detach().clone() for p in self.trainer.params], "optim": optim,
                "rng": self._rng.clone(), "next_step": step,
                "consumed_samples": step * self.global_batch, "from_group": self.group}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        opt = self.trainer.optimizer
        for p, src, st in zip(self.trainer.params, state["params"], state["optim"], strict=True):
            local(p).copy_(src)
            new: dict[str, Any] = {}
            for k, v in st.items():
                if k == "step" or not isinstance(v, torch.Tensor):
                    new[k] = v.clone() if isinstance(v, torch.Tensor) else v
                else:
                    t = torch.zeros_like(p)  # a DTensor for a TP-sharded parameter
                    local(t).copy_(v)
                    new[k] = t
            if new:
                opt.state[p] = new
            else:  # no state on the peer's rank (ZeRO-1: not this rank's to step): none here either
                opt.state.pop(p, None)
        torch.set_rng_state(state["rng"])
        if state["consumed_samples"] != state["next_step"] * self.global_batch:
            raise ValueError("healed state: the data position does not match the step")
        self.healed_from = int(state["from_group"])
        self._healed_now = True
        self.log("healed", step=int(state["next_step"]), from_group=self.healed_from)

    # ------------------------------------------------------------------ one step
    def _forward_backward(self, step: int, rows: list[int]) -> float:
        t0 = time.time()
        try:
            return forward_backward(self.trainer, self.sampler, step, rows, self.global_batch)
        finally:
            self._work.append([t0, time.time()])

    def step_once(self, fault: Any = None, expect: list[int] | None = None,
                  prev: list[int] | None = None) -> dict[str, Any]:
        """One attempt at the next step: quorum (asked in the background; a joining group heals there
        and takes no rows in this step), this group's share of the rows (that of the
        last quorum's groups while the quorum forms: :func:`steady_guess`), the cross-group SUM, the
        commit vote. ``fault(step)`` (a test hook) runs
        after the backward pass, before the reduction. ``expect``: the groups the supervisor runs this
        attempt on, ``prev``: those of the attempt before. In the redo of a voted-down step ``expect``
        is the quorum to come: the quorum is asked in the background (:meth:`_quorum`) while this
        group keeps the gradient of its own rows from the voted-down attempt and computes
        only its part of the lost groups' rows (:func:`redo_extra`); when torchft's quorum
        is another, its standard share is computed again. A redo without ``expect`` (the rank's own,
        right after the vote: ``RankWorker.replica_step``) takes the step set from the supervisor's
        :meth:`peers_lost` if that comes before the quorum (:meth:`_redo_hint`), else keeps its own
        rows for the quorum torchft formed. The cross-group reduction stops waiting when
        :meth:`peers_lost` names a group of its quorum. Returns ``{"event": "step" | "abort",
        "step", "participants", ...}``; an aborted step is redone by the next call."""
        from torch.distributed import ReduceOp

        mgr = self.manager
        t: dict[str, Any] = {"start": time.time()}  # the attempt's phases (time.time()): where a stall's seconds go
        # and its own work, [start, end] of each forward/backward and of the optimizer step: the rest of
        # a gap between two commits is waiting (quorum, reductions, the vote, the supervisor's round trip)
        self._work = t["work"] = []
        guess, asked = None, None
        if self._redo:
            # the redo of a voted-down step asks for a shrink-only quorum (torchft's own option): the
            # survivors of the last quorum only (a replacement waiting in the lighthouse joins, and
            # heals, at the next step), no heal, the same step
            asked = self._quorum(shrink_only=True)
            if expect is None:  # the rank's own redo: a step set once the supervisor names the dead groups
                expect, prev = self._redo_hint(asked)
            guess = redo_guess(self.group, expect)
        else:
            # the quorum forms (and a joining group heals) in torchft's background thread while this
            # group computes the share it had in the last quorum (steady_guess); checked below
            asked = self._quorum()
            guess = steady_guess(self.group, self._members, self._dead_groups)
        step = mgr.current_step()
        if guess is not None:
            n, idx = guess
        else:  # no quorum to guess from (the first step, a replacement's first): wait for this one
            t["quorum"] = asked.result()
            step, (n, idx) = mgr.current_step(), self._participation()
        if self._healed_now:  # the peer's RNG came with its state
            self._rng, self._healed_now = torch.get_rng_state(), False
        torch.set_rng_state(self._rng)  # a redone step sees the RNG of its first attempt
        kept, self._kept = self._kept, None
        extra = None
        if guess is not None and kept is not None and kept["step"] == step and kept["standard"] \
                and prev and (kept["n"], kept["idx"]) == redo_guess(self.group, prev):
            extra = redo_extra(self.global_batch, self.group, prev, expect or [], self.unit)
        elif guess is None and self._redo and kept is not None and kept["step"] == step and kept["standard"] \
                and idx is not None and redo_guess(self.group, kept["groups"]) == (kept["n"], kept["idx"]):
            # a redo without the supervisor's step set (the rank redoes at once, RankWorker.replica_step):
            # the quorum has formed, so its groups are known, and the lost groups' share is all to compute;
            # not when a group of the voted-down attempt's quorum was healing in it (it had no share: the
            # participants were fewer than the quorum's groups, and which ones torchft does not say)
            now = self.quorum_groups()
            if len(now) == n and self.group in now and now.index(self.group) == idx:
                extra = redo_extra(self.global_batch, self.group, kept["groups"], now, self.unit)
        if extra is not None:  # own rows kept: only the lost groups' share is computed
            assert kept is not None
            rows = kept["rows"] + extra
            part = self._forward_backward(step, extra) + kept["part"]
        else:
            rows = row_share(self.global_batch, n, idx, self.unit) if idx is not None else []
            part = self._forward_backward(step, rows)
        standard = extra is None
        if guess is not None:
            t["quorum"] = asked.result()
            got = self._participation()
            t["guess_ok"] = float(got == guess and mgr.current_step() == step)
            if not t["guess_ok"]:  # another quorum than guessed: this group's share again, for that one
                step, (n, idx) = mgr.current_step(), got
                torch.set_rng_state(self._rng)
                rows = row_share(self.global_batch, n, idx, self.unit) if idx is not None else []
                part, extra, standard = self._forward_backward(step, rows), None, True
        t["backward"] = time.time()
        if fault is not None:
            fault(step)
        # this rank's gradients (with ZeRO-1 the ones it owns): the same-coordinate rank of every
        # other group holds the same ones (HSDP across groups)
        grads = [local(p.grad) for p in self.trainer.params if p.grad is not None]
        flat = flatten(grads)
        if extra is not None:
            assert kept is not None
            flat += kept["flat"]
            t["kept_rows"] = float(len(kept["rows"]))
        # the reduction works in place: a copy of this group's own sum, kept for a redo
        mine = {"step": step, "n": n, "idx": idx, "rows": list(rows), "part": part, "flat": flat.clone(),
                "standard": standard, "groups": self.quorum_groups()}
        loss_t = torch.tensor([part], dtype=torch.float64)
        self._reduce(mgr.allreduce(flat, reduce_op=ReduceOp.SUM), mine["groups"])
        self._reduce(mgr.allreduce(loss_t, reduce_op=ReduceOp.SUM), mine["groups"])
        t["reduced"] = time.time()
        if mgr.errored() is not None:
            self._drop_cross_group_pg()
        t["reduce"] = time.time()
        self._redo = not mgr.should_commit()
        t["vote"] = time.time()
        if self._redo:
            self._kept = mine
            return {"event": "abort", "step": step, "participants": n, "phases": t, "error": _error(mgr)}
        unflatten_into(flat, grads)
        t0 = time.time()
        norm, lr = self.trainer.optimizer_step(step)
        self._work.append([t0, time.time()])
        self.trainer.next_step = step + 1
        self._rng = torch.get_rng_state()
        self._members = mine["groups"]
        row = {"event": "step", "step": step, "loss": float(loss_t.item()), "grad_norm": norm, "lr": lr,
               "participants": n, "groups": mine["groups"], "rows": rows, "healed_from": self.healed_from,
               "phases": t}
        self.healed_from = None
        return row

    def _redo_hint(self, asked: Any) -> tuple[list[int] | None, list[int] | None]:
        """A redo the rank started itself (``RankWorker.replica_step``): wait until its quorum forms or
        the supervisor names dead groups of the voted-down attempt's quorum (:meth:`peers_lost`),
        whichever comes first. Named first: the step set (``expect``: that quorum without them) and
        that quorum (``prev``), so the lost share is computed while the quorum forms; else ``(None,
        None)`` (the share follows the quorum torchft formed)."""
        kept = self._kept
        if kept is None:
            return None, None
        groups = list(kept["groups"])
        wake = threading.Event()
        self._wake = wake
        try:
            asked.add_done_callback(lambda _fut: wake.set())
            while not asked.done() and not self._dead_groups & set(groups):
                wake.wait()
                wake.clear()
        finally:
            self._wake = None
        dead = self._dead_groups & set(groups)
        if asked.done() or not dead:
            return None, None
        return [g for g in groups if g not in dead], groups

    def peers_lost(self, groups: list[int]) -> None:
        """The supervisor found the node of ``groups`` down (called from another thread while a step
        runs): an attempt whose quorum holds one of them stops waiting for its cross-group reduction
        now, rather than until gloo sees the dead peer's sockets close (a killed process's teardown,
        0.3-0.9 s on this loaded host) or, for a host that went silent, until its collective timeout.
        The attempt is voted down and redone without them; an attempt without them is not touched."""
        self._dead_groups |= {int(g) for g in groups}
        wake = self._wake
        if wake is not None:
            wake.set()

    def _reduce(self, work: Any, quorum: list[int]) -> None:
        """Wait for a cross-group reduction (torchft's managed work), or until :meth:`peers_lost` names
        a group of ``quorum``: then the error is torchft's (``report_error``: the step is voted down)
        and the gloo work is left to fail on its own (it holds its process group until then)."""
        inner = getattr(work, "_work", None)  # the process group's own work (torchft's _ManagedWork)
        if inner is not None:
            wake = threading.Event()
            self._wake = wake
            try:
                inner.get_future().add_done_callback(lambda _fut: wake.set())
                if not self._dead_groups & set(quorum):
                    wake.wait()
            finally:
                self._wake = None
            dead = sorted(self._dead_groups & set(quorum))
            if dead and not inner.is_completed():
                self.manager.report_error(RuntimeError(f"the node of replica group(s) {dead} is down (supervisor)"))
                return
        work.wait()

    def _drop_cross_group_pg(self) -> None:
        """This attempt's cross-group reduction failed (a peer group died in it): close the gloo group
        now. A live peer group may still be blocked in the same collective waiting on this group's
        sockets; gloo's ``abort`` does not wake it (it would wait ``timeout_s``: measured, 20 s), but
        closing the sockets does, within a second, so every survivor reaches the redo's quorum at
        about the same time (one left out by the lighthouse's join timeout would ask for a
        shrink-only quorum it is not part of, until torchft's quorum timeout). The next quorum
        configures a new group (torchft's ``configure``), even with the same members."""
        import gc

        pg = self.manager._pg  # torchft's reconfigurable ProcessGroupGloo (make_manager)
        # what torchft's abort(errored=False) does, without gloo's own abort: that one does not wake a
        # blocked peer, and it waited for the work in flight (0.27 s once here)
        pg._pg = None
        gc.collect()  # the group sits in reference cycles; fast: setup froze what existed (freeze_heap)
        self.manager._quorum_id = -1  # torchft configures the group when the quorum id changes

    def _quorum(self, shrink_only: bool = False) -> Future[float]:
        """Ask torchft for the step's quorum (asynchronous: it forms, and a group behind heals, on the
        manager's thread; the redo of a voted-down step asks for a shrink-only one, torchft's own
        option). A future of the time it formed; ``result()`` re-raises the quorum's error. For a dead
        group the quorum waits until the quorum service finds it gone (the supervisor's word, or its
        manager's port refusing the service's probe) or its heartbeat is ``replica_heartbeat_timeout_s``
        old."""
        self.manager.start_quorum(shrink_only=shrink_only)
        formed: Future[float] = Future()

        def done(fut: Any) -> None:
            err = fut.exception()
            if err is None:
                formed.set_result(time.time())
            else:
                formed.set_exception(err)

        self.manager._quorum_future.add_done_callback(done)
        return formed

    def _participation(self) -> tuple[int, int | None]:
        """``(participants, this group's index)`` of the formed quorum; the index is ``None`` for a group
        that heals in this step (torchft's asynchronous quorum: it joins the reduction with zeros, takes
        the summed gradient and the healed state at the commit, and computes from its next step on)."""
        mgr = self.manager
        return mgr.num_participants(), (mgr.participating_rank() if mgr.is_participating() else None)

    def close(self) -> None:
        self.manager.shutdown(wait=False)


def _error(mgr: Any) -> str:
    """The error torchft recorded for the step being voted down ("" if none: a peer voted it down)."""
    err = getattr(mgr, "errored", lambda: None)()
    return "" if err is None else repr(getattr(err, "original_exception", err))[:300]


class ReplicaGroupTrainer:
    """One rank of one replica group as its own OS process (the engine-level test): its own
    ``TCPStore`` and gloo world, the tiny preset, and :class:`ReplicaStepper` for the steps."""

    def __init__(self, spec: ReplicaRankSpec) -> None:
        from planner.layout import Layout
        from workers.engine.config import ModelConfig, TrainConfig
        from workers.engine.data import GlobalBatchSampler, builtin_dataset
        from workers.engine.replica_rows import group_layout
        from workers.engine.trainer import RankTrainer

        self.spec = spec
        self.log = _Log(spec.log, spec.group, spec.rank)
        # the group's store: hosts the group's default process group and torchft's manager address
        self.store = dist.TCPStore("127.0.0.1", spec.store_port, spec.size, is_master=spec.rank == 0,
                                   timeout=timedelta(seconds=spec.timeout_s * 3), wait_for_workers=False)
        dist.init_process_group("gloo", store=dist.PrefixStore("engine", self.store), rank=spec.rank,
                                world_size=spec.size)
        model = ModelConfig.preset("tiny")
        self.cfg = TrainConfig(model=model, steps=spec.steps, global_batch=spec.global_batch,
                               seed=spec.init_seed if spec.init_seed is not None else spec.seed,
                               lr=3e-3, min_lr=3e-4, warmup_steps=2, weight_decay=0.1, grad_clip=1.0)
        layout = group_layout(Layout(tp=spec.tp, pp=spec.pp, cp=spec.cp, dp=spec.dp, zero=spec.zero,
                                     micro_batch=spec.micro_batch))
        self.trainer = RankTrainer(self.cfg, layout, spec.rank, spec.size, collective_timeout_s=spec.timeout_s)
        # the data position is the step; the sampler is keyed by the run's seed, not the init seed
        sampler = GlobalBatchSampler(builtin_dataset(model.seq_len, max_bytes=256 * 1024),
                                     spec.global_batch, spec.seed)
        self.stepper = ReplicaStepper(self.trainer, sampler, group=spec.group, rank=spec.rank,
                                      global_batch=spec.global_batch, store_addr="127.0.0.1", store_port=spec.store_port,
                                      lighthouse=spec.lighthouse, min_replicas=spec.min_replicas,
                                      timeout_s=spec.timeout_s, log=self.log)
        self.manager = self.stepper.manager

    def _pace(self, t0: float) -> None:
        left = self.spec.min_step_s - (time.perf_counter() - t0)
        if left > 0:
            time.sleep(left)

    def _gate(self, step: int) -> None:
        """Test choreography: hold at ``gate_at`` until the replacement group is up (logged)."""
        s = self.spec
        if step != s.gate_at or s.gate_group < 0:
            return
        t0 = time.time()
        deadline = time.monotonic() + s.timeout_s * 6
        while time.monotonic() < deadline:
            if any(r["event"] == "up" and r["group"] == s.gate_group for r in self.log.rows()):
                break
            time.sleep(0.05)
        self.log("gate", step=step, waited_s=round(time.time() - t0, 3))

    def _wait_start(self) -> None:
        s = self.spec
        deadline = time.monotonic() + s.timeout_s * 6
        while s.start_groups and time.monotonic() < deadline:
            if len({r["group"] for r in self.log.rows() if r["event"] == "up"}) >= s.start_groups:
                return
            time.sleep(0.05)

    def _fault(self, step: int) -> None:
        if step == self.spec.kill_at:
            dist.barrier()  # both TP ranks of the group reach the fault together
            self.log("fault", step=step)
            os.kill(os.getpid(), signal.SIGKILL)

    def run(self) -> None:
        s, stepper = self.spec, self.stepper
        self.log("up", step=stepper.current_step())
        self._wait_start()
        while stepper.current_step() < s.steps:
            self._gate(stepper.current_step())
            t0 = time.perf_counter()
            row = stepper.step_once(self._fault, s.redo_expect, list(range(s.start_groups)) or None)
            event = row.pop("event")
            self.log(event, **row)
            self._pace(t0)
        self.log("done", step=stepper.current_step())
        torch.save([local(p).detach().clone() for p in self.trainer.params],
                   Path(s.out) / f"final-g{s.group}-r{s.rank}.pt")

    def close(self) -> None:
        self.stepper.close()
        self.trainer.close()
        dist.destroy_process_group()


def main(argv: list[str]) -> None:
    import faulthandler

    faulthandler.register(signal.SIGUSR1)  # stacks of a stuck rank: kill -USR1 <pid>
    torch.set_num_threads(1)
    raw = json.loads(argv[0])
    try:
        # a list: runs one after the other in this process (the layouts test: one spawn, several layouts)
        for one in raw if isinstance(raw, list) else [raw]:
            t = ReplicaGroupTrainer(ReplicaRankSpec(**one))
            t.run()
            t.close()
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    # torchft's manager / process-group threads can keep the interpreter's exit (final garbage
    # collection) waiting for seconds to minutes on a loaded machine: the rank's work is done
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spec_json(spec: ReplicaRankSpec) -> str:
    return json.dumps(asdict(spec))


if __name__ == "__main__":
    main(sys.argv[1:])
