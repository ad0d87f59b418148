"""Value log: record format, rotation, recovery truncation, corruption reporting."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from sluice.core.errors import CorruptRecord
from sluice.pump.storage.vlog import (HEADER_SIZE, Location, ValueLog, decode_record,
                                      encode_record)


def _open(path: Path, segment_size: int = 1 << 20) -> ValueLog:
    vlog = ValueLog(path, segment_size)
    vlog.truncate_to(Location(1, 0))
    return vlog


def test_records_round_trip_and_rotate(tmp_path: Path) -> None:
    vlog = _open(tmp_path, segment_size=1000)
    payloads = [bytes([i]) * (100 + i) for i in range(30)]
    locs = vlog.append(payloads)
    vlog.sync()
    assert len({loc.segment for loc in locs}) > 3, "small segments must rotate"
    for loc, p in zip(locs, payloads):
        assert vlog.read(loc, len(p)) == p
    # no segment grows past the limit unless one record alone is bigger
    for seg in vlog.segments():
        assert vlog.path(seg).stat().st_size <= 1000
    reader = vlog.reader()
    assert [reader.read(loc, len(p)) for loc, p in zip(locs, payloads)] == payloads
    scanned = [p for seg in vlog.segments() for _, p in vlog.scan(seg)]
    assert scanned == payloads
    vlog.close()


def test_a_record_bigger_than_a_segment_gets_its_own(tmp_path: Path) -> None:
    vlog = _open(tmp_path, segment_size=100)
    locs = vlog.append([b"a" * 10, b"b" * 500, b"c" * 10])
    vlog.sync()
    assert [loc.segment for loc in locs] == [1, 2, 3]
    assert vlog.read(locs[1], 500) == b"b" * 500
    vlog.close()


def test_torn_tail_and_unindexed_records_are_truncated(tmp_path: Path) -> None:
    vlog = _open(tmp_path, segment_size=300)
    locs = vlog.append([b"x" * 50, b"y" * 50])
    vlog.sync()
    indexed_end = vlog.end
    vlog.append([b"z" * 50] * 8)  # written but never indexed: spills into later segments
    vlog.sync()
    vlog.close()
    with open(tmp_path / "000003.log", "ab") as f:
        f.write(encode_record(b"torn")[:7])  # a torn header at the very end
    assert len(ValueLog(tmp_path, 300).segments()) >= 3

    vlog = ValueLog(tmp_path, 300)
    dropped = vlog.truncate_to(indexed_end)
    assert dropped > 0
    assert vlog.segments() == [indexed_end.segment]
    assert vlog.path(1).stat().st_size == indexed_end.offset
    assert vlog.read(locs[1], 50) == b"y" * 50
    # appends continue right after the indexed end
    (loc,) = vlog.append([b"after"])
    assert loc == indexed_end
    vlog.close()


def test_mid_file_corruption_names_file_and_offset(tmp_path: Path) -> None:
    vlog = _open(tmp_path)
    locs = vlog.append([b"a" * 100, b"b" * 100, b"c" * 100])
    vlog.sync()
    end = vlog.end
    vlog.close()
    path = tmp_path / "000001.log"
    with open(path, "r+b") as f:  # flip one payload byte of the middle record
        f.seek(locs[1].offset + HEADER_SIZE + 10)
        f.write(b"!")
    vlog = ValueLog(tmp_path, 1 << 20)
    with pytest.raises(CorruptRecord) as e:
        vlog.truncate_to(end)
    assert e.value.path == str(path) and e.value.offset == locs[1].offset
    assert "CRC32C" in e.value.reason
    with pytest.raises(CorruptRecord) as e2:
        vlog.read(locs[1], 100)
    assert e2.value.offset == locs[1].offset
    vlog.close()


def test_bad_magic_and_short_segment_are_errors(tmp_path: Path) -> None:
    vlog = _open(tmp_path)
    locs = vlog.append([b"a" * 100, b"b" * 100])
    vlog.sync()
    end = vlog.end
    vlog.close()
    path = tmp_path / "000001.log"
    with open(path, "r+b") as f:
        f.write(b"XXXX")
    with pytest.raises(CorruptRecord, match="bad magic") as e:
        ValueLog(tmp_path, 1 << 20).truncate_to(end)
    assert e.value.offset == locs[0].offset
    os.truncate(path, 50)  # acknowledged bytes missing: never "recovered" by truncation
    with pytest.raises(CorruptRecord, match="shorter than the indexed end"):
        ValueLog(tmp_path, 1 << 20).truncate_to(end)


@settings(max_examples=300, deadline=None)
@given(hst.binary(max_size=64), hst.integers(min_value=0, max_value=80))
def test_record_decoder_never_crashes(data: bytes, cut: int) -> None:
    """Random or damaged bytes decode cleanly or raise CorruptRecord, nothing else."""
    for buf in (data, encode_record(data)[:cut] + data, encode_record(data)):
        try:
            payload, end = decode_record(buf, 0, "f", 0)
        except CorruptRecord as e:
            assert e.path == "f" and e.offset == 0
        else:
            assert end <= len(buf) and len(payload) == end - HEADER_SIZE
    assert decode_record(encode_record(data), 0)[0] == data


def test_a_reader_holding_a_deleted_segment_s_fd_still_reads_exact_bytes(tmp_path: Path) -> None:
    """Deleting a segment (GC) never closes its descriptor at once: a reader that took it a
    moment before would `pread` a closed number, or one the kernel already reused for another
    file. The descriptor is retired and closed RETIRE_GRACE_S later."""
    now = [0.0]
    v = ValueLog(tmp_path / "vlog", segment_size=64, retire_grace_s=10.0, clock=lambda: now[0])
    v.truncate_to(Location(1, 0), verify=False)
    locs = v.append([b"a" * 40, b"b" * 40, b"c" * 40])
    v.sync()
    first = locs[0]
    fd = v.read_fd(first.segment)                 # a reader's thread took the descriptor
    v.delete_segment(first.segment)               # GC runs before that reader's pread
    reused = [os.open(tmp_path / f"other{i}", os.O_CREAT | os.O_RDWR) for i in range(4)]
    try:
        for r in reused:
            os.write(r, b"x" * 100)
        buf = os.pread(fd, HEADER_SIZE + 40, first.offset)
        assert decode_record(buf, 0)[0] == b"a" * 40
        assert not v.path(first.segment).exists()
        assert locs[1].segment != first.segment
        now[0] = 11.0
        v.delete_segment(locs[1].segment)         # the next GC closes what is due
        with pytest.raises(OSError):
            os.fstat(fd)
    finally:
        for r in reused:
            os.close(r)
        v.close()
