"""The capture's snapshots: chunks interleaved with the binlog, driven by modes and signals.

Invariant: a chunk goes to the pumps as one transaction right after the source transaction whose
state it equals, carrying the progress of the emitted prefix of chunks, and every change of plan
goes out as a row-less progress transaction; so the pumps' committed prefix never claims a chunk
that is not committed, and a restart resumes at the next chunk.

Threads, emission order and lock order (`_emit_lock`, then `_cond`): docs/snapshots.md
("How the capture runs them").
"""
from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import pymysql

from sluice.capture.payload import Mutation
from sluice.capture.reader import SourceTxn
from sluice.capture.schema import SchemaTracker, stable_table_id, version_of
from sluice.capture.snapshot.chunks import ChunkSplitter, SplitOptions, estimated_rows
from sluice.capture.snapshot.emit import ChunkEmission, Stamper
from sluice.capture.snapshot.keys import SnapshotTable, load_shape
from sluice.capture.snapshot.progress import PrefixTracker, SnapshotState, encode
from sluice.capture.snapshot.readonly import ConsistentReadHold, Released
from sluice.capture.snapshot.reader import snapshot_connect
from sluice.capture.snapshot.signals import (ExecuteSnapshot, LogSignal, PauseSnapshot,
                                             ResumeSnapshot, Signal, StopSnapshot, Watermark)
from sluice.capture.snapshot.window import WindowReconciler, split_signals
from sluice.capture.snapshot.worker import OnChunk, TableRun, run_read_only, run_signal_table
from sluice.core.errors import SluiceError
from sluice.proto import sluice_pb2 as pb
from sluice.core.log import kv

log = logging.getLogger(__name__)

__all__ = ["Snapshotter", "new_state", "new_snapshot_id", "SIGNAL_TABLE", "READ_ONLY"]

SIGNAL_TABLE = "signal-table"
READ_ONLY = "read-only"
_SYSTEM_DBS = ("mysql", "information_schema", "performance_schema", "sys")


def new_snapshot_id() -> str:
    """Unique, and ordered by creation time (hex milliseconds first) between snapshots."""
    return f"{int(time.time() * 1000):011x}{uuid.uuid4().hex[:8]}"


def new_state(tables: Sequence[str], mode: str = SIGNAL_TABLE) -> SnapshotState:
    """A fresh snapshot of these "db.table"s, at its first table."""
    return SnapshotState(snapshot_id=new_snapshot_id(), tables=tuple(tables), mode=mode).next_table()


