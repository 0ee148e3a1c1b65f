"""Goodput-aware plans (planner/goodput.py): recovery settings per layout, ETTR against the failure
simulator, the small job unchanged, the spec's goodput fields, the recovery phases' prior and calibration."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import planner
from planner.failure_rates import named
from planner.goodput import spares_needed
from planner.recovery_cost import PRIOR, PRIOR_PHASES, PRIOR_SOURCE, calibrate
from planner.recovery_names import POLICY_NAMES, REPLICA_GROUP, SOURCES
from planner.spec import SpecError, parse_spec
from service.failure_sim.simulation import Config, simulate

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
BIG: dict[str, Any] = {"model": {"name": "llama3-405b", "seq_len": 8192},
                       "cluster": {"gpu_type": "H100", "num_gpus": 16_384, "gpus_per_node": 8},
                       "parallel": {"global_batch": 2048}, "precision": "bf16"}
SMALL: dict[str, Any] = {"model": {"name": "llama3-8b", "seq_len": 8192},
                         "cluster": {"gpu_type": "H100", "num_gpus": 8, "gpus_per_node": 8},
                         "parallel": {"global_batch": 64}, "precision": "bf16"}
RECOVERY_KEYS = {"policy", "groups", "snapshot_every", "checkpoint_every_steps", "checkpoint_interval_s",
                 "warm_spares", "source", "restart_s", "save_s", "mttf_s", "ettr", "reason"}
SLOW = {"detect": 30.0, "plan": 1.0, "place": 20.0, "start": 120.0, "load": 60.0, "first_step": 5.0}


@pytest.fixture(scope="module")
def big() -> planner.PlanResult:
    return planner.plan({**BIG, "duration_days": 54, "failure_rates": "llama3"})


def test_the_prior_is_the_published_benchmark_row() -> None:
    """PRIOR_PHASES cites bench/results/recovery.json's runtime row; the numbers are that row's."""
    assert PRIOR_SOURCE.startswith("bench/results/recovery.json")
    rows = json.loads((ROOT / "bench/results/recovery.json").read_text())["rows"]
    ours = next(r for r in rows if r["system"] == "orthoplex runtime")
    assert ours["phases"] == pytest.approx(PRIOR_PHASES.as_dict(), abs=1e-3)
    assert PRIOR.recorded == 0 and PRIOR_SOURCE in PRIOR.source


def test_405b_plan_carries_recovery_settings_and_ettr(big: planner.PlanResult) -> None:
    assert big.plans and big.goodput is not None
    best = big.plans[0]
    assert best.recovery is not None and set(best.recovery) == RECOVERY_KEYS
    assert best.recovery["policy"] in POLICY_NAMES and best.recovery["source"] == SOURCES[best.recovery["policy"]]
    assert 0.9 < best.ettr < 1.0
    assert best.effective_tokens_per_s == pytest.approx(best.estimate.tokens_per_s * best.ettr, rel=1e-5)
    assert best.recovery["warm_spares"] >= 1  # 2,048 nodes: several are in repair at any time
    # ranked by effective tokens/s, each runner-up says why it lost
    eff = [p.effective_tokens_per_s for p in big.plans]
    assert eff == sorted(eff, reverse=True)
    assert all("lost_because" in row for row in big.goodput["ranking"][1:])
    assert best.recovery_options and all(o["lost_because"] for o in best.recovery_options)
    # the published restart loses to Orthoplex's own recovery at this scale
    restart = next(o for o in best.recovery_options if o["policy"] == "restart")
    assert restart["ettr"] < best.ettr - 0.03
    d = best.to_dict()
    assert d["ettr"] == best.ettr and d["recovery"] == best.recovery
    assert planner.Plan.from_dict(d).recovery == best.recovery


def test_replica_groups_only_when_a_group_fits_memory(big: planner.PlanResult) -> None:
    """Every replica-group count whose group would not fit is refused with the planner's memory price."""
    for p in big.plans:
        for o in p.recovery_options:
            if o["policy"] == REPLICA_GROUP and o["ettr"] == 0.0:
                assert "GiB per GPU" in o["lost_because"] or "needs" in o["lost_because"]
        if p.recovery["policy"] == REPLICA_GROUP and p.layout.zero:
            assert p.layout.dp_replicate == p.recovery["groups"]


def test_405b_ettr_agrees_with_the_simulator_within_a_point(big: planner.PlanResult) -> None:
    """The same inputs (layout, policy, groups, spares, rates, days, phases) through `orthoplex simulate`."""
    best = big.plans[0]
    rec = best.recovery
    groups = rec["groups"] if rec["policy"] == REPLICA_GROUP else None
    sim = simulate(Config(gpus=16_384, gpus_per_node=8, days=54, seed=0, policies=(rec["policy"],),
                          spares=rec["warm_spares"], rates="llama3", layout=best.layout.spec(), groups=groups))
    name = f"{rec['policy']}+k{rec['warm_spares']}" if rec["warm_spares"] else rec["policy"]
    simulated = next(r.ettr for r in sim.results if r.name == name)
    assert sim.extras["tokens_per_s"] == pytest.approx(best.estimate.tokens_per_s, rel=1e-9)
    assert abs(simulated - best.ettr) < 0.01, (simulated, best.ettr)


