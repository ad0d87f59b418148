"""Commit-ordered reads for PullBinlogs: whole transactions, framed for the wire as they are read.

Invariant: a chunk's `covered` ts names only transactions sent whole — every binlog with
commit_ts <= covered has been returned by this chunk or an earlier one of the same reader, and a
transaction split over several chunks (a huge one) counts as covered only once its COMMIT is out.

Speed comes from not touching protobuf on the server: the `e` index range gives commits and
fakes in commit order, and a COMMIT entry carries the location of its single-part prewrite (no
index lookup per transaction; multi-part prewrites use an `s` prefix scan). Records are sliced
out of large sequential `pread` windows (two of them, so the commit stream and a long
transaction's distant prewrite do not evict each other), each one checked (magic, length,
CRC32C) and appended with its field header to the chunk: the chunk's bytes are exactly the
`binlogs` field (1) of a serialized PullBinlogsResp, so the service sends them without
re-encoding.

Each whole transaction also gets its `txns` entry (PullBinlogsResp field 4, a TxnMeta): the
stored COMMIT (or FAKE) record verbatim — TxnMeta mirrors Binlog's field numbers — plus its
binlog count, so the envelope costs neither side a parse. Invariant: a chunk's `txns` are either
empty or describe every binlog of the chunk, in order; a chunk holding a piece of a split (huge)
transaction has none, and the consumer decodes it.

With `packed = True` (PullBinlogsReq.packed_meta) the same description travels as packed arrays
instead (PullBinlogsResp fields 5..9): per entry its commit_ts, start_ts and the byte offset where
its framed binlogs end, plus the indexes of FAKE entries and of entries whose COMMIT may carry a
producer position (its tag byte occurs in the record). Filling them costs a few list appends per
transaction; the same invariant holds (all or nothing per chunk). One walk (`_chunks`) builds
both descriptions; the encoders are core/wire.py's, shared with the drainer that reads them.
"""
from __future__ import annotations

import os
import struct
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple

import google_crc32c
import plyvel
from google.protobuf.message import DecodeError

from sluice.core import wire
from sluice.core.errors import CorruptRecord, FailedPrecondition
from sluice.proto import sluice_pb2 as pb

from . import index as ix
from .vlog import HEADER, HEADER_SIZE, MAGIC, Location, ValueLog

WINDOW = 1 << 20          # bytes per sequential value-log read
_COMMIT = pb.COMMIT
_FAKE = pb.FAKE
_PREWRITE = pb.PREWRITE
_E_KEY = struct.Struct(">cQBI")
_crc = google_crc32c.value


class Chunk(NamedTuple):
    frames: bytes      # wire encoding of PullBinlogsResp.binlogs for `count` payloads
    count: int
    covered: int       # see the module invariant
    exhausted: bool    # nothing more up to the watermark the reader was opened at
    txns: bytes = b""  # wire encoding of PullBinlogsResp.txns (see the module invariant)


_POSITION_TAG = 0x4A      # Binlog.position: field 9, length-delimited
_from_string = pb.Binlog.FromString


def _heavy(key: bytes, val: bytes, limit: int) -> bool:
    """Whether an `e` entry's transaction is more than an inline read takes: anything but a
    single-part transaction of at most `limit` bytes or a FAKE of at most `limit` bytes."""
    if len(val) == ix.COMMIT_VAL_SIZE:
        _, _, length, _, _, _, _, plen = ix.commit_val_unpack(val)
        return length + plen > limit
    return key[9] != _FAKE or ix.entry_val_unpack(val)[2] > limit


class SharedChunks:
    """Chunks that covered a whole range (after, watermark] in one call, for the other readers
    that ask for the same range: readers following live (one per drainer) all wake for the same
    durable group, and each would otherwise read, check and frame the same records. The bytes of
    (after, watermark] never change once served (nothing is stored at or below the served
    watermark afterwards), so a kept chunk is exactly what a reader would build. A few recent
    ones are kept; any thread."""

    def __init__(self, limit: int = 4) -> None:
        self.limit = limit
        self.hits = 0
        self._lock = threading.Lock()
        self._chunks: dict[tuple[int, int, bool, int, bool], Chunk] = {}

    def get(self, key: tuple[int, int, bool, int, bool]) -> Chunk | None:
        """The chunk kept for (after, watermark, packed, max_bytes, inline), if any: the same
        request on the same range, so exactly the bytes the caller would build."""
        with self._lock:
            chunk = self._chunks.get(key)
            if chunk is not None:
                self.hits += 1
            return chunk

    def put(self, key: tuple[int, int, bool, int, bool], chunk: Chunk) -> None:
        with self._lock:
            chunks = self._chunks
            chunks[key] = chunk
            if len(chunks) > self.limit:
                del chunks[next(iter(chunks))]   # the oldest


