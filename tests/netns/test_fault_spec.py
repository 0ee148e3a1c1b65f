"""The job spec's network fault kinds (``net_*``): validated with clear errors, refused on a cluster
without network namespaces, and executed from inside a node's namespace (where a supervisor runs)
through the cluster's root-namespace handle. No Ray: the job-spec path end to end is in
``test_netns_runtime``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.netns.probes import connects, ns_python, server, wait_until
from workers.runtime.contract.events import EventLog
from workers.runtime.contract.fault_spec import parse_faults
from workers.runtime.contract.job_spec import parse_job
from workers.testbed.fault_injector import FaultInjector, FaultPlan
from workers.testbed.network_fault_injector import NetFaultsUnavailable

BASE = {"model": "tiny", "steps": 4, "global_batch": 8, "checkpoint_dir": "/nowhere"}


@pytest.mark.parametrize("fault, says", [
    ({"kind": "net_rate", "at_step": 2, "mbit": 0}, "mbit must be > 0"),
    ({"kind": "net_loss", "at_step": 2, "pct": 100}, "pct must be in (0, 100)"),
    ({"kind": "net_loss", "at_step": 2, "pct": 5, "mbit": 3}, "unknown field(s) mbit"),
    ({"kind": "net_delay", "at_step": 2, "ms": 0}, "ms must be > 0"),
    ({"kind": "net_partition", "at_step": 2, "peers": []}, "peers must be a non-empty list"),
    ({"kind": "net_partition", "at_step": 2, "peers": ["n1"]}, "peers must be ranks"),
    ({"kind": "net_partition", "at_step": 2, "duration_s": -1}, "duration_s must be >= 0"),
    ({"kind": "net_heal", "at_step": 2, "what": "cable"}, "what must be one of"),
    ({"kind": "net_explode", "at_step": 2}, "unknown fault kind"),
])
def test_network_faults_are_validated_with_clear_errors(fault: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match="faults: .*" + __import__("re").escape(says)):
        parse_job({**BASE, "faults": [fault]})


def test_network_faults_parse_with_their_parameters() -> None:
    faults = parse_faults([{"kind": "net_rate", "at_step": 5, "mbit": 2},
                           {"kind": "net_partition", "at_step": 3, "rank": 0, "peers": [-1], "duration_s": 2}])
    assert [f.kind for f in faults] == ["net_partition", "net_rate"]
    assert faults[0].params() == {"peers": [-1], "duration_s": 2} and faults[0].peer_ranks(4) == [3]
    assert faults[1].network and faults[1].params() == {"mbit": 2, "duration_s": 0.0}


def test_network_faults_are_refused_on_a_cluster_without_namespaces() -> None:
    """This test process lives in the root namespace, as the supervisor of an in-process cluster does."""
    plan = FaultPlan(parse_faults([{"kind": "net_loss", "at_step": 1, "pct": 5}]), enabled=True)
    with pytest.raises(NetFaultsUnavailable, match=r"net_loss.*orthoplex cluster up --netns"):
        FaultInjector(object(), plan, EventLog(None))  # type: ignore[arg-type]


FIRE = """
import json, sys
from workers.runtime.contract.fault_spec import parse_fault
from workers.testbed.network_fault_injector import SpecNetFaults
from workers.testbed.netns_cluster import discover_here
rec = discover_here()
print(json.dumps(rec))
net = SpecNetFaults(rec)
net.fire(parse_fault({"kind": "net_partition", "at_step": 1}), "n2", [])
print(json.dumps(net.net.faults()))
"""


def test_a_node_namespace_finds_its_cluster_and_partitions_a_link_through_the_root_handle(netns_net: Any) -> None:
    c = netns_net
    n1, n2 = c.workers
    out = ns_python(c.head.netns, FIRE).splitlines()  # where a job's supervisor runs
    rec = json.loads(out[0])
    assert rec["root_handle"] == c.root_handle
    assert {(n["name"], n["ip"], n["veth"]) for n in rec["nodes"]} == {
        (n.name, n.ip, n.veth) for n in [c.head, *c.workers]}
    assert json.loads(out[1])["n2"]["down"] is True
    try:
        with server(n2.netns):
            assert not connects(n1.netns, n2.ip)  # the bridge end (root namespace) is down
            ns_python(n1.netns, "import json\nfrom workers.testbed.network_fault_injector import SpecNetFaults\n"
                      "from workers.testbed.netns_cluster import discover_here\n"
                      "SpecNetFaults(discover_here()).net.heal('n2')")
            # back within seconds (n1's neighbour entry for n2 failed during the cut and is resolved anew)
            wait_until(lambda: connects(n1.netns, n2.ip), 20, "n2 reachable again after the heal")
    finally:
        from workers.testbed.network_faults import NetFaults

        NetFaults(c).heal("n2")


def test_orthoplex_run_takes_network_faults_only_with_an_address() -> None:
    import typer
    from typer.testing import CliRunner

    from service.cli.runtime import _parse_fault_options, register

    fault = '{"kind": "net_partition", "at_step": 5, "duration_s": 2}'
    assert _parse_fault_options([fault], "10.250.7.2:6380") == [json.loads(fault)]
    app = typer.Typer()
    register(app)
    res = CliRunner().invoke(app, ["run", "--fault", fault])  # no --address: the in-process local cluster
    assert res.exit_code == 2 and "orthoplex cluster up" in res.output and "--netns" in res.output, res.output
    res = CliRunner().invoke(app, ["run", "--address", "10.250.7.2:6380", "--fault",
                                   '{"kind": "net_rate", "at_step": 1, "mbit": -1}'])
    assert res.exit_code == 2 and "mbit must be > 0" in res.output, res.output
