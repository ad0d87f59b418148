"""The drainer's native transaction join (native/src/txnjoin.rs, through Txn.from_framed /
Txn.from_binlogs / unframe) against the all-Python join it replaced (tests/support/pyjoin.py).

Rule: for every transaction both give the same envelope — start_ts, commit_ts, producer, the
position and snapshot (the COMMIT's, else the first part's, as messages), the joined prewrite
value, part count and binlog count — or both refuse it as CorruptTxn naming the same pump,
start_ts and commit_ts with the same reason (up to the wire decoder's own detail after the
reason's colon). Malformed bytes (random, truncated, bit-flipped) are CorruptTxn, never a crash.
"""
from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sluice_native
from sluice.drainer.txn import CorruptTxn, Txn, frame, unframe
from sluice.proto import sluice_pb2 as pb
from tests.support import pyjoin

POS = pb.Position(file_seq=3, offset=120, file_name="mariadb-bin.000003",
                  gtids=[pb.GtidPos(domain_id=0, server_id=1, seq_no=42)])
SNAP = pb.SnapshotProgress(snapshot_id="s1", chunks_done=2)


def value(n: int = 3) -> bytes:
    return pb.PrewriteValue(
        schema_version=4, source=pb.SourceInfo(name="src", gtid="0-1-42"),
        mutations=[pb.TableMutation(table_id=10, schema_name="shop", table_name="orders",
                                    changes=[pb.RowChange(tp=pb.INSERT) for _ in range(n)])]
    ).SerializeToString()


