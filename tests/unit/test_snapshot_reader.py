"""Chunk rows made straight from their wire packets (capture.snapshot.reader) — no server needed:
the same Datums as pymysql's decoded tuples through RowConverter.row, and clear errors for
packets that do not hold the columns."""
from __future__ import annotations

import pytest

from sluice.capture.snapshot.reader import RowConverter
from sluice.core.errors import InvalidArgument
from sluice.proto import sluice_pb2 as pb
from tests.support.rows import col

COLUMNS = [col("id", "bigint(20)"), col("u", "int(10) unsigned"), col("s", "varchar(300)"),
           col("b", "varbinary(8)"), col("d", "decimal(10,2)"), col("t", "time(6)"),
           col("e", "enum('a','b')"), col("y", "year(4)")]
# pymysql's (encoding, converter) per column for these field types, with SNAPSHOT_CONV.
CONVERTERS = [("ascii", int), ("ascii", int), ("utf8", None), (None, None), ("ascii", None),
              ("ascii", None), ("utf8", None), ("ascii", None)]


class Packet:
    def __init__(self, data: bytes) -> None:
        self._data, self._position = data, 0


def wire(*values: bytes | None) -> bytes:
    """A text-protocol row: each value a length-coded string, NULL as 0xfb."""
    out = b""
    for v in values:
        if v is None:
            out += b"\xfb"
        elif len(v) < 251:
            out += bytes([len(v)]) + v
        elif len(v) < 1 << 16:
            out += b"\xfc" + len(v).to_bytes(2, "little") + v
        else:
            out += b"\xfd" + len(v).to_bytes(3, "little") + v
    return out


def decoded(values: tuple[bytes | None, ...]) -> tuple[object, ...]:
    """What pymysql hands RowConverter.row for the same wire values."""
    out: list[object] = []
    for v, (enc, conv) in zip(values, CONVERTERS):
        if v is not None:
            if enc is not None:
                v = v.decode(enc)  # type: ignore[assignment]
            if conv is not None:
                v = conv(v)
        out.append(v)
    return tuple(out)


@pytest.mark.parametrize("values", [
    (b"-9223372036854775808", b"4294967295", "ünï 🚀".encode() * 40, b"\x00\xff", b"-12.50",
     b"-838:59:59.000000", b"b", b"2155"),
    (b"7", None, None, None, None, None, None, None),
    (b"1", b"0", b"", b"", b"0.00", b"00:00:00.000001", b"", b"0000"),
    (b"2", b"3", b"x" * 70000, b"y", b"1.00", b"01:00:00.000000", b"a", b"1901"),
])
def test_packet_rows_equal_the_rows_of_decoded_tuples(values: tuple[bytes | None, ...]) -> None:
    conv = RowConverter(COLUMNS)
    read = conv.packet_reader(CONVERTERS)
    holder = pb.TableMutation()
    packet = Packet(wire(*values))
    row = read(packet, holder.changes.add)
    assert row == conv.row(decoded(values))
    assert packet._position == len(packet._data)


def test_a_packet_that_does_not_hold_the_columns_is_refused() -> None:
    read = RowConverter(COLUMNS).packet_reader(CONVERTERS)
    full = wire(b"1", b"2", b"s", b"b", b"1.00", b"00:00:01", b"a", b"2000")
    with pytest.raises(InvalidArgument, match="ends before its 8 columns"):
        read(Packet(full[:4]), pb.TableMutation().changes.add)
    with pytest.raises(InvalidArgument, match="of them for its 8 columns"):
        read(Packet(full + b"\x01z"), pb.TableMutation().changes.add)
    with pytest.raises(InvalidArgument, match="returned 2 columns for 8"):
        RowConverter(COLUMNS).packet_reader(CONVERTERS[:2])
    bad_utf8 = wire(b"1", b"2", b"\xff\xfe", b"b", b"1.00", b"00:00:01", b"a", b"2000")
    with pytest.raises(UnicodeDecodeError):
        read(Packet(bad_utf8), pb.TableMutation().changes.add)
