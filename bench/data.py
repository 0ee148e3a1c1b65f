"""Data preparation benchmark: ``orthoplex data prepare`` throughput against a one-thread baseline.

Corpus: the Python standard library's sources (the engine's built-in corpus, ``stdlib_files``;
4 MiB, 1 MiB with ``--quick``) written as a jsonl file, one document per source file. Tokenizer:
a byte-level BPE (vocabulary 8192) trained in the same run on the first quarter of the corpus.
Measured: ``workers.engine.data.prepare.prepare`` (batched ``encode_batch``: the ``tokenizers``
thread pool over every core, plus reading, the split and writing both token files) against the
baseline of the same tokenizer encoding one document at a time on one thread
(``RAYON_NUM_THREADS``-independent: ``encode`` never uses the pool) with no I/O. The ratio is
bounded by the machine's cores; the baseline excludes file writing, so it favours the baseline.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from workers.engine.data import stdlib_files


def _bpe(texts: list[str], out: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=8192, special_tokens=["<unk>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(out))
    return out


def run(quick: bool = False) -> dict[str, Any]:
    from workers.engine.data.hf_tokenizer import load_tokenizer
    from workers.engine.data.prepare import prepare

    max_bytes = (1 if quick else 4) * 1024 * 1024
    docs = [f.read_text(encoding="utf-8", errors="replace") for f in stdlib_files(max_bytes)]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        corpus = root / "stdlib.jsonl"
        corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
        tok_path = _bpe(docs[: max(1, len(docs) // 4)], root / "tokenizer.json")
        tok = load_tokenizer(tok_path)
        t0 = time.perf_counter()
        base_tokens = sum(len(tok.encode(d, add_special_tokens=False).ids) + 1 for d in docs)
        base_s = time.perf_counter() - t0
        res = prepare([str(corpus)], str(tok_path), root / "out", val_fraction=0.01)
    total = res.train_tokens + res.val_tokens
    assert total == base_tokens, (total, base_tokens)
    row = {"documents": len(docs), "mib": round(res.bytes_in / 2**20, 2), "tokens": total,
           "prepare_s": round(res.seconds, 3), "prepare_tokens_per_s": round(res.tokens_per_s),
           "prepare_mib_per_s": round(res.bytes_in / 2**20 / res.seconds, 2),
           "baseline_s": round(base_s, 3), "baseline_tokens_per_s": round(base_tokens / base_s),
           "speedup": round(base_s / res.seconds, 2)}
    md = ["| corpus | tokens | prepare (tokens/s) | MiB/s | one-thread encode baseline (tokens/s) | ratio |",
          "|---|---|---|---|---|---|",
          f"| {row['documents']} stdlib files, {row['mib']} MiB jsonl | {total:,} | {row['prepare_tokens_per_s']:,} | "
          f"{row['prepare_mib_per_s']} | {row['baseline_tokens_per_s']:,} | {row['speedup']}x |",
          "",
          "Baseline: the same BPE tokenizer (vocabulary 8192) encoding one document at a time on one "
          "thread, no file I/O; prepare includes reading the jsonl, the 1% validation split and writing "
          "both token files. The ratio is bounded by the cores of the machine below."]
    return {"name": "data", "rows": [row], "markdown": "\n".join(md)}
