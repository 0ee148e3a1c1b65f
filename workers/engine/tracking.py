"""Run metrics as TensorBoard event files (``tensorboardX``) and, given a tracking URI, an MLflow run.

``TensorBoardLog(dir).log(step, {"loss": ..., "lr": ...})`` writes ``train/<name>`` scalars;
:func:`read_scalars` reads them back (the tests, and anyone without TensorBoard installed).
``MLflowLog(uri, experiment, run_name, params)`` logs the same metrics under their plain names
(``loss``, ``val_loss``, ``lr``, ...) with ``mlflow`` (``mlflow-skinny``: the client only).
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


class MLflowLog:
    """One MLflow run on the tracking server or store at ``uri`` (``sqlite:///FILE``, ``http://...``)."""

    def __init__(self, uri: str, experiment: str, run_name: str, params: dict[str, Any]) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(experiment)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(exp_id, run_name=run_name).info.run_id
        for k, v in params.items():
            self.client.log_param(self.run_id, k, v)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items() if v is not None]
        self.client.log_batch(self.run_id, metrics=batch)

    def close(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)


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