class CommitReader:
    """One reader per PullBinlogs stream, used from one (worker) thread at a time.

    Range mode (`commits` None): everything with commit_ts in (after, watermark], reopened at
    the then-served watermark after each exhaustion, so a caller that waits for new data and
    calls `next_chunk` again follows live. List mode: exactly the transactions committed at
    `commits` (the schema preamble), once; `covered` stays `after`. In range mode a chunk that
    covers everything up to the watermark in one call is kept in `shared` (when given) and
    taken from there by a reader at the same place.
    """

    def __init__(self, db: plyvel.DB, vlog: ValueLog, after: int,
                 watermark: Callable[[], int], commits: Sequence[int] | None = None,
                 shared: SharedChunks | None = None) -> None:
        self._db = db
        self._shared = shared if commits is None else None
        self._vlog = vlog
        self.after = after
        self._watermark = watermark
        self._commits = commits
        self.packed = False   # describe entries by packed arrays (PullBinlogsReq.packed_meta)
        self._gen: Iterator[tuple[tuple[bytes, ...], int, bool]] | None = None
        self._max_bytes = 0   # of the chunk being built (next_chunk sets it)
        self._inline = False  # the chunk being built is read on the event loop (next_chunk)
        self._opened_at = after
        self._done = False
        # two read windows: (segment, file offset of buf[0], buf)
        self._w0: tuple[int, int, bytes] = (-1, 0, b"")
        self._w1: tuple[int, int, bytes] = (-1, 0, b"")

    def next_chunk(self, max_bytes: int, inline: bool = False) -> Chunk:
        """Up to about max_bytes of payloads (at least one binlog when any is ready).

        `inline`: the caller reads on its event loop, so the chunk stops (not exhausted, maybe
        empty) before a transaction that is not a single-part one of at most max_bytes, or a
        small FAKE: the caller reads that one with the next call, from a worker thread."""
        self._max_bytes = max_bytes
        self._inline = inline
        key = None
        if self._gen is None:
            if self._done:
                return Chunk(b"", 0, self.after, True)
            shared = self._shared
            if shared is None:
                self._gen = self._chunks(self._entries(), max_bytes)
            else:
                wm = self._watermark()
                if wm <= self.after:   # nothing new (a live reader woken early, or polling)
                    self._opened_at = self.after
                    return Chunk(b"", 0, self.after, True)
                key = (self.after, wm, self.packed, max_bytes, inline)
                chunk = shared.get(key)
                if chunk is not None:
                    self.after = self._opened_at = wm
                    return chunk
                self._gen = self._chunks(self._entries(wm), max_bytes)
        parts, metas, count, covered, exhausted = next(self._gen)
        if exhausted:
            self._gen = None
            if self._commits is not None:
                self._done = True
            else:
                covered = max(covered, self._opened_at)
        if self._commits is None:
            self.after = covered
        chunk = Chunk(b"".join(parts), count, self.after, exhausted, b"".join(metas))
        if key is not None and exhausted:
            assert self._shared is not None
            self._shared.put(key, chunk)
        return chunk

    def binlogs(self) -> Iterator[tuple[bytes, int, bool]]:
        """One lazy pass: (payload, commit_ts, ends a transaction) up to the watermark read
        now (range mode) or over the listed transactions."""
        for payloads, commit_ts, txn_end in self._pieces(self._entries()):
            last = len(payloads) - 1
            for i, payload in enumerate(payloads):
                yield payload, commit_ts, txn_end and i == last

    def close(self) -> None:
        gen, self._gen = self._gen, None
        if gen is not None:
            gen.close()  # type: ignore[attr-defined]

    # -- internals ---------------------------------------------------------------------------

    def _entries(self, wm: int | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Index entries of the listed transactions, or of the range (after, wm] (wm: the
        served watermark read now when not given)."""
        if self._commits is not None:
            self._opened_at = self.after
            keys = [ix.entry_key(ix.E, c, _COMMIT, 0) for c in sorted(set(self._commits))]
            return self._pinned(keys)
        # The range covers commit_ts <= the watermark read here: reporting it never over-claims.
        if wm is None:
            wm = max(self.after, self._watermark())
        self._opened_at = wm
        if wm <= self.after:
            return iter(())
        return self._db.iterator(start=ix.ts_key(ix.E, self.after + 1),
                                 stop=ix.ts_key(ix.E, wm + 1))

    def _chunks(self, entries: Iterable[tuple[bytes, bytes]], max_bytes: int
                ) -> Iterator[tuple[list[bytes], list[bytes], int, int, bool]]:
        """(framed payloads, description, count, covered, exhausted) of about max_bytes each.
        The description is the chunk's `txns` entries, or with `packed` its packed arrays; it
        is empty unless every binlog of the chunk is in a transaction that lies whole in it.

        The hot path of PullBinlogs: a COMMIT that knows its single-part prewrite, both records
        in the current read window, is handled inline; everything else goes through `_read` and
        `_pieces`, the reference (simple) version of the same walk."""
        packed = self.packed
        parts: list[bytes] = []
        append = parts.append
        metas: list[bytes] = []          # txns entries (not packed)
        mappend = metas.append
        cts: list[int] = []              # packed arrays
        sts: list[int] = []
        ends: list[int] = []
        fakes: list[int] = []
        positioned: list[int] = []
        whole = True          # every binlog of this chunk is in a transaction that lies whole in it
        in_txn = 0            # binlogs of the current (generic path) transaction so far
        end = 0               # bytes of framed binlogs in this chunk so far
        count2 = wire.count_field(2)
        mheads = wire.META_HEADS
        size = count = 0
        covered = self.after
        heads = wire.HEADS
        unpack_key = _E_KEY.unpack
        unpack_commit = ix.commit_val_unpack
        unpack_head = HEADER.unpack_from
        commit_size = ix.COMMIT_VAL_SIZE
        read = self._read
        crc32c = _crc
        tag = _POSITION_TAG
        wseg, wstart, wbuf = self._w0
        wlen = len(wbuf)
        inline = self._inline
        for key, val in entries:
            # A chunk ends before this entry when it is full, or (`inline`) when the entry is
            # too much to read on the event loop: the entry is read by the next call. Either
            # way at a transaction boundary, so the chunk is described when all of it is whole.
            while count and size >= max_bytes or inline and _heavy(key, val, max_bytes):
                yield (parts, (([wire.packed_meta(cts, sts, ends, fakes, positioned)] if packed
                                else metas) if whole else []), count, covered, False)
                parts, metas, cts, sts, ends, fakes, positioned = [], [], [], [], [], [], []
                append, mappend = parts.append, metas.append
                whole = True
                size = count = end = 0
                max_bytes, inline = self._max_bytes, self._inline  # the caller's, for this call
            if len(val) == commit_size:
                seg, off, length, _, start_ts, pseg, poff, plen = unpack_commit(val)
                p = poff - wstart
                if pseg == wseg and p >= 0 and p + 12 + plen <= wlen:
                    magic, n, crc = unpack_head(wbuf, p)
                    pw = wbuf[p + 12:p + 12 + plen]
                    if magic != MAGIC or n != plen or crc32c(pw) != crc:
                        self._corrupt(pseg, poff, magic, n, plen)
                else:
                    pw = read(pseg, poff, plen)
                    wseg, wstart, wbuf = self._w0
                    wlen = len(wbuf)
                p = off - wstart
                if seg == wseg and p >= 0 and p + 12 + length <= wlen:
                    magic, n, crc = unpack_head(wbuf, p)
                    cm = wbuf[p + 12:p + 12 + length]
                    if magic != MAGIC or n != length or crc32c(cm) != crc:
                        self._corrupt(seg, off, magic, n, length)
                else:
                    cm = read(seg, off, length)
                    wseg, wstart, wbuf = self._w0
                    wlen = len(wbuf)
                h1 = heads.get(plen) or wire.frame_head(plen)
                h2 = heads.get(length) or wire.frame_head(length)
                append(h1)
                append(pw)
                append(h2)
                append(cm)
                covered = unpack_key(key)[1]
                if packed:
                    if tag in cm:
                        positioned.append(len(cts))
                    cts.append(covered)
                    sts.append(start_ts)
                    end += len(h1) + plen + len(h2) + length
                    ends.append(end)
                else:
                    head = mheads.get(length + 3)
                    mappend(head if head is not None else wire.meta_head(length + 3))
                    mappend(cm)
                    mappend(count2)
                size += plen + length
                count += 2
            else:
                for payloads, commit_ts, txn_end in self._pieces(((key, val),)):
                    for payload in payloads:
                        head = wire.frame_head(len(payload))
                        append(head)
                        append(payload)
                        end += len(head) + len(payload)
                        size += len(payload)
                        count += 1
                    in_txn += len(payloads)
                    if txn_end:
                        covered = commit_ts
                        if not packed:
                            metas += wire.txn_meta(payloads[-1], in_txn)
                        else:
                            try:
                                last = _from_string(payloads[-1])
                            except DecodeError:
                                whole = False   # undescribed: the consumer decodes and reports it
                                last = pb.Binlog()
                            if last.tp == pb.FAKE:
                                fakes.append(len(cts))
                                sts.append(commit_ts)
                            else:
                                if last.HasField("position"):
                                    positioned.append(len(cts))
                                sts.append(last.start_ts)
                            cts.append(commit_ts)
                            ends.append(end)
                        in_txn = 0
                    elif size >= max_bytes:   # a huge transaction: split, not yet covered
                        yield parts, [], count, covered, False
                        parts, metas, cts, sts, ends, fakes, positioned = \
                            [], [], [], [], [], [], []
                        append, mappend = parts.append, metas.append
                        whole = False     # the next chunk starts inside this transaction
                        size = count = end = 0
                        max_bytes, inline = self._max_bytes, self._inline
                wseg, wstart, wbuf = self._w0
                wlen = len(wbuf)
        yield (parts, (([wire.packed_meta(cts, sts, ends, fakes, positioned)] if packed
                        else metas) if whole else []), count, covered, True)

    def _pinned(self, keys: list[bytes]) -> Iterator[tuple[bytes, bytes]]:
        for key in keys:
            val = self._db.get(key)
            if val is None:
                raise FailedPrecondition(
                    f"schema transaction committed at {ix.parse_entry_key(key)[1]} is pinned but "
                    "its index entry is missing: the pump's index is inconsistent")
            yield key, val

    def _pieces(self, entries: Iterable[tuple[bytes, bytes]]
                ) -> Iterator[tuple[tuple[bytes, ...], int, bool]]:
        """(payloads, commit_ts, ends a transaction) in commit order: a whole transaction at a
        time, except a multi-part prewrite, whose parts come one at a time (bounded memory)."""
        read = self._read
        unpack_key = _E_KEY.unpack
        commit_size = ix.COMMIT_VAL_SIZE
        unpack_commit = ix.commit_val_unpack
        unpack_entry = ix.entry_val_unpack
        for key, val in entries:
            if len(val) == commit_size:   # a COMMIT that knows its single-part prewrite
                seg, off, length, _, _, pseg, poff, plen = unpack_commit(val)
                yield (read(pseg, poff, plen), read(seg, off, length)), unpack_key(key)[1], True
                continue
            _, commit_ts, tp, _ = unpack_key(key)
            seg, off, length, _, start_ts = unpack_entry(val)
            if tp == _COMMIT:
                prefix = ix.ts_key(ix.S, start_ts) + bytes([_PREWRITE])
                for _, pval in self._db.iterator(prefix=prefix):
                    pseg, poff, plen = unpack_entry(pval)[:3]
                    yield (read(pseg, poff, plen),), commit_ts, False
            yield (read(seg, off, length),), commit_ts, True

    def _read(self, seg: int, off: int, length: int) -> bytes:
        need = HEADER_SIZE + length
        wseg, wstart, buf = self._w0
        pos = off - wstart
        if wseg != seg or pos < 0 or pos + need > len(buf):
            wseg, wstart, buf = self._w1
            pos = off - wstart
            if wseg == seg and pos >= 0 and pos + need <= len(buf):
                self._w0, self._w1 = self._w1, self._w0
            elif need > WINDOW:
                return self._vlog.read(Location(seg, off), length)
            else:
                buf = os.pread(self._vlog.read_fd(seg), WINDOW, off)
                if len(buf) < need:   # the segment ends early: let the checked read say how
                    return self._vlog.read(Location(seg, off), length)
                self._w1 = self._w0
                self._w0 = (seg, off, buf)
                pos = 0
        magic, n, crc = HEADER.unpack_from(buf, pos)
        start = pos + HEADER_SIZE
        payload = buf[start:start + length]
        if magic != MAGIC or n != length or _crc(payload) != crc or len(payload) != length:
            self._corrupt(seg, off, magic, n, length)
        return payload

    def _corrupt(self, seg: int, off: int, magic: int, n: int, length: int) -> None:
        path = str(self._vlog.path(seg))
        if magic != MAGIC:
            raise CorruptRecord(path, off, f"bad magic {magic:#010x}")
        if n != length:
            raise CorruptRecord(path, off, f"length {n} differs from the indexed {length}")
        raise CorruptRecord(path, off, "CRC32C mismatch")
