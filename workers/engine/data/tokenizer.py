"""Byte-level tokenizer: one token per byte, 256 ids, id 0 reserved as the end-of-document marker.

Text is encoded as its UTF-8 bytes, so any file round-trips exactly except for NUL bytes: NUL is the
document separator (``EOD_ID``), and NUL bytes inside a document are dropped when encoding so a
separator is never ambiguous. A token stream of several documents is ``doc0 EOD doc1 EOD ...``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

VOCAB_SIZE = 256
EOD_ID = 0


class ByteTokenizer:
    """UTF-8 bytes <-> ids in ``[0, 256)``; ``eod_id`` separates documents."""

    vocab_size: int = VOCAB_SIZE
    eod_id: int = EOD_ID

    def encode_bytes(self, data: bytes, *, add_eod: bool = False) -> np.ndarray:
        """Ids (``uint8``) of raw bytes; NUL bytes are removed, an EOD is appended if asked."""
        clean = data.replace(b"\x00", b"")
        if add_eod:
            clean += b"\x00"
        return np.frombuffer(clean, dtype=np.uint8).copy()

    def encode(self, text: str, *, add_eod: bool = False) -> list[int]:
        """Ids of one document (its UTF-8 bytes)."""
        return self.encode_bytes(text.encode("utf-8"), add_eod=add_eod).tolist()

    def encode_documents(self, docs: Iterable[str | bytes]) -> np.ndarray:
        """One stream ``doc0 EOD doc1 EOD ...`` (``uint8``) for several documents."""
        parts = [self.encode_bytes(d.encode("utf-8") if isinstance(d, str) else d, add_eod=True)
                 for d in docs]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint8)

    def decode(self, ids: Sequence[int] | np.ndarray, *, keep_eod: bool = False) -> str:
        """Text of ids; EOD markers are dropped unless ``keep_eod`` (then they decode to ``"\\x00"``).

        Invalid UTF-8 (a model sample cut mid-character) decodes with replacement characters.
        """
        arr = np.asarray(ids, dtype=np.int64)
        if arr.size and (arr.min() < 0 or arr.max() >= VOCAB_SIZE):
            bad = int(arr[(arr < 0) | (arr >= VOCAB_SIZE)][0])
            raise ValueError(f"token id {bad} is outside the byte vocabulary [0, {VOCAB_SIZE})")
        if not keep_eod:
            arr = arr[arr != EOD_ID]
        return arr.astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    def decode_documents(self, ids: Sequence[int] | np.ndarray) -> list[str]:
        """Split a stream on EOD markers and decode each document (a trailing EOD ends the last one)."""
        text = self.decode(ids, keep_eod=True)
        docs = text.split("\x00")
        if docs and docs[-1] == "":
            docs.pop()
        return docs