def parts_of(raw: bytes, start_ts: int, parts: int, **kw) -> list[bytes]:
    size = max(1, -(-len(raw) // parts))
    return [pb.Binlog(tp=pb.PREWRITE, start_ts=start_ts, part_no=i,
                      part_count=parts if parts > 1 else 0,
                      prewrite_value=raw[i * size:(i + 1) * size], **kw).SerializeToString()
            for i in range(parts)]


def commit_of(start_ts: int, commit_ts: int, **kw) -> bytes:
    return pb.Binlog(tp=pb.COMMIT, start_ts=start_ts, commit_ts=commit_ts, **kw).SerializeToString()


def outcome(fn, *args):
    try:
        return "ok", fn(*args)
    except CorruptTxn as e:
        return "corrupt", (e.pump_id, e.start_ts, e.commit_ts, e.reason)


def native_join(prewrites: list[bytes], commit: bytes, pump_id: str) -> tuple:
    try:
        return sluice_native.join_binlogs(prewrites, commit)
    except sluice_native.TxnError as e:
        raise CorruptTxn(pump_id, *e.args) from None


def comparable(joined: tuple) -> tuple:
    st_, ct, producer, pos, snap, payload, count, n = joined[:8]   # [8]: the value's facts
    # Sub-messages compare as messages: the native join keeps their bytes as sent (repeated
    # occurrences concatenated), the former one re-serialized the merged message.
    return (st_, ct, producer, None if pos is None else pb.Position.FromString(pos),
            None if snap is None else pb.SnapshotProgress.FromString(snap), payload, count, n)


def same(prewrites: list[bytes], commit: bytes, pump_id: str = "pump-a") -> tuple:
    want = outcome(pyjoin.py_join, prewrites, commit, pump_id)
    got = outcome(native_join, prewrites, commit, pump_id)
    if want[0] == "ok":
        assert got[0] == "ok", got
        assert comparable(got[1]) == comparable(want[1])
    else:
        assert got[0] == "corrupt", got
        # same pump, start_ts, commit_ts and reason up to the decoder's detail
        assert got[1][:3] == want[1][:3]
        assert got[1][3].split(":")[0] == want[1][3].split(":")[0]
    # framed, through the drainer's own entry point
    framed = frame([*prewrites, commit])
    want_f = outcome(pyjoin.py_from_framed, framed, pump_id, 77)
    got_f = outcome(Txn.from_framed, framed, pump_id, 77)
    assert got_f[0] == want_f[0], (got_f, want_f)
    if got_f[0] == "ok":
        assert got_f[1] == want_f[1]
    else:
        assert got_f[1][:3] == want_f[1][:3]
        assert got_f[1][3].split(":")[0] == want_f[1][3].split(":")[0]
    return got


def test_valid_transactions_join_as_the_python_join_did():
    """Single and multi-part prewrites in any order (a retried part twice), position and
    snapshot on the COMMIT, on the first part only, on both or on neither, the producer from the
    COMMIT or else the first part, unknown fields, extreme timestamps."""
    raw = value(40)
    cases = [
        (parts_of(raw, 5, 1, producer_id="cap"), commit_of(5, 9, position=POS, snapshot=SNAP)),
        (parts_of(raw, 5, 1, producer_id="cap", position=POS), commit_of(5, 9)),
        (parts_of(raw, 5, 1, position=POS, snapshot=SNAP),
         commit_of(5, 9, producer_id="ü😀", position=pb.Position(file_seq=9))),
        (parts_of(b"", 5, 1), commit_of(5, 9)),
        (parts_of(raw, -(2**63), 1), commit_of(-(2**63), 2**63 - 1)),
    ]
    p4 = parts_of(raw, 100, 4, producer_id="cap-1", position=POS)
    cases.append(([p4[2], p4[0], p4[3], p4[1], p4[2]], commit_of(100, 105, snapshot=SNAP)))
    # unknown fields (varint, fixed64, fixed32, bytes, a group) and a repeated position merge
    extra = b"\xa0\x06\x01" + b"\xa9\x06" + b"\x00" * 8 + b"\xad\x06" + b"\x00" * 4 + b"\xb2\x06\x02hi" \
        + b"\xbb\x06\x08\x01\xbc\x06"
    twice = pb.Binlog(position=pb.Position(offset=7)).SerializeToString()
    cases.append(([parts_of(raw, 5, 1)[0] + extra], commit_of(5, 9, position=POS) + twice + extra))
    for prewrites, commit in cases:
        kind, got = same(prewrites, commit)
        assert kind == "ok"
    txn, n = Txn.from_framed(frame([*p4, commit_of(100, 105, snapshot=SNAP)]), "pump-a", 105)
    assert (txn.start_ts, txn.commit_ts, txn.producer_id, n) == (100, 105, "cap-1", 5)
    assert txn.position == POS and txn.snapshot == SNAP and txn.prewrite_bytes() == raw
    assert txn.prewrite == pb.PrewriteValue.FromString(raw)


def test_every_refusal_of_the_python_join_is_kept():
    """Each CorruptTxn of the former join, same pump/start_ts/commit_ts and reason."""
    raw = value(10)
    p3 = parts_of(raw, 7, 3)
    other_count = pb.Binlog(tp=pb.PREWRITE, start_ts=7, part_no=1, part_count=2).SerializeToString()
    dup = pb.Binlog(tp=pb.PREWRITE, start_ts=7, part_no=0, part_count=3,
                    prewrite_value=b"other").SerializeToString()
    beyond = pb.Binlog(tp=pb.PREWRITE, start_ts=7, part_no=5, part_count=3).SerializeToString()
    c = commit_of(7, 9)
    cases = {
        "undecodable commit binlog": (p3, b"\xff\xff\xff"),
        "expected a COMMIT binlog, got PREWRITE": (p3, p3[0]),
        "expected a COMMIT binlog, got type 9": (p3, pb.Binlog(tp=9, start_ts=7).SerializeToString()),
        "no prewrite binlog": ([], c),
        "undecodable prewrite binlog #1": ([p3[0], b"\xff\xff"], c),
        "binlog #0 is COMMIT start_ts 7, not a prewrite of this transaction": ([c], c),
        "binlog #0 is PREWRITE start_ts 8, not a prewrite of this transaction": (parts_of(raw, 8, 1), c),
        "prewrite parts disagree on part_count (3 vs 2)": ([p3[0], other_count], c),
        "prewrite part_no 5 >= part_count 3": ([p3[0], beyond], c),
        "two different prewrite parts numbered 0": ([p3[0], dup], c),
        "missing prewrite part(s) [1] of 3": ([p3[0], p3[2]], c),
        "missing prewrite part(s) [0, 2] of 3": ([p3[1]], c),
        "undecodable commit binlog: producer_id": (p3, c + b"\x3a\x02\xff\xfe"),
    }
    for reason, (prewrites, commit) in cases.items():
        kind, got = same(prewrites, commit)
        assert kind == "corrupt", reason
        assert got[3].startswith(reason), (reason, got)
    bad_value = parts_of(b"\xff" * 9, 7, 3)
    # the join itself answers; the value's refusal is its facts' place, made CorruptTxn by Txn
    assert same(bad_value, c)[0] == "ok"
    with pytest.raises(CorruptTxn, match=r"pump p \(start_ts 7, commit_ts 9\): undecodable prewrite value \(3 part"):
        Txn.from_binlogs(bad_value, c, "p")
    with pytest.raises(CorruptTxn, match=r"pump p \(start_ts \?, commit_ts 77\): unframable binlogs"):
        Txn.from_framed(b"\x0a\x05ab", "p", 77)
    with pytest.raises(CorruptTxn, match=r"commit_ts 77\): a transaction without binlogs"):
        Txn.from_framed(b"\x10\x01", "p", 77)
    with pytest.raises(CorruptTxn, match=r"pump p \(start_ts \?, commit_ts 5\): unframable binlogs"):
        unframe(b"\x0a", "p", 5)


def test_unframe_returns_the_framed_binlogs():
    binlogs = [b"", b"a", bytes(range(256)) * 3, b"\x00"]
    assert unframe(frame(binlogs)) == binlogs == pyjoin.py_unframe(frame(binlogs))
    # a watermark (field 2) and unknown fields around them are skipped, as the protobuf parser did
    framed = b"\x10\x05" + frame(binlogs) + b"\x1a\x01x"
    assert unframe(framed) == binlogs == pyjoin.py_unframe(framed)


def mutate(data: bytes, rnd: random.Random) -> bytes:
    b = bytearray(data)
    what = rnd.randrange(4)
    if what == 0 and b:
        b[rnd.randrange(len(b))] ^= 1 << rnd.randrange(8)
    elif what == 1:
        del b[rnd.randrange(len(b) + 1):]
    elif what == 2 and b:
        b[rnd.randrange(len(b))] = rnd.randrange(256)
    else:
        at = rnd.randrange(len(b) + 1)
        b[at:at] = rnd.randbytes(rnd.randrange(1, 6))
    return bytes(b)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=80), st.text(max_size=3))
