"""Data for the engine: a byte tokenizer, token datasets (text, token files, the built-in stdlib
corpus) and a deterministic global-batch sampler addressed by global sample index.

The sampler imports torch and loads on first use of its names (``GlobalBatchSampler``, ``permute``):
the control plane checks a job's data and tokenizer with the rest, without torch."""

from typing import Any

from workers.engine.data.build import build_dataset, tokens_dataset
from workers.engine.data.builtin import BUILTIN_MAX_BYTES, builtin_dataset, stdlib_files, stdlib_root
from workers.engine.data.text import collect_text_files, text_dataset
from workers.engine.data.tokenizer import EOD_ID, VOCAB_SIZE, ByteTokenizer
from workers.engine.data.tokens import TokenDataset, TokenFile, open_token_file, write_token_file

__all__ = [
    "BUILTIN_MAX_BYTES",
    "EOD_ID",
    "VOCAB_SIZE",
    "ByteTokenizer",
    "GlobalBatchSampler",
    "TokenDataset",
    "TokenFile",
    "build_dataset",
    "builtin_dataset",
    "collect_text_files",
    "open_token_file",
    "permute",
    "stdlib_files",
    "stdlib_root",
    "text_dataset",
    "tokens_dataset",
    "write_token_file",
]


_TORCH_NAMES = ("GlobalBatchSampler", "permute")


def __getattr__(name: str) -> Any:
    """The sampler's names (torch) only when asked for."""
    if name in _TORCH_NAMES:
        from workers.engine.data import sampler

        return getattr(sampler, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
