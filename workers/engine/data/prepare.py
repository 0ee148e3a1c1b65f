"""``orthoplex data prepare``: documents (text, jsonl, parquet) -> token files, with a held-out
validation split.

Documents are read in order (``hf_tokenizer.documents``) and tokenized in batches with the
tokenizer's ``encode_batch`` -- the ``tokenizers`` library's own thread pool, in parallel across
the machine's cores (``RAYON_NUM_THREADS`` caps it). Document ``i`` goes to the validation split
when ``i % every == every - 1`` (``every = round(1 / val_fraction)``): deterministic and spread over
the whole corpus. Each split is written in the engine's token-file format (``tokens.py``: header
with dtype and vocabulary size), every document followed by the tokenizer's EOS:
``OUT/train.tok`` and ``OUT/val.tok``, plus ``OUT/prepare.json`` (counts, sources, tokenizer).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from workers.engine.data.hf_tokenizer import DOC_SUFFIXES, documents, eos_id, load_tokenizer
from workers.engine.data.text import collect_text_files
from workers.engine.data.tokens import write_token_file


@dataclass(frozen=True)
class PrepareResult:
    train_docs: int
    val_docs: int
    train_tokens: int
    val_tokens: int
    bytes_in: int
    seconds: float
    vocab_size: int

    @property
    def tokens_per_s(self) -> float:
        return (self.train_tokens + self.val_tokens) / max(self.seconds, 1e-9)


def prepare(inputs: Iterable[str], tokenizer_path: str, out: str | Path, val_fraction: float = 0.01,
            batch_docs: int = 512, on_progress: Callable[[int], None] | None = None) -> PrepareResult:
    """Tokenize every document under ``inputs`` into ``out/train.tok`` and ``out/val.tok``;
    ``on_progress(bytes)`` after each batch (the CLI's progress bar)."""
    if not 0 <= val_fraction < 1:
        raise ValueError(f"val-fraction must be in [0, 1), got {val_fraction}")
    tok = load_tokenizer(tokenizer_path)
    eos = eos_id(tok, tokenizer_path)
    files = collect_text_files(list(inputs), suffixes=DOC_SUFFIXES)
    every = round(1 / val_fraction) if val_fraction > 0 else 0
    splits: dict[str, list[np.ndarray]] = {"train": [], "val": []}
    counts = {"train": 0, "val": 0}
    pending: list[str] = []
    index = 0
    bytes_in = 0
    t0 = time.perf_counter()

    def flush() -> None:
        nonlocal index
        encs = tok.encode_batch(pending, add_special_tokens=False)
        for enc in encs:
            split = "val" if every and index % every == every - 1 else "train"
            splits[split].append(np.asarray([*enc.ids, eos], dtype=np.int64))
            counts[split] += 1
            index += 1
        if on_progress is not None:
            on_progress(sum(len(d.encode("utf-8")) for d in pending))
        pending.clear()

    for f in files:
        for doc in documents(f):
            pending.append(doc)
            bytes_in += len(doc.encode("utf-8"))
            if len(pending) >= batch_docs:
                flush()
    if pending:
        flush()
    vocab = tok.get_vocab_size()
    dtype = "uint16" if vocab <= 65536 else "uint32"
    out = Path(out)
    sizes = {}
    for split, parts in splits.items():
        arr = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        write_token_file(out / f"{split}.tok", arr, dtype, vocab_size=vocab)
        sizes[split] = int(arr.size)
    res = PrepareResult(counts["train"], counts["val"], sizes["train"], sizes["val"], bytes_in,
                        time.perf_counter() - t0, vocab)
    (out / "prepare.json").write_text(json.dumps(
        {**asdict(res), "tokenizer": str(Path(tokenizer_path).resolve()), "eos_id": eos,
         "val_fraction": val_fraction, "sources": [str(f) for f in files]}, indent=2) + "\n")
    return res


def input_bytes(inputs: Iterable[str]) -> int:
    """Total size of the input files (the progress bar's total; parquet is compressed, so approximate)."""
    return sum(f.stat().st_size for f in collect_text_files(list(inputs), suffixes=DOC_SUFFIXES))
