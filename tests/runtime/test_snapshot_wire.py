"""The snapshot push's wire (``workers.runtime.recovery.snapshot_transport``): files arrive whole and in order, a
holder with another token or a dead or silent one fails that copy only (counted, dropped, no hang),
and a ``SnapshotHolder`` stores what its listener receives. Plain sockets on loopback, no Ray."""

import socket
import threading

import numpy as np
import pytest

from workers.runtime.recovery.memory_snapshots import SnapshotHolder, choose
from workers.runtime.recovery.snapshot_transport import (
    TOKEN_BYTES,
    LocalCopy,
    Receiver,
    Sender,
    local_name,
    parse_local_name,
)

pytestmark = pytest.mark.unit


def _receiver(token: bytes = b"t" * TOKEN_BYTES) -> tuple[Receiver, list]:
    got: list = []
    return Receiver(lambda *a: got.append(a), token), got


def test_files_arrive_whole_from_their_parts() -> None:
    rx, got = _receiver()
    big = np.arange(3 << 20, dtype=np.uint8)  # 3 MiB: several recv calls
    sender = Sender([rx.address.as_tuple()])
    try:
        assert sender.push(2, 7, 4, {"__1_0.distcp": [b"head", memoryview(big)], ".metadata": [b"m" * 10]}) == 0
        assert sender.push(2, 8, 4, {"__1_0.distcp": [b"x"]}) == 0  # the same connection again
    finally:
        sender.close()
        rx.close()
    assert [(e, s, w, sorted(f)) for e, s, w, f in got] == [
        (2, 7, 4, ["__1_0.distcp"]), (2, 7, 4, [".metadata"]), (2, 8, 4, ["__1_0.distcp"])]
    assert bytes(got[0][3]["__1_0.distcp"]) == b"head" + big.tobytes()
    assert bytes(got[1][3][".metadata"]) == b"m" * 10 and rx.frames == 3


def test_a_wrong_token_a_dead_and_a_silent_holder_each_fail_one_copy() -> None:
    good, got = _receiver()
    other, other_got = _receiver(b"u" * TOKEN_BYTES)
    dead, _ = _receiver()
    dead_addr = dead.address.as_tuple()
    dead.close()
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never answers
    accepted: list = []
    threading.Thread(target=lambda: accepted.append(silent.accept()), daemon=True).start()
    wrong = (other.address.host, other.address.port, (b"t" * TOKEN_BYTES).hex())  # the good holder's token
    addrs = [good.address.as_tuple(), wrong, dead_addr, ("127.0.0.1", silent.getsockname()[1], "74" * TOKEN_BYTES)]
    sender = Sender(addrs, timeout_s=0.5, connect_timeout_s=0.5)
    try:
        assert sender.push(1, 1, 1, {"__0_0.distcp": [b"abc"]}) == 3
        assert sender.live() == 1
        assert sender.push(1, 2, 1, {"__0_0.distcp": [b"def"]}) == 0  # the failed ones are not tried again
    finally:
        sender.close()
        for r in (good, other):
            r.close()
        silent.close()
    assert [s for _, s, _, _ in got] == [1, 2] and not other_got and other.rejected == 1


def test_a_holder_lists_and_serves_the_wire_copies_and_its_own_nodes_files(tmp_path) -> None:
    """Rank 1 (another node) pushes over the wire, rank 0 (the holder's node) writes into the holder's
    directory; the holder's inventory merges both, keeps the newest ``keep`` steps of each, serves
    either kind, and closing it removes the directory."""
    h = SnapshotHolder(keep=2, directory=str(tmp_path / "holder"))
    addr = h.address(host="127.0.0.1")
    assert addr["keep"] == 2 and addr["dir"] == str(tmp_path / "holder")
    sender, local = Sender([addr]), LocalCopy(addr["dir"], addr["keep"])
    try:
        for step in (1, 2, 3):
            assert sender.push(5, step, 2, {"__1_0.distcp": [b"y" * step]}) == 0
            assert local.push(5, step, 2, {"__0_0.distcp": [b"x", b"x" * step], ".metadata": [b"m"]}) == 0
        inv = h.inventory()
        assert sorted(e["step"] for e in inv) == [2, 3]
        assert [e["files"] for e in inv if e["step"] == 3] == [[".metadata", "__0_0.distcp", "__1_0.distcp"]]
        assert len(list((tmp_path / "holder").iterdir())) == 4  # 2 files x the newest 2 steps, no temp file
        got = h.get(5, 3, ["__0_0.distcp", "__1_0.distcp"])
        assert bytes(got["__0_0.distcp"]) == b"xxxx" and bytes(got["__1_0.distcp"]) == b"yyy"
        assert choose({"n": inv}).key.step == 3
    finally:
        sender.close()
        h.close()
    assert not (tmp_path / "holder").exists()
    assert local.push(5, 4, 2, {"__0_0.distcp": [b"z"]}) == 1 and local.dead  # its holder closed: counted


def test_local_names_round_trip_and_temp_files_are_not_snapshots() -> None:
    assert parse_local_name(local_name(3, 17, 8, "__5_0.distcp")) == (3, 17, 8, "__5_0.distcp")
    assert parse_local_name(local_name(0, 1, 2, ".metadata")) == (0, 1, 2, ".metadata")
    assert parse_local_name("tmp.__5_0.distcp") is None and parse_local_name("1_2_x") is None
