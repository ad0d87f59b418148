"""The value log: append-only segment files holding the exact payload bytes a pump acknowledged.

Invariant kept here: a record is either read back exactly as written or reported as
`CorruptRecord(path, offset, reason)`; nothing is ever silently skipped.

Layout: `vlog/000001.log`, `vlog/000002.log`, ... Each record is

    magic(4, big-endian 0x534C4331 "SLC1") | length(4, big-endian) | CRC32C(payload)(4) | payload

A group of records is written with one `pwrite` per segment touched and made durable with one
`fdatasync` (`sync()`); a new segment's directory entry is fsynced when the segment is created, so
a crash never loses a whole file that the index already points into. Recovery (`truncate_to`)
cuts the log back to the end recorded by the index: that removes a torn tail and every record
written but never indexed (never acknowledged).

Read descriptors are cached per segment and handed to readers on other threads. Deleting a
segment (GC) therefore never closes its descriptor at once: a reader that took it a moment
before would `pread` a closed number, or one the kernel already reused for another file. The
descriptor is retired and closed `RETIRE_GRACE_S` later; the unlinked file keeps its bytes
until then, so such a reader still reads exactly what was written.
"""
from __future__ import annotations

import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import google_crc32c

from sluice.core.errors import CorruptRecord, OutOfRange
from sluice.core.fsync import fsync_path

log = logging.getLogger(__name__)

MAGIC = 0x534C4331  # "SLC1"
HEADER = struct.Struct(">III")
HEADER_SIZE = HEADER.size
MAX_RECORD = (1 << 32) - 1
_READ_WINDOW = 256 << 10
RETIRE_GRACE_S = 60.0  # far longer than any single pread of a window
_crc = google_crc32c.value


class Location(NamedTuple):
    """Where a record starts: its segment number and the byte offset of its header (a named
    tuple, not a frozen dataclass: `append` builds one per record, and a frozen dataclass's
    `__init__` sets each field through `object.__setattr__`; both order by (segment, offset))."""

    segment: int
    offset: int


# Builds a Location without the Python-level `__new__` a named tuple's class defines (`append`
# builds one per record).
_tuple_new = tuple.__new__


def segment_name(segment: int) -> str:
    return f"{segment:06d}.log"


def encode_record(payload: bytes) -> bytes:
    return HEADER.pack(MAGIC, len(payload), _crc(payload)) + payload


def decode_record(buf: bytes | memoryview, pos: int, path: str = "<buffer>",
                  base_offset: int = 0) -> tuple[bytes, int]:
    """Decode the record starting at buf[pos]; returns (payload, position after it).

    Raises CorruptRecord (offset = base_offset + pos) on a short buffer, bad magic or bad CRC.
    """
    off = base_offset + pos
    if len(buf) - pos < HEADER_SIZE:
        raise CorruptRecord(path, off, f"truncated header ({len(buf) - pos} bytes)")
    magic, length, crc = HEADER.unpack_from(buf, pos)
    if magic != MAGIC:
        raise CorruptRecord(path, off, f"bad magic {magic:#010x}")
    end = pos + HEADER_SIZE + length
    if end > len(buf):
        raise CorruptRecord(path, off, f"length {length} runs past the end of the data")
    payload = bytes(buf[pos + HEADER_SIZE:end])
    if _crc(payload) != crc:
        raise CorruptRecord(path, off, "CRC32C mismatch")
    return payload, end



def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


