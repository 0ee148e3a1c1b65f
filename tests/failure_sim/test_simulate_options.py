"""``orthoplex simulate --layout/--groups``: the simulator plays a given layout with a given number of
replica groups (what a goodput-aware plan chose); bad values exit 2 naming the option."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from service.cli.main import app
from service.failure_sim.simulation import Config, simulate

pytestmark = pytest.mark.unit

LAYOUT = "tp=8,pp=16,cp=2,dp=4,vpp=4,zero=1"


def test_groups_set_how_much_a_failure_takes_out() -> None:
    two = simulate(Config(gpus=1024, days=20, seed=1, policies=("replica_group",), spares=4, layout=LAYOUT, groups=2))
    eight = simulate(Config(gpus=1024, days=20, seed=1, policies=("replica_group",), spares=4, layout=LAYOUT, groups=4))
    assert two.extras["layout"].startswith("tp8·pp16·cp2·dp4") and two.throughput.group_shape()[0] == 2
    # the same trace: with 4 groups a failure takes out a quarter of the throughput until the rejoin, not half
    assert eight.results[-1].ettr > two.results[-1].ettr


@pytest.mark.parametrize(("args", "field"), [(["--layout", "tp=3"], "layout"), (["--groups", "0"], "groups"),
                                             (["--layout", LAYOUT, "--groups", "3"], "groups"),
                                             (["--calibration", "x"], "calibration")])
def test_bad_options_exit_2_naming_the_field(args: list[str], field: str) -> None:
    r = CliRunner().invoke(app, ["simulate", "--gpus", "1024", "--days", "2", *args])
    assert r.exit_code == 2 and field in r.output, r.output