class Snapshotter:
    def __init__(self, *, signal_table: str, tracker: SchemaTracker, start_position: pb.Position,
                 state: SnapshotState | None, connection: dict[str, Any], chunk_size: int = 8192,
                 parallelism: int = 1, read_only: bool = False,
                 on_chunk: OnChunk | None = None) -> None:
        self.signal_table = signal_table
        self._sig = tuple(signal_table.split(".", 1)) if signal_table else ()
        self.tracker = tracker
        self.connection = connection
        self.chunk_size, self.parallelism = chunk_size, parallelism
        self.on_chunk = on_chunk
        self.read_only = read_only or not signal_table
        self.stamper = Stamper(start_position)
        self.reconciler = WindowReconciler(stamper=self.stamper)
        self.hold = ConsistentReadHold()
        self._cond = threading.Condition()
        self._prefix = PrefixTracker(state) if state is not None else None
        self._shape: SnapshotTable | None = None   # the table run whose chunks may be emitted
        self._gen = 0                            # bumped when a run must end (stop, new plan)
        self._emit_lock = threading.Lock()
        self._put: Callable[[object], None] | None = None
        self._commands: deque[tuple[Signal, str]] = deque()
        self._last: SourceTxn | None = None
        self._acks: list[tuple[SourceTxn | None, str]] = []
        self._ack_lock = threading.Lock()
        self._finished_reported = state is not None and state.finished
        self._stop = threading.Event()
        self.on_finished: Callable[[], None] | None = None
        self.chunk_reads = 0

    # -- state --------------------------------------------------------------------------------

    @property
    def state(self) -> SnapshotState | None:
        with self._cond:
            return self._prefix.state if self._prefix is not None else None

    @property
    def active(self) -> bool:
        st = self.state
        return st is not None and not st.finished

    @property
    def finished(self) -> bool:
        st = self.state
        return st is not None and st.finished

    def attach(self, put: Callable[[object], None]) -> None:
        """Where emitted transactions go (the capture's queue, in order); before any thread."""
        self._put = put

    def submit(self, signal: Signal, etcd_key: str = "") -> None:
        """A signal from etcd: applied at the next emission (or tick), in arrival order."""
        self._commands.append((signal, etcd_key))

    def committed(self, group: Sequence[object]) -> list[str]:
        """The etcd signal keys whose progress transaction is in this committed group."""
        ids = {id(t) for t in group}
        with self._ack_lock:
            done = [k for t, k in self._acks if t is None or id(t) in ids]
            self._acks = [(t, k) for t, k in self._acks if t is not None and id(t) not in ids]
        return done

    # -- emission (reader thread, chunk workers, ticker) -------------------------------------

    def process(self, txn: SourceTxn, end_offset: int = 0) -> None:
        """One source transaction in commit order; `end_offset` is where it ends in its binlog
        file (the reader has read every event before it)."""
        signals: list[Signal] = []
        if self._sig and self._touches_signal_table(txn):
            data, signals = split_signals(txn.mutations, self.signal_table)
            snaps = tuple(s for s in txn.schema_snapshots
                          if (s.schema_name, s.table_name) != self._sig)
            ddls = tuple(d for d in txn.ddls if (d.schema_name, d.table_name) != self._sig)
            if (len(data), len(snaps), len(ddls)) != (len(txn.mutations),
                                                      len(txn.schema_snapshots), len(txn.ddls)):
                txn = dataclasses.replace(txn, mutations=tuple(data), schema_snapshots=snaps,
                                          ddls=ddls)
        with self._emit_lock:
            # No snapshot window, pending chunk or command: the transaction only passes through
            # (the hold still counts it, under its lock, against chunks registered later).
            if not signals and not self._commands and self.reconciler.idle \
                    and (self._finished_reported or self.on_finished is None) \
                    and self.hold.pass_through(txn.position, end_offset):
                self.reconciler.passed(txn.position)
                assert self._put is not None
                self._put(txn)
                self._last = txn
                return
            out = self.hold.offer((txn, signals), txn.position)
            if end_offset:
                out += self.hold.reader_at(txn.position.file_seq, end_offset)
            self._release(out)

    def _touches_signal_table(self, txn: SourceTxn) -> bool:
        db, table = self._sig
        return any(m.table_name == table and m.schema_name == db for m in txn.mutations) \
            or any(s.table_name == table and s.schema_name == db for s in txn.schema_snapshots) \
            or any(d.table_name == table and d.schema_name == db for d in txn.ddls)

    def poll(self) -> None:
        """Emit what a chunk completion released, and apply pending etcd signals."""
        with self._emit_lock:
            self._release(self.hold.poll())

    def tick(self, reader: Any = None) -> None:
        """Periodic: like `poll`, and when the binlog reader idles at a heartbeat, tell the hold
        how far it has read (a chunk whose p is at the binlog's end waits for nothing else)."""
        with self._emit_lock:
            out = self.hold.poll()
            if reader is not None and self.hold.pending:
                a = reader.assembler
                # Re-read around the flag: a new event sets caught_up False before it moves the
                # end offset, so equal reads mean the offset is the heartbeat's or older.
                e1, idle, e2, fseq = a.last_event_end, reader.caught_up, a.last_event_end, a.file_seq
                if idle and e1 == e2 and e1 and fseq:
                    out += self.hold.reader_at(fseq, e1)
            self._release(out)

    def _release(self, items: list[Released]) -> None:
        assert self._put is not None
        for r in items:
            if r.chunk is not None:
                self._emit_chunk(dataclasses.replace(r.chunk, position=self.stamper.stamp()))
                continue
            txn, signals = r.txn
            marks = [s for s in signals if isinstance(s, Watermark)]
            emissions = self.reconciler.feed(txn.position, txn.mutations, marks)
            self._put(txn)
            self._last = txn
            for e in emissions:
                self._emit_chunk(e)
            for s in signals:
                if not isinstance(s, Watermark):
                    self._apply(s, "")
        while self._commands:
            self._apply(*self._commands.popleft())
        self._report_finished()

    def _report_finished(self) -> None:
        if self.on_finished is not None and not self._finished_reported and self.finished:
            self._finished_reported = True
            self.on_finished()

    def _emit_chunk(self, e: ChunkEmission) -> None:
        with self._cond:
            if self._prefix is None or e.shape is not self._shape \
                    or e.chunk.index < self._prefix.state.chunks_done:
                # A chunk of a run that was stopped or replaced: its rows are not emitted.
                log.debug("stale snapshot chunk dropped", extra=kv(table=e.chunk.table, chunk=e.chunk.index))
                return
            state = self._prefix.emitted(e.chunk, len(e.rows))
            self._cond.notify_all()
        assert self._put is not None
        self._put(self._chunk_txn(e, state))

    def _chunk_txn(self, e: ChunkEmission, state: SnapshotState) -> SourceTxn:
        db, table = e.shape.key.db, e.shape.key.table
        info = self.tracker.declared(db, table)
        declare: tuple[pb.TableInfo, ...] = ()
        if info is None:
            declare = tuple(self.tracker.declare_seeded(
                [(db, table)], version_of(e.position.file_seq, e.position.offset)))
            info = self.tracker.declared(db, table)
        mutation = e.mutation(stable_table_id(self.tracker.source, db, table),
                              info.version if info is not None else 0)
        return self._txn_at(e.position, (mutation,), declare, mutation.ByteSize(), state)

    def _txn_at(self, position: pb.Position, mutations: tuple[Mutation, ...],
                declare: tuple[pb.TableInfo, ...], size: int, state: SnapshotState) -> SourceTxn:
        # Not a source transaction: no GTID of its own (its position carries the GTID state of
        # the transaction it follows).
        after = self._last
        return SourceTxn(position=position, gtid="",
                         server_id=after.server_id if after else position.server_id,
                         ts_ms=after.ts_ms if after else position.ts_ms,
                         file=after.file if after else position.file_name,
                         offset=after.offset if after else position.offset,
                         mutations=mutations, schema_snapshots=declare, ddls=(), size=size,
                         snapshot=encode(state))

    def _emit_progress(self, state: SnapshotState, etcd_key: str = "") -> None:
        """A row-less transaction recording a change of plan (caller holds `_emit_lock`)."""
        assert self._put is not None
        txn = self._txn_at(self.stamper.stamp(), (), (), 0, state)
        if etcd_key:
            with self._ack_lock:
                self._acks.append((txn, etcd_key))
        self._put(txn)

    # -- signals ------------------------------------------------------------------------------

    def _available(self) -> list[str]:
        conn = pymysql.connect(**self.connection, autocommit=True, connect_timeout=5)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES "
                            "WHERE TABLE_TYPE = 'BASE TABLE' AND TABLE_SCHEMA NOT IN "
                            "(%s, %s, %s, %s)", _SYSTEM_DBS)
                rows = cur.fetchall()
        finally:
            conn.close()
        return [f"{d}.{t}" for d, t in rows if self.tracker.filter.captures(d, t)
                and f"{d}.{t}" != self.signal_table]

    def _apply(self, sig: Signal, etcd_key: str) -> None:
        """Apply one signal (caller holds `_emit_lock`); a plan change is recorded in order."""
        fields = {"signal": sig.id, "type": type(sig).__name__,
                  "channel": "etcd" if etcd_key else "signal-table"}
        if isinstance(sig, LogSignal):
            log.info("signal log: %s", sig.message, extra=kv(**fields))
            return
        tables = self._available() if isinstance(sig, ExecuteSnapshot) else []
        with self._cond:
            st = self._prefix.state if self._prefix is not None else None
            active = st is not None and not st.finished
            new: SnapshotState | None = None
            restart = False
            if isinstance(sig, ExecuteSnapshot):
                new, restart = self._execute(sig, tables, st if active else None, bool(etcd_key))
            elif st is None or not active:
                log.warning("signal ignored: no snapshot is running", extra=kv(**fields))
            elif isinstance(sig, StopSnapshot):
                new, restart = _stopped(st, sig.data_collections)
            elif isinstance(sig, PauseSnapshot):
                new = dataclasses.replace(st, paused=True)
            elif isinstance(sig, ResumeSnapshot):
                new = dataclasses.replace(st, paused=False)
            if new is None:
                self._ack_now(etcd_key)
                return
            if restart or self._prefix is None:
                self._prefix = PrefixTracker(new)
                self._gen += 1
                self._shape = None
            else:
                self._prefix.state = new
            self._cond.notify_all()
        log.info("snapshot signal applied", extra=kv(
            **fields, snapshot_id=new.snapshot_id, tables=list(new.tables),
            current_table=new.current_table, paused=new.paused, finished=new.finished))
        self._emit_progress(new, etcd_key)

    def _ack_now(self, etcd_key: str) -> None:
        if etcd_key:
            # Nothing to record: the key goes with the next committed group.
            with self._ack_lock:
                self._acks.append((None, etcd_key))

    def _execute(self, sig: ExecuteSnapshot, available: list[str], st: SnapshotState | None,
                 from_etcd: bool) -> tuple[SnapshotState | None, bool]:
        tables = sig.tables(available)
        if not tables:
            log.warning("execute-snapshot ignored: its data-collections match no captured table",
                        extra=kv(signal=sig.id, data_collections=list(sig.data_collections)))
            return None, False
        mode = READ_ONLY if (self.read_only or from_etcd or sig.snapshot_type == READ_ONLY) \
            else SIGNAL_TABLE
        conds = tuple((t, c) for t in tables if (c := sig.condition_for(t)))
        keys = tuple((t, sig.surrogate_key) for t in tables) if sig.surrogate_key else ()
        if st is None:
            return SnapshotState(snapshot_id=new_snapshot_id(), tables=tuple(tables), mode=mode,
                                 conditions=conds, surrogate_keys=keys).next_table(), True
        if st.mode != mode:
            log.error("execute-snapshot ignored: a %s snapshot is running and this one would be "
                      "%s; stop it first", st.mode, mode, extra=kv(signal=sig.id))
            return None, False
        add = [t for t in tables if t not in st.tables]
        if not add:
            log.warning("execute-snapshot ignored: its tables are already in the running "
                        "snapshot", extra=kv(signal=sig.id))
            return None, False
        return dataclasses.replace(
            st, tables=st.tables + tuple(add),
            conditions=st.conditions + tuple(x for x in conds if x[0] in add),
            surrogate_keys=st.surrogate_keys + tuple(x for x in keys if x[0] in add)), False

    # -- snapshot thread ----------------------------------------------------------------------

    def _gate(self, gen: int) -> bool:
        with self._cond:
            while not self._stop.is_set() and gen == self._gen and self._prefix is not None \
                    and self._prefix.state.paused:
                self._cond.wait(0.5)
            return not self._stop.is_set() and gen == self._gen

    def run(self, stop: threading.Event) -> None:
        """Snapshots as they are planned (at start or by signals), until `stop`."""
        self._stop = stop
        conn: Any = None
        try:
            while not stop.is_set():
                with self._cond:
                    while not stop.is_set() and not (
                            self._prefix is not None and not self._prefix.state.finished
                            and not self._prefix.state.paused):
                        self._cond.wait(0.5)
                    if stop.is_set():
                        break
                    assert self._prefix is not None
                    st, gen = self._prefix.state, self._gen
                if conn is None:
                    conn = snapshot_connect(self.connection)
                self._table(conn, st, gen)
        finally:
            if conn is not None:
                conn.close()

    def _table(self, conn: Any, st: SnapshotState, gen: int) -> None:
        table = st.current_table
        db, _, name = table.partition(".")
        try:
            shape = load_shape(conn, db, name, st.surrogate_key(table))
            splitter = ChunkSplitter(conn, shape.key, SplitOptions(chunk_size=self.chunk_size),
                                     max_key_at_start=st.max_key, resume_after=st.last_chunk_end,
                                     chunks_done=st.chunks_done)
        except (SluiceError, pymysql.err.ProgrammingError) as e:
            log.error("snapshot of %s skipped: %s", table, e)
            self._skip(table, gen)
            return
        with self._cond:
            if gen != self._gen or self._prefix is None or self._prefix.state.current_table != table:
                return
            self._prefix.state = dataclasses.replace(self._prefix.state, max_key=splitter.max_key)
            empty = splitter.finished
            if not empty:
                self._shape = shape
        if empty:   # empty table, or resumed past its last chunk
            self._skip(table, gen)
            return
        run = TableRun(shape, splitter, estimated_rows=estimated_rows(conn, shape.key),
                       gate=lambda: self._gate(gen), on_chunk=self.on_chunk)
        cond = st.condition(table)

        def connect() -> Any:
            return snapshot_connect(self.connection)
        if st.mode == READ_ONLY:
            run_read_only(run, self.hold, connect, self.parallelism, cond, on_complete=self.poll)
        else:
            run_signal_table(run, self.reconciler, connect, self.signal_table, self.parallelism,
                             condition=cond)
        self.chunk_reads += run.chunks
        # The reader records the table's last chunk after the run: wait for that.
        with self._cond:
            while not (self._stop.is_set() or gen != self._gen or self._prefix is None
                       or self._prefix.state.current_table != table or self._prefix.state.finished):
                self._cond.wait(0.5)
            done = self._prefix is not None and self._prefix.state.finished
        if done and gen == self._gen:
            st = self.state
            assert st is not None
            log.info("snapshot done", extra=kv(snapshot_id=st.snapshot_id, tables=len(st.tables), rows=st.rows_done))

    def _skip(self, table: str, gen: int) -> None:
        """Move past a table without chunks, and record it (a last empty table finishes)."""
        with self._emit_lock:
            with self._cond:
                if gen != self._gen or self._prefix is None \
                        or self._prefix.state.current_table != table:
                    return
                new = self._prefix.state.next_table()
                self._prefix = PrefixTracker(new)
                self._shape = None
                self._cond.notify_all()
            self._emit_progress(new)
            if new.finished:
                log.info("snapshot done", extra=kv(snapshot_id=new.snapshot_id, tables=len(new.tables), rows=new.rows_done))
            self._report_finished()


def _stopped(st: SnapshotState, patterns: Sequence[str]) -> tuple[SnapshotState, bool]:
    """The state after stop-snapshot (all tables, or those matching `patterns`); whether the
    current table's run must end."""
    if not patterns:
        return dataclasses.replace(st, current_table="", last_chunk_end=None, max_key=None,
                                   chunks_done=0, finished=True, paused=False), True
    pats = [re.compile(p) for p in patterns]
    i = st.tables.index(st.current_table)
    done, rest = st.tables[:i], [t for t in st.tables[i:] if not any(p.fullmatch(t) for p in pats)]
    if rest and rest[0] == st.current_table:
        return dataclasses.replace(st, tables=done + tuple(rest)), False
    if not rest:
        return dataclasses.replace(st, tables=done, current_table="", last_chunk_end=None,
                                   max_key=None, chunks_done=0, finished=True, paused=False), True
    return dataclasses.replace(st, tables=done + tuple(rest), current_table=rest[0],
                               last_chunk_end=None, max_key=None, chunks_done=0), True
