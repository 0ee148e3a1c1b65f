"""Data package: tokenizer, text/token-file/builtin datasets, the global-batch sampler."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from workers.engine.config import DataConfig
from workers.engine.data import (
    EOD_ID,
    ByteTokenizer,
    GlobalBatchSampler,
    TokenDataset,
    build_dataset,
    builtin_dataset,
    collect_text_files,
    open_token_file,
    permute,
    stdlib_files,
    stdlib_root,
    write_token_file,
)

pytestmark = pytest.mark.unit


# ---------------------------------------------------------------- tokenizer


def test_tokenizer_round_trip_unicode() -> None:
    tok = ByteTokenizer()
    text = "héllo wörld — ∑ 🚀\n\tend"
    ids = tok.encode(text)
    assert tok.vocab_size == 256 and all(0 < i < 256 for i in ids)
    assert len(ids) == len(text.encode("utf-8"))
    assert tok.decode(ids) == text


def test_tokenizer_documents_and_separator() -> None:
    tok = ByteTokenizer()
    stream = tok.encode_documents(["first doc", "sec\x00ond", b"third \xc3\xa9"])
    assert stream.dtype == np.uint8
    assert list(np.flatnonzero(stream == EOD_ID)) == [9, 16, 25]  # NUL inside a document is dropped
    assert tok.decode_documents(stream) == ["first doc", "second", "third é"]
    assert tok.decode(stream) == "first docsecondthird é"
    with pytest.raises(ValueError, match="outside the byte vocabulary"):
        tok.decode([65, 300])


# ---------------------------------------------------------------- text datasets


def _tree(root: Path) -> None:
    (root / "sub").mkdir(parents=True)
    (root / "b.txt").write_text("bbbb")
    (root / "a.md").write_text("aaaa")
    (root / "sub" / "c.py").write_text("cccc")
    (root / "skip.json").write_text("{}")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "x.py").write_text("nope")


def test_text_files_sorted_and_filtered(tmp_path: Path) -> None:
    _tree(tmp_path)
    files = collect_text_files([tmp_path])
    assert [f.relative_to(tmp_path).as_posix() for f in files] == ["a.md", "b.txt", "sub/c.py"]
    extra = tmp_path / "skip.json"
    files2 = collect_text_files([tmp_path / "sub", extra, str(tmp_path / "*.txt")])
    assert [f.name for f in files2] == ["c.py", "skip.json", "b.txt"]
    ds = build_dataset({"kind": "text", "paths": [str(tmp_path)]}, seq_len=4)
    stream = ds.tokens(0, ds.num_tokens)
    assert ByteTokenizer().decode_documents(stream) == ["aaaa", "bbbb", "cccc"]
    assert ds.num_samples == (15 - 1) // 4 and ds.vocab_size == 256
    assert ds[1].tolist() == stream[4:9].tolist()


def test_text_errors_name_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        build_dataset({"kind": "text", "paths": [str(missing)]}, seq_len=8)
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    with pytest.raises(ValueError, match=str(empty_dir)):
        build_dataset({"kind": "text", "paths": [str(empty_dir)]}, seq_len=8)
    (tmp_path / "zero.txt").write_text("")
    with pytest.raises(ValueError, match="empty"):
        build_dataset({"kind": "text", "paths": [str(tmp_path / "zero.txt")]}, seq_len=8)
    with pytest.raises(ValueError, match="matches no files"):
        build_dataset({"kind": "text", "paths": [str(tmp_path / "*.md")]}, seq_len=8)
    (tmp_path / "short.txt").write_text("abc")
    with pytest.raises(ValueError, match="fewer than one sample"):
        build_dataset({"kind": "text", "paths": [str(tmp_path / "short.txt")]}, seq_len=8)
    with pytest.raises(ValueError, match="needs at least one path"):
        build_dataset({"kind": "text", "paths": []}, seq_len=8)
    with pytest.raises(ValueError, match="data kind"):
        build_dataset({"kind": "parquet"}, seq_len=8)


# ---------------------------------------------------------------- token files


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_token_file_header_round_trip(tmp_path: Path, dtype: str) -> None:
    big = 70_000 if dtype == "uint32" else 60_000
    toks = np.arange(1000, dtype=np.int64) * 7 % big
    path = write_token_file(tmp_path / "t.bin", toks, dtype, vocab_size=big)
    tf = open_token_file(path)
    assert (tf.dtype, tf.vocab_size, tf.source) == (dtype, big, "header")
    assert isinstance(tf.tokens, np.memmap) and tf.tokens.tolist() == toks.tolist()
    ds = build_dataset(DataConfig(kind="tokens", paths=(str(path),), dtype="uint16"), seq_len=10)
    assert len(ds) == 99 and ds.vocab_size == big
    assert ds[98].tolist() == toks[980:991].tolist()
    with open(path, "ab") as f:  # a header that disagrees with the size is refused
        f.write(b"\x00\x00")
    with pytest.raises(ValueError, match="header says"):
        open_token_file(path)


def test_raw_token_files_dtype_sources(tmp_path: Path) -> None:
    toks = np.arange(300, dtype=np.uint32) + 65_000
    raw = tmp_path / "raw.bin"
    toks.tofile(raw)
    with pytest.raises(ValueError, match="cannot tell uint16 from uint32"):
        open_token_file(raw)
    assert open_token_file(raw, "uint32").tokens.tolist() == toks.tolist()
    (tmp_path / "raw.bin.json").write_text(json.dumps({"dtype": "uint32", "vocab_size": 70000}))
    tf = open_token_file(raw, "uint16")  # the sidecar wins over the caller's guess
    assert (tf.source, tf.dtype, tf.vocab_size) == ("sidecar", "uint32", 70000)
    npy = tmp_path / "x.npy"
    np.save(npy, np.arange(50, dtype=np.uint16))
    assert open_token_file(npy).tokens.tolist() == list(range(50))
    with pytest.raises(FileNotFoundError, match=r"nothere\.bin"):
        open_token_file(tmp_path / "nothere.bin")


def test_token_windows_cross_file_boundaries(tmp_path: Path) -> None:
    stream = np.random.default_rng(0).integers(0, 60000, size=1234)
    cuts = [0, 100, 101, 700, 1234]
    d = tmp_path / "shards"
    for i in range(4):
        write_token_file(d / f"part{i}.bin", stream[cuts[i]:cuts[i + 1]], "uint16")
    ds = build_dataset(SimpleNamespace(kind="tokens", paths=[str(d)], dtype="uint16"), seq_len=16)
    assert ds.num_tokens == 1234 and len(ds.sources) == 4
    for i in range(len(ds)):
        assert ds[i].tolist() == stream[16 * i:16 * i + 17].tolist()
    assert isinstance(ds, TokenDataset)


# ---------------------------------------------------------------- builtin corpus


def test_builtin_corpus_cached_and_deterministic(tmp_path: Path) -> None:
    files = stdlib_files(max_bytes=200_000)
    root = stdlib_root()
    rel = [f.relative_to(root).as_posix() for f in files]
    assert len(rel) > 3 and rel == sorted(rel)
    assert files == stdlib_files(max_bytes=200_000)
    assert sum(f.stat().st_size for f in files) <= 200_000
    assert not any("site-packages" in r for r in rel)
    a = builtin_dataset(32, cache_dir=tmp_path, max_bytes=200_000)
    cached = list(tmp_path.glob("builtin-stdlib-*.tok"))
    assert len(cached) == 1
    mtime = cached[0].stat().st_mtime_ns
    b = builtin_dataset(32, cache_dir=tmp_path, max_bytes=200_000)
    assert cached[0].stat().st_mtime_ns == mtime  # reused, not rewritten
    c = builtin_dataset(32, cache_dir=None, max_bytes=200_000)
    assert a.num_tokens == b.num_tokens == c.num_tokens
    assert np.array_equal(a.tokens(0, a.num_tokens), c.tokens(0, c.num_tokens))
    assert ByteTokenizer().decode_documents(c.tokens(0, c.num_tokens))[0] == files[0].read_text()


def test_builtin_default_size() -> None:
    ds = build_dataset(None, seq_len=64)
    assert 1_000_000 < ds.num_tokens <= 4 * 1024 * 1024 + len(ds.sources)
    assert ds.name.startswith("builtin-stdlib")


# ---------------------------------------------------------------- sampler


@pytest.mark.parametrize("n", [1, 2, 3, 5, 64, 1000, 4097])
def test_permutation_is_a_bijection(n: int) -> None:
    out = permute(np.arange(n), n, seed=3, epoch=1)
    assert sorted(out.tolist()) == list(range(n))
    if n >= 64:
        assert not np.array_equal(out, np.arange(n))
        assert not np.array_equal(out, permute(np.arange(n), n, seed=3, epoch=2))


def _toy(n_tokens: int = 5000, seq_len: int = 8) -> TokenDataset:
    return TokenDataset([np.arange(n_tokens, dtype=np.int64) % 50_000], seq_len)


def test_sampler_deterministic_and_layout_independent() -> None:
    ds = _toy()
    s1, s2 = GlobalBatchSampler(ds, 16, seed=7), GlobalBatchSampler(ds, 16, seed=7)
    other = GlobalBatchSampler(ds, 16, seed=8)
    for step in (0, 1, 5, 123):
        full = s1.batch(step)
        assert full.dtype == torch.long and full.shape == (16, 9)
        assert torch.equal(full, s2.batch(step))
        assert not torch.equal(full, other.batch(step))
        for dp in (1, 2, 4):
            assert torch.equal(torch.cat([s2.local_batch(step, r, dp) for r in range(dp)]), full)
        # targets are the inputs shifted by one token of the stream
        assert torch.equal(full[:, 1:] - full[:, :-1], torch.ones(16, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="not divisible"):
        s1.local_batch(0, 0, 3)


def test_sampler_epochs_cover_every_sample_once() -> None:
    ds = _toy(n_tokens=8 * 40 + 1)  # 40 samples, 10 batches of 4 per epoch
    s = GlobalBatchSampler(ds, 4, seed=1)
    first = torch.cat([s.batch(i)[:, 0] for i in range(10)]) // 8
    second = torch.cat([s.batch(i)[:, 0] for i in range(10, 20)]) // 8
    assert sorted(first.tolist()) == list(range(40)) == sorted(second.tolist())
    assert first.tolist() != second.tolist()
    assert s.epoch_of(9) == 0 and s.epoch_of(10) == 1


def test_sampler_resume_continues_order() -> None:
    ds = _toy()
    ref = GlobalBatchSampler(ds, 8, seed=5)
    expected = [ref.next_batch() for _ in range(6)]
    a = GlobalBatchSampler(ds, 8, seed=5)
    for _ in range(3):
        a.next_batch()
    state = json.loads(json.dumps(a.state_dict()))
    assert state["step"] == 3 and state["consumed_samples"] == 24
    b = GlobalBatchSampler(ds, 8, seed=5)
    b.load_state_dict(state)
    for i in range(3, 6):
        assert torch.equal(b.next_batch(), expected[i])
    with pytest.raises(ValueError, match="seed"):
        GlobalBatchSampler(ds, 8, seed=6).load_state_dict(state)
    with pytest.raises(ValueError, match="global_batch"):
        GlobalBatchSampler(ds, 4, seed=5).load_state_dict(state)
