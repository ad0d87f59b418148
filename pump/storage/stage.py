"""Validation of one request against the stored state plus the earlier requests of its group.

`Stager.stage` decodes a binlog and hands it to the handler of its type (`_HANDLERS`); a handler
raises (nothing staged) or adds the records and index facts to the request's `Stage`. Runs on the
committer thread only: it reads the index and memory, and writes nothing; a client's timestamp
above every one the TSO is known to have issued costs one TSO round trip (`_check_issued`).
"""
from __future__ import annotations

import os
import struct
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Protocol

import google_crc32c
from google.protobuf.message import DecodeError

from sluice.core.errors import (AlreadyExists, FailedPrecondition, InvalidArgument, SluiceError,
                                StaleEpoch, UnknownProducer)
from sluice.proto import sluice_pb2 as pb

from . import index as ix
from .records import NO_PRODUCER, ProducerRecord, Stage, TxnRecord
from .schema import multipart_schema_tables, schema_tables, value_tables
from .sorter import Pending, check_commit, check_part
from .state import StoreState
from .valuecheck import check_multipart_value
from .vlog import HEADER_SIZE

# A multi-part prewrite of more parts than this (64 MiB parts: 4 TiB) is not a transaction but a
# part bitmap that would cost memory: refused.
MAX_PARTS = 1 << 16

_PREWRITE, _COMMIT, _ROLLBACK, _FAKE = pb.PREWRITE, pb.COMMIT, pb.ROLLBACK, pb.FAKE
_COMMITTED, _ROLLED_BACK = pb.TXN_COMMITTED, pb.TXN_ROLLED_BACK
_HASH = struct.Struct(">II")
_crc32c = google_crc32c.value
# Builds a named tuple without the Python-level `__new__` its class defines (one frame per call,
# once per prewrite here): every field is given, in order.
_tuple_new = tuple.__new__
_NO_SEGMENTS: frozenset[int] = frozenset()
_NO_BOUND = 1 << 64
_from_string = pb.Binlog.FromString

# (read(offset, n), length) of one part's serialized Binlog
PartReader = tuple[Callable[[int, int], bytes], int]


class Admission(Protocol):
    """The pump's admission rules for new prewrites (pump/admission.py), checked on the
    committer thread: in-memory only. A storage without one stores any well-formed binlog."""

    def check(self, producer_id: str) -> None:
        """Raise (InvalidArgument) unless prewrites of this producer can be resolved later."""

    def check_value(self, value: bytes) -> pb.PrewriteValue:
        """Raise (InvalidArgument) unless a whole prewrite value decodes; returns it decoded
        (the stager reads its schema declarations from it instead of walking it again)."""


class IssuedTimestamps(Protocol):
    """The TSO as the pump's stager sees it (pump/tso_view.py). A storage without one stores
    any timestamp a client sends."""

    def fresh_ts(self) -> int:
        """A timestamp the TSO hands out now (blocks the committer thread for one TSO round
        trip); raises Unavailable when none comes."""


def content_hash(payload: bytes, crc: int) -> bytes:
    """Content identity for idempotent retries: CRC32C (also the record checksum) and zlib's
    CRC-32 side by side, 64 bits. It only ever compares two binlogs under the same key, where a
    collision needs a retry with different content that matches both; a cryptographic hash
    would cost more than the rest of the write path."""
    return _HASH.pack(crc, _zcrc(payload))


_zcrc = zlib.crc32


