"""MySQL/MariaDB row-image values -> pb.Datum, decoded natively (native/, `sluice_native`).

Invariant: every value MySQL/MariaDB can store decodes to the Datum that `core.rowcodec` maps back
to the same value (extremes, exact decimals, zero dates and parts, long and negative TIME, YEAR
0000, empty SET, NULL) — nothing is turned into NULL or approximated on the way.

Python keeps the policy (`native_spec`, the FULL-image and column-count checks, `UndecodableRow`);
why not mysql-replication's values and what the native core does: docs/capture.md ("Values").
"""
from __future__ import annotations

import codecs
import dataclasses
import json
from collections.abc import Callable
from typing import Any

from pymysqlreplication.constants import FIELD_TYPE as FT

from sluice.core.errors import InvalidArgument
from sluice.proto import sluice_pb2 as pb

try:
    import sluice_native
except ImportError as e:   # pragma: no cover - an install without the native build
    raise ImportError("the native core sluice_native is not built: run ./install.sh (it needs "
                      f"cargo, the Rust toolchain): {e}") from e

# A Python column decoder the native loop calls: (event body, pos) -> (Datum bytes, next pos).
PyColumn = Callable[[bytes, int], tuple[bytes, int]]
Spec = tuple[Any, ...]

NATIVE_CHARSETS = frozenset({"utf-8", "cp1252", "ascii"})


class UndecodableRow(InvalidArgument):
    """A row image that does not match its TableMap: never skipped, the capture stops."""


@dataclasses.dataclass(frozen=True, slots=True)
class BinColumn:
    """What the TableMap says about one column's binary layout (type code + metadata)."""

    type: int
    max_length: int = 0       # VARCHAR / CHAR: bytes
    size: int = 0             # ENUM / SET: bytes of the value
    length_size: int = 0      # BLOB / GEOMETRY / JSON: bytes of the length prefix
    fsp: int = 0              # TIME2 / DATETIME2 / TIMESTAMP2
    precision: int = 0        # NEWDECIMAL
    decimals: int = 0
    bits: int = 0             # BIT: total bits


# ------------------------------------------------------------------------------------------------
# the columns still decoded in Python
# ------------------------------------------------------------------------------------------------

def _read_len(buf: bytes, pos: int, length_size: int) -> tuple[int, int]:
    end = pos + length_size
    if end > len(buf):
        raise UndecodableRow(f"length prefix at byte {pos} runs past the row image ({len(buf)} bytes)")
    return int.from_bytes(buf[pos:end], "little"), end


def _text_column(length_size: int, encoding: str, kind: str, where: str) -> PyColumn:
    """Text in a character set the native core does not decode (gbk, ucs2, ...)."""
    def dec(buf: bytes, pos: int) -> tuple[bytes, int]:
        n, start = _read_len(buf, pos, length_size)
        end = start + n
        if end > len(buf):
            raise UndecodableRow(f"{where}: value at byte {start} runs past the row image")
        try:
            text = buf[start:end].decode(encoding)
        except UnicodeDecodeError as e:
            raise UndecodableRow(f"{where}: value is not valid {encoding}: {e}") from None
        d = pb.Datum()
        setattr(d, kind, text)
        return d.SerializeToString(), end
    return dec


def _mysql_json_column(length_size: int, where: str) -> PyColumn:
    """MySQL's binary JSON (experimental: MariaDB stores JSON as text, see docs/capture.md)."""
    from pymysqlreplication.json_binary import parse_json

    def plain(v: object) -> object:
        if isinstance(v, bytes):
            return v.decode("utf-8", "replace")
        if isinstance(v, dict):
            return {plain(k): plain(x) for k, x in v.items()}
        if isinstance(v, list):
            return [plain(x) for x in v]
        return v

    def dec(buf: bytes, pos: int) -> tuple[bytes, int]:
        n, start = _read_len(buf, pos, length_size)
        end = start + n
        if end > len(buf):
            raise UndecodableRow(f"{where}: value at byte {start} runs past the row image")
        raw = buf[start:end]
        text = json.dumps(plain(parse_json(raw[0], raw[1:])), separators=(",", ":"),
                          ensure_ascii=False) if n else "null"
        return pb.Datum(json=text).SerializeToString(), end
    return dec


# ------------------------------------------------------------------------------------------------
# compile
# ------------------------------------------------------------------------------------------------

