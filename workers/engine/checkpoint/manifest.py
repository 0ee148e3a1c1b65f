"""``manifest.json``: what a committed checkpoint contains and how to verify it.

The manifest is written last, by rank 0, inside the temporary directory; the directory's rename
is the commit. It carries its own checksum (sha256 of its canonical JSON without the ``checksum``
key), so a damaged manifest is detected like a damaged data file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"


class ManifestError(ValueError):
    """The manifest is missing, unreadable, inconsistent or of an unknown format."""


@dataclass(frozen=True)
class FileEntry:
    bytes: int
    sha256: str


def to_jsonable(obj: Any) -> Any:
    """Plain JSON values from what a trainer passes (Layout/Plan objects, dataclasses, numpy, paths)."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if hasattr(obj, "to_dict"):
        return to_jsonable(obj.to_dict())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return to_jsonable(dataclasses.asdict(obj))
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if hasattr(obj, "item") and hasattr(obj, "dtype"):  # numpy / torch scalar
        return obj.item()
    raise TypeError(f"cannot store {type(obj).__name__} in a checkpoint manifest (not JSON-serialisable)")


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


@dataclass
class Manifest:
    step: int
    world_size: int
    files: dict[str, FileEntry]
    layout: dict[str, Any] | None = None
    plan: dict[str, Any] | None = None
    data: dict[str, Any] | None = None
    rng: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    nonce: str = ""
    created_at: float = field(default_factory=time.time)
    writer: dict[str, Any] = field(default_factory=lambda: {
        "host": platform.node(), "pid": os.getpid(), "python": sys.version.split()[0]})
    format_version: int = FORMAT_VERSION

    @property
    def total_bytes(self) -> int:
        return sum(e.bytes for e in self.files.values())

    def to_dict(self) -> dict[str, Any]:
        body = to_jsonable({
            "format_version": self.format_version, "step": self.step, "world_size": self.world_size,
            "layout": self.layout, "plan": self.plan, "data": self.data, "rng": self.rng,
            "extra": self.extra, "nonce": self.nonce, "created_at": self.created_at,
            "created_at_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.created_at)),
            "writer": self.writer, "total_bytes": self.total_bytes,
            "files": {k: {"bytes": v.bytes, "sha256": v.sha256} for k, v in sorted(self.files.items())},
        })
        body["checksum"] = hashlib.sha256(_canonical(body)).hexdigest()
        return body

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True).encode() + b"\n"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Manifest:
        if not isinstance(d, dict):
            raise ManifestError("manifest is not a JSON object")
        body = {k: v for k, v in d.items() if k != "checksum"}
        if d.get("checksum") != hashlib.sha256(_canonical(body)).hexdigest():
            raise ManifestError("manifest checksum mismatch (the manifest itself is damaged)")
        version = d.get("format_version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise ManifestError(f"manifest format version {version!r} is not supported (<= {FORMAT_VERSION})")
        try:
            files = {str(k): FileEntry(int(v["bytes"]), str(v["sha256"])) for k, v in d["files"].items()}
            return cls(step=int(d["step"]), world_size=int(d["world_size"]), files=files,
                       layout=d.get("layout"), plan=d.get("plan"), data=d.get("data"), rng=d.get("rng"),
                       extra=d.get("extra") or {}, nonce=str(d.get("nonce", "")),
                       created_at=float(d["created_at"]), writer=d.get("writer") or {},
                       format_version=version)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ManifestError(f"manifest is missing or has a malformed field ({exc})") from exc

    @classmethod
    def read(cls, checkpoint_dir: Path) -> Manifest:
        path = checkpoint_dir / MANIFEST_NAME
        if not path.is_file():
            raise ManifestError(f"no {MANIFEST_NAME}")
        try:
            data = json.loads(path.read_bytes())
        except (OSError, ValueError) as exc:
            raise ManifestError(f"{MANIFEST_NAME} unreadable ({exc})") from exc
        return cls.from_dict(data)
