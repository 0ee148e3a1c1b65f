"""The RankWorker actor: one per placement-group bundle, runs one rank of the engine.

It owns a ``RankTrainer`` (workers/engine) and answers ``heartbeat()`` while a step runs (the actor
is threaded), so the supervisor can tell a live-but-stuck rank from a dead one. Every step reports
its *busy* time (this thread's CPU time: compute, not time blocked in collectives, since
``torch.set_num_threads(1)`` keeps the compute on the calling thread) next to the wall time; the
straggler scorer uses the busy time.

Fault hooks (``inject``) exist for tests and demos only; the supervisor calls them only when fault
injection was enabled explicitly (see ``faults``).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from typing import Any

import ray

#: The rank's torch work (setup, steps, saves, restores) runs on one thread of its own: Ray's
#: concurrency group ``torch`` of one thread, beside the default group's threads, which answer
#: heartbeats and fault hooks while a step runs. DTensor caches its sharding decisions per thread
#: (torch's ``LocalLRUCache``); spread over the actor's four threads, a new rank paid the cold cache
#: on each of its first four steps (tp=2 tiny: 0.25-0.35 s of CPU each in the optimizer step alone,
#: a replacement replica group's first four steps included; measured 2026-12-06).
TORCH_GROUP = "torch"
#: ``ray.remote`` options of every RankWorker actor (a gang's and the warm pool's)
ACTOR_CONCURRENCY: dict[str, Any] = {"max_concurrency": 4, "concurrency_groups": {TORCH_GROUP: 1}}
_on_torch_thread = ray.method(concurrency_group=TORCH_GROUP)



def burn_cpu(seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU time (a slow rank computes, it does not sleep)."""
    if seconds <= 0:
        return
    end = time.thread_time() + seconds
    x = 1.0001
    while time.thread_time() < end:
        for _ in range(2000):
            x = x * 1.0000001 + 1e-9

def _rss_mb() -> float | None:
    """This process's resident memory (MiB), from ``/proc/self/statm``; None where there is none."""
    try:
        with open("/proc/self/statm") as f:
            return round(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)
    except (OSError, ValueError, IndexError):
        return None


