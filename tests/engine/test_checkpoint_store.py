"""Checkpoint store: commit protocol, torn-checkpoint matrix (SIGKILLed writer), corruption, retention.

The writer that gets killed is this file run as a script (``python test_checkpoint_store.py write
ROOT STEP KEEP POINT``): it writes a checkpoint of ``N_FILES`` files through the store and SIGKILLs
itself at ``POINT``: ``files:K`` (after K of the files) or one of the store's fault points.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # when run as the writer script
    sys.path.insert(0, str(REPO))

from workers.engine.checkpoint.store import (  # noqa: E402
    CheckpointCorrupt,
    apply_retention,
    begin_checkpoint,
    commit_checkpoint,
    find_latest_verified,
    list_checkpoints,
    list_temporary,
    read_latest_pointer,
    step_dirname,
    verify_checkpoint,
)

N_FILES = 4


def write_checkpoint(root: Path, step: int, keep: int = 2, kill_at: str | None = None) -> None:
    """What every rank + rank 0 do, in one process: write files, then commit; die at ``kill_at``."""

    def fault(point: str) -> None:
        if point == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    pending = begin_checkpoint(root, step)
    for k in range(N_FILES):
        fault(f"files:{k}")
        data = f"rank {k} of step {step}\n".encode() * (200 + 50 * k)
        with open(pending.tmp_path / f"__{k}_0.distcp", "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    (pending.tmp_path / ".metadata").write_bytes(b"meta" * 10)
    commit_checkpoint(pending, world_size=N_FILES, layout={"tp": 2, "dp": 2}, data={"step": step},
                      extra={"note": "test"}, keep=keep, fault=fault)


def _killed_writer(root: Path, step: int, point: str, keep: int = 2) -> None:
    proc = subprocess.run([sys.executable, __file__, "write", str(root), str(step), str(keep), point],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-2000:])


def _verified_steps(root: Path) -> list[int]:
    out = []
    for rec in list_checkpoints(root):
        try:
            verify_checkpoint(rec.path)
            out.append(rec.step)
        except CheckpointCorrupt:
            pass
    return out


pytestmark = pytest.mark.unit


def test_commit_layout_and_manifest(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 42)
    path = tmp_path / "step-00000042"
    assert path.is_dir() and not list_temporary(tmp_path)
    man = verify_checkpoint(path)
    assert man.step == 42 and man.world_size == N_FILES and man.layout == {"tp": 2, "dp": 2}
    assert sorted(man.files) == [".metadata"] + [f"__{k}_0.distcp" for k in range(N_FILES)]
    assert man.total_bytes == sum((path / n).stat().st_size for n in man.files)
    assert read_latest_pointer(tmp_path) == "step-00000042"
    raw = json.loads((path / "manifest.json").read_text())
    assert {"format_version", "checksum", "files", "created_at", "data", "extra"} <= set(raw)
    rec, skipped = find_latest_verified(tmp_path)
    assert rec is not None and rec.step == 42 and skipped == []
    assert find_latest_verified(tmp_path / "absent") == (None, [])


# Where the writer of step 3 dies -> which step the loader must pick.
KILL_MATRIX = [
    ("files:0", 2), ("files:2", 2), ("manifest:before", 2), ("manifest:written", 2),
    ("rename:done", 3), ("latest:tmp-written", 3), ("retention:renamed", 3),
]


@pytest.mark.parametrize(("point", "expect"), KILL_MATRIX)
def test_killed_writer(tmp_path: Path, point: str, expect: int, caplog: pytest.LogCaptureFixture) -> None:
    write_checkpoint(tmp_path, 1)
    write_checkpoint(tmp_path, 2)
    _killed_writer(tmp_path, 3, point)
    with caplog.at_level(logging.WARNING, logger="orthoplex.checkpoint"):
        rec, skipped = find_latest_verified(tmp_path)
    assert rec is not None and rec.step == expect
    reasons = dict(skipped)
    if expect == 2:  # the torn step-3 directory is named, with the reason
        (torn,) = [p for p in reasons if "step-00000003.tmp-" in p]
        assert "uncommitted" in reasons[torn] and torn in caplog.text
        assert read_latest_pointer(tmp_path) == "step-00000002"
    if point == "latest:tmp-written":  # the pointer is still the old, whole one; the scan wins
        assert read_latest_pointer(tmp_path) == "step-00000002"
        assert "'latest' points at step-00000002" in caplog.text
    if point == "retention:renamed":
        assert any("half-deleted" in r for r in reasons.values())
    assert len(_verified_steps(tmp_path)) >= 2
    # the next save cleans up and the store is whole again
    write_checkpoint(tmp_path, 4)
    assert not list_temporary(tmp_path) and not list(tmp_path.glob("latest.tmp-*"))
    assert _verified_steps(tmp_path) == [expect, 4]
    assert find_latest_verified(tmp_path)[1] == []


def _damage_flip(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01
    p.write_bytes(bytes(data))


def _damage_truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


DAMAGE = [
    ("flip a byte", lambda d: _damage_flip(d / "__1_0.distcp"), "sha256 of __1_0.distcp"),
    ("truncate", lambda d: _damage_truncate(d / "__2_0.distcp"), "size of __2_0.distcp"),
    ("delete", lambda d: (d / "__0_0.distcp").unlink(), "missing file __0_0.distcp"),
    ("extra file", lambda d: (d / "stray.bin").write_bytes(b"x"), "unexpected file stray.bin"),
    ("delete manifest", lambda d: (d / "manifest.json").unlink(), "no manifest.json"),
    ("edit manifest", lambda d: (d / "manifest.json").write_text(
        (d / "manifest.json").read_text().replace('"step": 3', '"step": 4')), "checksum mismatch"),
    ("garble manifest", lambda d: (d / "manifest.json").write_text("{not json"), "unreadable"),
]


@pytest.mark.parametrize(("what", "damage", "reason"), DAMAGE, ids=[d[0] for d in DAMAGE])
def test_damaged_checkpoint_falls_back(tmp_path: Path, what: str, damage, reason: str) -> None:
    for step in (1, 2, 3):
        write_checkpoint(tmp_path, step, keep=3)
    damage(tmp_path / "step-00000003")
    rec, skipped = find_latest_verified(tmp_path)
    assert rec is not None and rec.step == 2
    assert skipped == [(str(tmp_path / "step-00000003"), skipped[0][1])]
    assert reason in skipped[0][1], skipped
    if what == "flip a byte":  # only the hash catches a flipped byte
        assert verify_checkpoint(tmp_path / "step-00000003", check_hashes=False).step == 3


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_retention_keeps_last_n_verified(tmp_path: Path, keep: int) -> None:
    for step in range(1, 6):
        write_checkpoint(tmp_path, step, keep=keep)
        assert len(_verified_steps(tmp_path)) == min(step, max(keep, 2))
    assert [r.step for r in list_checkpoints(tmp_path)] == list(range(6 - max(keep, 2), 6))


def test_retention_never_leaves_fewer_than_two_verified(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        write_checkpoint(tmp_path, step, keep=2)
    _damage_flip(tmp_path / "step-00000003" / "__0_0.distcp")
    write_checkpoint(tmp_path, 4, keep=2)  # 3 is damaged: deleted, and 2 is kept to make two
    assert [r.step for r in list_checkpoints(tmp_path)] == [2, 4] == _verified_steps(tmp_path)
    # without a fresh commit, retention never deletes the newest verified, nor damaged newer ones
    for step in (5, 6):
        write_checkpoint(tmp_path, step, keep=2)
    _damage_truncate(tmp_path / "step-00000006" / "__3_0.distcp")
    deleted = apply_retention(tmp_path, keep=2)
    assert deleted == []
    assert [r.step for r in list_checkpoints(tmp_path)] == [5, 6] and _verified_steps(tmp_path) == [5]


def test_same_step_again_replaces_and_abandoned_newer_are_removed(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        write_checkpoint(tmp_path, step, keep=3)
    old_nonce = verify_checkpoint(tmp_path / "step-00000002").nonce
    write_checkpoint(tmp_path, 2, keep=3)  # a run resumed from step 1 commits step 2 again
    man = verify_checkpoint(tmp_path / "step-00000002")
    assert man.nonce != old_nonce
    assert [r.step for r in list_checkpoints(tmp_path)] == [1, 2]  # step 3 was an abandoned future
    assert not list_temporary(tmp_path) and read_latest_pointer(tmp_path) == step_dirname(2)


if __name__ == "__main__":
    _, cmd, root, step, keep, point = sys.argv
    assert cmd == "write"
    write_checkpoint(Path(root), int(step), keep=int(keep), kill_at=point)
    sys.exit(3)  # the kill point was never reached