def test_small_job_plan_is_unchanged() -> None:
    """8 GPUs for a day: the same layouts in the same order as the healthy-speed plan."""
    plain = planner.plan(SMALL)
    priced = planner.plan({**SMALL, "duration_days": 1, "failure_rates": "llama3"})
    assert [p.layout for p in priced.plans] == [p.layout for p in plain.plans]
    assert all(p.ettr is not None and p.ettr > 0.99 for p in priced.plans)
    assert plain.plans[0].ettr is None and "ettr" not in plain.plans[0].to_dict()


def test_recorded_slow_recoveries_change_the_choice() -> None:
    fast = planner.plan({**BIG, "duration_days": 54}, top_k=1).plans[0]
    slow_cal = calibrate([SLOW] * 3).to_dict()
    slow = planner.plan({**BIG, "duration_days": 54, "recovery_phases": slow_cal}, top_k=1).plans[0]
    assert slow.ettr < fast.ettr
    assert (slow.recovery["policy"], slow.recovery["groups"]) != (fast.recovery["policy"], fast.recovery["groups"])


def test_calibrate_is_the_median_with_the_prior() -> None:
    assert calibrate([]) is PRIOR
    one = calibrate([SLOW])
    assert one.recorded == 1 and one.phases.detect == pytest.approx((PRIOR_PHASES.detect + 30.0) / 2)
    three = calibrate([SLOW, SLOW, {"detect": -1}, {"nope": 1}])
    assert three.recorded == 2 and three.phases.start == 120.0


@pytest.mark.parametrize(("extra", "field"), [
    ({"failure_rates": "llama3"}, "duration_days"),
    ({"duration_days": 0}, "duration_days"),
    ({"duration_days": 5000}, "duration_days"),
    ({"duration_days": 3, "failure_rates": "mars"}, "failure_rates"),
    ({"duration_days": 3, "failure_rates": "cluster"}, "failure_rates"),
    ({"duration_days": 3, "failure_rates": {"name": "cluster", "node_failures_per_node_day": -1}},
     "failure_rates.node_failures_per_node_day"),
    ({"duration_days": 3, "recovery_phases": {"phases": {"detect": 1}}}, "recovery_phases.phases.plan"),
])
def test_goodput_fields_errors_name_the_field(extra: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({**SMALL, **extra})
    assert err.value.field == field


def test_cluster_rates_as_numbers_and_the_rsc_table() -> None:
    spec = parse_spec({**SMALL, "duration_days": 2,
                       "failure_rates": {"name": "cluster", "node_failures_per_node_day": 0.01, "node_days": 1500}})
    assert spec.failure_rates is not None and spec.failure_rates.unexpected_per_node_day == 0.01
    assert "1,500.0 node-days" in spec.failure_rates.source
    assert named("rsc", 8).unexpected_per_node_day == pytest.approx(6.5 / 1000)


def test_spares_cover_the_nodes_in_repair() -> None:
    rates = named("llama3", 8)
    assert spares_needed(rates, 1, 0) == 0
    k = spares_needed(rates, 2048, 0)
    assert 3 <= k <= 15
    assert spares_needed(rates, 2048, k) == 0  # idle nodes count as spares


def test_cli_plan_prints_the_goodput_choice_and_names_bad_fields(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from service.cli.main import app

    spec = tmp_path / "small.json"
    spec.write_text(json.dumps(SMALL))
    r = CliRunner().invoke(app, ["plan", "--spec", str(spec), "--duration-days", "1", "--top", "2", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["goodput"]["failure_rates"]["name"] == "llama3" and len(out["plans"]) == 2
    assert set(out["plans"][0]["recovery"]) == RECOVERY_KEYS and out["plans"][0]["ettr"] > 0.99
    r = CliRunner().invoke(app, ["plan", "--spec", str(spec), "--duration-days", "1"])
    assert r.exit_code == 0 and "Ranked by effective tokens/s" in r.output and "chosen:" in r.output
    for args, field in ((["--duration-days", "-1"], "duration_days"), (["--failure-rates", "mars"], "--failure-rates"),
                        (["--failure-rates", "llama3"], "duration_days"), (["--calibration", "x"], "--calibration")):
        r = CliRunner().invoke(app, ["plan", "--spec", str(spec), *args])
        assert r.exit_code == 2 and field in r.output, (args, r.output)