_INT_SIZES = {FT.TINY: 1, FT.SHORT: 2, FT.INT24: 3, FT.LONG: 4, FT.LONGLONG: 8}
_TEMPORAL = {FT.DATETIME2: "datetime2", FT.TIMESTAMP2: "timestamp2", FT.TIME2: "time2"}
_LEGACY = {FT.DATETIME: "datetime", FT.TIMESTAMP: "timestamp", FT.TIME: "time"}


def _text_spec(name: str, length_size: int, encoding: str, col: pb.ColumnInfo, where: str) -> Spec:
    kind = "json" if col.data_type == "json" else "str"
    codec = codecs.lookup(encoding).name
    if codec in NATIVE_CHARSETS:
        return (name, "text", length_size, codec, kind == "json")
    return (name, "py", _text_column(length_size, encoding, kind, where))


def native_spec(b: BinColumn, col: pb.ColumnInfo, encoding: str | None, where: str) -> Spec:
    """The native core's spec of one column (see native/src/lib.rs `RowDecoder::new`);
    `encoding` is the Python codec of a text column, None for binary."""
    t, name = b.type, col.name
    if t in _INT_SIZES:
        return (name, "int", _INT_SIZES[t], bool(col.unsigned))
    if t == FT.FLOAT:
        # FLOAT travels as the exact float32 value widened to a double: writing it back into a
        # FLOAT column gives the same bits, which a decimal rounding could not promise.
        return (name, "float")
    if t == FT.DOUBLE:
        return (name, "double")
    if t == FT.NEWDECIMAL:
        return (name, "decimal", b.precision, b.decimals)
    if t == FT.YEAR:
        return (name, "year")
    if t == FT.DATE or t == FT.NEWDATE:
        return (name, "date")
    if t in _TEMPORAL:
        return (name, _TEMPORAL[t], b.fsp)
    if t in _LEGACY:
        return (name, _LEGACY[t])
    if t in (FT.VARCHAR, FT.VAR_STRING, FT.STRING):
        ls = 2 if b.max_length > 255 else 1
        if encoding is None:
            # BINARY(n) is stored right-padded with 0x00 and logged with the padding stripped.
            return (name, "bytes", ls, b.max_length if t == FT.STRING else 0)
        return _text_spec(name, ls, encoding, col, where)
    if t == FT.BLOB:
        if encoding is None:
            return (name, "bytes", b.length_size, 0)
        return _text_spec(name, b.length_size, encoding, col, where)
    if t == FT.ENUM:
        return (name, "enum", b.size, list(col.elements))
    if t == FT.SET:
        return (name, "set", b.size, list(col.elements))
    if t == FT.BIT:
        return (name, "bit", b.bits)
    if t == FT.GEOMETRY:
        return (name, "bytes", b.length_size, 0)
    if t == FT.JSON:
        return (name, "py", _mysql_json_column(b.length_size, where))
    raise UndecodableRow(f"{where}: column type code {t} is not supported")


class RowDecoder:
    """Decodes the row images of one table shape (all columns, FULL row image)."""

    __slots__ = ("native", "ncols", "where", "_full")

    def __init__(self, specs: list[Spec], where: str) -> None:
        try:
            self.native = sluice_native.RowDecoder(specs)
        except ValueError as e:
            raise UndecodableRow(f"{where}: {e}") from None
        self.ncols = len(specs)
        self.where = where
        n = self.ncols
        self._full = bytes([0xFF]) * (n // 8) + (bytes([(1 << (n % 8)) - 1]) if n % 8 else b"")

    def check_present(self, bitmap: bytes, what: str) -> None:
        """FULL row image: every column present. Anything else would decode to wrong columns."""
        if bitmap != self._full:
            raise UndecodableRow(f"{self.where}: {what} row image does not hold every column "
                                 "(binlog_row_image must be FULL)")

    def decode(self, data: bytes, tp: int, start: int = 0, end: int | None = None) -> tuple[bytes, int]:
        """The row images of one rows event (`data[start:end]`: the event's packet, read in
        place) -> (bytes of `repeated RowChange`, i.e. what `TableMutation.MergeFromString`
        appends to its changes; number of changes).
        `tp` is pb.INSERT (after images), pb.UPDATE (before/after pairs) or pb.DELETE."""
        try:
            return self.native.decode(data, tp, start, end)
        except sluice_native.DecodeError as e:
            raise UndecodableRow(f"{self.where}: {e}") from None
