"""The Python row-image decoder the capture used before its native core (native/, issue #23).

Kept only as the oracle of tests/unit/test_native_decode.py: the product decodes with
`sluice_native.RowDecoder` (capture/types.py), and these per-column decoders say what every
value must decode to. Same invariant as capture/types.py; not imported by the product.
"""
from __future__ import annotations

import json
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any

from pymysqlreplication.constants import FIELD_TYPE as FT

from sluice.capture.types import BinColumn, UndecodableRow
from sluice.proto import sluice_pb2 as pb

# A decoder reads one non-NULL value at buf[pos:], sets it into the Datum and returns the next pos.
Decoder = Callable[[bytes, int, pb.Datum], int]


_S8, _S16, _S32, _S64 = (struct.Struct(f) for f in ("<b", "<h", "<i", "<q"))
_U16, _U32, _U64 = (struct.Struct(f) for f in ("<H", "<I", "<Q"))
_F32, _F64 = struct.Struct("<f"), struct.Struct("<d")
_DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)
_from_bytes = int.from_bytes


# ------------------------------------------------------------------------------------------------
# integers and floating point
# ------------------------------------------------------------------------------------------------

def _int_decoder(st: struct.Struct, unsigned: bool) -> Decoder:
    unpack, n = st.unpack_from, st.size
    if unsigned:
        def dec(buf: bytes, pos: int, d: pb.Datum) -> int:
            d.uint = unpack(buf, pos)[0]
            return pos + n
    else:
        def dec(buf: bytes, pos: int, d: pb.Datum) -> int:
            d.int = unpack(buf, pos)[0]
            return pos + n
    return dec


def _u8(buf: bytes, pos: int, d: pb.Datum) -> int:
    d.uint = buf[pos]
    return pos + 1


def _int24(unsigned: bool) -> Decoder:
    if unsigned:
        def dec(buf: bytes, pos: int, d: pb.Datum) -> int:
            d.uint = _from_bytes(buf[pos:pos + 3], "little")
            return pos + 3
    else:
        def dec(buf: bytes, pos: int, d: pb.Datum) -> int:
            d.int = _from_bytes(buf[pos:pos + 3], "little", signed=True)
            return pos + 3
    return dec


def _float_decoder(st: struct.Struct) -> Decoder:
    unpack, n = st.unpack_from, st.size

    def dec(buf: bytes, pos: int, d: pb.Datum) -> int:
        # FLOAT travels as the exact float32 value widened to a double: writing it back into a
        # FLOAT column gives the same bits, which a decimal rounding could not promise.
        d.double = unpack(buf, pos)[0]
        return pos + n
    return dec


def _year(buf: bytes, pos: int, d: pb.Datum) -> int:
    b = buf[pos]
    d.int = b + 1900 if b else 0   # YEAR 0000 is stored as 0, not as 1900
    return pos + 1


# ------------------------------------------------------------------------------------------------
# decimals
# ------------------------------------------------------------------------------------------------

def _decimal_decoder(precision: int, scale: int) -> Decoder:
    intg = precision - scale
    intg0, intg0x = divmod(intg, 9)
    frac0, frac0x = divmod(scale, 9)
    lead = _DIG2BYTES[intg0x]
    tail = _DIG2BYTES[frac0x]
    size = lead + intg0 * 4 + frac0 * 4 + tail

    def dec(buf: bytes, pos: int, d: pb.Datum) -> int:
        raw = bytearray(buf[pos:pos + size])
        negative = not raw[0] & 0x80
        raw[0] ^= 0x80
        if negative:
            raw = bytearray(b ^ 0xFF for b in raw)
        p = lead
        ip = _from_bytes(raw[:lead], "big") if lead else 0
        for _ in range(intg0):
            ip = ip * 1_000_000_000 + _from_bytes(raw[p:p + 4], "big")
            p += 4
        text = f"-{ip}" if negative else str(ip)
        if scale:
            parts = []
            for _ in range(frac0):
                parts.append(f"{_from_bytes(raw[p:p + 4], 'big'):09d}")
                p += 4
            if tail:
                parts.append(f"{_from_bytes(raw[p:p + tail], 'big'):0{frac0x}d}")
            text += "." + "".join(parts)
        d.decimal = text
        return pos + size
    return dec


