"""A capture transaction's mutations as protobuf wire bytes (`RowsMutation`).

The native row decoder already returns each rows event's `repeated RowChange` as wire bytes;
a TableMutation is a few header fields in front of them and a PrewriteValue is its mutations,
DDL, schema snapshots and source info, each length-delimited. The PrewriteValue is built from
those bytes natively (native/src/pumpwrite.rs, `SourceTxn.prewrite_values`), not as message
trees that protobuf copies and serializes again, and keeps the payload's meaning exactly: it
decodes, field by field, to the message the protobuf classes build from the same parts
(tests/unit/test_capture_payload.py). Fields are written in field-number order with proto3
defaults omitted, as protobuf serializes them.
"""
from __future__ import annotations

from typing import Any

from sluice.core.wire import int_field as _int_field, len_field
from sluice.proto import sluice_pb2 as pb

__all__ = ["RowsMutation", "Mutation", "change_count"]

def _str_field(tag: int, s: str) -> bytes:
    return len_field(tag, s.encode()) if s else b""


# Header bytes of a table's mutations: the same for every transaction on that table (bounded: a
# shape change adds one).
_HEADS: dict[tuple[int, str, str, int], bytes] = {}
_MAX_CACHED = 1 << 14


def _cached(cache: dict[Any, bytes], key: Any, value: bytes) -> bytes:
    if len(cache) >= _MAX_CACHED:
        cache.clear()
    cache[key] = value
    return value


class RowsMutation:
    """One table's rows in a captured transaction, kept as the native decoder's wire bytes.

    Reads like pb.TableMutation (`table_id`, `schema_name`, `table_name`, `table_version`,
    `changes`); `changes` is parsed on first use only (snapshot windows and signal tables read
    it, the pump payload does not). Appended to only while its transaction is being assembled.
    """

    __slots__ = ("table_id", "schema_name", "table_name", "table_version", "count", "_parts",
                 "_message")

    def __init__(self, table_id: int, schema_name: str, table_name: str, table_version: int) -> None:
        self.table_id, self.schema_name = table_id, schema_name
        self.table_name, self.table_version = table_name, table_version
        self.count = 0                  # RowChanges in it
        self._parts: list[bytes] = []   # `repeated RowChange` (field 5) wire bytes, in order
        self._message: pb.TableMutation | None = None

    def add(self, changes: bytes, count: int) -> None:
        self._parts.append(changes)
        self.count += count
        self._message = None

    def SerializeToString(self) -> bytes:  # noqa: N802 - pb.TableMutation's spelling
        key = (self.table_id, self.schema_name, self.table_name, self.table_version)
        head = _HEADS.get(key)
        if head is None:
            head = _cached(_HEADS, key, b"".join((
                _int_field(0x08, self.table_id), _str_field(0x12, self.schema_name),
                _str_field(0x1A, self.table_name), _int_field(0x20, self.table_version))))
        parts = self._parts
        return head + parts[0] if len(parts) == 1 else head + b"".join(parts)

    def ByteSize(self) -> int:  # noqa: N802 - pb.TableMutation's spelling
        return len(self.SerializeToString())

    def message(self) -> pb.TableMutation:
        """The same mutation as a protobuf message (parsed once)."""
        m = self._message
        if m is None:
            m = self._message = pb.TableMutation.FromString(self.SerializeToString())
        return m

    @property
    def changes(self) -> Any:
        return self.message().changes

    def __repr__(self) -> str:
        return (f"RowsMutation({self.schema_name}.{self.table_name}, table_id={self.table_id}, "
                f"version={self.table_version}, {self.count} changes)")


Mutation = RowsMutation | pb.TableMutation
"""A transaction's mutation: native rows as wire bytes, or a message (snapshot chunks)."""


def change_count(m: Mutation) -> int:
    return m.count if type(m) is RowsMutation else len(m.changes)