class ValueLog:
    """Segment files under `dir`. Appends come from one thread (the committer); reads from any."""

    def __init__(self, directory: str | Path, segment_size: int, sync: bool = True,
                 retire_grace_s: float = RETIRE_GRACE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.dir = Path(directory)
        self.segment_size = segment_size
        self.sync_enabled = sync
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # guards the read-fd cache and the segment size table
        self._read_fds: dict[int, int] = {}
        self._retired: list[tuple[float, int]] = []   # (close after, fd) of deleted segments
        self._retire_grace_s = retire_grace_s
        self._clock = clock
        self._sizes: dict[int, int] = {}
        self._wfd = -1
        self._wseg = 0
        self._woff = 0
        self._dirty: set[int] = set()

    # -- recovery ------------------------------------------------------------------------------

    def segments(self) -> list[int]:
        out = []
        for p in self.dir.iterdir():
            if p.suffix == ".log" and p.stem.isdigit():
                out.append(int(p.stem))
        return sorted(out)

    def path(self, segment: int) -> Path:
        return self.dir / segment_name(segment)

    def truncate_to(self, end: Location, verify: bool = True) -> int:
        """Cut the log back to `end` (the index's durable end) and open it for appends.

        Deletes later segments, truncates the end segment, then (verify) reads every record of
        the end segment up to `end.offset`. Returns the number of bytes dropped.
        """
        dropped = 0
        for seg in self.segments():
            if seg > end.segment:
                p = self.path(seg)
                dropped += p.stat().st_size
                log.warning("recovery: removing unindexed segment %s", p)
                p.unlink()
        p = self.path(end.segment)
        if not p.exists():
            if end.offset != 0:
                raise CorruptRecord(str(p), 0, f"segment missing but the index ends at offset "
                                                f"{end.offset}")
            self._create(end.segment)
        size = p.stat().st_size
        if size < end.offset:
            raise CorruptRecord(str(p), size, f"segment is shorter than the indexed end "
                                              f"{end.offset}: acknowledged records are missing")
        if size > end.offset:
            log.warning("recovery: truncating %s from %d to %d bytes (torn or unindexed tail)",
                        p, size, end.offset)
            dropped += size - end.offset
            with open(p, "r+b") as f:
                f.truncate(end.offset)
                os.fsync(f.fileno())
        if verify:
            for _ in self.scan(end.segment, 0, end.offset):
                pass
        self._open_for_append(end.segment, end.offset)
        for seg in self.segments():
            self._sizes[seg] = self.path(seg).stat().st_size
        return dropped

    def _create(self, segment: int) -> None:
        fd = os.open(self.path(segment), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.close(fd)
        fsync_path(self.dir)

    def _open_for_append(self, segment: int, offset: int) -> None:
        if self._wfd >= 0:
            os.close(self._wfd)
        self._wfd = os.open(self.path(segment), os.O_WRONLY)
        self._wseg, self._woff = segment, offset

    # -- appends (committer thread only) -------------------------------------------------------

    @property
    def end(self) -> Location:
        return Location(self._wseg, self._woff)

    def append(self, payloads: list[bytes], crcs: list[int] | None = None) -> list[Location]:
        """Write `payloads` as records (not yet durable: call `sync()`); returns their locations.

        Rotates to a new segment before a record that would cross `segment_size` (a record larger
        than a segment gets a segment of its own). `crcs`: the payloads' CRC32C if known.
        """
        locs: list[Location] = []
        parts: list[bytes] = []
        start = self._woff
        off = start
        seg = self._wseg
        limit = self.segment_size
        pack, crc = HEADER.pack, _crc
        for j, payload in enumerate(payloads):
            n = len(payload)
            if off > 0 and off + HEADER_SIZE + n > limit:
                self._flush(parts, start)
                parts = []
                self._rotate()
                seg, off, start = self._wseg, 0, 0
            locs.append(_tuple_new(Location, (seg, off)))
            parts.append(pack(MAGIC, n, crcs[j] if crcs is not None else crc(payload)))
            parts.append(payload)
            off += HEADER_SIZE + n
        self._flush(parts, start)
        return locs

    def _flush(self, parts: list[bytes], start: int) -> None:
        if not parts:
            return
        data = parts[0] + parts[1] if len(parts) == 2 else b"".join(parts)
        _pwrite_all(self._wfd, data, start)
        self._woff = start + len(data)
        self._dirty.add(self._wseg)
        with self._lock:
            self._sizes[self._wseg] = self._woff

    def _rotate(self) -> None:
        if self.sync_enabled and self._wseg in self._dirty:
            os.fdatasync(self._wfd)
        self._dirty.discard(self._wseg)
        new = self._wseg + 1
        self._create(new)
        self._open_for_append(new, 0)
        with self._lock:
            self._sizes[new] = 0
        log.info("value log rotated to %s", self.path(new))

    def sync(self) -> None:
        """fdatasync the active segment (earlier segments were synced when rotated away)."""
        if self.sync_enabled and self._dirty:
            os.fdatasync(self._wfd)
        self._dirty.clear()

    def rollback_to(self, end: Location) -> None:
        """Undo appends after a failed group (best effort; recovery would do the same)."""
        for seg in list(self._sizes):
            if seg > end.segment:
                self.delete_segment(seg)
        self._open_for_append(end.segment, end.offset)
        os.ftruncate(self._wfd, end.offset)
        with self._lock:
            self._sizes[end.segment] = end.offset

    # -- reads (any thread) --------------------------------------------------------------------

    def read_fd(self, segment: int) -> int:
        with self._lock:
            fd = self._read_fds.get(segment)
            if fd is None:
                try:
                    fd = os.open(self.path(segment), os.O_RDONLY)
                except FileNotFoundError:
                    raise OutOfRange(f"value-log segment {segment_name(segment)} was garbage "
                                      "collected") from None
                self._read_fds[segment] = fd
            return fd

    def read(self, loc: Location, length: int) -> bytes:
        """Read and check the record at `loc` whose payload is `length` bytes."""
        buf = os.pread(self.read_fd(loc.segment), HEADER_SIZE + length, loc.offset)
        return self._check(buf, 0, loc, length)

    def _check(self, buf: bytes | memoryview, pos: int, loc: Location, length: int) -> bytes:
        payload, _ = decode_record(buf, pos, str(self.path(loc.segment)), loc.offset - pos)
        if len(payload) != length:
            raise CorruptRecord(str(self.path(loc.segment)), loc.offset,
                                f"length {len(payload)} differs from the indexed {length}")
        return payload

    def reader(self) -> "Reader":
        return Reader(self)

    def scan(self, segment: int, start: int = 0, end: int | None = None
             ) -> Iterator[tuple[int, bytes]]:
        """Yield (offset, payload) for every record in [start, end) of a segment, buffered."""
        p = self.path(segment)
        if end is None:
            end = p.stat().st_size
        with open(p, "rb", buffering=0) as f:
            f.seek(start)
            buf = b""
            base = start  # file offset of buf[0]
            pos = 0
            while base + pos < end:
                need = HEADER_SIZE
                if len(buf) - pos >= HEADER_SIZE:
                    need = HEADER_SIZE + HEADER.unpack_from(buf, pos)[1]
                if len(buf) - pos < need:
                    more = f.read(max(need - (len(buf) - pos), 1 << 20))
                    if not more:
                        decode_record(buf, pos, str(p), base)  # raises on the short record
                    buf = buf[pos:] + more
                    base += pos
                    pos = 0
                    continue
                off = base + pos
                payload, pos = decode_record(buf, pos, str(p), base)
                if base + pos > end:
                    raise CorruptRecord(str(p), off, f"record runs past the end {end}")
                yield off, payload

    def size_of(self, segment: int) -> int:
        with self._lock:
            return self._sizes.get(segment, 0)

    def total_bytes(self) -> int:
        with self._lock:
            return sum(self._sizes.values())

    def segment_count(self) -> int:
        with self._lock:
            return len(self._sizes)

    def delete_segment(self, segment: int) -> int:
        """Unlink a segment file; returns its size. Its read descriptor is retired, not closed
        (module docstring)."""
        now = self._clock()
        with self._lock:
            fd = self._read_fds.pop(segment, None)
            size = self._sizes.pop(segment, 0)
            if fd is not None:
                self._retired.append((now + self._retire_grace_s, fd))
            due = [f for t, f in self._retired if t <= now]
            self._retired = [(t, f) for t, f in self._retired if t > now]
        for f in due:
            os.close(f)
        try:
            self.path(segment).unlink()
        except FileNotFoundError:
            pass
        return size

    def sync_dir(self) -> None:
        fsync_path(self.dir)

    def close(self) -> None:
        with self._lock:
            fds = list(self._read_fds.values()) + [f for _, f in self._retired]
            self._read_fds.clear()
            self._retired.clear()
        for fd in fds:
            os.close(fd)
        if self._wfd >= 0:
            os.close(self._wfd)
            self._wfd = -1


class Reader:
    """A read cursor with a read-ahead window, so commit-ordered reads of nearby records cost
    one `pread` per window rather than one per record. Not shared between threads."""

    def __init__(self, vlog: ValueLog) -> None:
        self._vlog = vlog
        self._seg = -1
        self._start = 0
        self._buf = b""

    def read(self, loc: Location, length: int) -> bytes:
        need = HEADER_SIZE + length
        pos = loc.offset - self._start
        if loc.segment != self._seg or pos < 0 or pos + need > len(self._buf):
            if need >= _READ_WINDOW:
                self._seg = -1
                self._buf = b""
                return self._vlog.read(loc, length)
            fd = self._vlog.read_fd(loc.segment)
            self._buf = os.pread(fd, _READ_WINDOW, loc.offset)
            self._seg, self._start, pos = loc.segment, loc.offset, 0
        return self._vlog._check(memoryview(self._buf), pos, loc, length)
