"""Replica groups with any layout inside a group (issue #38), engine level: 2 replica groups under
torchft (a real lighthouse, real gloo process groups, one OS process per rank), each group a 4-rank
layout with pipeline parallelism, ZeRO or FSDP inside, against the single-process reference.

One spawn of 2 groups x 4 ranks runs three group layouts one after the other (each with its own
lighthouse, stores and process groups; fewer spawns on this 2-core box):

- ``tp=2,pp=2``: a pass is 2 rows (2 micro-batches of 1 through the 2-stage 1F1B), 4 rows a group;
- ``pp=2,dp=2,zero=1``: a pass is 4 rows (a full pass: the pipeline's shapes are fixed), one a
  group; each rank reduces across groups only the gradients whose optimizer state it owns;
- ``cp=2,dp=2,zero=3``: FSDP2 inside a group (each rank reduces its gradient shards across
  groups), 2 passes of 2 rows a group.

Checked for each: every committed step of both groups has the single-process loss and pre-clipping
global gradient norm (1e-4 relative; real text, clipping active), both groups commit every step
with 2 participants, and the rows each group ran are its share in whole blocks.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from engine_harness import reference, text_batches, tiny_cfg

from planner.layout import Layout
from workers.engine.replica_ft import ReplicaRankSpec, read_log
from workers.engine.replica_rows import group_layout, pass_rows, replica_problems, row_share, share_unit

ROOT = Path(__file__).resolve().parents[2]
GROUPS, STEPS, GLOBAL_BATCH, SEED = 2, 5, 8, 1234
LAYOUTS = ["tp=2,pp=2", "pp=2,dp=2,zero=1", "cp=2,dp=2,zero=3"]
REL = 1e-4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.unit
def test_shares_come_in_blocks_a_group_can_run() -> None:
    tp_pp = Layout.parse("tp=2,pp=2,micro_batch=1")
    assert (pass_rows(tp_pp), share_unit(tp_pp), group_layout(tp_pp).num_micro_batches) == (2, 2, 2)
    zero = Layout.parse("pp=2,dp=2,zero=1,micro_batch=1")
    assert (pass_rows(zero), share_unit(zero)) == (4, 4)
    fsdp = Layout.parse("cp=2,dp=2,zero=3,micro_batch=2")
    assert (pass_rows(fsdp), share_unit(fsdp), group_layout(fsdp).num_micro_batches) == (4, 2, 1)
    assert row_share(12, 3, 1, unit=4) == [4, 5, 6, 7] and row_share(8, 3, 2, unit=4) == []
    assert row_share(12, 2, 1, unit=2) == [6, 7, 8, 9, 10, 11]
    assert replica_problems(zero, 8) == [] and "multiple of the 4 rows" in replica_problems(zero, 6)[0]
    with pytest.raises(ValueError, match="whole blocks"):
        row_share(6, 2, 0, unit=4)


def _run(work: Path, timeout_s: float = 300.0) -> dict[str, dict[str, Any]]:
    os.environ.setdefault("RUST_LOG", "warn")
    from torchft._torchft import LighthouseServer

    work.mkdir(parents=True, exist_ok=True)
    lighthouses = [LighthouseServer(bind="[::]:0", min_replicas=GROUPS, heartbeat_timeout_ms=5000,
                                    join_timeout_ms=20_000) for _ in LAYOUTS]
    plans: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for spec, lh in zip(LAYOUTS, lighthouses, strict=True):
        lay = Layout.parse(spec)
        out = work / spec.replace(",", "_").replace("=", "")
        out.mkdir()
        for g in range(GROUPS):
            port = _free_port()
            for r in range(4):
                one = ReplicaRankSpec(group=g, rank=r, tp=lay.tp, pp=lay.pp, cp=lay.cp, dp=lay.dp, zero=lay.zero,
                                      store_port=port, lighthouse=lh.address(), log=str(out / "events.jsonl"),
                                      out=str(out), steps=STEPS, global_batch=GLOBAL_BATCH, micro_batch=1,
                                      seed=SEED, start_groups=GROUPS, timeout_s=60.0)
                assert one.size == 4
                plans.setdefault((g, r), []).append(dict(one.__dict__))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "RUST_LOG": "warn"}
    procs = [subprocess.Popen([sys.executable, "-m", "workers.engine.replica_ft", json.dumps(p)], cwd=ROOT, env=env,
                              stdout=open(work / f"g{g}-r{r}.out", "w"), stderr=subprocess.STDOUT)  # noqa: SIM115
             for (g, r), p in sorted(plans.items())]
    timed_out = False
    try:
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        timed_out = True  # the ranks' stacks (SIGUSR1 below) and output go into the failure
    finally:
        live = [p for p in procs if p.poll() is None]
        for p in live:
            p.send_signal(signal.SIGUSR1)  # a stuck rank's stacks into its .out file
        if live:
            time.sleep(1.0)
        for p in live:
            p.kill()
        for lh in lighthouses:
            lh.shutdown()
    codes = [p.returncode for p in procs]
    if timed_out or codes != [0] * len(procs):
        outs = "\n".join(f"--- {f.name}\n" + f.read_text(errors="replace")[-3000:] for f in sorted(work.glob("*.out")))
        raise AssertionError(f"{'timed out after ' + str(timeout_s) + ' s; ' if timed_out else ''}exit codes {codes}\n{outs}")
    return {spec: {"rows": read_log(work / spec.replace(",", "_").replace("=", "") / "events.jsonl")}
            for spec in LAYOUTS}


@pytest.mark.engine
@pytest.mark.timeout(600)
def test_groups_of_pipeline_zero_and_fsdp_layouts_match_one_process(tmp_path: Path) -> None:
    t0 = time.monotonic()
    runs = _run(tmp_path)
    took = time.monotonic() - t0
    cfg = tiny_cfg(steps=STEPS, global_batch=GLOBAL_BATCH, seed=SEED)
    ref = reference(cfg, text_batches(cfg, STEPS, SEED))
    assert max(ref["norms"]) > cfg.grad_clip  # clipping is active
    worst = {}
    for spec, run in runs.items():
        unit = share_unit(Layout.parse(spec + ",micro_batch=1"))
        rows = [r for r in run["rows"] if r["event"] in ("step", "abort")]
        assert rows and all(r["event"] == "step" for r in rows), spec
        errs = []
        for g in range(GROUPS):
            for rank in range(4):
                mine = sorted((r for r in rows if r["group"] == g and r["rank"] == rank), key=lambda r: r["step"])
                assert [r["step"] for r in mine] == list(range(STEPS)), (spec, g, rank)
                for r in mine:
                    assert r["participants"] == GROUPS and r["rows"] == row_share(GLOBAL_BATCH, GROUPS, g, unit), r
                    errs.append(abs(r["loss"] - ref["losses"][r["step"]]) / ref["losses"][r["step"]])
                    errs.append(abs(r["grad_norm"] - ref["norms"][r["step"]]) / ref["norms"][r["step"]])
        worst[spec] = max(errs)
        assert worst[spec] < REL, (spec, worst)
    print(json.dumps({"test_s": round(took, 1), "worst_rel": worst}))