class RankWorker:
    """Plain class; ``launch``/``supervisor`` wrap it with ``ray.remote`` and per-bundle options."""

    def __init__(self) -> None:
        import torch

        torch.set_num_threads(1)
        self._trainer: Any = None
        self._rank = -1
        self._lock = threading.Lock()
        self._hb: dict[str, Any] = {"phase": "idle", "step": -1, "since": time.time()}
        self._slow_factor = 1.0
        self._jitter = 0.0
        self._hang = False
        self._fence: tuple[str, int] | None = None  # (checkpoint_dir, gang epoch)
        self._snap: Any = None  # Snapshotter: this rank's shard to two nodes' memory after every n-th step
        self._snap_every = 1
        self._snap_links: list[Any] = []  # its snapshot_wire LocalCopy and Sender (per gang; closed with the next)
        self.snapshot_push_errors = 0
        self._rng = random.Random(os.getpid())
        self._rdzv: dict[str, Any] | None = None
        self._replica: Any = None  # ReplicaStepper: this rank's replica group under torchft (replica_groups)
        self._lighthouse_proxy: Any = None  # ProxyProcess: the manager's way to the job's quorum service
        self._replica_commits: list[dict[str, Any]] = []
        self._replica_aborts: list[int] = []
        self._replica_abort_rows: list[dict[str, Any]] = []  # the last aborted attempts (phases, torchft's error)
        self._kill_mid_step = False  # fault hook: kill this node in the middle of the next replica step

    # ---------------------------------------------------------------- bookkeeping
    def _phase(self, phase: str, step: int | None = None) -> None:
        with self._lock:
            self._hb = {"phase": phase, "step": self._hb["step"] if step is None else step, "since": time.time()}

    def info(self) -> dict[str, Any]:
        import ray

        ctx = ray.get_runtime_context()
        return {
            "node_id": ctx.get_node_id(),
            "pid": os.getpid(),
            "ip": ray.util.get_node_ip_address(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "cuda_host": os.path.exists("/dev/nvidiactl"),  # an NVIDIA driver on this host
            "rss_mb": _rss_mb(),
        }

    def use_gpus(self, ids: list[str]) -> None:
        """A warm rank (started outside any bundle) takes its bundle's GPUs; CUDA starts later."""
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(ids)

    def heartbeat(self) -> dict[str, Any]:
        with self._lock:
            hb = dict(self._hb)
        hb["rank"] = self._rank
        hb["now"] = time.time()
        return hb

    # ---------------------------------------------------------------- lifecycle
    def endpoint(self, timeout_s: float) -> dict[str, Any]:
        from workers.runtime.cluster.rendezvous import endpoint

        return endpoint(timeout_s).to_dict()

    @_on_torch_thread
    def setup(self, rdzv: dict[str, Any], cfg: dict[str, Any], layout: dict[str, Any], rank: int,
              world_size: int, collective_timeout_s: float, fence_epoch: int | None = None,
              snapshot_to: list[Any] | None = None, snapshot_every: int = 1) -> dict[str, float]:
        """Join the process group and build this rank's trainer for ``layout``; ``fence_epoch`` is the
        gang's epoch (see ``fencing``): steps and saves are refused once a newer gang started.
        ``snapshot_to``: the snapshot holders (``memsnap``) this rank pushes its shard to after every
        ``snapshot_every``-th step (all ranks of a gang get holders, or none do: creating the
        snapshotter is collective)."""
        from planner.layout import Layout
        from workers.engine.config import TrainConfig
        from workers.engine.trainer import RankTrainer
        from workers.runtime.cluster.rendezvous import Rendezvous, join

        self._rank = rank
        self._rdzv = dict(rdzv)
        self._fence = (cfg.get("checkpoint_dir"), fence_epoch) if fence_epoch is not None else None
        self._phase("setup")
        t0 = time.perf_counter()
        join(Rendezvous.from_dict(rdzv), rank, world_size)
        t1 = time.perf_counter()
        self._trainer = RankTrainer(TrainConfig.from_dict(cfg), Layout.from_dict(layout), rank, world_size,
                                    collective_timeout_s=collective_timeout_s)
        self._close_snap_links()
        if snapshot_to is not None:
            from workers.engine.checkpoint.snapshot import Snapshotter

            self._snap_every = max(1, int(snapshot_every))
            self._snap = Snapshotter(self._trainer, self._pusher(fence_epoch or 0, world_size, snapshot_to),
                                     tag=f"e{fence_epoch or 0}", timeout_s=collective_timeout_s)
        self._phase("idle")
        return {"join_s": t1 - t0, "build_s": time.perf_counter() - t1}

    def _pusher(self, epoch: int, world: int, holders: list[Any]) -> Any:
        """The snapshotter's push: this rank's files to each holder (``snapshot_wire``): written into
        the directory of its own node's holder (node memory, no copy through a socket), sent over a
        TCP link to the others (the addresses are asked through Ray on the first push, in the
        background). Best effort per copy: a holder that fails is dropped and counted, the rank
        goes on."""
        from workers.runtime.recovery.snapshot_transport import LocalCopy, Sender

        links = self._snap_links

        def push(step: int, files: dict[str, list[Any]]) -> None:
            import ray

            if not links:
                here = ray.get_runtime_context().get_node_id()
                remote = []
                for ref in [h.address.remote() for h in holders]:
                    try:
                        addr = ray.get(ref, timeout=60)
                    except Exception:  # its node died: one copy fewer
                        self.snapshot_push_errors += 1
                        continue
                    if addr["node"] == here:
                        links.append(LocalCopy(addr["dir"], int(addr["keep"])))
                    else:
                        remote.append(addr)
                links.append(Sender(remote, timeout_s=60.0))
            for link in links:
                self.snapshot_push_errors += link.push(epoch, world=world, step=step, files=files)

        return push

    def _close_snap_links(self) -> None:
        links, self._snap_links = self._snap_links, []
        for link in links:
            link.close()

    # ---------------------------------------------------------------- replica groups (torchft)
    @_on_torch_thread
    def setup_replica(self, group: int, lighthouse: str, min_replicas: int, timeout_s: float,
                      secret: str) -> dict[str, Any]:
        """Make this rank (its gang is one replica group: ``setup`` built the group's TP world) a rank
        of replica group ``group`` under torchft (``workers.engine.replica_ft.ReplicaStepper``): the
        manager uses the group's rendezvous store; the step counter starts at 0 (a replacement heals
        from a peer at its first quorum). The manager asks the job's quorum service through a loopback
        proxy (a child process) that adds the job's ``secret`` (torchft 0.2.0's client cannot send it)."""
        from workers.engine.replica_ft import ReplicaStepper
        from workers.engine.replica_passes import warm_up
        from workers.runtime.recovery.quorum_proxy import ProxyProcess

        assert self._trainer is not None and self._rdzv is not None, "setup first"
        cfg = self._trainer.cfg
        sampler = self._trainer._data()
        warm_s = warm_up(self._trainer, sampler, cfg.global_batch)  # not in its first steps
        freeze_heap()
        if self._lighthouse_proxy is not None:
            self._lighthouse_proxy.close()
        self._lighthouse_proxy = ProxyProcess(lighthouse, secret)
        lighthouse = self._lighthouse_proxy.address()
        self._replica = ReplicaStepper(
            self._trainer, sampler, group=group, rank=self._rank, global_batch=cfg.global_batch,
            store_addr=str(self._rdzv["host"]), store_port=int(self._rdzv["port"]), lighthouse=lighthouse,
            min_replicas=min_replicas, timeout_s=timeout_s)
        return {"group": group, "step": self._replica.current_step(), "warm_up_s": round(warm_s, 3)}

    @_on_torch_thread
    def replica_step(self, expect: list[int] | None = None, prev: list[int] | None = None,
                     snapshot_group: int | None = None) -> dict[str, Any]:
        """One step of this rank's replica group (``ReplicaStepper.step_once``; ``expect``: the groups
        the supervisor runs it on, ``prev``: those of the attempt before): committed (``event: step``),
        after one redo at once if the first attempt was voted down, or voted down (``abort``: the next
        call redoes it). Calls queue behind an attempt still running (one the supervisor stopped
        waiting for when a peer group died): the ``torch`` group's one thread runs one at a time;
        every reply lists the rank's aborted steps. ``snapshot_group``: the group that takes the job's
        in-memory snapshot after a commit (every ``snapshot_every``-th step; one group, since every
        group holds the same state)."""
        self._phase("step", self._replica.current_step())
        w0, c0 = time.perf_counter(), time.thread_time()
        row = self._replica_attempt(w0, c0, expect, prev)
        if row["event"] == "abort":
            # voted down (a peer group died in it): redo it at once, before the supervisor has seen
            # the failure; torchft's shrink-only quorum decides who is in the redo (the survivors of
            # the last quorum), and the reply is the redo's. A redo voted down too is the
            # supervisor's to relaunch (with its step set)
            row = self._replica_attempt(time.perf_counter(), time.thread_time(), None, None)  # ReplicaStepper._redo_hint
        row["snapshot_s"] = None
        if row["event"] == "step" and self._snap is not None and snapshot_group == self._replica.group \
                and (int(row["step"]) + 1) % self._snap_every == 0:
            row["snapshot_s"] = self._snap.start()  # every rank of the group together (a collective at the first)
        # the last commits (a supervisor that stopped waiting for one sees it here) and every abort
        row.update(recent=list(self._replica_commits), aborted_steps=list(self._replica_aborts),
                   recent_aborts=list(self._replica_abort_rows))
        self._phase("idle", row["step"])
        return row

    def replica_peers_lost(self, groups: list[int]) -> bool:
        """The supervisor found the node of replica groups ``groups`` down: a step attempt of this rank
        still waiting for a reduction with them stops waiting (``ReplicaStepper.peers_lost``). Runs
        beside the step (no lock)."""
        if self._replica is not None:
            self._replica.peers_lost(groups)
        return True

    def _replica_attempt(self, w0: float, c0: float, expect: list[int] | None,
                         prev: list[int] | None) -> dict[str, Any]:
        row = self._replica.step_once(self._mid_step_fault, expect, prev)
        row.update(rank=self._rank, busy_s=time.thread_time() - c0, wall_s=time.perf_counter() - w0,
                   ts=time.time(), tokens=self._trainer.cfg.global_batch * self._trainer.cfg.model.seq_len,
                   pid=os.getpid())
        if row["event"] == "step":
            self._replica_commits = [*self._replica_commits[-7:], dict(row)]
        else:
            self._replica_aborts.append(int(row["step"]))
            self._replica_abort_rows = [*self._replica_abort_rows[-7:], dict(row)]
        return row

    def _mid_step_fault(self, step: int) -> None:
        if self._kill_mid_step:  # after the backward pass, before the cross-group reduction
            _kill_own_node(whole_node=True)

    @_on_torch_thread
    def restore(self) -> int:
        self._phase("restore")
        start = int(self._trainer.restore())
        self._phase("idle", start - 1)
        return start

    @_on_torch_thread
    def restore_snapshot(self, sources: list[tuple[Any, list[str]]], epoch: int, step: int) -> int:
        """Load the in-memory snapshot ``(epoch, step)``, fetching its files from the holders that have
        them (``[(holder, names)]``), resharded into this rank's layout."""
        import ray

        from workers.engine.checkpoint.snapshot import load_snapshot

        self._phase("restore")
        files: dict[str, Any] = {}  # file name -> ObjectRef (a holder's)
        # handles, not bytes: load_snapshot fetches only the files this rank's new layout needs
        for part in ray.get([h.refs.remote(epoch, step, names) for h, names in sources], timeout=120):
            files.update(part)
        start = load_snapshot(self._trainer, files)
        self._phase("idle", start - 1)
        return start

    @_on_torch_thread
    def flush_snapshot(self) -> int | None:
        """This rank's in-memory snapshot of the step just done, pushed to its holders before this
        returns (a drain or a resize moves the gang next: nothing may be left in flight); its step, or
        ``None`` without snapshots. Every rank of the gang calls it at the same step boundary (a
        snapshot after ``snapshot_every`` skipped this step is taken now)."""
        if self._snap is None or self._trainer is None:
            return None
        step = self._snap.wait()
        if step != self._trainer.next_step:
            self._snap.start()
            step = self._snap.wait()
        return step

    def snapshot_stats(self) -> dict[str, float]:
        stats = dict(self._snap.stats) if self._snap is not None else {}
        stats["push_errors"] = self.snapshot_push_errors
        return stats

    @_on_torch_thread
    def step(self, expect: list[int] | None = None, prev: list[int] | None = None,
             snapshot_group: int | None = None) -> dict[str, Any]:
        """One optimizer step; the slow/jitter hooks add busy time after the step's collectives.
        ``expect``, ``prev``, ``snapshot_group``: a replica group rank's (:meth:`replica_step`)."""
        if self._replica is not None:  # a rank of a replica group: one torchft step attempt
            return self.replica_step(expect, prev, snapshot_group)
        self._check_fence("run a step")
        self._phase("step", self._trainer.next_step)
        w0, c0 = time.perf_counter(), time.thread_time()
        while self._hang:  # fault hook: a rank that stops making progress (no crash)
            time.sleep(0.05)
        res = self._trainer.step()
        snap_s = push_s = None  # what the step waited for its snapshot; the previous one's push (background)
        if self._snap is not None and res.step % self._snap_every == 0:
            snap_s = self._snap.start()  # waits for the previous one, stages this one, pushes it in the background
            push_s = self._snap.prev_push_s
        busy = time.thread_time() - c0
        extra = busy * (self._slow_factor - 1.0)
        if self._jitter:
            extra += busy * self._rng.uniform(0.0, 2.0 * self._jitter)
        burn_cpu(extra)
        out = {
            "rank": self._rank,
            "step": res.step,
            "loss": res.loss,
            "grad_norm": res.grad_norm,
            "lr": res.lr,
            "tokens": res.tokens,
            "seconds": res.seconds,
            "busy_s": time.thread_time() - c0,
            "wall_s": time.perf_counter() - w0,
            "snapshot_s": snap_s,
            "snapshot_push_s": push_s,
        }
        # after the step's timing (straggler scores and tokens/s see the step only)
        out.update(self._eval_export(res.step))
        self._phase("idle", res.step)
        return out

    @_on_torch_thread
    def after_step(self, step: int) -> dict[str, Any]:
        """A replica group's rank, after the committed step ``step`` (1-based): what a one-gang rank
        runs after its step (:meth:`_eval_export`). The supervisor asks one live group (every group
        holds the same state after a commit)."""
        out = self._eval_export(step)
        self._phase("idle", step)
        return out

    def _eval_export(self, step: int) -> dict[str, Any]:
        """The job's validation loss every ``eval_every`` steps and after the last, and its HF export
        after the last (both collective over this rank's gang or group: every rank runs them)."""
        cfg = self._trainer.cfg
        evaluates, exports = cfg.after_step(step)
        out: dict[str, Any] = {}
        if evaluates:
            self._phase("eval", step)
            out["val_loss"] = self._trainer.val_loss()
        if exports and cfg.export is not None:
            self._phase("export", step)
            out["exported"] = self._trainer.export_hf(cfg.export.dir)
        return out

    @_on_torch_thread
    def save(self) -> dict[str, Any]:
        self._check_fence("write a checkpoint")
        self._phase("save")
        info = self._trainer.save()
        self._phase("idle")
        return {"step": info.step, "path": info.path, "seconds": info.seconds, "bytes": info.bytes}

    def _check_fence(self, what: str) -> None:
        if self._fence is not None:
            from workers.runtime.recovery.fencing import check

            check(self._fence[0], self._fence[1], what)

    def close(self) -> None:
        """Barrier + destroy the trainer's groups and the default group (clean end of a run)."""
        from workers.runtime.cluster.rendezvous import leave

        self._phase("close")
        if self._replica is not None:
            self._replica.close()
            self._replica = None
        if self._lighthouse_proxy is not None:
            self._lighthouse_proxy.close()
            self._lighthouse_proxy = None
        if self._snap is not None:
            self._snap.close()
            self._snap = None
        self._close_snap_links()
        if self._trainer is not None:
            self._trainer.close()
            self._trainer = None
        leave()
        self._phase("closed")

    # ---------------------------------------------------------------- fault hooks (tests/demos)
    def inject(self, kind: str, factor: float = 1.0, amplitude: float = 0.0) -> bool:
        """Arm a fault on this rank: ``slow``/``jitter`` (sticky), ``hang`` (next step), ``exit``, ``kill_node``."""
        if kind == "slow":
            self._slow_factor = float(factor)
        elif kind == "jitter":
            self._jitter = float(amplitude)
        elif kind == "hang":
            self._hang = True
        elif kind == "exit":
            threading.Timer(0.05, os._exit, args=(1,)).start()
        elif kind == "kill_node" and self._replica is not None:
            self._kill_mid_step = True  # a replica group: in the middle of its next step (the one redone)
        elif kind == "kill_node":
            threading.Timer(0.05, _kill_own_node).start()
        else:
            raise ValueError(f"unknown fault kind {kind!r}")
        return True


def freeze_heap() -> None:
    """Move every object that exists now (torch, the model, Ray's own) to the collector's permanent
    generation: a full collection then scans only what came after. A replica rank collects when a
    peer group dies (``ReplicaStepper._drop_cross_group_pg``, to close the failed gloo group's
    sockets); unfrozen, that collection took 0.27-0.43 s of the survivors' stall here."""
    import gc

    gc.collect()
    gc.freeze()


def _kill_own_node(whole_node: bool = False) -> None:
    """SIGKILL this node's raylet (our parent process), then ourselves: a hard node failure.
    ``whole_node``: every other worker process of the raylet first, as a crashed host loses them all
    at once (otherwise they notice the raylet's death on their own, seconds later on a loaded host:
    a replica group's other rank would keep its torchft manager heartbeating meanwhile)."""
    from workers.runtime.cluster.procfs import children

    raylet = os.getppid()
    try:
        with open(f"/proc/{raylet}/comm") as f:
            is_raylet = f.read().strip() == "raylet"
    except OSError:
        is_raylet = False
    if is_raylet:
        if whole_node:
            for pid in children(raylet) - {os.getpid()}:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        os.kill(raylet, signal.SIGKILL)
    os._exit(1)