# ------------------------------------------------------------------------------------------------
# temporals
# ------------------------------------------------------------------------------------------------

def _frac_reader(fsp: int) -> tuple[int, int]:
    """(bytes, multiplier to microseconds) of the fractional part for a given precision."""
    n = (fsp + 1) // 2
    return n, (1, 10_000, 100, 1)[n]


def _date(buf: bytes, pos: int, d: pb.Datum) -> int:
    v = buf[pos] | buf[pos + 1] << 8 | buf[pos + 2] << 16
    dt = d.datetime
    dt.year, dt.month, dt.day = v >> 9, (v >> 5) & 15, v & 31
    return pos + 3


def _datetime2(fsp: int) -> Decoder:
    fn, mul = _frac_reader(fsp)

    def dec(buf: bytes, pos: int, d: pb.Datum) -> int:
        v = _from_bytes(buf[pos:pos + 5], "big") - 0x8000000000
        ymd, hms = v >> 17, v & 0x1FFFF
        ym = ymd >> 5
        dt = d.datetime
        dt.year, dt.month, dt.day = ym // 13, ym % 13, ymd & 31
        dt.hour, dt.minute, dt.second = hms >> 12, (hms >> 6) & 63, hms & 63
        if fn:
            dt.microsecond = _from_bytes(buf[pos + 5:pos + 5 + fn], "big") * mul
        # Setting a zero sub-message field still marks the oneof: '0000-00-00 00:00:00' stays a
        # datetime, never a NULL.
        return pos + 5 + fn
    return dec


def _timestamp2(fsp: int) -> Decoder:
    fn, mul = _frac_reader(fsp)
    gmtime = time.gmtime

    def dec(buf: bytes, pos: int, d: pb.Datum) -> int:
        secs = _from_bytes(buf[pos:pos + 4], "big")
        us = _from_bytes(buf[pos + 4:pos + 4 + fn], "big") * mul if fn else 0
        dt = d.datetime
        if secs or us:
            t = gmtime(secs)
            dt.year, dt.month, dt.day = t.tm_year, t.tm_mon, t.tm_mday
            dt.hour, dt.minute, dt.second, dt.microsecond = t.tm_hour, t.tm_min, t.tm_sec, us
        else:
            dt.SetInParent()   # the zero TIMESTAMP '0000-00-00 00:00:00'
        return pos + 4 + fn
    return dec


def _time2(fsp: int) -> Decoder:
    fn = (fsp + 1) // 2

    def dec(buf: bytes, pos: int, d: pb.Datum) -> int:
        # my_time_packed_from_binary: the integer part and the fraction form one signed number
        # (intpart << 24 | microseconds); a negative value with a fraction borrows from intpart.
        if fn == 3:
            packed = _from_bytes(buf[pos:pos + 6], "big") - 0x800000000000
        else:
            intpart = _from_bytes(buf[pos:pos + 3], "big") - 0x800000
            if fn == 0:
                frac = 0
            else:
                frac = _from_bytes(buf[pos + 3:pos + 3 + fn], "big")
                if intpart < 0 and frac:
                    intpart += 1
                    frac -= 0x100 if fn == 1 else 0x10000
                frac *= 10_000 if fn == 1 else 100
            packed = (intpart << 24) + frac
        t = d.time
        if packed < 0:
            t.negative = True
            packed = -packed
        hms, us = packed >> 24, packed & 0xFFFFFF
        t.hours, t.minutes, t.seconds, t.microseconds = (hms >> 12) & 0x3FF, (hms >> 6) & 63, hms & 63, us
        if not packed:
            t.SetInParent()
        return pos + 3 + fn
    return dec


