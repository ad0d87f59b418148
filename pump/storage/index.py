"""Index key and value layout (LevelDB via plyvel) for the pump's storage.

Invariant kept here: entry keys sort by (ts, type, part_no), big-endian, so that a range scan of the
commit keyspace is commit order, and a rollback and the parts of a multi-part prewrite of one
start_ts never collide.

Keyspaces (first byte):
    e | commit_ts(8) | type(1) | part_no(4)   COMMIT and FAKE entries, in commit order
    s | start_ts(8)  | type(1) | part_no(4)   PREWRITE parts and ROLLBACK entries
      value of an entry: segment(4) | offset(8) | length(4) | hash(8) | start_ts(8)
      a COMMIT of a single-part prewrite appends the prewrite's segment(4) | offset(8) |
      length(4), so commit-ordered reads join without an `s` lookup (32-byte COMMIT values,
      and every multi-part prewrite, are joined by an `s` prefix scan)
    t | start_ts(8)  -> state(1) | commit_ts(8) | hash(8) of the resolving binlog
    u | start_ts(8)  -> an unresolved prewrite: part_count(4) | wall_ms(8) | n_tables(4) |
                        table_id(8)* | producer_id (utf-8)
    g | segment(4)   -> segment summary: max_ts(8) | max_commit_ts_of_its_prewrites(8)
    k | table_id(8) | commit_ts(8) -> a schema pin: the value-log segments (4 each) of a
                        schema-bearing transaction, kept by GC (see gc.retained_pins)
    p | producer_id  -> epoch(8) | len(4) position | len(4) snapshot   (len 0xFFFFFFFF = none)
    m | name         -> metadata (format version, vlog end, watermark, max ts, gc ts)
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from sluice.proto import sluice_pb2 as pb

FORMAT_VERSION = 1

E, S, T, U, G, K, P, M = b"e", b"s", b"t", b"u", b"g", b"k", b"p", b"m"

TYPE_PREWRITE = pb.PREWRITE
TYPE_COMMIT = pb.COMMIT
TYPE_ROLLBACK = pb.ROLLBACK
TYPE_FAKE = pb.FAKE

META_VERSION = M + b"format_version"
META_VLOG_END = M + b"vlog_end"
META_WATERMARK = M + b"served_watermark"
META_MAX_TS = M + b"max_received_ts"
META_GC_TS = M + b"gc_ts"

_ENTRY_KEY = struct.Struct(">cQBI")
_TS_KEY = struct.Struct(">cQ")
_ENTRY_VAL = struct.Struct(">IQI8sq")
_COMMIT_VAL = struct.Struct(">IQI8sqIQI")
_PIN_KEY = struct.Struct(">cqq")
_TXN_VAL = struct.Struct(">Bq8s")
_U_HEAD = struct.Struct(">IqI")
_SEG_KEY = struct.Struct(">cI")
_SUMMARY = struct.Struct(">qq")
_LOC = struct.Struct(">IQ")
_Q = struct.Struct(">q")
_I = struct.Struct(">I")
_NONE = 0xFFFFFFFF

TXN_COMMITTED = pb.TXN_COMMITTED
TXN_ROLLED_BACK = pb.TXN_ROLLED_BACK

entry_key_pack = _ENTRY_KEY.pack
entry_val_pack = _ENTRY_VAL.pack
entry_val_unpack = _ENTRY_VAL.unpack_from   # COMMIT values may be longer (see above)
entry_val_unpack_from = _ENTRY_VAL.unpack_from
commit_val_pack = _COMMIT_VAL.pack
commit_val_unpack = _COMMIT_VAL.unpack
ENTRY_VAL_SIZE = _ENTRY_VAL.size
COMMIT_VAL_SIZE = _COMMIT_VAL.size
txn_val_pack = _TXN_VAL.pack
txn_val_unpack = _TXN_VAL.unpack


def entry_key(prefix: bytes, ts: int, tp: int, part_no: int = 0) -> bytes:
    return _ENTRY_KEY.pack(prefix, ts, tp, part_no)


def parse_entry_key(key: bytes) -> tuple[bytes, int, int, int]:
    return _ENTRY_KEY.unpack(key)


def ts_key(prefix: bytes, ts: int) -> bytes:
    """The first key of `prefix` with ts >= `ts` (also the t/u key of a start_ts)."""
    return _TS_KEY.pack(prefix, ts)


def parse_ts_key(key: bytes) -> int:
    return _TS_KEY.unpack_from(key)[1]


@dataclass(frozen=True)
class Entry:
    segment: int
    offset: int
    length: int
    hash: bytes
    start_ts: int  # COMMIT entries: the transaction's start_ts (for the join); else 0


def parse_entry(value: bytes) -> Entry:
    return Entry(*_ENTRY_VAL.unpack_from(value))


def seg_key(segment: int) -> bytes:
    return _SEG_KEY.pack(G, segment)


def parse_seg_key(key: bytes) -> int:
    return _SEG_KEY.unpack(key)[1]


def summary_val(max_ts: int, max_need_ts: int) -> bytes:
    return _SUMMARY.pack(max_ts, max_need_ts)


def parse_summary(value: bytes) -> tuple[int, int]:
    return _SUMMARY.unpack(value)


def loc_val(segment: int, offset: int) -> bytes:
    return _LOC.pack(segment, offset)


def parse_loc(value: bytes) -> tuple[int, int]:
    return _LOC.unpack(value)


def int_val(v: int) -> bytes:
    return _Q.pack(v)


def parse_int(value: bytes | None, default: int = 0) -> int:
    return default if value is None else _Q.unpack(value)[0]


def pin_key(table_id: int, commit_ts: int) -> bytes:
    return _PIN_KEY.pack(K, table_id, commit_ts)


def parse_pin(key: bytes, value: bytes) -> tuple[int, int, frozenset[int]]:
    """(table_id, commit_ts, segments) of a `k` entry.

    Also reads the first layout (`k` table_id -> commit_ts | segments, one pin per table);
    recovery rewrites such entries in the current layout.
    """
    if len(key) == 1 + 8:
        table_id = _Q.unpack_from(key, 1)[0]
        commit_ts = _Q.unpack_from(value)[0]
        return table_id, commit_ts, _segments(value, 8)
    _, table_id, commit_ts = _PIN_KEY.unpack(key)
    return table_id, commit_ts, _segments(value, 0)


def pin_val(segments: frozenset[int]) -> bytes:
    return b"".join(_I.pack(s) for s in sorted(segments))


def _segments(value: bytes, pos: int) -> frozenset[int]:
    return frozenset(_I.unpack_from(value, pos + 4 * i)[0]
                     for i in range((len(value) - pos) // 4))


def unresolved_val(part_count: int, wall_ms: int, tables: tuple[int, ...], producer_id: str
                   ) -> bytes:
    head = _U_HEAD.pack(part_count, wall_ms, len(tables))
    if not tables:   # nearly every prewrite: one per transaction on the write path
        return head + producer_id.encode()
    return head + b"".join(_Q.pack(t) for t in tables) + producer_id.encode()


def parse_unresolved(value: bytes) -> tuple[int, int, tuple[int, ...], str]:
    part_count, wall_ms, n = _U_HEAD.unpack_from(value)
    pos = _U_HEAD.size
    tables = tuple(_Q.unpack_from(value, pos + 8 * i)[0] for i in range(n))
    return part_count, wall_ms, tables, value[pos + 8 * n:].decode()


def producer_key(producer_id: str) -> bytes:
    return P + producer_id.encode()


def producer_val(epoch: int, position: bytes | None, snapshot: bytes | None) -> bytes:
    out = [_Q.pack(epoch)]
    for blob in (position, snapshot):
        if blob is None:
            out.append(_I.pack(_NONE))
        else:
            out.append(_I.pack(len(blob)))
            out.append(blob)
    return b"".join(out)


def parse_producer_val(value: bytes) -> tuple[int, bytes | None, bytes | None]:
    epoch = _Q.unpack_from(value)[0]
    pos = 8
    blobs: list[bytes | None] = []
    for _ in range(2):
        n = _I.unpack_from(value, pos)[0]
        pos += 4
        if n == _NONE:
            blobs.append(None)
        else:
            blobs.append(value[pos:pos + n])
            pos += n
    return epoch, blobs[0], blobs[1]
