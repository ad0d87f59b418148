"""The layout of a PullBinlogs response on the wire, which pumps write and drainers slice.

A response is `binlogs` (field 1, each binlog length-delimited: a transaction's bytes are its
binlogs framed so, which DrainerPullResp field 1 shares), then either `txns` (field 4, one
TxnMeta per transaction) or the packed arrays (fields 5..9), then `watermark` (2) and
`schema_only` (3). Pumps build responses from these encoders without protobuf; drainers check
and slice them with the same constants (proto/sluice.proto is the contract).
"""
from __future__ import annotations

import struct
import sys
from array import array

__all__ = ["FRAME_TAG", "PACKED_TAG", "F_TXN_COMMIT_TS", "F_TXN_START_TS", "F_TXN_END",
           "F_FAKE_INDEX", "F_POSITIONED_INDEX", "varint", "read_varint", "frame_head",
           "meta_head", "count_field", "txn_meta", "packed_meta", "tail", "trailing_fields",
           "len_field", "int_field"]

FRAME_TAG = 0x0A          # field 1 (binlogs), length-delimited: every transaction starts so
META_TAG = 0x22           # field 4 (txns), length-delimited TxnMeta
PACKED_TAG = 0x2A         # field 5 (txn_commit_ts): what a pump writes right after the binlogs
F_TXN_COMMIT_TS, F_TXN_START_TS, F_TXN_END, F_FAKE_INDEX, F_POSITIONED_INDEX = 5, 6, 7, 8, 9
_WATERMARK_TAG = b"\x10"  # field 2, varint
_SCHEMA_ONLY = b"\x18\x01"  # field 3 = true
_COUNT_FIELD = b"\xa0\x06"  # TxnMeta.binlog_count (field 100, varint)


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def len_field(tag: int, data: bytes) -> bytes:
    """A length-delimited field (`tag` is the whole one-byte key: field number << 3 | 2)."""
    n = len(data)
    return bytes((tag, n)) + data if n < 0x80 else bytes((tag,)) + varint(n) + data


# varint(n >> 7) by n >> 7, for int_field: consecutive timestamps (a group's start_ts and
# commit_ts) and repeated ones (its ts_ms) share their high varint bytes, and a Python varint
# of a 50-bit timestamp costs ~2.5x the lookup. Bounded; plain values, so no lock.
_HIGH: dict[int, bytes] = {}


def int_field(tag: int, n: int) -> bytes:
    """A varint field (`tag` the one-byte key: field number << 3 | 0; int64/uint32/uint64, a
    negative int64 as ten bytes); b"" for 0, which proto3 does not write."""
    if 0 < n < 0x80:
        return bytes((tag, n))
    if n < 0x4000:
        return bytes((tag,)) + varint(n & 0xFFFFFFFFFFFFFFFF) if n else b""
    hi = n >> 7
    h = _HIGH.get(hi)
    if h is None:
        if len(_HIGH) >= 4096:
            _HIGH.clear()
        h = _HIGH[hi] = varint(hi)
    return bytes((tag, n & 0x7F | 0x80)) + h


def read_varint(b: bytes, i: int) -> tuple[int, int]:
    """(value, offset after it) of the varint at b[i]; ValueError when it is truncated."""
    shift = n = 0
    while i < len(b):
        x = b[i]
        i += 1
        n |= (x & 0x7F) << shift
        shift += 7
        if x < 0x80:
            return n, i
    raise ValueError("truncated varint")


HEADS: dict[int, bytes] = {}          # frame_head cache (the pump's read loop reads it inline)
META_HEADS: dict[int, bytes] = {}     # meta_head cache


def frame_head(n: int) -> bytes:
    """Field 1 (length-delimited) header for an n-byte binlog."""
    head = HEADS.get(n)
    if head is None:
        head = bytes((FRAME_TAG,)) + varint(n)
        if len(HEADS) < 1 << 16:
            HEADS[n] = head
    return head


def meta_head(n: int) -> bytes:
    """Field 4 (txns) header for an n-byte TxnMeta."""
    head = META_HEADS.get(n)
    if head is None:
        head = bytes((META_TAG,)) + varint(n)
        if len(META_HEADS) < 1 << 12:
            META_HEADS[n] = head
    return head


_COUNTS = [_COUNT_FIELD + varint(n) for n in range(128)]


def count_field(n: int) -> bytes:
    return _COUNTS[n] if n < 128 else _COUNT_FIELD + varint(n)


def txn_meta(last: bytes, count: int) -> tuple[bytes, bytes, bytes]:
    """The framed TxnMeta of a transaction whose COMMIT (or FAKE) record is `last`: TxnMeta
    mirrors Binlog's field numbers, so the stored record is its body, plus the binlog count."""
    tail_ = count_field(count)
    return meta_head(len(last) + len(tail_)), last, tail_


_BIG_ENDIAN = sys.byteorder == "big"


def packed_meta(cts: list[int], sts: list[int], ends: list[int], fakes: list[int],
                positioned: list[int]) -> bytes:
    """Fields 5..9 (packed) for one response's entries; b"" when there are none."""
    n = len(cts)
    if not n:
        return b""
    if _BIG_ENDIAN:
        return _packed_meta_portable(cts, sts, ends, fakes, positioned)
    out = [b"\x2a", varint(8 * n), array("q", cts).tobytes(),
           b"\x32", varint(8 * n), array("q", sts).tobytes(),
           b"\x3a", varint(4 * n), array("I", ends).tobytes()]
    if fakes:
        out += (b"\x42", varint(4 * len(fakes)), array("I", fakes).tobytes())
    if positioned:
        out += (b"\x4a", varint(4 * len(positioned)), array("I", positioned).tobytes())
    return b"".join(out)


def _packed_meta_portable(cts: list[int], sts: list[int], ends: list[int], fakes: list[int],
                          positioned: list[int]) -> bytes:
    """packed_meta on a big-endian host (protobuf fixed-width fields are little-endian)."""
    def field(tag: bytes, fmt: str, values: list[int]) -> bytes:
        data = struct.pack(f"<{len(values)}{fmt}", *values)
        return tag + varint(len(data)) + data if values else b""
    return (field(b"\x2a", "q", cts) + field(b"\x32", "q", sts) + field(b"\x3a", "I", ends)
            + field(b"\x42", "I", fakes) + field(b"\x4a", "I", positioned))


def tail(watermark: int, schema_only: bool = False) -> bytes:
    """Fields 2 (watermark) and 3 (schema_only), which end a response."""
    out = _WATERMARK_TAG + varint(watermark & 0xFFFFFFFFFFFFFFFF) if watermark else b""
    return out + _SCHEMA_ONLY if schema_only else out


def trailing_fields(raw: bytes, start: int) -> tuple[dict[int, tuple[int, int]], int]:
    """The length-delimited fields from raw[start] on (the packed arrays after the binlogs):
    field number -> (offset, length), and the offset where they stop. ValueError: truncated."""
    fields: dict[int, tuple[int, int]] = {}
    i = start
    while i < len(raw) and raw[i] & 7 == 2:
        tag = raw[i] >> 3
        length, i = read_varint(raw, i + 1)
        fields[tag] = (i, length)
        i += length
    return fields, i