def _legacy_datetime(buf: bytes, pos: int, d: pb.Datum) -> int:
    v = _U64.unpack_from(buf, pos)[0]
    date, tod = divmod(v, 1_000_000)
    dt = d.datetime
    dt.year, dt.month, dt.day = date // 10000, (date // 100) % 100, date % 100
    dt.hour, dt.minute, dt.second = tod // 10000, (tod // 100) % 100, tod % 100
    dt.SetInParent()
    return pos + 8


def _legacy_timestamp(buf: bytes, pos: int, d: pb.Datum) -> int:
    secs = _U32.unpack_from(buf, pos)[0]
    dt = d.datetime
    if secs:
        t = time.gmtime(secs)
        dt.year, dt.month, dt.day = t.tm_year, t.tm_mon, t.tm_mday
        dt.hour, dt.minute, dt.second = t.tm_hour, t.tm_min, t.tm_sec
    else:
        dt.SetInParent()
    return pos + 4


def _legacy_time(buf: bytes, pos: int, d: pb.Datum) -> int:
    v = _from_bytes(buf[pos:pos + 3], "little", signed=True)
    t = d.time
    if v < 0:
        t.negative, v = True, -v
    t.hours, t.minutes, t.seconds = v // 10000, (v // 100) % 100, v % 100
    t.SetInParent()
    return pos + 3


# ------------------------------------------------------------------------------------------------
# strings, blobs, enum/set, bit, json
# ------------------------------------------------------------------------------------------------

def _prefixed(length_size: int) -> Callable[[bytes, int], tuple[int, int]]:
    """Reader of a little-endian length prefix of `length_size` bytes: (length, start)."""
    if length_size == 1:
        return lambda buf, pos: (buf[pos], pos + 1)
    if length_size == 2:
        return lambda buf, pos: (buf[pos] | buf[pos + 1] << 8, pos + 2)
    return lambda buf, pos: (_from_bytes(buf[pos:pos + length_size], "little"), pos + length_size)


def _text_decoder(length_size: int, encoding: str, kind: str, where: str) -> Decoder:
    read_len = _prefixed(length_size)

    def dec(buf: bytes, pos: int, d: pb.Datum) -> int:
        n, start = read_len(buf, pos)
        end = start + n
        try:
            text = buf[start:end].decode(encoding)
        except UnicodeDecodeError as e:
            raise UndecodableRow(f"{where}: value is not valid {encoding}: {e}") from None
        setattr(d, kind, text)
        return end
    return dec


def _bytes_decoder(length_size: int, pad_to: int = 0) -> Decoder:
    read_len = _prefixed(length_size)

    def dec(buf: bytes, pos: int, d: pb.Datum) -> int:
        n, start = read_len(buf, pos)
        end = start + n
        v = buf[start:end]
        if pad_to and n < pad_to:
            # BINARY(n) is stored right-padded with 0x00 and logged with the padding stripped.
            v = v + b"\x00" * (pad_to - n)
        d.bytes = v
        return end
    return dec


def _enum_decoder(size: int, elements: Sequence[str]) -> Decoder:
    members = ("",) + tuple(elements)   # index 0 is the '' MySQL stores for an invalid value

    def dec(buf: bytes, pos: int, d: pb.Datum) -> int:
        i = buf[pos] if size == 1 else buf[pos] | buf[pos + 1] << 8
        d.str = members[i] if i < len(members) else ""
        return pos + size
    return dec


def _set_decoder(size: int, elements: Sequence[str]) -> Decoder:
    members = tuple(elements)

    def dec(buf: bytes, pos: int, d: pb.Datum) -> int:
        mask = _from_bytes(buf[pos:pos + size], "little")
        d.str = ",".join(m for i, m in enumerate(members) if mask >> i & 1)
        return pos + size
    return dec


def _bit_decoder(bits: int) -> Decoder:
    n = (bits + 7) // 8

    def dec(buf: bytes, pos: int, d: pb.Datum) -> int:
        d.bytes = buf[pos:pos + n]
        return pos + n
    return dec


