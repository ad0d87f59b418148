"""Whether a multi-part prewrite's parts, joined in part order, form a valid PrewriteValue.

Invariant kept here: the check reads the value as a stream over the stored parts and holds at
most one bounded batch of it in memory (`_BATCH` bytes, or one row change if that is larger), so
a 200 MiB transaction is checked without a 200 MiB buffer. Every message is parsed by the
generated parser: small top-level fields whole, a table mutation whole when it is at most
`_BATCH` bytes, and a bigger one as batches of its row changes (repeated field 5 entries,
concatenated, are themselves a valid TableMutation encoding).
"""
from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.message import DecodeError

from sluice.proto import sluice_pb2 as pb

from .schema import _MAX_SCHEMA_MESSAGE, ReadAt, _prewrite_value_range, _Stream

_MUTATIONS, _DDL, _SNAPSHOTS, _SOURCE = 2, 3, 4, 5           # PrewriteValue fields
_CHANGES = 5                                                 # TableMutation.changes
_BATCH = 16 << 20
_TOP_LEVEL = {_DDL: pb.DDL, _SNAPSHOTS: pb.TableInfo, _SOURCE: pb.SourceInfo}


class _Counted:
    """A _Stream with a count of the bytes consumed (cheap bounds for nested messages)."""

    def __init__(self, stream: _Stream) -> None:
        self.s, self.n = stream, 0

    def read(self, k: int) -> bytes:
        self.n += k
        return self.s.read(k)

    def skip(self, k: int) -> None:
        self.n += k
        self.s.skip(k)

    def varint(self) -> tuple[int, bytes]:
        raw = bytearray()
        result = shift = 0
        while True:
            b = self.s.read(1)[0]
            raw.append(b)
            result |= (b & 0x7F) << shift
            if b < 0x80:
                self.n += len(raw)
                return result, bytes(raw)
            shift += 7
            if shift > 63:
                raise ValueError("varint too long")

    def skip_field(self, wire: int) -> None:
        if wire == 0:
            self.varint()
        elif wire == 1:
            self.skip(8)
        elif wire == 2:
            self.skip(self.varint()[0])
        elif wire == 5:
            self.skip(4)
        else:
            raise ValueError(f"wire type {wire}")


def _check_mutation(c: _Counted, length: int) -> None:
    if length <= _BATCH:
        pb.TableMutation.FromString(c.read(length))
        return
    end = c.n + length
    batch = bytearray()
    while c.n < end:
        tag, raw_tag = c.varint()
        if tag >> 3 == 0:
            raise ValueError("field number 0")
        wire = tag & 7
        if wire == 2:
            n, raw_n = c.varint()
            if c.n + n > end:
                raise ValueError("field runs past its table mutation")
            batch += raw_tag + raw_n + c.read(n)
        elif wire == 0:
            batch += raw_tag + c.varint()[1]
        elif wire == 1:
            batch += raw_tag + c.read(8)
        elif wire == 5:
            batch += raw_tag + c.read(4)
        else:
            raise ValueError(f"wire type {wire} in a table mutation")
        if len(batch) >= _BATCH:
            pb.TableMutation.FromString(bytes(batch))
            batch.clear()
    if c.n != end:
        raise ValueError("table mutation length does not match its fields")
    pb.TableMutation.FromString(bytes(batch))


def check_multipart_value(parts: Sequence[tuple[ReadAt, int]]) -> None:
    """Raise ValueError (or DecodeError) unless the parts' prewrite values, joined in part
    order, parse as a PrewriteValue. `parts`: (read, length) of each part's serialized Binlog."""
    ranges = []
    for read, length in parts:
        start, n = _prewrite_value_range(read, length)
        ranges.append((read, start, n))
    stream = _Stream(ranges)
    c = _Counted(stream)
    scalars = bytearray()   # top-level varint/fixed fields, parsed together at the end
    while not stream.eof():
        tag, raw_tag = c.varint()
        field, wire = tag >> 3, tag & 7
        if field == 0:
            raise ValueError("field number 0")
        if wire == 2:
            n, _ = c.varint()
            if field == _MUTATIONS:
                _check_mutation(c, n)
            elif field in _TOP_LEVEL:
                if n > _MAX_SCHEMA_MESSAGE:
                    raise ValueError(f"field {field} of {n} bytes")
                _TOP_LEVEL[field].FromString(c.read(n))
            else:
                c.skip(n)    # an unknown field, as the parser would keep it
        elif wire == 0:
            scalars += raw_tag + c.varint()[1]
        elif wire in (1, 5):
            scalars += raw_tag + c.read(8 if wire == 1 else 4)
        else:
            raise ValueError(f"wire type {wire} in a top-level field")
    pb.PrewriteValue.FromString(bytes(scalars))


__all__ = ["check_multipart_value", "DecodeError"]
