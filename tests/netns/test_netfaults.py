"""Network faults on real links between network namespaces (no Ray): partition, partition from some
peers, bandwidth cap, packet loss, delay and jitter (a userspace delay line: no netem here); each
healed."""

from __future__ import annotations

from typing import Any

import pytest

from tests.netns.probes import connects, rtts_ms, send_seconds, server, udp_delivered
from workers.testbed.network_faults import NetFaults, delay_supported

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


def _stats(rtts: list[float]) -> tuple[float, float, float]:
    """(p10, median, p90) of sorted round trips."""
    return rtts[len(rtts) // 10], rtts[len(rtts) // 2], rtts[len(rtts) * 9 // 10]


def test_delay_and_jitter_hold_every_packet_then_heal(netns_net: Any) -> None:
    """The kernel here has no netem: the delay lines (a TAP per link end, in userspace) do it."""
    c = netns_net
    f = NetFaults(c)
    n1, n2 = c.workers
    assert delay_supported()
    try:
        with server(n2.netns):
            _, clean, _ = _stats(rtts_ms(n1.netns, n2.ip, 30))
            f.delay("n2", 40)  # a request crosses n2's link once each way: +80 ms a round trip
            assert len(f.lines["n2"]) == 2
            lo, delayed, _ = _stats(rtts_ms(n1.netns, n2.ip, 30))
            assert lo >= 80 and delayed < 80 + clean + 120, (clean, lo, delayed)
            f.delay("n2", 40, 20)  # each way 20-60 ms, in order (a wire does not reorder)
            rtts = rtts_ms(n1.netns, n2.ip, 60)
            lo, _, hi = _stats(rtts)
            assert rtts[0] >= 40 and hi - lo > 10, rtts
            f.heal("n2", "delay")
            assert "n2" not in f.lines
            _, healed, _ = _stats(rtts_ms(n1.netns, n2.ip, 30))
            assert healed < 40, (clean, healed)
    finally:
        f.heal("n2")
    assert not any(p.poll() is None for ps in f.lines.values() for p in ps)


def test_delay_combines_with_loss_and_rate_applied_once(netns_net: Any) -> None:
    c = netns_net
    f = NetFaults(c)
    n1, n2 = c.workers
    try:
        with server(n2.netns):
            f.delay("n2", 5)
            f.loss("n2", 30)  # applied after the delay line, once: ~70 % arrive (twice would be ~49 %)
            got = udp_delivered(n1.netns, n2.ip, 1000)
            f.heal("n2", "loss")
            f.rate("n2", 4)
            capped = send_seconds(n1.netns, n2.ip, 1_000_000)  # 8 Mbit through 4 Mbit/s: >= 2 s
    finally:
        f.heal("n2")
    assert 580 <= got <= 820, got
    assert capped >= 1.6, capped
    assert f.faults()["n2"] == {"down": False, "drop_peers": [], "rate_mbit": None, "loss_pct": 0.0,
                                "delay_ms": 0.0, "jitter_ms": 0.0}


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
    with pytest.raises(ValueError, match="ms"):
        f.delay("n1", 0)
    assert not f.lines
