"""Index key layout and value encodings."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as hst

from sluice.proto import sluice_pb2 as pb
from sluice.pump.storage import index as ix

_ts = hst.integers(min_value=1, max_value=(1 << 63) - 1)
_tp = hst.sampled_from([pb.PREWRITE, pb.COMMIT, pb.ROLLBACK, pb.FAKE])
_part = hst.integers(min_value=0, max_value=(1 << 32) - 1)


@given(hst.lists(hst.tuples(_ts, _tp, _part), min_size=2, max_size=50, unique=True))
def test_entry_keys_sort_by_ts_then_type_then_part(entries: list[tuple[int, int, int]]) -> None:
    """Entry keys sort by (ts, type, part_no), big-endian, so that a range scan of the commit
    keyspace is commit order, and a rollback and the parts of a multi-part prewrite of one
    start_ts never collide."""
    keys = {ix.entry_key(ix.E, *e): e for e in entries}
    assert len(keys) == len(entries), "distinct (ts, type, part) never collide"
    assert [keys[k] for k in sorted(keys)] == sorted(entries)
    for k, e in keys.items():
        assert ix.parse_entry_key(k) == (ix.E, *e)


def test_range_scan_bounds_cover_exactly_one_ts_range() -> None:
    inside = ix.entry_key(ix.E, 10, pb.FAKE, 7)
    assert ix.ts_key(ix.E, 10) <= ix.entry_key(ix.E, 10, pb.PREWRITE, 0) <= inside \
        < ix.ts_key(ix.E, 11)
    assert ix.ts_key(ix.E, 1 << 40) < ix.ts_key(ix.S, 0), "keyspaces do not interleave"


def test_value_encodings_round_trip() -> None:
    v = ix.entry_val_pack(3, 1 << 40, 1234, b"12345678", 99)
    assert ix.parse_entry(v) == ix.Entry(3, 1 << 40, 1234, b"12345678", 99)
    assert ix.parse_unresolved(ix.unresolved_val(4, 1700000000000, (1, -2), "cap-1")) == \
        (4, 1700000000000, (1, -2), "cap-1")
    assert ix.parse_producer_val(ix.producer_val(7, None, b"")) == (7, None, b"")
    assert ix.parse_producer_val(ix.producer_val(0, b"pos", None)) == (0, b"pos", None)
    c = ix.commit_val_pack(3, 1 << 40, 1234, b"12345678", 99, 2, 77, 1000)
    assert len(c) == ix.COMMIT_VAL_SIZE and ix.parse_entry(c[:ix.ENTRY_VAL_SIZE]) == \
        ix.Entry(3, 1 << 40, 1234, b"12345678", 99)
    assert ix.commit_val_unpack(c)[5:] == (2, 77, 1000)
    assert ix.parse_pin(ix.pin_key(-5, 55), ix.pin_val(frozenset({3, 1}))) == \
        (-5, 55, frozenset({1, 3}))
    # the first layout: k table_id -> commit_ts | segments
    legacy_key = b"k" + (7).to_bytes(8, "big")
    legacy_val = (55).to_bytes(8, "big") + (1).to_bytes(4, "big") + (3).to_bytes(4, "big")
    assert ix.parse_pin(legacy_key, legacy_val) == (7, 55, frozenset({1, 3}))
    assert ix.parse_seg_key(ix.seg_key(12)) == 12
    assert ix.parse_summary(ix.summary_val(5, 6)) == (5, 6)
