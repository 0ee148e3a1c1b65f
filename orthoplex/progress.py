"""The progress bar of :meth:`Client.wait` and :meth:`Client.events` (``progress=True``): step /
steps, loss and ETA, computed by the code ``orthoplex status`` shows them with
(``service.cli.progress``), drawn with rich (a terminal, or a notebook's output cell)."""

from __future__ import annotations

from typing import Any

from rich.progress import BarColumn, Progress, TaskID, TextColumn

from service.cli.progress import RATE_WINDOW, format_eta
from service.cli.progress import progress as job_progress

#: metrics rows kept for the step rate (the ETA): the newest ones
KEEP_ROWS = RATE_WINDOW * 2


class JobProgress:
    """What the bar shows, fed with the job, its newest metrics rows and its events as they come."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        self.metrics: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []

    @property
    def steps(self) -> int:
        return int((self.job.get("spec") or {}).get("steps") or 0)

    @property
    def last_step(self) -> int:
        return int(self.metrics[-1]["step"]) if self.metrics else 0

    def add_metrics(self, rows: list[dict[str, Any]]) -> None:
        self.metrics = (self.metrics + rows)[-KEEP_ROWS:]

    def add_event(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    def text(self) -> tuple[int, int, str]:
        """(steps done, steps, ``loss 2.3412  ETA 1m02s  RUNNING``)."""
        prog = job_progress(self.job, self.metrics, self.events)
        loss = f"loss {prog.loss:.4f}" if prog.loss is not None else "loss -"
        return prog.step or 0, prog.steps, f"{loss}  ETA {format_eta(prog.eta_s)}  {self.job.get('state')}"


class ProgressBar:
    """A rich bar for one job: ``job 3 first-job ━━━━━━ 5/12  loss 2.3412  ETA 0m20s  RUNNING``."""

    def __init__(self, tracker: JobProgress) -> None:
        self.tracker = tracker
        self._bar = Progress(TextColumn("{task.description}"), BarColumn(),
                             TextColumn("{task.completed:.0f}/{task.total:.0f}"), TextColumn("{task.fields[info]}"))
        self._task: TaskID | None = None

    def __enter__(self) -> ProgressBar:
        self._bar.start()
        job = self.tracker.job
        self._task = self._bar.add_task(f"job {job.get('id')} {job.get('name')}", total=self.tracker.steps or 1,
                                        info="")
        self.refresh()
        return self

    def refresh(self) -> None:
        if self._task is None:
            return
        done, steps, info = self.tracker.text()
        self._bar.update(self._task, completed=done, total=steps or 1, info=info)

    def __exit__(self, *exc: object) -> None:
        self.refresh()
        self._bar.stop()