def _mysql_json_decoder(length_size: int) -> Decoder:
    """MySQL's binary JSON (experimental: MariaDB stores JSON as text, see docs/capture.md)."""
    from pymysqlreplication.json_binary import parse_json
    read_len = _prefixed(length_size)

    def plain(v: object) -> object:
        if isinstance(v, bytes):
            return v.decode("utf-8", "replace")
        if isinstance(v, dict):
            return {plain(k): plain(x) for k, x in v.items()}
        if isinstance(v, list):
            return [plain(x) for x in v]
        return v

    def dec(buf: bytes, pos: int, d: pb.Datum) -> int:
        n, start = read_len(buf, pos)
        end = start + n
        raw = buf[start:end]
        d.json = json.dumps(plain(parse_json(raw[0], raw[1:])), separators=(",", ":"),
                            ensure_ascii=False) if n else "null"
        return end
    return dec


# ------------------------------------------------------------------------------------------------
# compile
# ------------------------------------------------------------------------------------------------

_INTS = {FT.TINY: (_S8, None), FT.SHORT: (_S16, _U16), FT.LONG: (_S32, _U32),
         FT.LONGLONG: (_S64, _U64)}


def compile_column(b: BinColumn, col: pb.ColumnInfo, encoding: str | None, where: str) -> Decoder:
    """The decoder of one column; `encoding` is the Python codec of a text column, None for binary."""
    t = b.type
    if t == FT.TINY:
        return _u8 if col.unsigned else _int_decoder(_S8, False)
    if t in _INTS:
        signed_st, unsigned_st = _INTS[t]
        return _int_decoder(unsigned_st if col.unsigned else signed_st, col.unsigned)
    if t == FT.INT24:
        return _int24(col.unsigned)
    if t == FT.FLOAT:
        return _float_decoder(_F32)
    if t == FT.DOUBLE:
        return _float_decoder(_F64)
    if t == FT.NEWDECIMAL:
        return _decimal_decoder(b.precision, b.decimals)
    if t == FT.YEAR:
        return _year
    if t == FT.DATE or t == FT.NEWDATE:
        return _date
    if t == FT.DATETIME2:
        return _datetime2(b.fsp)
    if t == FT.TIMESTAMP2:
        return _timestamp2(b.fsp)
    if t == FT.TIME2:
        return _time2(b.fsp)
    if t == FT.DATETIME:
        return _legacy_datetime
    if t == FT.TIMESTAMP:
        return _legacy_timestamp
    if t == FT.TIME:
        return _legacy_time
    if t in (FT.VARCHAR, FT.VAR_STRING, FT.STRING):
        ls = 2 if b.max_length > 255 else 1
        if encoding is None:
            return _bytes_decoder(ls, pad_to=b.max_length if t == FT.STRING else 0)
        return _text_decoder(ls, encoding, "json" if col.data_type == "json" else "str", where)
    if t == FT.BLOB:
        if encoding is None:
            return _bytes_decoder(b.length_size)
        return _text_decoder(b.length_size, encoding,
                             "json" if col.data_type == "json" else "str", where)
    if t == FT.ENUM:
        return _enum_decoder(b.size, col.elements)
    if t == FT.SET:
        return _set_decoder(b.size, col.elements)
    if t == FT.BIT:
        return _bit_decoder(b.bits)
    if t == FT.GEOMETRY:
        return _bytes_decoder(b.length_size)
    if t == FT.JSON:
        return _mysql_json_decoder(b.length_size)
    raise UndecodableRow(f"{where}: column type code {t} is not supported")


