"""drainer/txn.py's former all-Python transaction join (`unframe` + `Txn.from_binlogs` before
native/src/txnjoin.rs, issue 23), kept only as the differential oracle of
tests/unit/test_native_txnjoin.py and the baseline of bench/drainer_read.py.

`py_join` returns what the native `join_binlogs` returns (start_ts, commit_ts, producer_id,
position bytes, snapshot bytes, joined prewrite value, part count, binlogs) or raises
CorruptTxn exactly as the former code did (reasons compared up to the protobuf library's own
decode-error detail)."""
from __future__ import annotations

from google.protobuf.message import DecodeError

from sluice.drainer.txn import CorruptTxn, Txn
from sluice.proto import sluice_pb2 as pb


def py_unframe(framed: bytes, pump_id: str = "", commit_ts: int | None = None) -> list[bytes]:
    try:
        binlogs = list(pb.DrainerPullResp.FromString(framed).binlogs)
    except DecodeError as e:
        raise CorruptTxn(pump_id, None, commit_ts, f"unframable binlogs: {e}") from None
    if not binlogs:
        raise CorruptTxn(pump_id, None, commit_ts, "a transaction without binlogs")
    return binlogs


def py_join(prewrite_parts: list[bytes], commit: bytes, pump_id: str) -> tuple:
    c = pb.Binlog()
    try:
        c.ParseFromString(commit)
    except DecodeError as e:
        raise CorruptTxn(pump_id, None, None, f"undecodable commit binlog: {e}") from None
    start_ts, commit_ts = c.start_ts, c.commit_ts
    if c.tp != pb.COMMIT:
        raise CorruptTxn(pump_id, start_ts, commit_ts,
                         f"expected a COMMIT binlog, got {_name(c.tp)}")
    if not prewrite_parts:
        raise CorruptTxn(pump_id, start_ts, commit_ts, "no prewrite binlog")
    parts: dict[int, pb.Binlog] = {}
    count = 0
    for i, raw in enumerate(prewrite_parts):
        p = pb.Binlog()
        try:
            p.ParseFromString(raw)
        except DecodeError as e:
            raise CorruptTxn(pump_id, start_ts, commit_ts,
                             f"undecodable prewrite binlog #{i}: {e}") from None
        if p.tp != pb.PREWRITE or p.start_ts != start_ts:
            raise CorruptTxn(pump_id, start_ts, commit_ts,
                             f"binlog #{i} is {_name(p.tp)} start_ts {p.start_ts}, "
                             f"not a prewrite of this transaction")
        n = max(1, p.part_count)
        if count and n != count:
            raise CorruptTxn(pump_id, start_ts, commit_ts,
                             f"prewrite parts disagree on part_count ({count} vs {n})")
        count = n
        if p.part_no >= n:
            raise CorruptTxn(pump_id, start_ts, commit_ts,
                             f"prewrite part_no {p.part_no} >= part_count {n}")
        seen = parts.get(p.part_no)
        if seen is not None and seen.prewrite_value != p.prewrite_value:
            raise CorruptTxn(pump_id, start_ts, commit_ts,
                             f"two different prewrite parts numbered {p.part_no}")
        parts[p.part_no] = p
    missing = [i for i in range(count) if i not in parts]
    if missing:
        raise CorruptTxn(pump_id, start_ts, commit_ts,
                         f"missing prewrite part(s) {missing} of {count}")
    ordered = [parts[i] for i in range(count)]
    joined = b"".join(p.prewrite_value for p in ordered)
    first = ordered[0]
    position = (c.position if c.HasField("position")
                else first.position if first.HasField("position") else None)
    snapshot = (c.snapshot if c.HasField("snapshot")
                else first.snapshot if first.HasField("snapshot") else None)
    return (start_ts, commit_ts, c.producer_id or first.producer_id,
            None if position is None else position.SerializeToString(),
            None if snapshot is None else snapshot.SerializeToString(),
            joined, count, len(prewrite_parts) + 1)


def py_from_framed(framed: bytes, pump_id: str, commit_ts: int | None = None) -> tuple[Txn, int]:
    """The former syncer step: unframe, then join (the prewrite value parsed by upb)."""
    payload = py_unframe(framed, pump_id, commit_ts)
    joined = py_join(payload[:-1], payload[-1], pump_id)
    return py_txn(joined, pump_id), len(payload)


def py_txn(joined: tuple, pump_id: str) -> Txn:
    """The former Txn._joined: the prewrite value parsed by upb at the join (a DecodeError is
    CorruptTxn), then the position and snapshot."""
    start_ts, commit_ts, producer_id, pos, snap, payload, count = joined[:7]
    try:
        value = pb.PrewriteValue.FromString(payload)
    except DecodeError as e:
        raise CorruptTxn(pump_id, start_ts, commit_ts,
                         f"undecodable prewrite value ({count} part(s)): {e}") from None
    try:
        position = None if pos is None else pb.Position.FromString(pos)
        snapshot = None if snap is None else pb.SnapshotProgress.FromString(snap)
    except DecodeError as e:
        raise CorruptTxn(pump_id, start_ts, commit_ts,
                         f"undecodable position or snapshot of a binlog: {e}") from None
    return Txn(commit_ts, start_ts, producer_id, position, value, snapshot, pump_id)


def _name(tp: int) -> str:
    # The former code called BinlogType.Name, which raises ValueError for a number the enum
    # does not know (a crash, not CorruptTxn); the native join names it "type <n>".
    try:
        return pb.BinlogType.Name(tp)
    except ValueError:
        return f"type {tp}"


def py_commit_position(framed: bytes) -> tuple[str, pb.Position | None]:
    """The reader's former look at a positioned packed entry: unframe, parse the COMMIT, its
    producer and position (as a message) when it has one."""
    c = pb.Binlog.FromString(py_unframe(framed)[-1])
    if c.HasField("position"):
        return c.producer_id, c.position
    return c.producer_id, None