class Stager:
    def __init__(self, state: StoreState) -> None:
        self.state = state
        # Set by the pump server before it takes writes (see Admission).
        self.admission: Admission | None = None
        self._tso: IssuedTimestamps | None = None
        # The highest timestamp the TSO is known to have issued (a fetch, or a heartbeat): a
        # client's timestamp at or below it needs no TSO round trip. No bound without a TSO.
        self.issued = _NO_BOUND
        # (ts, monotonic s) of the last timestamp `_check_issued` fetched: issued to this pump
        # alone, so its heartbeat may use it as a fake binlog's ts instead of fetching another.
        self.fetched: tuple[int, float] = (0, float("-inf"))

    @property
    def tso(self) -> IssuedTimestamps | None:
        return self._tso

    @tso.setter
    def tso(self, value: IssuedTimestamps | None) -> None:
        self._tso = value
        self.issued = 0 if value is not None else _NO_BOUND

    # -- lookups: this request, then its group, then what is stored ----------------------

    def producer(self, st: Stage, grp: Stage, pid: str) -> ProducerRecord:
        rec = st.producers.get(pid) or grp.producers.get(pid) or self.state.producers.get(pid)
        return rec if rec is not None else NO_PRODUCER

    def _key_hash(self, st: Stage, grp: Stage, key: bytes, stored: bool = True
                  ) -> bytes | None:
        """The content hash under `key`: staged, or in the index unless `stored` is false (the
        caller knows the index cannot hold it: see StoreState.max_start_ts)."""
        h = st.keys.get(key) or grp.keys.get(key)
        if h is not None or not stored:
            return h
        raw = self.state.db.get(key)
        return None if raw is None else ix.entry_val_unpack(raw)[3]

    def _pending(self, st: Stage, grp: Stage, start_ts: int) -> Pending | None:
        if start_ts in st.pending:
            return st.pending[start_ts]
        if start_ts in grp.pending:
            return grp.pending[start_ts]
        return self.state.sorter.pending.get(start_ts)

    def _txn(self, st: Stage, grp: Stage, start_ts: int) -> TxnRecord | None:
        t = st.txn.get(start_ts) or grp.txn.get(start_ts)
        if t is not None or start_ts > self.state.max_start_ts:
            return t
        raw = self.state.db.get(ix.ts_key(ix.T, start_ts))
        return None if raw is None else ix.txn_val_unpack(raw)

    def _check_issued(self, i: int, field: str, ts: int) -> None:
        """Refuse a timestamp the TSO has not issued yet. A legitimate one was handed
        out before its request arrived, so a TSO timestamp fetched now is at least it: one
        round trip decides, with no clock-skew allowance. A timestamp from the future (a bug,
        or a corrupted request) would otherwise be stored and order its transaction after
        others that committed later, or hold it back until the TSO's clock caught up."""
        # Callers test `ts > self.issued` first; without a TSO `issued` is _NO_BOUND.
        assert self._tso is not None
        now = self._tso.fresh_ts()
        self.fetched = (now, time.monotonic())
        if now > self.issued:
            self.issued = now
        if ts > now:
            raise InvalidArgument(
                f"binlog {i}: {field} {ts} is ahead of every timestamp the TSO has issued "
                f"(latest {now}): timestamps must come from the TSO")

    # -- requests ------------------------------------------------------------------------

    def stage_epoch(self, st: Stage, grp: Stage, pid: str, epoch: int) -> ProducerRecord:
        rec = self.producer(st, grp, pid)
        if epoch < rec.epoch:
            raise StaleEpoch(f"producer {pid}: epoch {epoch} < recorded epoch {rec.epoch}")
        if epoch > rec.epoch:
            rec = ProducerRecord(epoch, rec.position, rec.snapshot)
            st.producers[pid] = rec
        return rec

    def stage(self, st: Stage, grp: Stage, i: int, payload: bytes,
              from_client: bool = False) -> None:
        """Validate binlog `i` of a request and stage it into `st` (raises: nothing staged)."""
        self.stage_all(st, grp, (payload,), from_client, i)

    def stage_all(self, st: Stage, grp: Stage, payloads: Sequence[bytes],
                  from_client: bool = False, first: int = 0) -> None:
        """Validate the binlogs of a request in order and stage them into `st` (raises at the
        first bad one, binlog `first + k`: the caller then drops `st` whole).

        The hot loop of the write path (every binlog of every request): lookups are bound
        once per request and the handlers take plain arguments rather than a record."""
        producers = self.state.producers
        st_producers, grp_producers = st.producers, grp.producers
        from_string = _from_string
        handlers = _HANDLERS
        for i, payload in enumerate(payloads, first):
            try:
                b = from_string(payload)
            except DecodeError as e:
                raise InvalidArgument(f"binlog {i}: malformed Binlog payload: {e}") from None
            pid = b.producer_id
            if pid:
                rec = st_producers.get(pid) or grp_producers.get(pid) or producers.get(pid) \
                    or NO_PRODUCER
                epoch = b.producer_epoch
                if epoch != rec.epoch:
                    if epoch < rec.epoch:
                        raise StaleEpoch(f"binlog {i}: producer {pid} epoch {epoch} < "
                                         f"recorded epoch {rec.epoch}")
                    st_producers[pid] = ProducerRecord(epoch, rec.position, rec.snapshot)
            if b.start_ts <= 0:
                raise InvalidArgument(f"binlog {i}: start_ts {b.start_ts} must be > 0")
            handler = handlers.get(b.tp)
            if handler is None:
                raise InvalidArgument(f"binlog {i}: unknown binlog type {b.tp}")
            crc = _crc32c(payload)
            # content_hash, inlined: this runs for every binlog.
            handler(self, st, grp, i, b, payload, crc, _HASH.pack(crc, _zcrc(payload)),
                    from_client)
        if st.progress:
            self._record_progress(st, grp)

    def _record_progress(self, st: Stage, grp: Stage) -> None:
        """Each producer's position and snapshot progress from the last COMMIT of the request
        that carries it (`_commit` notes those binlogs), at the producer's current epoch."""
        done: set[str] = set()
        for pid, _ in st.progress:
            if pid in done:
                continue
            done.add(pid)
            rec = self.producer(st, grp, pid)
            pos_b = st.progress.get((pid, True))
            snap_b = st.progress.get((pid, False))
            st.producers[pid] = ProducerRecord(
                rec.epoch,
                pos_b.position.SerializeToString() if pos_b is not None else rec.position,
                snap_b.snapshot.SerializeToString() if snap_b is not None else rec.snapshot)
        st.progress.clear()

    # -- one handler per binlog type -------------------------------------------------------
    # Each takes (binlog index in its request, decoded binlog, payload, CRC32C, content hash,
    # whether a client sent it), raises (nothing staged) or stages it into `st`.

    def _prewrite(self, st: Stage, grp: Stage, i: int, b: pb.Binlog, payload: bytes, crc: int,
                  h: bytes, from_client: bool) -> None:
        start_ts, pid = b.start_ts, b.producer_id
        part_count = b.part_count or 1
        part_no = b.part_no
        if part_no >= part_count:
            raise InvalidArgument(f"binlog {i}: prewrite start_ts={start_ts}: part_no "
                                  f"{part_no} >= part_count {part_count}")
        if part_count > MAX_PARTS:
            raise InvalidArgument(f"binlog {i}: prewrite start_ts={start_ts}: part_count "
                                  f"{part_count} > {MAX_PARTS}")
        if start_ts > self.issued:
            self._check_issued(i, "start_ts", start_ts)
        key = ix.entry_key_pack(ix.S, start_ts, _PREWRITE, part_no)
        p = self._pending(st, grp, start_ts)
        if p is None or p.parts >> part_no & 1:
            old = self._key_hash(st, grp, key, start_ts <= self.state.max_start_ts)
            if old is not None:
                if old == h:
                    return
                raise AlreadyExists(f"binlog {i}: a different prewrite (part {part_no}) is "
                                    f"already stored under start_ts={start_ts}")
        if p is None:
            t = self._txn(st, grp, start_ts)
            if t is not None:
                raise AlreadyExists(
                    f"binlog {i}: start_ts={start_ts} is already "
                    f"{'committed' if t[0] == _COMMITTED else 'rolled back'}; a new prewrite "
                    "part cannot be added")
        adm = self.admission
        if p is None:
            if adm is not None:
                _admit(adm, i, start_ts, pid)
            # A multi-part prewrite's schema is found once all its parts are there (commit).
            # With admission the value is decoded anyway: its schema is read from that.
            if part_count > 1:
                tables: tuple[int, ...] = ()
            elif adm is not None:
                tables = value_tables(_admit_value(adm, i, start_ts, b.prewrite_value))
            else:
                tables = schema_tables(b.prewrite_value)
            p = _tuple_new(Pending, (start_ts, part_count, 1 << part_no, pid, time.monotonic(),
                                     _NO_SEGMENTS, tables, None))
        else:
            check_part(p, start_ts, part_no, part_count)
            p = p.with_part(part_no)
        st.pending[start_ts] = p
        st.add(payload, crc, (key, h, 0, start_ts, start_ts))
        if adm is not None and part_count > 1 and p.complete:
            # The parts add up only now: the whole value must decode before the last part
            # is acknowledged (the commit could never be read otherwise). Streamed over the
            # stored parts: memory stays bounded whatever the transaction's size.
            try:
                check_multipart_value(self.multipart_parts(st, grp, start_ts, part_count))
            except (ValueError, IndexError, DecodeError, OSError) as e:
                raise InvalidArgument(
                    f"binlog {i}: prewrite start_ts={start_ts}: prewrite_value of its "
                    f"{part_count} parts joined is not a valid PrewriteValue: {e}") from None

    def _commit(self, st: Stage, grp: Stage, i: int, b: pb.Binlog, payload: bytes, crc: int,
                h: bytes, from_client: bool) -> None:
        start_ts = b.start_ts
        commit_ts = b.commit_ts
        if commit_ts <= start_ts:
            raise InvalidArgument(f"binlog {i}: commit_ts {commit_ts} <= start_ts {start_ts}")
        # Clients' commits and the pump's own resolves alike (a producer's TxnStatus answer).
        if commit_ts > self.issued:
            self._check_issued(i, "commit_ts", commit_ts)
        key = ix.entry_key_pack(ix.E, commit_ts, _COMMIT, 0)
        p = self._pending(st, grp, start_ts)
        if p is None:
            t = self._txn(st, grp, start_ts)
            if t is not None:
                state, t_commit_ts = t[0], t[1]
                if state == _COMMITTED and t_commit_ts == commit_ts:
                    return  # the same decision again (a retry, or the pump's own resolve)
                raise AlreadyExists(
                    f"binlog {i}: start_ts={start_ts} is already "
                    + (f"committed with commit_ts={t_commit_ts}" if state == _COMMITTED
                       else "rolled back"))
        # Only a ts at or below the highest one stored can collide: skip the lookup otherwise.
        if commit_ts <= max(self.state.sorter.max_ts, grp.max_ts, st.max_ts) and \
                self._key_hash(st, grp, key) is not None:
            raise AlreadyExists(f"binlog {i}: commit_ts {commit_ts} is already used by "
                                "another transaction")
        check_commit(p, start_ts, commit_ts, self.state.served)
        assert p is not None
        if p.part_count > 1:
            p = p._replace(tables=multipart_schema_tables(
                self.multipart_parts(st, grp, start_ts, p.part_count)))
        st.pending[start_ts] = None
        st.txn[start_ts] = (_COMMITTED, commit_ts, h)
        st.commits.append((start_ts, commit_ts, p, len(st.records)))
        if commit_ts > st.max_ts:
            st.max_ts = commit_ts
        pid = b.producer_id
        if pid:
            # The producer's progress is what the request's last commit carrying it says:
            # serialized once per request by `_record_progress`, not once per commit.
            if b.HasField("position"):
                st.progress[(pid, True)] = b
            if b.HasField("snapshot"):
                st.progress[(pid, False)] = b
        st.add(payload, crc, (key, h, start_ts, commit_ts, 0))

    def _rollback(self, st: Stage, grp: Stage, i: int, b: pb.Binlog, payload: bytes, crc: int,
                  h: bytes, from_client: bool) -> None:
        start_ts = b.start_ts
        key = ix.entry_key_pack(ix.S, start_ts, _ROLLBACK, 0)
        p = self._pending(st, grp, start_ts)
        if p is None:
            t = self._txn(st, grp, start_ts)
            if t is None:
                raise FailedPrecondition(f"binlog {i}: rollback for start_ts={start_ts} "
                                         "without its prewrite")
            if t[0] == _ROLLED_BACK:
                return
            raise AlreadyExists(f"binlog {i}: start_ts={start_ts} is already committed "
                                f"with commit_ts={t[1]}")
        st.pending[start_ts] = None
        st.txn[start_ts] = (_ROLLED_BACK, 0, h)
        st.add(payload, crc, (key, h, 0, start_ts, 0))

    def _fake(self, st: Stage, grp: Stage, i: int, b: pb.Binlog, payload: bytes, crc: int,
              h: bytes, from_client: bool) -> None:
        start_ts = b.start_ts
        if from_client:
            raise InvalidArgument(f"binlog {i}: fake binlogs are written by the pump itself "
                                  "(heartbeats at fresh TSO timestamps), not by clients")
        ts = b.commit_ts
        if ts != start_ts:
            raise InvalidArgument(f"binlog {i}: fake binlog needs start_ts == commit_ts "
                                  f"(got {start_ts} and {ts})")
        key = ix.entry_key_pack(ix.E, ts, _FAKE, 0)
        if self._key_hash(st, grp, key) is not None:
            return  # a fake carries no data: any fake at this ts is the same heartbeat
        if ts <= self.state.served:
            raise FailedPrecondition(f"binlog {i}: fake binlog ts {ts} <= served watermark "
                                     f"{self.state.served}")
        if ts > self.issued:
            self.issued = ts   # the pump's own heartbeat: a fresh TSO timestamp
        if ts > st.max_ts:
            st.max_ts = ts
        st.add(payload, crc, (key, h, 0, ts, 0))

    # -- multi-part prewrites: the parts, wherever they are --------------------------------

    def multipart_parts(self, st: Stage, grp: Stage, start_ts: int, part_count: int
                        ) -> list[PartReader]:
        """(read(offset, n), length) of each part's serialized Binlog, in part order: in memory
        for parts of this group, `pread` on the value log otherwise."""
        parts: list[PartReader] = []
        for part_no in range(part_count):
            key = ix.entry_key_pack(ix.S, start_ts, _PREWRITE, part_no)
            staged = st.record_of(key) or grp.record_of(key)
            if staged is not None:
                parts.append((lambda off, n, b=staged: b[off:off + n], len(staged)))
                continue
            raw = self.state.db.get(key)
            if raw is None:   # the sorter saw every part: only a bug gets here
                raise FailedPrecondition(f"prewrite part {part_no} of start_ts={start_ts} is "
                                         "not in the index")
            seg, off, length = ix.entry_val_unpack(raw)[:3]
            fd = self.state.vlog.read_fd(seg)
            base = off + HEADER_SIZE
            parts.append((lambda o, n, fd=fd, base=base: os.pread(fd, n, base + o), length))
        return parts


_Handler = Callable[[Stager, Stage, Stage, int, pb.Binlog, bytes, int, bytes, bool], None]
_HANDLERS: dict[int, _Handler] = {
    _PREWRITE: Stager._prewrite,
    _COMMIT: Stager._commit,
    _ROLLBACK: Stager._rollback,
    _FAKE: Stager._fake,
}


def _admit(adm: Admission, i: int, start_ts: int, pid: str) -> None:
    if not pid:
        raise InvalidArgument(f"binlog {i}: prewrite start_ts={start_ts}: producer_id is "
                              "empty: a prewrite must name its registered producer, which "
                              "resolves it if its commit never comes")
    try:
        adm.check(pid)
    except UnknownProducer as e:
        raise UnknownProducer(f"binlog {i}: prewrite start_ts={start_ts}: {e}",
                              e.producer_id) from None


def _admit_value(adm: Admission, i: int, start_ts: int, value: bytes) -> pb.PrewriteValue:
    try:
        return adm.check_value(value)
    except SluiceError as e:
        raise InvalidArgument(f"binlog {i}: prewrite start_ts={start_ts}: {e}") from None