class RowDecoder:
    """Decodes the row images of one table shape (all columns, FULL row image)."""

    __slots__ = ("decoders", "ncols", "where")

    def __init__(self, decoders: list[Decoder], where: str) -> None:
        self.decoders = decoders
        self.ncols = len(decoders)
        self.where = where

    def check_present(self, bitmap: bytes, what: str) -> None:
        """FULL row image: every column present. Anything else would decode to wrong columns."""
        n = self.ncols
        full = bytes([0xFF]) * (n // 8) + (bytes([(1 << (n % 8)) - 1]) if n % 8 else b"")
        if bitmap != full:
            raise UndecodableRow(f"{self.where}: {what} row image does not hold every column "
                                 "(binlog_row_image must be FULL)")

    def row(self, buf: bytes, pos: int) -> tuple[pb.Row, int]:
        row = pb.Row()
        add = row.columns.add
        nb = (self.ncols + 7) >> 3
        nulls = buf[pos:pos + nb]
        pos += nb
        for i, dec in enumerate(self.decoders):
            d = add()
            if nulls[i >> 3] >> (i & 7) & 1:
                d.null = True
            else:
                pos = dec(buf, pos, d)
        return row, pos


# ------------------------------------------------------------------------------------------------
# the old capture path, for bench/capture.py's "old Python decode" column
# ------------------------------------------------------------------------------------------------

def old_rows(self: Any, ev: Any) -> None:
    """The Assembler's `_rows` as it was before the native core: per-row Python decoding into
    pb.RowChange objects (bound onto an Assembler by `use_python_decoder`)."""
    from sluice.capture.reader import UnknownTableId
    t = self._need_txn("rows")
    entry = self._maps.get(ev.table_id)
    if entry is None:
        raise UnknownTableId(ev.table_id, self.where())
    body = ev.data[ev.start:ev.end]
    t.size += len(body)
    if entry.info is None or entry.decoder is None:
        if self.tracker.filter.marks(entry.db, entry.table):
            t.marked = True
        return
    dec = entry.decoder
    if ev.number_of_columns != dec.ncols:
        raise UndecodableRow(f"{dec.where}: rows event has {ev.number_of_columns} columns")
    changes: list[pb.RowChange] = []
    pos, n = 0, len(body)
    row = dec.row
    if ev.tp == pb.UPDATE:
        dec.check_present(ev.present, "before")
        dec.check_present(ev.present2, "after")
        while pos < n:
            before, pos = row(body, pos)
            after, pos = row(body, pos)
            changes.append(pb.RowChange(tp=pb.UPDATE, before=before, after=after))
    elif ev.tp == pb.INSERT:
        dec.check_present(ev.present, "inserted")
        while pos < n:
            after, pos = row(body, pos)
            changes.append(pb.RowChange(tp=pb.INSERT, after=after))
    else:
        dec.check_present(ev.present, "deleted")
        while pos < n:
            before, pos = row(body, pos)
            changes.append(pb.RowChange(tp=pb.DELETE, before=before))
    if pos != n:
        raise UndecodableRow(f"{dec.where}: row images end at byte {pos} of {n}")
    muts = t.mutations
    if muts and muts[-1].table_id == entry.table_id:
        muts[-1].changes.extend(changes)
    else:
        muts.append(pb.TableMutation(table_id=entry.table_id, schema_name=entry.db,
                                     table_name=entry.table, table_version=entry.info.version,
                                     changes=changes))


def python_decode_tracker(source: str, table_filter: Any) -> Any:
    """A SchemaTracker whose entries carry the old Python RowDecoder (same shapes, same ids)."""
    import dataclasses as _dc

    from sluice.capture.schema import SchemaTracker, map_columns

    class _Tracker(SchemaTracker):
        def __init__(self) -> None:
            super().__init__(source, table_filter)
            self._py: dict[int, tuple[Any, RowDecoder]] = {}

        def on_table_map(self, event: Any, version: int) -> Any:
            entry, declare = super().on_table_map(event, version)
            if entry.decoder is None:
                return entry, declare
            hit = self._py.get(id(entry.decoder))
            if hit is None or hit[0] is not entry.decoder:
                _, bins, encs, _ = map_columns(event)
                py = RowDecoder([compile_column(b, c, e, f"{entry.decoder.where}.{c.name}")
                                 for b, c, e in zip(bins, entry.info.columns, encs)], entry.decoder.where)
                hit = self._py[id(entry.decoder)] = (entry.decoder, py)
            return _dc.replace(entry, decoder=hit[1]), declare

    return _Tracker()


def use_python_decoder(reader: Any) -> None:
    """Make a BinlogReader decode rows with the old Python path (benchmarks only)."""
    import types as _types
    reader.assembler._rows = _types.MethodType(old_rows, reader.assembler)
