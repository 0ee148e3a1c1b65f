"""The recovery benchmark's second torchft peer: torchft used directly, as TorchTitan's fault-tolerance
mode runs it. One plain OS process per replica group (group size 1, the whole model), each with its
own ``TCPStore`` and a torchft ``Manager`` over a fault-tolerant ``ProcessGroupGloo``, healing over
``PGTransport``; torchft's own ``LighthouseServer`` in this process. No Ray: what restarts a lost
replica group is this driver, as a job scheduler would (it starts a replacement process as soon as
the fault is logged).

The step is the one the Ray Train peer runs (``bench.recovery_peers.torchft_loop``: the same model,
rows, optimizer and data, no padding); the failure is the group's process SIGKILLed in step
``kill_at`` after its backward pass, before the cross-group reduction. Numbers come from the same
ranks' log and :func:`bench.recovery_peers.summarize`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.recovery_peers import (
    GROUPS,
    HEARTBEAT_TIMEOUT_MS,
    KILL_AT,
    MAX_STEPS,
    MIN_REPLICAS,
    SETTLE_STEPS,
    STEPS,
)

KIND = "torchft-direct"


def _group_main(config_path: str, group: int) -> None:
    """One replica group's process: its store, its torchft manager, the peers' training loop."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torchft import Manager, ProcessGroupGloo
    from torchft.checkpointing.pg_transport import PGTransport

    from bench.recovery_peers import _Run, torchft_loop

    config = json.loads(Path(config_path).read_text())
    run = _Run(config, group, config["groups"])
    timeout = timedelta(seconds=config["timeout_s"])
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=timeout * 3, wait_for_workers=False)
    pg = ProcessGroupGloo(timeout=timeout)
    manager = Manager(
        pg=pg, min_replica_size=config["min_replicas"], load_state_dict=run.load_state_dict,
        state_dict=run.state_dict, world_size=1, rank=0, replica_id=f"rg{group}-{os.getpid()}",
        store_addr="127.0.0.1", store_port=store.port, lighthouse_addr=config["lighthouse"],
        timeout=timeout, quorum_timeout=timeout,
        checkpoint_transport=PGTransport(pg, timeout=timeout, device=torch.device("cpu")),
    )
    torchft_loop(run, manager, config["timeout_s"])
    os._exit(0)  # torchft's threads can hold the interpreter's exit for seconds


def _launch(config_path: Path, group: int, out: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "RUST_LOG": "warn", "OMP_NUM_THREADS": "1"}
    with (out / f"group{group}-{time.monotonic_ns()}.log").open("wb") as f:
        return subprocess.Popen([sys.executable, "-m", "bench.recovery_torchft", str(config_path), str(group)],
                                stdout=f, stderr=subprocess.STDOUT, env=env, cwd=Path(__file__).resolve().parents[1])


def run_direct(steps: int = STEPS, kill_at: int = KILL_AT, work: Path | None = None, timeout_s: float = 30.0,
               heartbeat_timeout_ms: int = HEARTBEAT_TIMEOUT_MS, deadline_s: float = 240.0,
               settle_steps: int = SETTLE_STEPS, max_steps: int = MAX_STEPS) -> dict[str, Any]:
    """Run the direct torchft peer once: ``GROUPS`` processes, the last one killed in step ``kill_at``,
    a replacement started when the fault is logged; past ``deadline_s`` every process is killed and
    the run is reported with ``fit_hung`` (its numbers from the log up to then)."""
    from torchft._torchft import LighthouseServer

    from bench.recovery_peers import _train_config, summarize

    if not 0 < kill_at < steps:
        raise ValueError(f"kill_at must be in 1..steps-1, got {kill_at} for {steps} steps")
    os.environ.setdefault("RUST_LOG", "warn")  # the lighthouse (in this process) logs every quorum at info
    tmp = work is None
    work = Path(tempfile.mkdtemp(prefix="orthoplex-peer-direct-")) if work is None else work
    work.mkdir(parents=True, exist_ok=True)
    log = work / f"{KIND}.jsonl"
    for path in (log, Path(str(log) + ".killed"), Path(str(log) + ".done")):
        path.unlink(missing_ok=True)
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=MIN_REPLICAS, heartbeat_timeout_ms=heartbeat_timeout_ms,
                                  join_timeout_ms=10_000)
    config = {"train": _train_config(steps, work, KIND), "log": str(log), "kill_at": kill_at,
              "kill_group": GROUPS - 1, "kill": "process", "timeout_s": timeout_s, "groups": GROUPS,
              "min_replicas": MIN_REPLICAS, "settle_steps": settle_steps, "max_steps": max_steps,
              "lighthouse": lighthouse.address()}
    config_path = work / f"{KIND}.json"
    config_path.write_text(json.dumps(config))
    procs = [_launch(config_path, g, work) for g in range(GROUPS)]
    t0 = time.time()
    replaced, hung = False, False
    try:
        while any(p.poll() is None for p in procs):
            if time.time() - t0 > deadline_s:
                hung = True
                break
            if not replaced and Path(str(log) + ".killed").exists():
                procs.append(_launch(config_path, GROUPS - 1, work))  # the scheduler restarts the group
                replaced = True
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
        lighthouse.shutdown()
    wall = time.time() - t0
    rows = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    out = summarize(rows, KIND, GROUPS, GROUPS - 1)
    if tmp:
        shutil.rmtree(work, ignore_errors=True)
    return {**out, "fit_hung": hung, "wall_s": round(wall, 2), "ended_ts": t0 + wall, "steps": steps,
            "groups": GROUPS, "settle_steps": settle_steps, "heartbeat_timeout_ms": heartbeat_timeout_ms}


if __name__ == "__main__":
    _group_main(sys.argv[1], int(sys.argv[2]))
