"""MySQL's binary JSON column (experimental: MariaDB stores JSON as text) decodes to its JSON text.

The column images are built here by an encoder that follows MySQL's documented format
(sql/json_binary.h: type byte, then small objects/arrays with 2-byte counts, sizes and offsets,
inlined literals and 16-bit integers, variable-length string lengths), so the test states the
wire format, not the decoder's own reading of it."""
from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from pymysqlreplication.constants import FIELD_TYPE as FT

from sluice.capture.types import BinColumn, RowDecoder, native_spec
from sluice.proto import sluice_pb2 as pb

_SMALL_OBJ, _SMALL_ARR, _LITERAL, _INT16, _INT32, _INT64, _DOUBLE, _STRING = (
    0x00, 0x02, 0x04, 0x05, 0x07, 0x09, 0x0B, 0x0C)


def _varlen(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _scalar(v: Any) -> tuple[int, bytes, bool]:
    """(type, bytes, inlined in a small container's value entry)."""
    if v is None or isinstance(v, bool):
        return _LITERAL, struct.pack("<H", {None: 0, True: 1, False: 2}[v]), True
    if isinstance(v, int):
        if -2**15 <= v < 2**15:
            return _INT16, struct.pack("<h", v), True
        if -2**31 <= v < 2**31:
            return _INT32, struct.pack("<i", v), False
        return _INT64, struct.pack("<q", v), False
    if isinstance(v, float):
        return _DOUBLE, struct.pack("<d", v), False
    if isinstance(v, str):
        b = v.encode()
        return _STRING, _varlen(len(b)) + b, False
    if isinstance(v, list):
        return _SMALL_ARR, _container([], v), False
    return _SMALL_OBJ, _container(list(v), list(v.values())), False


def _container(keys: list[str], values: list[Any]) -> bytes:
    n = len(values)
    header = 4 + (4 * n if keys else 0) + 3 * n
    key_bytes = [k.encode() for k in keys]
    offset = header + sum(map(len, key_bytes))
    key_entries, value_entries, tail = b"", b"", b""
    pos = header
    for k in key_bytes:
        key_entries += struct.pack("<HH", pos, len(k))
        pos += len(k)
    for v in values:
        t, data, inline = _scalar(v)
        if inline:
            value_entries += bytes([t]) + data
        else:
            value_entries += bytes([t]) + struct.pack("<H", offset + len(tail))
            tail += data
    body = key_entries + value_entries + b"".join(key_bytes) + tail
    return struct.pack("<HH", n, 4 + len(body)) + body


def mysql_json(doc: Any) -> bytes:
    t, data, _ = _scalar(doc)
    if t == _LITERAL:
        data = data[:1]
    return bytes([t]) + data


def decode_one(raw: bytes) -> pb.Row:
    """One INSERT image of (j JSON, n INT) through the capture's row decoder: the JSON column is
    one of the Python columns the native loop calls, and the INT after it must still line up."""
    dec = RowDecoder([native_spec(BinColumn(type=FT.JSON, length_size=4),
                                  pb.ColumnInfo(name="j", data_type="json"), None, "t.j"),
                      native_spec(BinColumn(type=FT.LONG), pb.ColumnInfo(name="n", data_type="int"),
                                  None, "t.n")], "t")
    body = b"\x00" + struct.pack("<I", len(raw)) + raw + struct.pack("<i", -7)
    data, n = dec.decode(body, pb.INSERT)
    (change,) = pb.TableMutation.FromString(data).changes
    assert n == 1 and change.after.columns[1].int == -7
    return change.after


@pytest.mark.parametrize("doc", [
    {"a": 1, "b": [True, None, "x"], "c": {"d": -2.5, "big": 2**40}},
    [1, 70000, "ünï 🚀", {"k": False}],
    "just text", 12, None,
])
def test_mysql_binary_json_decodes_to_its_json_text(doc: Any) -> None:
    d = decode_one(mysql_json(doc)).columns[0]
    assert json.loads(d.json) == doc


def test_an_empty_mysql_json_value_is_json_null() -> None:
    assert decode_one(b"").columns[0].json == "null"
