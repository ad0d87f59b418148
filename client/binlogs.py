"""A producer's binlogs (pb.Binlog) as protobuf wire bytes, built without message objects.

The capture writes two binlogs per source transaction (its Prewrite and its Commit) that differ
only in their first fields; building each as a message (a Position copied into it, serialized
again for the Commit) was a large part of its per-transaction CPU. Here a binlog is its
serialized bytes plus what the pumps client routes and checks by (`Encoded`); a prewrite keeps
the bytes of its fields 7..11 (producer, epoch, position, snapshot progress, ts_ms), which its
Commit repeats unchanged.

Fields are written in field-number order with proto3 defaults omitted, as protobuf serializes
them: the bytes equal `pb.Binlog(...).SerializeToString()` of the same fields
(tests/unit/test_client_binlogs.py, on torture positions and snapshot progress).
"""
from __future__ import annotations

from typing import NamedTuple

from sluice.core.wire import int_field, len_field
from sluice.proto import sluice_pb2 as pb

__all__ = ["Encoded", "encode", "identity", "tail", "prewrite", "commit", "commit_of",
           "position_bytes"]

# Keys of pb.Binlog's fields (field number << 3 | wire type).
_START_TS, _COMMIT_TS, _VALUE = 0x10, 0x18, 0x22
_PRODUCER, _EPOCH, _POSITION, _SNAPSHOT, _TS_MS = 0x3A, 0x40, 0x4A, 0x52, 0x58
_GENERATION = 0x48        # pb.Position.generation (field 9), its last field
_PREWRITE_HEAD = bytes((0x08, pb.PREWRITE))
_COMMIT_HEAD = bytes((0x08, pb.COMMIT))


class Encoded(NamedTuple):
    """One binlog as the pumps take it."""

    tp: int
    start_ts: int
    commit_ts: int
    raw: bytes               # the serialized pb.Binlog
    tail: bytes | None       # a prewrite's fields 7..11, which its Commit repeats (None: unknown)


def encode(b: pb.Binlog | Encoded) -> Encoded:
    """A message binlog as bytes (an Encoded one as it is)."""
    if type(b) is Encoded:
        return b
    return Encoded(b.tp, b.start_ts, b.commit_ts, b.SerializeToString(), None)  # type: ignore[union-attr]


def identity(producer_id: str, epoch: int) -> bytes:
    """Fields 7 and 8: the same for every binlog of one producer incarnation."""
    return (len_field(_PRODUCER, producer_id.encode()) if producer_id else b"") \
        + int_field(_EPOCH, epoch)


def tail(ident: bytes, position: bytes | None, snapshot: bytes | None, ts_ms: int) -> bytes:
    """Fields 7..11: `ident` from `identity`, then the serialized position and snapshot
    progress (None: the field is absent; b"": present and empty), then ts_ms."""
    out = ident
    if position is not None:
        out += len_field(_POSITION, position)
    if snapshot is not None:
        out += len_field(_SNAPSHOT, snapshot)
    return out + int_field(_TS_MS, ts_ms)


def prewrite(start_ts: int, value: bytes, tl: bytes) -> Encoded:
    """A single-part PREWRITE (the pumps client cuts one over max_binlog_size into parts)."""
    raw = _PREWRITE_HEAD + int_field(_START_TS, start_ts) \
        + (len_field(_VALUE, value) if value else b"") + tl
    return Encoded(pb.PREWRITE, start_ts, 0, raw, tl)


def commit(start_ts: int, commit_ts: int, tl: bytes) -> Encoded:
    raw = _COMMIT_HEAD + int_field(_START_TS, start_ts) + int_field(_COMMIT_TS, commit_ts) + tl
    return Encoded(pb.COMMIT, start_ts, commit_ts, raw, None)


def commit_of(p: Encoded, commit_ts: int) -> Encoded:
    """The COMMIT of prewrite `p`: its start_ts, producer, epoch, position, snapshot progress and
    ts_ms, with `commit_ts`."""
    if p.tail is not None:
        return commit(p.start_ts, commit_ts, p.tail)
    m = pb.Binlog.FromString(p.raw)
    return encode(pb.Binlog(tp=pb.COMMIT, start_ts=m.start_ts, commit_ts=commit_ts,
                            producer_id=m.producer_id, producer_epoch=m.producer_epoch,
                            position=m.position if m.HasField("position") else None,
                            snapshot=m.snapshot if m.HasField("snapshot") else None,
                            ts_ms=m.ts_ms))


def position_bytes(position: pb.Position, generation: int) -> bytes:
    """`position` serialized with `generation` stamped on it (0: as it is)."""
    if not generation:
        return position.SerializeToString()
    if not position.generation:
        # generation is Position's last field: appended, the bytes are what protobuf writes
        return position.SerializeToString() + int_field(_GENERATION, generation)
    stamped = pb.Position()
    stamped.CopyFrom(position)
    stamped.generation = generation
    return stamped.SerializeToString()
