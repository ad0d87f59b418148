"""Source positions (core/position.py): ordering, GTID-only comparison, format/parse."""
from __future__ import annotations

import functools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.core.errors import InvalidArgument
from sluice.core.position import (EMPTY_KEY, IncomparablePositions, compare, format_position,
                                  is_after, is_empty, max_position, parse_position, position_key)
from sluice.proto import sluice_pb2 as pb

UUID_A = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
UUID_B = "4e11fa47-71ca-11e1-9e33-c80aa9429563"


def fpos(file_seq: int, offset: int, sub_seq: int = 0, gtids: str = "") -> pb.Position:
    p = pb.Position(file_seq=file_seq, offset=offset, sub_seq=sub_seq,
                    file_name=f"mysql-bin.{file_seq:06d}")
    if gtids:
        p.gtids.extend(parse_position(gtids).gtids)
    return p


def gpos(gtids: str, sub_seq: int = 0) -> pb.Position:
    p = parse_position(gtids)
    p.sub_seq = sub_seq
    return p


def test_positions_are_totally_ordered_per_producer() -> None:
    """Invariant: source positions are totally ordered per producer by (file_seq, offset, sub_seq);
    MariaDB GTIDs are compared per domain."""
    ordered = [
        pb.Position(),
        fpos(1, 4),
        fpos(1, 4, 1),          # a snapshot chunk emitted at 1:4 orders after sub_seq 0 ...
        fpos(1, 4, 2),
        fpos(1, 900),           # ... and before the next offset
        fpos(2, 4),             # a new file beats any offset of the old one
        fpos(10, 4),            # numeric, not lexical, file order
    ]
    shuffled = ordered[:]
    random.Random(7).shuffle(shuffled)
    assert sorted(shuffled, key=position_key) == ordered
    assert sorted(shuffled, key=functools.cmp_to_key(compare)) == ordered
    for i, a in enumerate(ordered):
        for j, b in enumerate(ordered):
            assert compare(a, b) == (i > j) - (i < j)
            assert is_after(a, b) == (i > j)

    # GTIDs per domain: domain 1 only grows, domain 0 decides.
    g = [gpos("0-1-5"), gpos("0-1-6,1-1-3"), gpos("0-2-7,1-1-3"), gpos("0-2-7,1-1-4")]
    for i, a in enumerate(g):
        for j, b in enumerate(g):
            assert compare(a, b) == (i > j) - (i < j)


def test_file_coordinates_are_authoritative_when_both_have_them() -> None:
    # GTIDs say the opposite; one producer reads one binlog, so the file order wins.
    a = fpos(3, 100, gtids="0-1-50")
    b = fpos(3, 200, gtids="0-1-40")
    assert compare(a, b) == -1
    assert is_after(b, a) and not is_after(a, b)


def test_gtid_only_positions_compare_per_domain() -> None:
    a = gpos("0-1-99")
    assert compare(a, gpos("0-1-99")) == 0
    assert compare(a, gpos("0-1-100")) == -1
    assert compare(a, gpos("0-7-100")) == -1      # server_id does not matter, seq_no does
    assert compare(gpos("0-1-99,1-2-5"), a) == 1   # B has every domain of A, and more
    assert compare(a, gpos("1-2-5,0-1-99")) == -1  # domain order in the message is irrelevant
    # equal GTID state: sub_seq orders a snapshot chunk before the transaction
    assert compare(gpos("0-1-99", sub_seq=1), gpos("0-1-99", sub_seq=2)) == -1


def test_after_failover_gtids_decide_when_one_side_lacks_file_coordinates() -> None:
    old_server = fpos(42, 1234, gtids="0-1-99")
    new_server_gtid_only = gpos("0-2-100")
    assert compare(new_server_gtid_only, old_server) == 1
    assert compare(gpos("0-1-98"), old_server) == -1
    assert compare(gpos("0-1-99"), old_server) == 0


def test_incomparable_positions_raise_in_compare_but_count_as_after() -> None:
    ahead_in_0 = gpos("0-1-10,1-1-5")
    ahead_in_1 = gpos("0-1-9,1-1-6")
    with pytest.raises(IncomparablePositions, match="ahead in some domain"):
        compare(ahead_in_0, ahead_in_1)
    # a domain missing on one side: neither covers the other
    with pytest.raises(IncomparablePositions):
        compare(gpos("0-1-10"), gpos("1-1-10"))
    # file coordinates on one side, GTIDs only on the other: nothing in common
    with pytest.raises(IncomparablePositions, match="no common coordinate"):
        compare(fpos(1, 4), gpos("0-1-1"))
    # the filter must never drop what it cannot place
    assert is_after(ahead_in_0, ahead_in_1) and is_after(ahead_in_1, ahead_in_0)
    assert is_after(fpos(1, 4), gpos("0-1-1"))


