"""A multi-part prewrite's value is checked as a stream over its parts (pump/storage/valuecheck)."""
from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError

from sluice.proto import sluice_pb2 as pb
from sluice.pump.storage import valuecheck
from sluice.pump.storage.valuecheck import check_multipart_value


def parts_of(raw: bytes, n: int) -> list[tuple]:
    """(read, length) of n serialized part Binlogs carrying raw split in n pieces."""
    cut = max(1, -(-len(raw) // n))
    out = []
    for i in range(n):
        b = pb.Binlog(tp=pb.PREWRITE, start_ts=5, producer_id="p", part_no=i, part_count=n,
                      prewrite_value=raw[i * cut:(i + 1) * cut]).SerializeToString()
        out.append((lambda off, k, b=b: b[off:off + k], len(b)))
    return out


def value(rows: int = 50) -> bytes:
    return pb.PrewriteValue(
        schema_version=3, snapshot_chunk=True,
        ddl=pb.DDL(tp=pb.CREATE_TABLE, table_id=9, query="create table t (a int)"),
        schema_snapshots=[pb.TableInfo(table_id=9, schema_name="db", table_name="t")],
        source=pb.SourceInfo(name="src"),
        mutations=[pb.TableMutation(table_id=9, schema_name="db", table_name="t", changes=[
            pb.RowChange(tp=pb.INSERT, after=pb.Row(columns=[pb.Datum(int=r),
                                                              pb.Datum(str="é" * r)]))
            for r in range(rows)]) for _ in range(3)]).SerializeToString()


@pytest.mark.parametrize("n", [2, 3, 7, 40])
@pytest.mark.parametrize("batch", [16 << 20, 64])
def test_a_valid_value_passes_whatever_the_split_and_the_batch_size(
        n: int, batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every split of a valid PrewriteValue passes, also when table mutations are larger than
    the batch and are checked row change by row change."""
    monkeypatch.setattr(valuecheck, "_BATCH", batch)
    check_multipart_value(parts_of(value(), n))


@pytest.mark.parametrize("batch", [16 << 20, 64])
def test_values_the_parser_refuses_are_refused(batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """What pb.PrewriteValue.FromString refuses, the streamed check refuses: garbage, a
    truncated value, a bad nested row, invalid UTF-8 in a string field."""
    monkeypatch.setattr(valuecheck, "_BATCH", batch)
    good = value()
    bad_row = pb.PrewriteValue(mutations=[pb.TableMutation(table_id=1, changes=[
        pb.RowChange(tp=pb.INSERT)])]).SerializeToString()
    # RowChange.after (field 3) given as a bytes field holding junk
    bad_row = bad_row[:-2] + b"\x1a\x03\xff\xff\xff"
    bad_row = bad_row[:1] + bytes([len(bad_row) - 2]) + bad_row[2:]
    bad_utf8 = pb.PrewriteValue(source=pb.SourceInfo(name="x")).SerializeToString()
    bad_utf8 = bad_utf8.replace(b"x", b"\xff")
    for raw in (b"\xff" * 11, good[:-3], bad_row, bad_utf8):
        with pytest.raises((DecodeError, ValueError, IndexError)):
            pb.PrewriteValue.FromString(raw)   # the parser's own verdict...
        with pytest.raises((DecodeError, ValueError, IndexError)):
            check_multipart_value(parts_of(raw, 2))   # ...is the streamed check's
