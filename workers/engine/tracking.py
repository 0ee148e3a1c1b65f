"""Run metrics as TensorBoard event files (``tensorboardX``): one scalar per metric per step.

``TensorBoardLog(dir).log(step, {"loss": ..., "lr": ...})`` writes ``train/<name>`` scalars;
:func:`read_scalars` reads them back (the tests, and anyone without TensorBoard installed).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any


class TensorBoardLog:
    """A TensorBoard event file under ``log_dir``."""

    def __init__(self, log_dir: str | Path) -> None:
        from tensorboardX import SummaryWriter

        self.dir = Path(log_dir)
        self.writer = SummaryWriter(logdir=str(self.dir), flush_secs=5)

    def log(self, step: int, metrics: dict[str, float], prefix: str = "train") -> None:
        for name, value in metrics.items():
            if value is not None:
                self.writer.add_scalar(f"{prefix}/{name}", float(value), global_step=step)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


def read_scalars(log_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files under ``log_dir``: ``{tag: [(step, value), ...]}``."""
    from tensorboardX.proto import event_pb2

    out: dict[str, list[tuple[int, float]]] = {}
    for f in sorted(Path(log_dir).rglob("events.out.tfevents.*")):
        data = f.read_bytes()
        pos = 0
        while pos + 12 <= len(data):
            (n,) = struct.unpack_from("<Q", data, pos)
            rec = data[pos + 12:pos + 12 + n]  # length, its crc, the record, its crc
            pos += 12 + n + 4
            ev: Any = event_pb2.Event()
            ev.ParseFromString(rec)
            for v in ev.summary.value:
                out.setdefault(v.tag, []).append((int(ev.step), float(v.simple_value)))
    return out