def test_empty_position_is_before_everything() -> None:
    assert is_empty(None) and is_empty(pb.Position()) and is_empty(pb.Position(sub_seq=3))
    for p in (fpos(1, 4), gpos("0-1-1"), pb.Position(mysql_gtid_set=f"{UUID_A}:1")):
        assert not is_empty(p)
        assert compare(pb.Position(), p) == -1 and compare(p, None) == 1
        assert is_after(p, None) and not is_after(None, p)
    assert compare(None, pb.Position()) == 0
    assert position_key(None) == position_key(pb.Position()) == EMPTY_KEY < position_key(fpos(0, 4))


def test_a_higher_generation_is_after_every_position_of_a_lower_one() -> None:
    """A deliberate rewind (`ctl position set`) resumes at a higher generation: its positions
    are after everything of the old generation, whatever their coordinates."""
    def gen(p: pb.Position, g: int) -> pb.Position:
        p.generation = g
        return p
    old_far, rewound = fpos(9, 900), gen(fpos(1, 4), 1)
    assert compare(rewound, old_far) == 1 and is_after(rewound, old_far)
    assert not is_after(old_far, rewound)
    assert compare(gen(gpos("0-1-3"), 1), gpos("0-1-99")) == 1
    assert compare(gen(gpos("0-1-3"), 1), gpos("1-1-5")) == 1     # incomparable GTIDs otherwise
    assert max_position([old_far, rewound, fpos(3, 4)]) is rewound
    assert position_key(rewound) > position_key(old_far)
    assert format_position(rewound) == "mysql-bin.000001:4#0 gen=1"
    assert parse_position("mysql-bin.000001:4#0 gen=1") == rewound
    assert compare(pb.Position(), rewound) == -1   # empty stays first


def test_position_key_refuses_gtid_only_positions() -> None:
    with pytest.raises(IncomparablePositions, match="no sortable key"):
        position_key(gpos("0-1-1"))


def test_mysql_gtid_sets_compare_by_inclusion() -> None:
    small = pb.Position(mysql_gtid_set=f"{UUID_A}:1-5")
    big = pb.Position(mysql_gtid_set=f"{UUID_A}:1-3:4-9,\n{UUID_B}:1")
    other = pb.Position(mysql_gtid_set=f"{UUID_B}:1-2")
    assert compare(small, big) == -1 and compare(big, small) == 1
    assert compare(big, pb.Position(mysql_gtid_set=f"{UUID_B}:1,{UUID_A}:1-9")) == 0
    with pytest.raises(IncomparablePositions):
        compare(small, other)


def test_max_position() -> None:
    ps = [fpos(2, 4), None, fpos(3, 1), pb.Position(), fpos(1, 999)]
    assert max_position(ps) is ps[2]
    assert is_empty(max_position([])) and is_empty(max_position([None, pb.Position()]))
    assert max_position([gpos("0-1-5"), gpos("0-1-7,1-1-1")]) == gpos("0-1-7,1-1-1")


@pytest.mark.parametrize("text,want", [
    ("mysql-bin.000042:1234#0 gtid=0-1-99",
     pb.Position(file_seq=42, offset=1234, file_name="mysql-bin.000042",
                 gtids=[pb.GtidPos(domain_id=0, server_id=1, seq_no=99)])),
    ("0-1-99,1-2-5", pb.Position(gtids=[pb.GtidPos(domain_id=0, server_id=1, seq_no=99),
                                        pb.GtidPos(domain_id=1, server_id=2, seq_no=5)])),
    ("mysql-bin.000007:4", pb.Position(file_seq=7, offset=4, file_name="mysql-bin.000007")),
    ("000007:4#3", pb.Position(file_seq=7, offset=4, sub_seq=3)),
    ("relay:4#1 file-seq=9", pb.Position(file_seq=9, offset=4, sub_seq=1, file_name="relay")),
    ("empty", pb.Position()),
])
def test_parse_position_accepts_formatted_and_gtid_only_text(text: str, want: pb.Position) -> None:
    assert parse_position(text) == want


def test_format_position_example() -> None:
    assert format_position(fpos(42, 1234, gtids="0-1-99")) == "mysql-bin.000042:1234#0 gtid=0-1-99"
    assert format_position(None) == "empty"


