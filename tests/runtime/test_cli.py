"""The runtime's CLI: ``orthoplex run`` options -> job spec, the summary, ``cluster up|down``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from planner.recovery_choice import DEFAULT_WARM_RANKS
from service.cli.runtime import build_spec, register, summarize
from workers.runtime.cluster.ray_auth import token_env


def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


@pytest.mark.unit
def test_run_options_become_a_spec_with_faults_only_when_asked() -> None:
    kw = dict(model="tiny", steps=10, global_batch=12, min_gpus=4, layout_hint="tp=2,pp=2", checkpoint_dir="/c",
              slow_factor=2.0, events_out=None, metrics_out=None, max_checkpoint_every=5, hang_timeout_s=30.0)
    plain = build_spec(kill_node_at_step=None, slow_node_at_step=None, **kw)
    assert plain["faults"] == [] and plain["layout_hint"]["tp"] == 2 and plain["min_gpus"] == 4
    assert plain["layout_hint"]["pp"] == 2
    faulty = build_spec(kill_node_at_step=3, slow_node_at_step=5, **kw)
    assert [f["kind"] for f in faulty["faults"]] == ["kill_node", "slow_node"]
    assert faulty["faults"][1]["factor"] == 2.0
    # the service's defaults (planner.recovery_choice): snapshots and warm ranks on, re-plan on dp=1
    assert "max_gpus" not in plain and plain["runtime"]["snapshots"] is True
    # warm ranks auto (DEFAULT_WARM_RANKS): the plan's 4 ranks fit one node, so 4 warm per node
    assert DEFAULT_WARM_RANKS == "auto" and plain["recovery"]["warm_ranks"] == 4
    assert plain["runtime"]["warm_ranks_per_node"] == 4 and plain["runtime"]["replica_groups"] == 0
    assert "recovery" in plain  # what it chose, for the run's first line (run pops it)
    off = build_spec(kill_node_at_step=None, slow_node_at_step=None, snapshots=False, warm_ranks=0, **kw)
    assert off["runtime"]["snapshots"] is False and off["runtime"]["warm_ranks_per_node"] == 0
    restart = build_spec(kill_node_at_step=None, slow_node_at_step=None, recovery="restart", **kw)
    assert restart["runtime"]["snapshots"] is False and restart["recovery"]["policy"] == "restart"
    # dp=3 holds three full replicas: auto runs three replica groups of tp=2 (the 6-GPU job) ...
    six = {**kw, "layout_hint": "tp=2,dp=3", "min_gpus": 1, "max_gpus": 6}
    groups = build_spec(kill_node_at_step=None, slow_node_at_step=None, nodes=4, gpus_per_node=2, snapshots=False,
                        **six)
    assert groups["runtime"]["replica_groups"] == 3 and groups["layout_hint"]["tp"] == 2, groups["recovery"]
    # ... and where the runtime's replica path does not run the choice (snapshots inside a group, until
    # it does), auto re-plans from memory instead, saying why: never a spec the runtime refuses
    auto = build_spec(kill_node_at_step=None, slow_node_at_step=None, nodes=4, gpus_per_node=2, **six)
    if auto["recovery"]["policy"] != "replica_groups":
        assert auto["runtime"]["replica_groups"] == 0 and auto["runtime"]["snapshots"] is True
        assert "the runtime does not run these replica groups" in auto["recovery"]["reason"]
    with pytest.raises(ValueError, match="--replica-groups"):  # 4 groups do not divide dp=3
        build_spec(kill_node_at_step=None, slow_node_at_step=None, nodes=4, gpus_per_node=2, replica_groups=4,
                   **{**kw, "layout_hint": "tp=2,dp=3", "min_gpus": 1, "max_gpus": 6})
    # --replica-groups R without --max-gpus: R groups of the hint's layout (the demo's two groups of tp=1)
    named = build_spec(kill_node_at_step=None, slow_node_at_step=None, nodes=3, gpus_per_node=4, replica_groups=2,
                       **{**kw, "layout_hint": "tp=1", "min_gpus": 1})
    assert named["runtime"]["replica_groups"] == 2 and named["recovery"]["group_gpus"] == 1, named["recovery"]
    if not named["runtime"]["snapshots"]:  # the default yields where the runtime's groups take none yet
        assert "snapshots off" in named["recovery"]["reason"]
    capped = build_spec(kill_node_at_step=None, slow_node_at_step=None, max_gpus=8, snapshots=True, **kw)
    assert capped["max_gpus"] == 8 and capped["runtime"]["snapshots"] is True
    assert capped["runtime"]["snapshot_every"] == 1
    assert build_spec(kill_node_at_step=None, slow_node_at_step=None, snapshots=True, snapshot_every=3,
                      **kw)["runtime"]["snapshot_every"] == 3
    with pytest.raises(ValueError, match="max-gpus"):
        build_spec(kill_node_at_step=None, slow_node_at_step=None, max_gpus=2, **kw)


@pytest.mark.unit
def test_run_refuses_max_gpus_below_min_gpus_with_exit_2() -> None:
    res = CliRunner().invoke(_app(), ["run", "--min-gpus", "4", "--max-gpus", "2"])
    assert res.exit_code == 2 and "--max-gpus" in res.output, res.output


@pytest.mark.unit
def test_run_refuses_a_snapshot_cadence_below_one_with_exit_2() -> None:
    res = CliRunner().invoke(_app(), ["run", "--snapshots", "--snapshot-every", "0"])
    assert res.exit_code == 2 and "--snapshot-every" in res.output, res.output


@pytest.mark.unit
def test_summary_lists_plans_failures_recovery_phases_and_loss() -> None:
    text = summarize({
        "state": "SUCCEEDED", "steps_done": 10, "final_loss": 4.2, "error": "",
        "plans": [{"short": "tp2·pp2·cp1·dp3", "num_gpus": 12}, {"short": "tp2·pp1·cp1·dp4", "num_gpus": 8}],
        "failures": [{"step": 4, "kind": "node_lost", "reason": "node gone"}],
        "recoveries": [{"cause": "node_lost", "total_s": 3.0,
                        "phases": {"detect": 1, "plan": 0, "place": 0, "start": 1, "load": 0.5, "first_step": 0.5}}],
    })
    assert "tp2·pp2·cp1·dp3 (12 GPUs) -> tp2·pp1·cp1·dp4 (8 GPUs)" in text
    assert "node_lost" in text and "detect 1.00s" in text and "final loss: 4.2" in text


@pytest.mark.unit
def test_commands_are_registered() -> None:
    res = CliRunner().invoke(_app(), ["--help"])
    assert res.exit_code == 0 and "run" in res.output and "cluster" in res.output
    res = CliRunner().invoke(_app(), ["cluster", "--help"])
    assert "up" in res.output and "down" in res.output


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_cluster_up_outlives_the_command_and_down_stops_only_it(tmp_path: Path) -> None:
    app = _app()
    res = CliRunner().invoke(app, ["cluster", "up", "--nodes", "1", "--gpus-per-node", "2", "--cpus-per-node", "1",
                                   "--data-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output + repr(res.exception)
    rec = json.loads((tmp_path / "cluster.json").read_text())
    try:
        assert rec["pids"] and all(Path(f"/proc/{p}").exists() for p in rec["pids"])
        probe = (f"import ray; ray.init(address='{rec['address']}'); r = ray.cluster_resources(); "
                 "print(int(r.get('GPU', 0))); ray.shutdown()")
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                             env=dict(token_env(Path(rec["token_file"]), dict(os.environ))))
        assert out.stdout.strip().splitlines()[-1] == "2", out.stderr[-2000:]
    finally:
        res = CliRunner().invoke(app, ["cluster", "down", "--data-dir", str(tmp_path)])
    assert res.exit_code == 0 and "stopped" in res.output
    assert not (tmp_path / "cluster.json").exists()
    assert [p for p in rec["pids"] if _running(p)] == []
    # Ray's DashboardAgent and RuntimeEnvAgent rename themselves (their titles do not name the temp
    # dir) but stay in the sessions of the `ray start` commands: none of them may be left
    from workers.runtime.cluster.procfs import in_sessions as _pids_in_sessions

    assert rec["sessions"] and [p for p in _pids_in_sessions(set(rec["sessions"])) if _running(p)] == []


def _running(pid: int) -> bool:
    try:
        return "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
