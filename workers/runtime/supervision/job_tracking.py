"""A service job's tracking, kept by its supervisor: the same TensorBoard scalars and MLflow run as
``orthoplex train`` (``workers.engine.tracking.RunTracker``: loss, grad norm, lr, tokens/s, MFU,
val_loss), from rank 0's step results.

The runtime spec's ``tracking`` (``workers.runtime.contract.attempt_spec``) says where:
``{"tensorboard_dir", "mlflow_uri", "experiment", "run_name"}``. Every attempt of a job appends to
the same TensorBoard directory and continues the same MLflow run (tagged with the run name). The
tracker starts with the first step, so an unreachable MLflow server never keeps a job from
starting; a tracking error is logged once and training goes on.
"""

from __future__ import annotations

import logging
from typing import Any

from workers.engine.config import ModelConfig

log = logging.getLogger("workers.runtime.supervision.job_tracking")


class JobTracking:
    def __init__(self, tracking: dict[str, Any] | None, model: dict[str, Any], gpu_type: str | None,
                 steps: int) -> None:
        self.conf = dict(tracking or {})
        self.model = ModelConfig.from_dict(dict(model))
        self.gpu_type = gpu_type
        self.steps = steps
        self._tracker: Any = None
        self._broken = False

    @property
    def enabled(self) -> bool:
        return bool(self.conf.get("tensorboard_dir") or self.conf.get("mlflow_uri")) and not self._broken

    def _get(self) -> Any:
        if self._tracker is None and self.enabled:
            from workers.engine.tracking import RunTracker

            run = str(self.conf.get("run_name") or "job")
            try:
                self._tracker = RunTracker(self.conf.get("tensorboard_dir"), self.model, self.gpu_type,
                                           mlflow_uri=self.conf.get("mlflow_uri"),
                                           experiment=str(self.conf.get("experiment") or "orthoplex"),
                                           run_name=run, params={"model": self.model.name, "steps": self.steps},
                                           resume_key=run)
            except Exception as e:  # an MLflow server that cannot be reached: TensorBoard still runs
                log.warning("tracking could not start: %r", e)
                self.conf["mlflow_uri"] = None
                try:
                    self._tracker = RunTracker(self.conf.get("tensorboard_dir"), self.model, self.gpu_type,
                                               run_name=run)
                except Exception as e2:
                    log.warning("tensorboard could not start: %r", e2)
                    self._broken = True
        return self._tracker

    def on_step(self, step: int, rank0: dict[str, Any], devices: int, wall_s: float) -> None:
        """Log one step (``rank0``: rank 0's step result, ``val_loss`` on an eval step)."""
        tracker = self._get()
        if tracker is None:
            return
        tracker.log_step(step, loss=rank0["loss"], grad_norm=rank0["grad_norm"], lr=rank0["lr"],
                         tokens_per_s=float(rank0["tokens"]) / max(wall_s, 1e-9), devices=devices)
        if rank0.get("val_loss") is not None:
            tracker.log_eval(step, rank0["val_loss"])
        tracker.flush()
        if step >= self.steps:
            self.close("FINISHED")

    def close(self, status: str = "FINISHED") -> None:
        if self._tracker is not None:
            tracker, self._tracker = self._tracker, None
            tracker.close(status)
            for e in tracker.errors:
                log.warning("tracking: %s", e)
