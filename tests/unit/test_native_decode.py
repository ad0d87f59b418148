"""The native row-image decoder (native/, `sluice_native`) against the Python decoder it replaced.

The oracle is the old all-Python decoder, kept in tests/support/pydecode.py. Row images are built
here from each type's documented binary layout (MySQL `decimal2bin`, `TIME2`/`DATETIME2`
packing, little-endian integers, length-prefixed strings), on the torture values of
tests/integration/test_capture_reader.py and on random rows (hypothesis); both decoders must
give equal RowChanges, or both refuse the image.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymysqlreplication.constants import FIELD_TYPE as FT

import sluice_native
from sluice.capture.types import BinColumn, RowDecoder, UndecodableRow, native_spec
from sluice.proto import sluice_pb2 as pb
from tests.support import pydecode

_DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)


@dataclass
class Col:
    name: str
    b: BinColumn
    info: pb.ColumnInfo
    enc: str | None = None


def col(name: str, t: int, data_type: str, enc: str | None = None, unsigned: bool = False,
        elements: tuple[str, ...] = (), **bin_args: Any) -> Col:
    return Col(name, BinColumn(type=t, **bin_args),
               pb.ColumnInfo(name=name, data_type=data_type, unsigned=unsigned, elements=elements), enc)


# ------------------------------------------------------------------------------------------------
# encoders: values -> row image bytes, by the documented layouts
# ------------------------------------------------------------------------------------------------

def enc_decimal(text: str, precision: int, scale: int) -> bytes:
    neg = text.startswith("-")
    ip, _, fp = text.lstrip("-").partition(".")
    fp = (fp + "0" * scale)[:scale]
    intg = precision - scale
    intg0, intg0x = divmod(intg, 9)
    frac0, frac0x = divmod(scale, 9)
    ipv = int(ip)
    out = bytearray()
    if intg0x:
        out += (ipv // 10 ** (9 * intg0)).to_bytes(_DIG2BYTES[intg0x], "big")
    for k in range(intg0):
        out += (ipv // 10 ** (9 * (intg0 - 1 - k)) % 10**9).to_bytes(4, "big")
    for k in range(frac0):
        out += int(fp[9 * k:9 * k + 9]).to_bytes(4, "big")
    if frac0x:
        out += int(fp[9 * frac0:]).to_bytes(_DIG2BYTES[frac0x], "big")
    if neg:
        out = bytearray(b ^ 0xFF for b in out)
    out[0] ^= 0x80
    return bytes(out)


def enc_time2(neg: bool, h: int, m: int, s: int, us: int, fsp: int) -> bytes:
    """my_time_packed_to_binary: the integer part is `packed >> 24` (floor), the fraction C's
    truncated remainder, so a negative value with a fraction stores a borrowed second."""
    fn = (fsp + 1) // 2
    us -= us % 10 ** (6 - fsp)
    packed = ((h << 12 | m << 6 | s) << 24) + us
    if neg:
        packed = -packed
    if fn == 3:
        return (packed + 0x800000000000).to_bytes(6, "big")
    out = ((packed >> 24) + 0x800000).to_bytes(3, "big")
    if fn:
        frac = abs(packed) % (1 << 24) // (10_000 if fn == 1 else 100)
        out += ((-frac if packed < 0 else frac) & (0xFF if fn == 1 else 0xFFFF)).to_bytes(fn, "big")
    return out


def enc_datetime2(y: int, mo: int, d: int, h: int, mi: int, s: int, us: int, fsp: int) -> bytes:
    fn = (fsp + 1) // 2
    v = ((y * 13 + mo) << 5 | d) << 17 | (h << 12 | mi << 6 | s)
    out = (v + 0x8000000000).to_bytes(5, "big")
    if fn:
        out += (us // (1, 10_000, 100, 1)[fn]).to_bytes(fn, "big")
    return out


def lenpref(data: bytes, size: int) -> bytes:
    return len(data).to_bytes(size, "little") + data


def image(cols: list[Col], values: list[bytes | None]) -> bytes:
    """One row image: null bitmap, then the non-NULL values' bytes."""
    nulls = bytearray((len(cols) + 7) // 8)
    for i, v in enumerate(values):
        if v is None:
            nulls[i >> 3] |= 1 << (i & 7)
    return bytes(nulls) + b"".join(v for v in values if v is not None)


# ------------------------------------------------------------------------------------------------
# the two decoders
# ------------------------------------------------------------------------------------------------

def oracle(cols: list[Col], body: bytes, tp: int) -> list[pb.RowChange]:
    dec = pydecode.RowDecoder([pydecode.compile_column(c.b, c.info, c.enc, f"db.t.{c.name}")
                               for c in cols], "db.t")
    out, pos = [], 0
    while pos < len(body):
        ch = pb.RowChange(tp=tp)
        if tp != pb.INSERT:
            row, pos = dec.row(body, pos)
            ch.before.CopyFrom(row)
        if tp != pb.DELETE:
            row, pos = dec.row(body, pos)
            ch.after.CopyFrom(row)
        out.append(ch)
    if pos != len(body):
        raise UndecodableRow(f"row images end at byte {pos} of {len(body)}")
    return out


def native(cols: list[Col], body: bytes, tp: int) -> list[pb.RowChange]:
    dec = RowDecoder([native_spec(c.b, c.info, c.enc, f"db.t.{c.name}") for c in cols], "db.t")
    data, n = dec.decode(body, tp)
    changes = list(pb.TableMutation.FromString(data).changes)
    assert len(changes) == n
    return changes


def same(cols: list[Col], body: bytes, tp: int = pb.INSERT) -> list[pb.RowChange]:
    want = oracle(cols, body, tp)
    got = native(cols, body, tp)
    assert got == want
    return got


# ------------------------------------------------------------------------------------------------
# torture types
# ------------------------------------------------------------------------------------------------

TORTURE = [
    col("ti", FT.TINY, "tinyint"), col("tiu", FT.TINY, "tinyint", unsigned=True),
    col("si", FT.SHORT, "smallint"), col("siu", FT.SHORT, "smallint", unsigned=True),
    col("mi", FT.INT24, "mediumint"), col("miu", FT.INT24, "mediumint", unsigned=True),
    col("i", FT.LONG, "int"), col("iu", FT.LONG, "int", unsigned=True),
    col("bi", FT.LONGLONG, "bigint"), col("biu", FT.LONGLONG, "bigint", unsigned=True),
    col("d65", FT.NEWDECIMAL, "decimal", precision=65, decimals=30),
    col("d10", FT.NEWDECIMAL, "decimal", precision=10, decimals=2),
    col("d5", FT.NEWDECIMAL, "decimal", precision=5, decimals=5),
    col("d0", FT.NEWDECIMAL, "decimal", precision=20, decimals=0),
    col("f", FT.FLOAT, "float"), col("dbl", FT.DOUBLE, "double"),
    col("c", FT.STRING, "char", "utf8", max_length=40),
    col("vc", FT.VARCHAR, "varchar", "utf8", max_length=1200),
    col("tx", FT.BLOB, "text", "utf8", length_size=2),
    col("ltx", FT.BLOB, "longtext", "utf8", length_size=4),
    col("lat", FT.VARCHAR, "varchar", "cp1252", max_length=10),
    col("bn", FT.STRING, "binary", max_length=4), col("vb", FT.VARCHAR, "varbinary", max_length=10),
    col("bl", FT.BLOB, "blob", length_size=2),
    col("dt", FT.DATE, "date"), col("dtm", FT.DATETIME2, "datetime", fsp=6),
    col("dtm0", FT.DATETIME2, "datetime", fsp=0), col("ts", FT.TIMESTAMP2, "timestamp", fsp=6),
    col("ts0", FT.TIMESTAMP2, "timestamp", fsp=0), col("tm", FT.TIME2, "time", fsp=6),
    col("tm3", FT.TIME2, "time", fsp=3), col("tm0", FT.TIME2, "time", fsp=0),
    col("y", FT.YEAR, "year"), col("e", FT.ENUM, "enum", elements=("a", "b", "c"), size=1),
    col("s", FT.SET, "set", elements=("x", "y", "z"), size=1), col("b", FT.BIT, "bit", bits=12),
    col("b64", FT.BIT, "bit", bits=64), col("b1", FT.BIT, "bit", bits=1),
    col("j", FT.BLOB, "json", "utf8", length_size=4),
    col("ldt", FT.DATETIME, "datetime"), col("lts", FT.TIMESTAMP, "timestamp"),
    col("ltm", FT.TIME, "time"), col("asc", FT.VARCHAR, "varchar", "ascii", max_length=10),
    col("gb", FT.VARCHAR, "varchar", "gbk", max_length=20),   # a Python-decoded charset
    col("geo", FT.GEOMETRY, "geometry", length_size=4),
]

MIN_ROW = [
    b"\x80", b"\x00", struct.pack("<h", -32768), b"\0\0", (-8388608).to_bytes(3, "little", signed=True),
    b"\0\0\0", struct.pack("<i", -2**31), b"\0" * 4, struct.pack("<q", -2**63), b"\0" * 8,
    enc_decimal("-" + "9" * 35 + "." + "9" * 30, 65, 30), enc_decimal("-12345678.91", 10, 2),
    enc_decimal("-0.12345", 5, 5), enc_decimal("-99999999999999999999", 20, 0),
    struct.pack("<f", -1.5), struct.pack("<d", -1.7976931348623157e308),
    lenpref(b"", 1), lenpref(b"", 2), lenpref(b"", 2), lenpref(b"", 4), lenpref(b"", 1),
    lenpref(b"ab", 1), lenpref(b"", 1), lenpref(b"", 2),
    b"\0\0\0", enc_datetime2(0, 0, 0, 0, 0, 0, 0, 6), enc_datetime2(0, 0, 0, 0, 0, 0, 0, 0),
    b"\0" * 7, b"\0" * 4, enc_time2(True, 838, 59, 59, 0, 6), enc_time2(True, 0, 0, 0, 1000, 3),
    enc_time2(True, 838, 59, 59, 0, 0), b"\0", b"\x01", b"\x00", b"\0\0", b"\0" * 8, b"\0",
    lenpref(b"[]", 4), b"\0" * 8, b"\0" * 4, (-8385959).to_bytes(3, "little", signed=True),
    lenpref(b"", 1), lenpref(b"", 1), lenpref(b"", 4),
]

MAX_ROW = [
    b"\x7f", b"\xff", struct.pack("<h", 32767), b"\xff\xff", (8388607).to_bytes(3, "little", signed=True),
    b"\xff" * 3, struct.pack("<i", 2**31 - 1), b"\xff" * 4, struct.pack("<q", 2**63 - 1), b"\xff" * 8,
    enc_decimal("9" * 35 + "." + "9" * 30, 65, 30), enc_decimal("99999999.99", 10, 2),
    enc_decimal("0.99999", 5, 5), enc_decimal("12345678901234567890", 20, 0),
    struct.pack("<f", 3.4028234663852886e38), struct.pack("<d", 2.2250738585072014e-308),
    lenpref("ten chars!".encode(), 1), lenpref(("😀 ünïcödé " + "x" * 200).encode(), 2),
    lenpref("tëxt 🚀".encode(), 2), lenpref(b"l" * 70000, 4), lenpref("café €".encode("cp1252"), 1),
    lenpref(b"\x00\x01\x02\x03", 1), lenpref(b"\xff\x00", 1), lenpref(bytes(range(256)), 2),
    ((2020 << 9) | (0 << 5) | 15).to_bytes(3, "little"),
    enc_datetime2(9999, 12, 31, 23, 59, 59, 999999, 6), enc_datetime2(2021, 6, 0, 10, 0, 0, 0, 0),
    (2**31 - 1).to_bytes(4, "big") + (999999).to_bytes(3, "big"), (1).to_bytes(4, "big"),
    enc_time2(False, 838, 59, 59, 0, 6), enc_time2(True, 0, 0, 1, 500_000, 3),
    enc_time2(False, 100, 0, 0, 0, 0), b"\xff", b"\x03", b"\x05", (0xFFF).to_bytes(2, "big"),
    b"\xff" * 8, b"\x01", lenpref(b'{"k": [1, "\xc3\xa9", null], "n": 1.5}', 4),
    (99991231235959).to_bytes(8, "little"), (2**32 - 1).to_bytes(4, "little"),
    (8385959).to_bytes(3, "little", signed=True), lenpref(b"ascii ~", 1),
    lenpref("中文".encode("gbk"), 1), lenpref(b"\x00\x00\x00\x00\x01\x01\x00\x00\x00" + b"\x11" * 16, 4),
]


def test_torture_types_decode_the_same_as_the_python_decoder() -> None:
    """Every type the capture decodes — integer extremes, DECIMAL(65,30), zero dates and zero
    parts, TIME negative/beyond 24 h/fractional, YEAR 0000, empty SET, BIT(64), utf8mb4, latin1,
    BLOB, JSON text, legacy temporals, NULL — decodes natively to exactly the Python decoder's
    Datums, as INSERT, UPDATE and DELETE images."""
    assert len(MIN_ROW) == len(MAX_ROW) == len(TORTURE)
    rows = [image(TORTURE, MIN_ROW), image(TORTURE, MAX_ROW), image(TORTURE, [None] * len(TORTURE))]
    got = same(TORTURE, b"".join(rows), pb.INSERT)
    assert len(got) == 3
    same(TORTURE, rows[0] + rows[1] + rows[1] + rows[2], pb.UPDATE)
    same(TORTURE, rows[2] + rows[0], pb.DELETE)
    by = {c.name: i for i, c in enumerate(TORTURE)}
    lo, hi, nul = (ch.after.columns for ch in got)
    assert lo[by["d65"]].decimal == "-" + "9" * 35 + "." + "9" * 30
    assert lo[by["bi"]].int == -2**63 and hi[by["biu"]].uint == 2**64 - 1
    assert hi[by["b64"]].bytes == b"\xff" * 8
    assert lo[by["y"]].WhichOneof("value") == "int" and lo[by["y"]].int == 0
    assert lo[by["s"]].WhichOneof("value") == "str" and lo[by["s"]].str == ""
    assert lo[by["dt"]].WhichOneof("value") == "datetime"     # the zero date is not NULL
    assert lo[by["tm"]].time.negative and lo[by["tm"]].time.hours == 838
    assert hi[by["tm3"]].time.negative and hi[by["tm3"]].time.microseconds == 500_000
    assert hi[by["lat"]].str == "café €" and hi[by["gb"]].str == "中文"
    assert hi[by["bn"]].bytes == b"\x00\x01\x02\x03"
    assert all(d.null for d in nul)


def test_latin1_and_ascii_accept_and_refuse_what_pythons_codecs_do() -> None:
    """Native text decoding follows Python's codecs byte for byte: every cp1252 byte decodes to
    the same character, and the five bytes cp1252 leaves undefined are refused (UndecodableRow),
    as are non-ASCII bytes in an ascii column and invalid UTF-8."""
    lat = [col("lat", FT.VARCHAR, "varchar", "cp1252", max_length=10)]
    for b in range(256):
        body = image(lat, [lenpref(bytes([b, 0x41]), 1)])
        try:
            want = oracle(lat, body, pb.INSERT)
        except UndecodableRow:
            with pytest.raises(UndecodableRow, match="not valid cp1252"):
                native(lat, body, pb.INSERT)
            assert b in (0x81, 0x8D, 0x8F, 0x90, 0x9D)
        else:
            assert native(lat, body, pb.INSERT) == want
    asc = [col("a", FT.VARCHAR, "varchar", "ascii", max_length=10)]
    with pytest.raises(UndecodableRow, match="not valid ascii"):
        native(asc, image(asc, [lenpref(b"\x80", 1)]), pb.INSERT)
    u8 = [col("u", FT.VARCHAR, "varchar", "utf8", max_length=40)]
    for bad in (b"\xff", b"\xc3", b"\xed\xa0\x80", b"a\xf0\x9f\x98"):   # incl. a surrogate, a cut emoji
        body = image(u8, [lenpref(bad, 1)])
        with pytest.raises(UndecodableRow):
            oracle(u8, body, pb.INSERT)
        with pytest.raises(UndecodableRow, match="db.t: column u: value is not valid utf-8"):
            native(u8, body, pb.INSERT)


def test_truncated_or_overlong_images_are_refused_naming_the_column() -> None:
    """A row image shorter than its columns (or a length prefix running past the end) is an
    UndecodableRow naming the column and byte, never a short value; a decimal image whose digit
    groups are out of range is refused too (MariaDB never writes one)."""
    cols = [col("id", FT.LONG, "int"), col("v", FT.VARCHAR, "varchar", "utf8", max_length=40)]
    good = image(cols, [struct.pack("<i", 7), lenpref(b"hello", 1)])
    same(cols, good)
    for cut in range(1, len(good)):
        with pytest.raises(UndecodableRow, match=r"db\.t: column (id|v|\(null bitmap\)): row image does not match"):
            native(cols, good[:cut], pb.INSERT)
    with pytest.raises(UndecodableRow, match="column v"):
        native(cols, image(cols, [struct.pack("<i", 7), b"\x09abc"]), pb.INSERT)
    dec = [col("d", FT.NEWDECIMAL, "decimal", precision=10, decimals=0)]
    with pytest.raises(UndecodableRow, match="column d: decimal integer group is out of range"):
        native(dec, image(dec, [bytes([0x80 | 0x0F]) + b"\xff\xff\xff\xff"]), pb.INSERT)


def test_update_needs_pairs_and_the_mutation_type_is_checked() -> None:
    """An UPDATE body is before/after pairs: an odd number of images is refused; a mutation type
    other than INSERT/UPDATE/DELETE is a programming error the native core refuses."""
    cols = [col("id", FT.LONG, "int")]
    one = image(cols, [struct.pack("<i", 1)])
    assert len(same(cols, one * 2, pb.UPDATE)) == 1
    with pytest.raises(UndecodableRow):
        native(cols, one * 3, pb.UPDATE)
    with pytest.raises(ValueError, match="mutation type 4"):
        sluice_native.RowDecoder([("id", "int", 4, False)]).decode(one, 4)


# ------------------------------------------------------------------------------------------------
# random rows
# ------------------------------------------------------------------------------------------------

def _raw(n: int) -> st.SearchStrategy[bytes]:
    return st.binary(min_size=n, max_size=n)


@st.composite
def decimal_value(draw: st.DrawFn, precision: int, scale: int) -> bytes:
    ip = draw(st.integers(0, 10 ** (precision - scale) - 1))
    fp = draw(st.integers(0, 10 ** scale - 1))
    neg = draw(st.booleans())
    text = ("-" if neg else "") + str(ip) + ("." + str(fp).zfill(scale) if scale else "")
    return enc_decimal(text, precision, scale)


@st.composite
def column_and_values(draw: st.DrawFn, i: int) -> tuple[Col, st.SearchStrategy[bytes]]:
    """A random column and the strategy of its non-NULL image bytes."""
    kind = draw(st.sampled_from(["int", "float", "double", "decimal", "year", "date", "datetime2",
                                 "timestamp2", "time2", "legacy", "text", "bytes", "binchar",
                                 "enum", "set", "bit", "json"]))
    name = f"c{i}"
    if kind == "int":
        t, n = draw(st.sampled_from([(FT.TINY, 1), (FT.SHORT, 2), (FT.INT24, 3), (FT.LONG, 4),
                                     (FT.LONGLONG, 8)]))
        return col(name, t, "int", unsigned=draw(st.booleans())), _raw(n)
    if kind == "float":
        return col(name, FT.FLOAT, "float"), st.floats(width=32, allow_nan=False).map(lambda v: struct.pack("<f", v))
    if kind == "double":
        return col(name, FT.DOUBLE, "double"), st.floats(allow_nan=False).map(lambda v: struct.pack("<d", v))
    if kind == "decimal":
        p = draw(st.integers(1, 65))
        s = draw(st.integers(0, min(p, 30)))
        return col(name, FT.NEWDECIMAL, "decimal", precision=p, decimals=s), decimal_value(p, s)
    if kind == "year":
        return col(name, FT.YEAR, "year"), _raw(1)
    if kind == "date":
        return col(name, FT.DATE, "date"), _raw(3)
    if kind in ("datetime2", "timestamp2", "time2"):
        fsp = draw(st.integers(0, 6))
        t = {"datetime2": FT.DATETIME2, "timestamp2": FT.TIMESTAMP2, "time2": FT.TIME2}[kind]
        base = {"datetime2": 5, "timestamp2": 4, "time2": 3}[kind]
        return col(name, t, kind[:-1], fsp=fsp), _raw(base + (fsp + 1) // 2)
    if kind == "legacy":
        t, n = draw(st.sampled_from([(FT.DATETIME, 8), (FT.TIMESTAMP, 4), (FT.TIME, 3)]))
        return col(name, t, "datetime"), _raw(n)
    if kind in ("text", "json"):
        enc = draw(st.sampled_from(["utf8", "utf-8", "cp1252", "ascii"])) if kind == "text" else "utf8"
        ls = draw(st.sampled_from([1, 2, 3, 4]))
        t = FT.BLOB if ls > 2 or draw(st.booleans()) else FT.VARCHAR
        c = col(name, t, "json" if kind == "json" else "text", enc, length_size=ls, max_length=300 if ls == 2 else 200)
        if t == FT.VARCHAR:
            ls = 2 if c.b.max_length > 255 else 1
        alphabet = {"ascii": st.characters(max_codepoint=127),
                    "cp1252": st.characters(codec="cp1252")}.get(enc, st.characters(codec="utf-8"))
        codec = {"utf8": "utf-8"}.get(enc, enc)
        return c, st.text(alphabet, max_size=60).map(lambda s: lenpref(s.encode(codec), ls))
    if kind == "bytes":
        ls = draw(st.sampled_from([1, 2, 3, 4]))
        return col(name, FT.BLOB, "blob", length_size=ls), st.binary(max_size=80).map(lambda b: lenpref(b, ls))
    if kind == "binchar":
        n = draw(st.integers(1, 300))
        ls = 2 if n > 255 else 1
        return col(name, FT.STRING, "binary", max_length=n), st.binary(max_size=min(n, 40)).map(lambda b: lenpref(b, ls))
    if kind in ("enum", "set"):
        members = tuple(draw(st.lists(st.text(max_size=5), min_size=1, max_size=70)))
        size = draw(st.sampled_from([1, 2] if kind == "enum" else [1, 2, 3, 4, 8]))
        return (col(name, FT.ENUM if kind == "enum" else FT.SET, kind, elements=members, size=size),
                _raw(size))
    bits = draw(st.integers(1, 64))
    return col(name, FT.BIT, "bit", bits=bits), _raw((bits + 7) // 8)


@st.composite
def table_and_body(draw: st.DrawFn) -> tuple[list[Col], bytes, int]:
    ncols = draw(st.integers(1, 12))
    pairs = [draw(column_and_values(i)) for i in range(ncols)]
    cols = [c for c, _ in pairs]
    tp = draw(st.sampled_from([pb.INSERT, pb.UPDATE, pb.DELETE]))
    nrows = draw(st.integers(1, 4)) * (2 if tp == pb.UPDATE else 1)
    rows = []
    for _ in range(nrows):
        rows.append(image(cols, [None if draw(st.integers(0, 5)) == 0 else draw(v) for _, v in pairs]))
    return cols, b"".join(rows), tp


@pytest.mark.timeout(300)
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(table_and_body())
def test_random_rows_decode_the_same_as_the_python_decoder(case: tuple[list[Col], bytes, int]) -> None:
    """Random tables (every column kind, random NULLs) and random row images of each: the native
    decoder gives exactly the Python decoder's RowChanges (every byte of fixed-width temporals,
    integers and enum/set/bit images random; decimals and text valid by construction)."""
    cols, body, tp = case
    same(cols, body, tp)


# ------------------------------------------------------------------------------------------------
# event framing (sluice_native.parse_event) on packets built from the documented layout
# ------------------------------------------------------------------------------------------------

def packet(etype: int, body: bytes, *, ts: int = 1_700_000_123, server_id: int = 7, log_pos: int = 4096,
           checksum: bool = False) -> bytes:
    """OK byte + 19-byte event header (timestamp, type, server id, event size, next position,
    flags) + body (+ CRC32 placeholder)."""
    trailer = b"\xde\xad\xbe\xef" if checksum else b""
    size = 19 + len(body) + len(trailer)
    return b"\x00" + struct.pack("<IBIIIH", ts, etype, server_id, size, log_pos, 0) + body + trailer


def packed(n: int) -> bytes:
    if n < 251:
        return bytes([n])
    if n < 1 << 16:
        return b"\xfc" + n.to_bytes(2, "little")
    if n < 1 << 24:
        return b"\xfd" + n.to_bytes(3, "little")
    return b"\xfe" + n.to_bytes(8, "little")


@pytest.mark.parametrize("checksum", [False, True])
@pytest.mark.parametrize("etype,tp,v2", [(23, pb.INSERT, False), (24, pb.UPDATE, False), (25, pb.DELETE, False),
                                         (30, pb.INSERT, True), (31, pb.UPDATE, True), (32, pb.DELETE, True)])
@pytest.mark.parametrize("ncols", [1, 8, 9, 250, 251, 300, 70000])
def test_rows_event_post_header_is_framed_by_its_layout(etype: int, tp: int, v2: bool, ncols: int,
                                                        checksum: bool) -> None:
    """A rows event (v1 MariaDB, v2 MySQL with extra data) is framed as its layout says: 6-byte
    table id, flags, v2 extra data skipped by its own length, packed column count, one present
    bitmap (two for UPDATE), then the row images up to the CRC32 when the binlog has checksums."""
    nb = (ncols + 7) // 8
    bm1, bm2 = bytes([0xA5]) * nb, bytes([0x5A]) * nb
    table_id = 0x0000_8765_4321_00FF & 0xFFFF_FFFF_FFFF
    extra = (b"\x07\x00" + b"\x00\x01\x02\x03\x04") if v2 else b""   # length 7 counts its own 2 bytes
    rows = b"row images \x00\xff"
    body = (table_id.to_bytes(6, "little") + b"\x01\x00" + extra + packed(ncols) + bm1
            + (bm2 if tp == pb.UPDATE else b"") + rows)
    data = packet(etype, body, checksum=checksum)
    h = sluice_native.parse_event(data, checksum)
    assert h[:5] == (etype, 1_700_000_123, 7, len(data) - 1, 4096)
    end = len(data) - (4 if checksum else 0)
    assert h[5:] == (end, tp, table_id, ncols, bm1, bm2 if tp == pb.UPDATE else None, end - len(rows))
    assert data[h[11]:h[5]] == rows


def test_gtid_xid_and_other_events_are_framed() -> None:
    """MariaDB GTID (sequence number, domain, flags; a group-commit id after them is ignored),
    XID, and any other event: header only."""
    g = packet(162, (2**64 - 2).to_bytes(8, "little") + (7).to_bytes(4, "little") + b"\x2c"
               + (99).to_bytes(8, "little"), server_id=3)
    assert sluice_native.parse_event(g, False)[6:] == (2**64 - 2, 7, 0x2C)
    x = packet(16, (123456789).to_bytes(8, "little"), checksum=True)
    assert sluice_native.parse_event(x, True) == (16, 1_700_000_123, 7, len(x) - 1, 4096, len(x) - 4, 123456789)
    q = packet(2, b"anything")
    assert sluice_native.parse_event(q, False) == (2, 1_700_000_123, 7, len(q) - 1, 4096, len(q))


def test_malformed_packets_are_refused_naming_the_problem() -> None:
    """A packet that is not an event, whose header's size disagrees with the packet, or that ends
    inside a post-header or bitmap raises DecodeError (the capture stops: never a guess)."""
    with pytest.raises(sluice_native.DecodeError, match="not an event"):
        sluice_native.parse_event(b"\x00" + b"\x01" * 10, False)
    with pytest.raises(sluice_native.DecodeError, match="not an event"):
        sluice_native.parse_event(b"\xff" + b"\x01" * 30, False)
    good = packet(23, (5).to_bytes(6, "little") + b"\x00\x00" + packed(16) + b"\xff\xff")
    with pytest.raises(sluice_native.DecodeError, match="packet holds"):
        sluice_native.parse_event(good + b"\x00", False)
    for cut, what in ((4, "post-header"), (9, "column count"), (10, "column count"),
                      (12, "columns-present bitmap")):
        bad = packet(23, ((5).to_bytes(6, "little") + b"\x00\x00" + b"\xfc\x10\x00" + b"\xff\xff")[:cut])
        with pytest.raises(sluice_native.DecodeError, match=what):
            sluice_native.parse_event(bad, False)
    upd = packet(24, (5).to_bytes(6, "little") + b"\x00\x00" + packed(16) + b"\xff\xff" + b"\xff")
    with pytest.raises(sluice_native.DecodeError, match="after-image bitmap"):
        sluice_native.parse_event(upd, False)
    v2 = packet(30, (5).to_bytes(6, "little") + b"\x00\x00" + b"\x40\x00" + packed(1) + b"\x01")
    with pytest.raises(sluice_native.DecodeError, match="extra data"):
        sluice_native.parse_event(v2, False)
    with pytest.raises(sluice_native.DecodeError, match="shorter than its header"):
        sluice_native.parse_event(packet(16, b""), True)
    with pytest.raises(sluice_native.DecodeError, match="GTID"):
        sluice_native.parse_event(packet(162, b"\x00" * 12), False)


def test_row_images_are_decoded_in_place_from_the_packet() -> None:
    """decode(data, tp, start, end) reads only data[start:end]: a value running into the bytes
    after `end` (the CRC32) is refused, and Python columns see positions within the images."""
    dec = RowDecoder([("id", "int", 4, False), ("g", "py", lambda buf, pos: (pb.Datum(bytes=buf[pos:pos + 2]).SerializeToString(), pos + 2))], "t")
    images = b"\x00" + (42).to_bytes(4, "little") + b"ab"
    data = b"HEADER" + images + b"CRC!"
    raw, n = dec.decode(data, pb.INSERT, 6, 6 + len(images))
    m = pb.TableMutation()
    m.MergeFromString(raw)
    assert n == 1 and m.changes[0].after.columns[0].int == 42 and m.changes[0].after.columns[1].bytes == b"ab"
    with pytest.raises(UndecodableRow, match="needs 4 bytes"):
        dec.decode(data, pb.INSERT, 6, 6 + 3)
    with pytest.raises(ValueError, match="outside a buffer"):
        dec.decode(data, pb.INSERT, 6, len(data) + 1)


def test_packets_are_split_by_their_headers() -> None:
    """split_packets: complete packets only (an incomplete one stays for the next read), the
    sequence numbers checked and carried (wrapping at 256), a payload of 16 MB or more joined
    from its packets, and the first packet out of order reported, not consumed."""
    def pk(payload: bytes, seq: int) -> bytes:
        return len(payload).to_bytes(3, "little") + bytes([seq & 255]) + payload
    a, b = b"\x00event-a", b"\x00" + b"b" * 300
    buf = pk(a, 254) + pk(b, 255) + pk(b"\x00next", 0)[:6]
    got, used, seq, bad = sluice_native.split_packets(buf, 254)
    assert (got, used, seq, bad) == ([a, b], len(pk(a, 0)) + len(pk(b, 0)), 0, -1)
    assert sluice_native.split_packets(buf[used:] + b"ext", 0) == ([b"\x00next"], 9, 1, -1)
    big = b"\x00" + b"x" * (0xFFFFFF - 1)
    joined = pk(big, 3) + pk(b"tail", 4) + pk(b"\xfe", 5)
    got, used, seq, bad = sluice_native.split_packets(joined, 3)
    assert [len(g) for g in got] == [0xFFFFFF + 4, 1] and got[0] == big + b"tail" and (used, seq, bad) == (len(joined), 6, -1)
    assert sluice_native.split_packets(pk(big, 3)[:100], 3) == ([], 0, 3, -1)
    assert sluice_native.split_packets(pk(a, 7) + pk(b, 9), 7) == ([a], len(pk(a, 7)), 8, 9)
    assert sluice_native.split_packets(pk(a, 0), 5) == ([], 0, 5, 0)