def test_random_bytes_are_corrupt_txn_never_a_crash(data, pump):
    for fn in (lambda: Txn.from_framed(data, pump, 3), lambda: unframe(data, pump, 3),
               lambda: Txn.from_binlogs([data], commit_of(1, 2), pump),
               lambda: Txn.from_binlogs([parts_of(value(), 1, 1)[0]], data, pump)):
        try:
            fn()
        except CorruptTxn as e:
            assert e.pump_id == pump


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1))
def test_mutated_transactions_join_or_refuse_as_the_python_join_did(seed):
    """Bit flips, truncation, overwritten and inserted bytes in one binlog of a valid
    transaction: same envelope or both CorruptTxn with the same names. The native join checks a
    position/snapshot's wire form when it reads the binlog and parses the chosen one after the
    join, so a sub-message that is well-formed wire but not a valid message (bad UTF-8 in
    file_name, say) may be refused with another reason; the pair must still agree on refusing."""
    rnd = random.Random(seed)
    raw = value(rnd.randrange(1, 5))
    n = rnd.randrange(1, 4)
    prewrites = parts_of(raw, 11, n, producer_id="cap", position=POS if rnd.random() < 0.5 else None)
    commit = commit_of(11, 12, position=POS, snapshot=SNAP)
    binlogs = [*prewrites, commit]
    i = rnd.randrange(len(binlogs))
    binlogs[i] = mutate(binlogs[i], rnd)
    want = outcome(pyjoin.py_join, binlogs[:-1], binlogs[-1], "p")
    got = outcome(native_join, binlogs[:-1], binlogs[-1], "p")
    if want[0] == "ok" and got[0] == "ok":
        assert comparable(got[1]) == comparable(want[1])
        want_t = outcome(pyjoin.py_txn, want[1], "p")
        got_t = outcome(Txn._joined, got[1], "p")
        assert got_t[0] == want_t[0]
        if got_t[0] == "ok":
            assert got_t[1] == want_t[1]
        return
    if want[0] == "corrupt" and got[0] == "corrupt":
        assert got[1][:3] == want[1][:3], (got, want)
        return
    # One side refused: only for a position/snapshot that parses as wire but not as a message,
    # which the former join refused while reading the binlog and the native one when parsing it
    # (or never, when it is a part's sub-message the COMMIT's own one overrides).
    ok, bad = (got, want) if got[0] == "ok" else (want, got)
    assert "undecodable" in bad[1][3], (got, want)
    assert outcome(Txn._joined, ok[1], "p")[0] in ("ok", "corrupt")


def test_commit_position_reads_the_commit_as_the_python_reader_did():
    """The reader's look at a positioned packed entry: the COMMIT's producer and position."""
    raw = value(2)
    for commit in (commit_of(5, 9, producer_id="cap", position=POS), commit_of(5, 9, producer_id="cap"),
                   commit_of(5, 9, position=pb.Position()),
                   commit_of(5, 9, position=POS) + pb.Binlog(position=pb.Position(offset=1)).SerializeToString()):
        framed = frame([*parts_of(raw, 5, 2), commit])
        producer, pos = sluice_native.commit_position(framed)
        want_producer, want_pos = pyjoin.py_commit_position(framed)
        assert producer == want_producer
        assert (None if pos is None else pb.Position.FromString(pos)) == want_pos


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1))
def test_commit_position_of_malformed_bytes_is_a_value_error_or_the_python_answer(seed):
    """Malformed entries are refused (ValueError: the reader's "undecodable commit binlog"),
    never a crash; whenever both read one, they agree."""
    rnd = random.Random(seed)
    framed = mutate(frame([*parts_of(value(1), 5, 1), commit_of(5, 9, producer_id="c", position=POS)]), rnd)
    try:
        got = sluice_native.commit_position(framed)
    except ValueError:
        return
    try:
        want = pyjoin.py_commit_position(framed)
    except Exception:  # noqa: BLE001 - the former reader refused it (DecodeError / CorruptTxn)
        return
    assert got[0] == want[0]
    assert (None if got[1] is None else pb.Position.FromString(got[1])) == want[1]
