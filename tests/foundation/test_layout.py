"""The shared Layout type: Megatron rank order, groups, parsing, field-named errors."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.layout import Layout, LayoutError

pytestmark = pytest.mark.unit

sizes = st.sampled_from([1, 2, 3, 4])


def test_megatron_order_tp_fastest_then_cp_dp_pp() -> None:
    lay = Layout(tp=2, cp=2, dp=2, pp=2)
    assert [lay.coords(r).tp for r in range(4)] == [0, 1, 0, 1]
    assert lay.coords(2).cp == 1 and lay.coords(4).dp == 1 and lay.coords(8).pp == 1
    assert lay.groups("tp")[:2] == [[0, 1], [2, 3]]
    assert lay.groups("cp")[0] == [0, 2]
    assert lay.groups("dp")[0] == [0, 4]
    assert lay.groups("pp")[0] == [0, 8]
    assert lay.groups("dp", "cp")[0] == [0, 2, 4, 6]


@given(tp=sizes, cp=sizes, dp=sizes, pp=sizes)
def test_groups_partition_the_world(tp: int, cp: int, dp: int, pp: int) -> None:
    lay = Layout(tp=tp, cp=cp, dp=dp, pp=pp)
    for dims in [("tp",), ("cp",), ("dp",), ("pp",), ("dp", "cp"), ("tp", "cp")]:
        groups = lay.groups(*dims)
        flat = sorted(itertools.chain.from_iterable(groups))
        assert flat == list(range(lay.world_size))
        size = 1
        for d in dims:
            size *= lay.size(d)
        assert all(len(g) == size for g in groups)
    for r in range(lay.world_size):
        c = lay.coords(r)
        assert lay.rank_of(pp=c.pp, dp=c.dp, cp=c.cp, tp=c.tp) == r


def test_parse_and_round_trip() -> None:
    lay = Layout.parse("tp=2,cp=2,pp=2,dp=1,vpp=2,zero=1,cp_method=ulysses")
    assert (lay.tp, lay.cp, lay.pp, lay.dp, lay.vpp, lay.zero) == (2, 2, 2, 1, 2, 1)
    assert lay.schedule == "interleaved" and lay.sp is True and lay.cp_method == "ulysses"
    assert Layout.from_dict(lay.to_dict()) == lay
    assert Layout.parse("tp=2,sp=false").sp is False
    assert lay.short() == "tp2·pp2·cp2·dp1·vpp2"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("tp=0", "tp"),
        ("tp=x", "tp"),
        ("zero=2", "zero"),
        ("schedule=zigzag", "schedule"),
        ("cp_method=tree", "cp_method"),
        ("foo=1", "foo"),
        ("tp2", "tp2"),
        ("vpp=2,schedule=1f1b,pp=2", "vpp"),
        ("schedule=interleaved", "schedule"),
    ],
)
def test_parse_errors_name_the_field(text: str, field: str) -> None:
    with pytest.raises(LayoutError, match=field):
        Layout.parse(text)


def test_micro_batches() -> None:
    lay = Layout(dp=2, micro_batch=2)
    assert lay.micro_batches_for(16) == 4
    assert lay.with_global_batch(16).num_micro_batches == 4
    with pytest.raises(LayoutError, match="global_batch"):
        lay.micro_batches_for(6)
