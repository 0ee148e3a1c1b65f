"""In-memory snapshots: the state a storage checkpoint holds, as raw bytes in CPU memory, every step.

After every step :class:`Snapshotter` copies this rank's piece of the trainer's
:class:`ModelOptimizerState` (model, optimizer, the step and data position, the RNG states) into one
preallocated CPU buffer (a plain ``copy_`` per tensor, no serialisation); the bytes are handed to
``push`` on a background thread (the runtime sends them to snapshot holders in memory on this node
and on another one), overlapped with the next step. No DCP write, no tmpfs file, no collective per
step.

The layout of those bytes is DCP's: the first snapshot of a gang plans it as a DCP save would
(every rank's local save plan, gathered once over the snapshot group, deduplicated so a replicated
tensor is stored by one rank only) and fixes, for every saved chunk, the rank file and byte range
that holds it. That plan is reused while the state's shapes stay (a change re-plans, collectively,
at the same step on every rank). A snapshot of ``world`` ranks is then the files
``__<rank>_0.distcp`` (a small pickled header with the rank's non-tensor items, then the tensor
bytes) and, from rank 0, ``.metadata``: DCP ``Metadata`` whose ``storage_data`` maps each chunk to a
:class:`Loc` (file, offset, length).

:func:`load_snapshot` restores a trainer from a snapshot with ``dcp.load`` through
:class:`MemoryReader`, without a process group (``no_dist``: every rank plans its own reads against
the metadata; any layout and world size can load any snapshot, as from storage). The reader learns
from the read plan which rank files hold the pieces this rank's new layout needs
(:func:`needed_files`) and fetches only those: ``files`` may map names to bytes or to a fetchable
handle (a Ray ``ObjectRef`` from a holder), resolved by ``fetch`` only when needed. Tensors are
viewed in place in the fetched bytes (``torch.frombuffer``) and copied into the trainer's tensors.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import os
import pickle
import struct
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, SavePlan, WriteItemType
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future as TorchFuture

from workers.engine.checkpoint import _dist
from workers.engine.checkpoint.dcp_io import APP_KEY
from workers.engine.checkpoint.rng import capture_rng_state
from workers.engine.checkpoint.state import ModelOptimizerState

log = logging.getLogger("orthoplex.snapshot")
METADATA = ".metadata"
FORMAT = "orthoplex-flat-1"
# (steps completed, {file name: its bytes-like parts, back to back}) -> None; the parts may view the
# snapshotter's staging buffer: valid during the call only (send or copy them before returning)
Push = Callable[[int, dict[str, list[Any]]], None]
Fetch = Callable[[Mapping[str, Any]], dict[str, bytes]]  # {name: handle} -> {name: bytes}
_HEADER = struct.Struct("<Q")
_ALIGN = 64


def shard_name(rank: int) -> str:
    """The file rank ``rank`` pushes for each snapshot (DCP's shard naming)."""
    return f"__{rank}_0.distcp"


def tmpfs_root() -> Path:
    """``/dev/shm`` when there is one (memory), else the temp dir (no longer used for staging)."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() else Path(tempfile.gettempdir())


@dataclass(frozen=True)
class Loc:
    """Where a saved item is: in rank file ``name``; a tensor chunk at ``offset`` (``length`` bytes)
    of the tensor bytes, a non-tensor item (``offset`` -1) in the file's header under its FQN."""

    name: str
    offset: int
    length: int
    sizes: tuple[int, ...] = ()


def _state(trainer: Any) -> ModelOptimizerState:
    """The trainer's checkpoint state (``app_state``: its optimizer-name aliases too) plus RNG states."""
    state = trainer.app_state()
    state.extra = {**state.extra, "rng": capture_rng_state()}
    return state


def _extra_json(trainer: Any) -> str:
    """What ``ModelOptimizerState.state_dict()['extra']`` is for :func:`_state`'s state."""
    return json.dumps({**trainer._trainer_state(), "rng": capture_rng_state()}, sort_keys=True)


_WRAPPERS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def _clean(fqn: str) -> str:
    for w in _WRAPPERS:
        fqn = fqn.replace(w, "")
    return fqn


class _Sources:
    """Where each item of a planned layout lives between snapshots, so a snapshot need not rebuild
    the state dict: the tensors' local shards (parameters and optimizer state, updated in place by
    the optimizer) and, for the non-tensor items, the optimizer param group or the trainer state.
    :meth:`build` returns ``None`` when some item cannot be mapped (the snapshot then takes the slow
    path every time); the mapping is checked against the state dict it was built from."""

    def __init__(self, tensors: list[torch.Tensor], getters: list[tuple[str, Callable[[], Any]]]) -> None:
        self.tensors = tensors
        self.getters = getters

    @classmethod
    def build(cls, layout: _Layout, planner: DefaultSavePlanner, state: ModelOptimizerState,
              trainer: Any) -> _Sources | None:
        tensors = [planner.resolve_data(item) for item, _, _ in layout.tensors]
        groups: dict[str, dict[str, Any]] = {}
        for module, opt in state._pairs:
            by_param = {id(p): g for g in opt.param_groups for p in g["params"]}
            for fqn, p in module.named_parameters(remove_duplicate=False):
                if id(p) in by_param:
                    groups[_clean(fqn)] = by_param[id(p)]
        for here, there in state.optim_aliases.items():
            if here in groups:
                groups[there] = groups[here]
        getters: list[tuple[str, Callable[[], Any]]] = []
        for item in layout.objects:
            fqn = item.index.fqn
            path = planner.mappings.get(fqn, ())
            value = planner.lookup_object(item.index)
            get: Callable[[], Any] | None = None
            if tuple(path) == (APP_KEY, "extra"):
                get = functools.partial(_extra_json, trainer)
                if json.loads(get()).get("next_step") != json.loads(value).get("next_step"):
                    get = None
            elif len(path) == 3 and path[1] == "optim" and str(path[2]).startswith("param_groups."):
                name, _, key = str(path[2])[len("param_groups."):].rpartition(".")
                group = groups.get(name)
                if group is not None and key in group and key != "params" and group[key] == value:
                    get = functools.partial(dict.__getitem__, group, key)
            if get is None:
                log.info("snapshot item %s has no cheap source: every snapshot rebuilds the state dict", fqn)
                return None
            getters.append((fqn, get))
        return cls(tensors, getters)

    def stage(self, layout: _Layout, buf: torch.Tensor) -> bytes:
        for src, (_, offset, n) in zip(self.tensors, layout.tensors, strict=True):
            buf[offset:offset + n].copy_(src.detach().reshape(-1).view(torch.uint8))
        return pickle.dumps({fqn: get() for fqn, get in self.getters}, protocol=pickle.HIGHEST_PROTOCOL)


def _signature(flat: Mapping[str, Any]) -> tuple:
    """What the save plan depends on: each key and, for tensors, its global shape and dtype."""
    return tuple((k, (tuple(v.shape), str(v.dtype)) if isinstance(v, torch.Tensor) else None)
                 for k, v in sorted(flat.items()))


@dataclass
class _Layout:
    signature: tuple
    tensors: list[tuple[Any, int, int]]  # (write item, offset, bytes) of this rank's tensor chunks
    objects: list[Any]  # this rank's non-tensor write items
    total: int
    metadata: bytes  # pickled DCP Metadata with Loc storage data (rank 0 pushes it)


def _chunk_bytes(item: Any) -> int:
    numel = 1
    for s in item.tensor_data.chunk.sizes:
        numel *= int(s)
    return numel * torch.empty((), dtype=item.tensor_data.properties.dtype).element_size()


def plan_layout(plans: Sequence[SavePlan], metadata: Metadata, rank: int, signature: tuple = ()) -> _Layout:
    """Byte ranges for every rank's deduplicated save plan (``plans``: the global plan, one per rank),
    the metadata pointing at them, and ``rank``'s own part. Pure: every rank computes the same."""
    storage: dict[MetadataIndex, Loc] = {}
    mine: tuple[list[tuple[Any, int, int]], list[Any], int] = ([], [], 0)
    for r, plan in enumerate(plans):
        tensors: list[tuple[Any, int, int]] = []
        objects: list[Any] = []
        offset = 0
        for item in plan.items:
            if item.type == WriteItemType.BYTE_IO:
                objects.append(item)
                storage[item.index] = Loc(shard_name(r), -1, 0)
                continue
            n = _chunk_bytes(item)
            tensors.append((item, offset, n))
            storage[item.index] = Loc(shard_name(r), offset, n, tuple(int(s) for s in item.tensor_data.chunk.sizes))
            offset += -(-n // _ALIGN) * _ALIGN
        if r == rank:
            mine = (tensors, objects, offset)
    md = {"format": FORMAT, "world": len(plans), "metadata": replace(metadata, storage_data=storage)}
    return _Layout(signature, mine[0], mine[1], mine[2], pickle.dumps(md, protocol=pickle.HIGHEST_PROTOCOL))


def stage(layout: _Layout, planner: DefaultSavePlanner, buf: torch.Tensor) -> bytes:
    """Copy this rank's tensor chunks into ``buf`` (``layout.total`` bytes); returns its non-tensor
    items (by FQN), pickled."""
    for item, offset, n in layout.tensors:
        src = planner.resolve_data(item)
        buf[offset:offset + n].copy_(src.detach().reshape(-1).view(torch.uint8))
    # one pickle of all non-tensor items (hundreds of small ones: optimizer hyper-parameters), not a
    # torch.save each as DCP does; taken now, before the next step can change them
    return pickle.dumps({item.index.fqn: planner.lookup_object(item.index) for item in layout.objects},
                        protocol=pickle.HIGHEST_PROTOCOL)


def pack_parts(objects: bytes, buf: torch.Tensor) -> list[Any]:
    """A rank file as parts, without copying the tensor bytes: header length and the pickled
    non-tensor items, then a view of ``buf``."""
    return [_HEADER.pack(len(objects)) + objects, memoryview(buf.numpy())]


def pack(objects: bytes, buf: torch.Tensor) -> bytes:
    """A rank file: header length, the pickled non-tensor items, the tensor bytes."""
    return b"".join(pack_parts(objects, buf))


class Snapshotter:
    """Takes this rank's snapshot after each step; at most one in flight (the next waits for it).

    The first snapshot (and one after the state's shapes changed) plans the layout: collective over
    the default group, on the training thread between two steps (every rank snapshots the same
    step); later ones are local copies. ``timeout_s`` is unused (no process group of its own)."""

    def __init__(self, trainer: Any, push: Push, *, tag: str, timeout_s: float = 120.0,
                 verify_every: int = 20) -> None:
        self.trainer = trainer
        self.push = push
        self.tag = tag
        self.rank, self.world_size = _dist.rank_and_size(None)
        # no staging directory any more; kept so callers checking for leftovers find none
        self._shared = tmpfs_root() / f"orthoplex-snap-{tag}-unused"
        self._layout: _Layout | None = None
        self._sources: _Sources | None = None
        self._buf: torch.Tensor | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="orthoplex-snap")
        self._pending: Future | None = None
        self.stats: dict[str, float] = {"blocked_s": 0.0, "background_s": 0.0, "snapshots": 0, "bytes": 0,
                                        "plans": 0, "full": 0}
        self.verify_every = verify_every
        self._count = 0
        self._last_push_s: float | None = None  # the newest finished push (background thread)
        self.prev_push_s: float | None = None  # the push the newest start() waited for (None: the first)

    def _plan(self, planner: DefaultSavePlanner, signature: tuple) -> _Layout:
        local = planner.create_local_plan()
        if _dist.active() and self.world_size > 1:
            plans: list[Any] = [None] * self.world_size
            dist.all_gather_object(plans, local)
        else:
            plans = [local]
        global_plans, metadata = planner.create_global_plan(plans)
        self.stats["plans"] += 1
        return plan_layout(global_plans, metadata, self.rank, signature)

    def start(self) -> float:
        """Snapshot the state after the last step; returns once it is copied into host memory, with the
        seconds the caller was held (the wait for the previous push included; the push of this one
        runs in the background)."""
        t_enter = time.perf_counter()
        self.wait()
        self.prev_push_s = self._last_push_s
        t0 = time.perf_counter()
        step = int(self.trainer.next_step)
        self._count += 1
        if self._sources is not None and self._layout is not None and (self._count - 1) % self.verify_every:
            layout, buf = self._layout, self._buf
            assert buf is not None
            objects = self._sources.stage(layout, buf)  # the cheap path: copies from known sources
        else:  # the first snapshot, and every verify_every-th: the state dict, checked against the plan
            state = _state(self.trainer)
            planner = DefaultSavePlanner(dedup_save_to_lowest_rank=True)
            planner.set_up_planner({APP_KEY: state.state_dict()}, None, self.rank == 0)
            sig = _signature(planner.state_dict)
            if self._layout is None or self._layout.signature != sig:
                self._layout = self._plan(planner, sig)
                self._buf = torch.empty(self._layout.total, dtype=torch.uint8)
            layout, buf = self._layout, self._buf
            assert buf is not None
            objects = stage(layout, planner, buf)
            self._sources = _Sources.build(layout, planner, state, self.trainer)
            self.stats["full"] += 1
        self.stats["blocked_s"] += time.perf_counter() - t0

        def finish() -> int:
            t1 = time.perf_counter()
            files = {shard_name(self.rank): pack_parts(objects, buf)}
            if self.rank == 0:
                files[METADATA] = [layout.metadata]
            self.push(step, files)
            self._last_push_s = time.perf_counter() - t1
            self.stats["background_s"] += self._last_push_s
            self.stats["snapshots"] += 1
            self.stats["bytes"] += sum(memoryview(p).nbytes for parts in files.values() for p in parts)
            return step

        self._pending = self._executor.submit(finish)
        return time.perf_counter() - t_enter

    def wait(self) -> int | None:
        """Block until the snapshot in flight (if any) is pushed; its step, re-raising its error."""
        pending, self._pending = self._pending, None
        return pending.result() if pending is not None else None

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._executor.shutdown(wait=True)


# ---------------------------------------------------------------------------------------------- load

def needed_files(metadata: Metadata, plan: LoadPlan | Iterable[Any]) -> list[str]:
    """The rank files holding the saved pieces that ``plan``'s reads overlap (sorted)."""
    items = plan.items if isinstance(plan, LoadPlan) else plan
    return sorted({metadata.storage_data[req.storage_index].name for req in items})


def _fetch_bytes(handles: Mapping[str, Any]) -> dict[str, bytes]:
    """Bytes stay bytes; anything else is a Ray ``ObjectRef`` (one ``ray.get`` for all of them: Ray
    moves each object to this node once; other ranks on the node read the node's copy)."""
    out = {n: h for n, h in handles.items() if isinstance(h, (bytes, bytearray, memoryview))}
    refs = {n: h for n, h in handles.items() if n not in out}
    if refs:
        import ray

        out.update(zip(refs, ray.get(list(refs.values()), timeout=120), strict=True))
    return out


def _load_object(planner: LoadPlanner, req: Any, obj: Any) -> None:
    """``planner.load_bytes`` without the ``torch.save``/``torch.load`` round trip per item."""
    if isinstance(planner, DefaultLoadPlanner) and type(planner).load_bytes is DefaultLoadPlanner.load_bytes:
        if planner.flatten_state_dict:
            set_element(planner.original_state_dict, planner.mappings[req.dest_index.fqn], obj)
        else:
            planner.state_dict[req.dest_index.fqn] = obj
        return
    raw = io.BytesIO()
    torch.save(obj, raw)
    raw.seek(0)
    planner.load_bytes(req, raw)


class MemoryReader(StorageReader):
    """A DCP ``StorageReader`` over a snapshot's files in memory; fetches only the files its reads need."""

    def __init__(self, metadata: Metadata, files: Mapping[str, Any], fetch: Fetch = _fetch_bytes) -> None:
        self.metadata = metadata
        self.files = files
        self.fetch = fetch
        self.fetched: list[str] = []
        self.stats: dict[str, float] = {"fetch_s": 0.0, "read_s": 0.0, "bytes": 0}

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        pass

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        return self.metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        pass

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return False

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> TorchFuture[None]:
        names = needed_files(self.metadata, plan)
        missing = [n for n in names if n not in self.files]
        if missing:
            raise FileNotFoundError(f"snapshot lacks {missing} (needed by this rank's layout)")
        t0 = time.perf_counter()
        data = self.fetch({n: self.files[n] for n in names})
        t1 = time.perf_counter()
        self.fetched = names
        self.stats["fetch_s"] = t1 - t0
        self.stats["bytes"] = sum(len(data[n]) for n in names)
        parsed: dict[str, tuple[dict[str, Any], memoryview]] = {}
        for n in names:
            raw = memoryview(data[n])
            (hlen,) = _HEADER.unpack_from(raw, 0)
            parsed[n] = (pickle.loads(raw[_HEADER.size:_HEADER.size + hlen]), raw[_HEADER.size + hlen:])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # frombuffer on read-only bytes: we only read
            for req in plan.items:
                loc: Loc = self.metadata.storage_data[req.storage_index]
                objects, body = parsed[loc.name]
                if req.type == LoadItemType.BYTE_IO:
                    _load_object(planner, req, objects[req.storage_index.fqn])
                    continue
                dtype = self.metadata.state_dict_metadata[req.storage_index.fqn].properties.dtype
                if loc.length:
                    saved = torch.frombuffer(body, dtype=dtype, offset=loc.offset,
                                             count=loc.length // dtype.itemsize).view(loc.sizes)
                else:  # an empty chunk
                    saved = torch.empty(loc.sizes, dtype=dtype)
                for dim, (start, length) in enumerate(zip(req.storage_offsets, req.lengths, strict=True)):
                    saved = saved.narrow(dim, start, length)
                target = planner.resolve_tensor(req).detach()
                if target.size() != saved.size():
                    raise AssertionError(f"{req.storage_index}: size {tuple(saved.size())} vs {tuple(target.size())}")
                target.copy_(saved)
                planner.commit_tensor(req, target)
        self.stats["read_s"] = time.perf_counter() - t1
        fut: TorchFuture[None] = TorchFuture()
        fut.set_result(None)
        return fut


def load_snapshot(trainer: Any, files: Mapping[str, Any], *, fetch: Fetch = _fetch_bytes) -> int:
    """Load a snapshot (``.metadata`` and rank files: bytes, or handles ``fetch`` resolves) into
    ``trainer``, resharded into its layout; only the rank files this rank's pieces overlap are
    fetched. No collective. Returns the next step to run."""
    if METADATA not in files:
        raise ValueError("snapshot has no .metadata")
    t0 = time.perf_counter()
    head = pickle.loads(fetch({METADATA: files[METADATA]})[METADATA])
    t_meta = time.perf_counter()
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise ValueError(f"snapshot .metadata is not of format {FORMAT}")
    metadata = head["metadata"]
    reader = MemoryReader(metadata, files, fetch)
    state = _state(trainer)
    t_state = time.perf_counter()
    dcp.load({APP_KEY: state}, storage_reader=reader, no_dist=True)
    t_load = time.perf_counter()
    next_step = trainer.resume_position(state.extra, state.extra.get("rng"), "snapshot")
    timings = {"fetched": reader.fetched, "of": sum(1 for n in files if n != METADATA), **reader.stats,
               "metadata_s": round(t_meta - t0, 4), "dcp_load_s": round(t_load - t_state, 4),
               "total_s": round(time.perf_counter() - t0, 4)}
    log.info("snapshot loaded: %s", json.dumps(timings))
    trace = os.environ.get("ORTHOPLEX_SNAPSHOT_TRACE")
    if trace:  # benchmarks: one JSON line per rank restore
        with open(trace, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), **timings}) + "\n")
    return next_step
