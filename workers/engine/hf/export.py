"""Export a rank-sharded model as an HF Llama checkpoint directory (``transformers`` loads it).

Every rank walks the same list of parameters; for each one the ranks of the stage holding it
gather it (``DTensor.full_tensor``: one tensor at a time beyond the rank's own shard) and the
stage's first rank (tp = cp = dp = 0) appends its bytes to the stage's safetensors file. The file
header -- names, shapes, dtypes, offsets -- is known before any data (shapes come from the model
config), so the file is streamed: header first, then each tensor as it is gathered; nothing waits
in memory. One file per pipeline stage, ``model-0000s-of-0000n.safetensors``, plus
``model.safetensors.index.json`` and ``config.json`` written by rank 0.
"""

from __future__ import annotations

import json
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from workers import object_store
from workers.engine.config import ModelConfig
from workers.engine.hf.config import hf_config
from workers.engine.hf.weights import INDEX_FILE, engine_name, hf_name, is_rotary, rope_rows_engine_to_hf

_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


def shard_file(stage: int, stages: int) -> str:
    return f"model-{stage + 1:05d}-of-{stages:05d}.safetensors"


class StreamingSafetensors:
    """A safetensors file written tensor by tensor in the order its header lists them."""

    def __init__(self, path: Path, entries: list[tuple[str, tuple[int, ...], torch.dtype]]) -> None:
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        offset = 0
        self.expected: list[tuple[str, int]] = []
        for name, shape, dtype in entries:
            size = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
            header[name] = {"dtype": _DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
            self.expected.append((name, size))
            offset += size
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # data aligned to 8 bytes, as safetensors writes it
        self.tmp = path.with_suffix(path.suffix + ".tmp")
        self.path = path
        self.f = self.tmp.open("wb")
        self.f.write(struct.pack("<Q", len(raw)))
        self.f.write(raw)
        self.i = 0

    def write(self, name: str, t: torch.Tensor) -> None:
        want, size = self.expected[self.i]
        data = t.detach().contiguous().cpu().numpy().tobytes() if t.dtype != torch.bfloat16 else \
            t.detach().contiguous().cpu().view(torch.int16).numpy().tobytes()
        if name != want or len(data) != size:
            raise RuntimeError(f"export: expected {want} ({size} bytes), got {name} ({len(data)} bytes)")
        self.f.write(data)
        self.i += 1

    def close(self) -> None:
        if self.i != len(self.expected):
            raise RuntimeError(f"export: {self.path.name} got {self.i} of {len(self.expected)} tensors")
        self.f.close()
        self.tmp.replace(self.path)


def _to_hf(name: str, t: torch.Tensor, head_dim: int) -> torch.Tensor:
    if is_rotary(name):
        rows = rope_rows_engine_to_hf(head_dim)
        return t.view(-1, head_dim, t.shape[-1])[:, rows].reshape(t.shape)
    return t


def export_hf(parts: Any, cfg: ModelConfig, layout: Any, coords: Any, out: str | Path,
              base_config: dict[str, Any] | None = None, extra_files: dict[str, bytes] | None = None) -> Path | str:
    """Write this run's weights under ``out`` (collective over all ranks). An object-store ``out``
    (``s3://...``): each writer writes into a local temporary directory and uploads its files,
    streamed, then removes them."""
    from torch.distributed.tensor import DTensor

    remote = str(out) if object_store.is_url(out) else None
    out = Path(tempfile.mkdtemp(prefix="orthoplex-export-")) if remote else Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stages = layout.pp
    writer_rank = coords.tp == 0 and coords.cp == 0 and coords.dp == 0
    from workers.engine.model import TIED_HEAD

    held = [(engine_name(n), p) for n, p in parts.named_parameters()
            if not (cfg.tie_embeddings and n == TIED_HEAD)]  # tied: embed_tokens only, as transformers writes
    held.sort(key=lambda x: x[0])
    fname = shard_file(coords.pp, stages)
    writer = StreamingSafetensors(out / fname, [(hf_name(n), tuple(p.shape), p.dtype) for n, p in held]) \
        if writer_rank else None
    for name, p in held:
        full = p.full_tensor() if isinstance(p, DTensor) else p.detach()
        if writer is not None:
            writer.write(hf_name(name), _to_hf(name, full, cfg.head_dim))
        del full
    if writer is not None:
        writer.close()
    # the index: every stage's names (an all-gather of names only)
    names = {hf_name(n): fname for n, _ in held} if writer_rank else {}
    gathered: list[Any] = [None] * dist.get_world_size() if dist.is_initialized() else [names]
    if dist.is_initialized():
        dist.all_gather_object(gathered, names)
    if (dist.get_rank() if dist.is_initialized() else 0) == 0:
        weight_map: dict[str, str] = {}
        for g in gathered:
            weight_map.update(g)
        from workers.engine.model import Transformer

        with torch.device("meta"):
            total = sum(p.numel() * 4 for p in Transformer(cfg).parameters())
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
        (out / "config.json").write_text(json.dumps(hf_config(cfg, base_config), indent=2) + "\n")
        for fn, data in (extra_files or {}).items():
            (out / fn).write_bytes(data)
    if remote is not None:  # every rank uploads what it wrote
        for f in sorted(out.iterdir()):
            object_store.upload(f, object_store.join(remote, f.name))
        shutil.rmtree(out, ignore_errors=True)
    if dist.is_initialized():
        dist.barrier()
    return remote if remote is not None else out