@pytest.mark.parametrize("text,needle", [
    ("", "empty position"),
    ("mysql-bin.000042", "bad token"),
    ("mysql-bin.000042:abc", "bad offset"),
    ("relay:4", "no numeric suffix"),
    ("0-1-99,0-2-100", "domain 0 appears twice"),
    ("gtid=0-1", "bad GTID list"),
    ("bogus=1", "unknown key"),
    ("000000:0", "both 0"),
    ("mysql-gtid=nope:1", "bad MySQL GTID set"),
    ("gtid=0-1-1 0-1-2", "gtid given twice"),
])
def test_parse_position_rejects_bad_text_naming_the_part(text: str, needle: str) -> None:
    with pytest.raises(InvalidArgument, match=needle):
        parse_position(text)


_u32 = st.integers(0, 2**32 - 1)
_u64 = st.integers(0, 2**64 - 1)


@st.composite
def positions(draw: st.DrawFn) -> pb.Position:
    p = pb.Position()
    if draw(st.booleans()):
        p.file_seq = draw(st.integers(1, 10**7))
        p.offset = draw(_u64)
        if draw(st.booleans()):
            p.file_name = draw(st.sampled_from(["mysql-bin.", "mariadb-bin.", "x.y."])) + \
                f"{p.file_seq:06d}"
        elif draw(st.booleans()):
            p.file_name = "relay-log"  # no numeric suffix: needs file-seq= to round trip
    elif draw(st.booleans()):
        p.file_name = "mysql-bin.000001"
    p.sub_seq = draw(_u64)
    for d in draw(st.lists(_u32, unique=True, max_size=3)):
        p.gtids.add(domain_id=d, server_id=draw(_u32), seq_no=draw(_u64))
    if draw(st.booleans()):
        p.mysql_gtid_set = f"{UUID_A}:1-{draw(st.integers(1, 99))}"
    p.server_id = draw(_u32)
    p.ts_ms = draw(st.integers(0, 2**62))
    p.generation = draw(st.sampled_from([0, 0, 1, 2**32 - 1]))
    return p


@settings(max_examples=300, deadline=None)
@given(positions())
def test_format_parse_round_trip(p: pb.Position) -> None:
    text = format_position(p)
    if is_empty(p):
        assert text == "empty"
        return
    assert parse_position(text) == p


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5), st.integers(0, 50), st.integers(0, 3)), min_size=2))
def test_position_key_agrees_with_compare(coords: list[tuple[int, int, int]]) -> None:
    ps = [fpos(f, o, s) for f, o, s in coords]
    by_key = sorted(ps, key=position_key)
    by_cmp = sorted(ps, key=functools.cmp_to_key(compare))
    assert [position_key(p) for p in by_key] == [position_key(p) for p in by_cmp]
    assert by_key == sorted(ps, key=lambda p: (p.file_seq, p.offset, p.sub_seq))


_names = st.sampled_from(["", "mysql-bin.000042", "mysql-bin.000001", "x", "bin.7", "a.b.000042",
                          "mysql-bin.999999999999"])


@settings(max_examples=300, deadline=None)
@given(st.builds(pb.Position, file_seq=st.sampled_from([0, 1, 7, 42, 2**64 - 1]),
                 offset=st.sampled_from([0, 4, 4242, 2**64 - 1]), file_name=_names,
                 sub_seq=st.integers(0, 3),
                 gtids=st.lists(st.builds(pb.GtidPos, domain_id=st.integers(0, 3),
                                          server_id=st.integers(0, 2**32 - 1),
                                          seq_no=st.integers(0, 2**64 - 1)), max_size=3),
                 mysql_gtid_set=st.sampled_from(["", "3E11FA47-71CA-11E1-9E33-C80AA9429562:1-5",
                                                 " a:1 ,\n b:2"]),
                 server_id=st.integers(0, 3), ts_ms=st.sampled_from([0, 1_700_000_000_123]),
                 generation=st.integers(0, 2)) | st.none())
def test_format_position_writes_what_the_former_formatter_wrote(pos: pb.Position | None) -> None:
    """format_position (read once per Spark changelog transaction, so every field is read once)
    writes every position exactly as the former formatter (tests/support/pyposition.py) did."""
    from tests.support.pyposition import py_format_position
    assert format_position(pos) == py_format_position(pos)
    assert format_position(pos) == format_position(pos)   # the file-seq memo changes nothing
