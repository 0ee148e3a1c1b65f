"""Network faults on real links between network namespaces (no Ray): partition, partition from some
peers, bandwidth cap, packet loss, delay where the kernel has netem; each healed."""

from __future__ import annotations

from typing import Any

import pytest

from tests.netns.probes import connects, send_seconds, server, udp_delivered
from workers.runtime.netfaults import NetFaults, NetFaultUnsupported, delay_supported

pytestmark = [pytest.mark.cluster]


def test_every_node_has_its_own_address_and_reaches_the_others(netns_net: Any) -> None:
    c = netns_net
    ips = {c.head.ip, *(n.ip for n in c.workers), c.bridge_ip}
    assert len(ips) == 4
    n1, n2 = c.workers
    with server(n2.netns):
        assert connects(n1.netns, n2.ip)
        assert connects(c.head.netns, n2.ip)


def test_partition_cuts_the_node_off_and_heal_restores_it(netns_net: Any) -> None:
    c = netns_net
    f = NetFaults(c)
    n1, n2 = c.workers
    with server(n2.netns):
        f.partition("n2")
        assert not connects(n1.netns, n2.ip)
        assert not connects(c.head.netns, n2.ip)
        f.heal("n2")
        assert connects(n1.netns, n2.ip)


def test_partition_from_some_peers_only(netns_net: Any) -> None:
    c = netns_net
    f = NetFaults(c)
    n1, n2 = c.workers
    with server(n2.netns):
        f.partition("n2", peers=["n1"])
        assert not connects(n1.netns, n2.ip)  # cut from n1 ...
        assert connects(c.head.netns, n2.ip)  # ... but the head still reaches it
        f.heal("n2", "partition")
        assert connects(n1.netns, n2.ip)
    assert f.faults()["n2"]["drop_peers"] == []


def test_rate_cap_slows_a_transfer_to_the_cap(netns_net: Any) -> None:
    c = netns_net
    f = NetFaults(c)
    n1, n2 = c.workers
    nbytes = 1_000_000  # 8 Mbit: at least 2 s through a 4 Mbit/s link (load only makes it slower)
    with server(n2.netns):
        f.rate("n2", 4)
        capped = send_seconds(n1.netns, n2.ip, nbytes)
        f.heal("n2")
        free = send_seconds(n1.netns, n2.ip, nbytes)
    assert capped >= 1.6, f"1 MB through a 4 Mbit/s cap took only {capped:.2f} s"
    assert capped > 3 * free, (capped, free)


def test_loss_drops_about_the_given_share_each_way(netns_net: Any) -> None:
    c = netns_net
    f = NetFaults(c)
    n1, n2 = c.workers
    with server(n2.netns):
        f.loss("n2", 20)  # a datagram from n1 crosses n2's link once: ~80 % arrive
        got = udp_delivered(n1.netns, n2.ip, 1000)
        f.heal("n2", "loss")
        clean = udp_delivered(n1.netns, n2.ip, 1000)
    assert 650 <= got <= 920, got
    assert clean >= 980, clean


def test_delay_uses_netem_or_says_the_kernel_lacks_it(netns_net: Any) -> None:
    f = NetFaults(netns_net)
    if delay_supported():
        f.delay("n2", 50, 5)
        assert f.faults()["n2"]["delay_ms"] == 50
        f.heal("n2")
    else:
        with pytest.raises(NetFaultUnsupported, match="CONFIG_NET_SCH_NETEM"):
            f.delay("n2", 50, 5)


def test_bad_fault_arguments_are_refused(netns_net: Any) -> None:
    f = NetFaults(netns_net)
    with pytest.raises(ValueError, match="mbit"):
        f.rate("n1", 0)
    with pytest.raises(ValueError, match="pct"):
        f.loss("n1", 100)
    with pytest.raises(KeyError, match="n9"):
        f.partition("n9")
    with pytest.raises(ValueError, match="kind"):
        f.heal("n1", "flood")
