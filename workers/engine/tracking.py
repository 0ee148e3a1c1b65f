"""Run metrics as TensorBoard event files (``tensorboardX``) and, given a tracking URI, an MLflow run.

``TensorBoardLog(dir).log(step, {"loss": ..., "lr": ...})`` writes ``train/<name>`` scalars;
:func:`read_scalars` reads them back (the tests, and anyone without TensorBoard installed).
``MLflowLog(uri, experiment, run_name, params)`` logs the same metrics under their plain names
(``loss``, ``val_loss``, ``lr``, ...) with ``mlflow`` (``mlflow-skinny``: the client only).
:class:`RunTracker` is both plus MFU, as ``orthoplex train`` and a service job (the Ray runtime's
supervisor) log a run: one home for what a run's tracking holds.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from workers import object_store


class TensorBoardLog:
    """A TensorBoard event file under ``log_dir``."""

    def __init__(self, log_dir: str | Path) -> None:
        from tensorboardX import SummaryWriter

        # an s3:// URL stays a string: tensorboardX writes it through boto3 (AWS_* variables)
        self.dir: str | Path = log_dir if object_store.is_url(log_dir) else Path(log_dir)
        self.writer = SummaryWriter(logdir=str(self.dir), flush_secs=5)

    def log(self, step: int, metrics: dict[str, float], prefix: str = "train") -> None:
        for name, value in metrics.items():
            if value is not None:
                self.writer.add_scalar(f"{prefix}/{name}", float(value), global_step=step)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


class MLflowLog:
    """One MLflow run on the tracking server or store at ``uri`` (``sqlite:///FILE``, ``http://...``).

    ``resume_key``: a run tagged ``orthoplex.run`` with this value is continued instead of starting
    another (a service job's attempts, each a new supervisor, log into one run)."""

    def __init__(self, uri: str, experiment: str, run_name: str, params: dict[str, Any],
                 resume_key: str | None = None) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(experiment)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(experiment)
        found = []
        if resume_key is not None:
            found = self.client.search_runs([exp_id], filter_string=f"tags.`orthoplex.run` = '{resume_key}'",
                                            max_results=1)
        if found:
            self.run_id = found[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            return
        tags = {"orthoplex.run": resume_key} if resume_key is not None else None
        self.run_id = self.client.create_run(exp_id, run_name=run_name, tags=tags).info.run_id
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


def peak_flops(gpu_type: str | None) -> tuple[float, str]:
    """(dense bf16 peak FLOP/s of one device of ``gpu_type``, where the number comes from): the
    planner's GPU profile (``planner.profiles``). Without a type, or on CPU, the planner's ``CPU``
    stand-in profile (0.5 TFLOP/s per rank): MFU on CPU is relative to that declared stand-in, not to
    any measured CPU peak."""
    from planner.profiles import PROFILES, lookup_gpu

    prof = lookup_gpu(gpu_type) if gpu_type else None
    if prof is None:
        prof = PROFILES["CPU"]
    return prof.peak_tflops * 1e12, f"planner profile {prof.name}: {prof.peak_tflops:g} TFLOP/s per device"


class RunTracker:
    """A run's TensorBoard files (always, under ``tensorboard_dir``) and MLflow run (given a URI):
    ``loss``, ``grad_norm``, ``lr``, ``tokens_per_s``, ``mfu`` per step and ``val_loss`` per eval.

    MFU = ``flops_per_token(model) * tokens/s / (devices * peak_flops(gpu_type))``. A tracking
    failure (an MLflow server going away) never fails the run: it is reported once in ``errors``
    and MLflow logging stops."""

    def __init__(self, tensorboard_dir: str | Path | None, model: Any, gpu_type: str | None = None, *,
                 mlflow_uri: str | None = None, experiment: str = "orthoplex", run_name: str = "run",
                 params: dict[str, Any] | None = None, resume_key: str | None = None) -> None:
        self.flops_per_token = float(model.flops_per_token())
        self.peak, self.peak_source = peak_flops(gpu_type)
        self.errors: list[str] = []
        self.board = TensorBoardLog(tensorboard_dir) if tensorboard_dir else None
        self.mlflow: MLflowLog | None = None
        if mlflow_uri:
            all_params = {**(params or {}), "mfu_peak": self.peak_source}
            self.mlflow = MLflowLog(mlflow_uri, experiment, run_name, all_params, resume_key=resume_key)

    def mfu(self, tokens_per_s: float, devices: int) -> float:
        return self.flops_per_token * tokens_per_s / (max(1, devices) * self.peak)

    def _emit(self, step: int, metrics: dict[str, float]) -> None:
        if self.board is not None:
            self.board.log(step, metrics)
        if self.mlflow is not None:
            try:
                self.mlflow.log(step, metrics)
            except Exception as e:  # mlflow raises its own exceptions and connection errors
                self.errors.append(f"mlflow: {e}")
                self.mlflow = None

    def log_step(self, step: int, *, loss: float, grad_norm: float, lr: float, tokens_per_s: float,
                 devices: int) -> dict[str, float]:
        """The step's metrics as logged (MFU included)."""
        metrics = {"loss": float(loss), "grad_norm": float(grad_norm), "lr": float(lr),
                   "tokens_per_s": float(tokens_per_s), "mfu": self.mfu(tokens_per_s, devices)}
        self._emit(step, metrics)
        return metrics

    def log_eval(self, step: int, val_loss: float) -> None:
        self._emit(step, {"val_loss": float(val_loss)})

    def flush(self) -> None:
        if self.board is not None:
            self.board.writer.flush()

    def close(self, status: str = "FINISHED") -> None:
        if self.board is not None:
            self.board.close()
            self.board = None
        if self.mlflow is not None:
            try:
                self.mlflow.close(status)
            except Exception as e:
                self.errors.append(f"mlflow: {e}")
            self.mlflow = None


def read_scalars(log_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files under ``log_dir`` (a directory or an ``s3://`` prefix):
    ``{tag: [(step, value), ...]}``."""
    from tensorboardX.proto import event_pb2

    out: dict[str, list[tuple[int, float]]] = {}
    if object_store.is_url(log_dir):
        keys = sorted(k for k in object_store.find(str(log_dir)) if "events.out.tfevents." in k.rsplit("/", 1)[-1])
        blobs = (object_store.read_bytes(object_store.join(str(log_dir), k)) for k in keys)
    else:
        blobs = (f.read_bytes() for f in sorted(Path(log_dir).rglob("events.out.tfevents.*")))
    for data in blobs:
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
