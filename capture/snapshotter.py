"""The capture's initial snapshot in signal-table mode (DBLog): chunks interleaved with the binlog.

Invariant: a chunk goes to the pumps as one transaction right after the source transaction whose
high watermark closed its window (at that transaction's position, sub_seq 2^32 + n), carrying
the progress of the emitted prefix of chunks; so the pumps' committed prefix always holds a
snapshot progress that never claims a chunk that is not committed, and a restart resumes at the
next chunk (re-reading at most chunks that were in flight).

Threads: `split` runs in the binlog reader thread (it owns the schema tracker) for every source
transaction in commit order; `run` runs in its own thread and drives the snapshot worker
(capture/snapshot/worker.py) table by table. The prefix tracker is shared under a lock; the
worker moves to the next table only after the reader recorded the last chunk of the current one.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import uuid
from collections.abc import Sequence
from typing import Any

from sluice.capture.reader import SourceTxn
from sluice.capture.schema import SchemaTracker, stable_table_id, version_of
from sluice.capture.snapshot.chunks import ChunkSplitter, SplitOptions
from sluice.capture.snapshot.emit import ChunkEmission
from sluice.capture.snapshot.keys import load_shape
from sluice.capture.snapshot.progress import PrefixTracker, SnapshotState, encode
from sluice.capture.snapshot.reader import snapshot_connect
from sluice.capture.snapshot.window import WindowReconciler, split_signals
from sluice.capture.snapshot.worker import TableRun, run_signal_table
from sluice.proto import sluice_pb2 as pb

log = logging.getLogger(__name__)

__all__ = ["Snapshotter", "new_state"]


def new_state(tables: Sequence[str]) -> SnapshotState:
    """A fresh snapshot of these "db.table"s, at its first table."""
    return SnapshotState(snapshot_id=uuid.uuid4().hex[:16], tables=tuple(tables),
                         mode="signal-table").next_table()


class Snapshotter:
    def __init__(self, signal_table: str, tracker: SchemaTracker, start_position: pb.Position,
                 state: SnapshotState | None) -> None:
        self.signal_table = signal_table
        self._sig = tuple(signal_table.split(".", 1)) if signal_table else ()
        self.tracker = tracker
        self.reconciler = WindowReconciler(start_position)
        self._cond = threading.Condition()
        self._prefix = PrefixTracker(state) if state is not None else None

    @property
    def active(self) -> bool:
        return self._prefix is not None and not self._prefix.state.finished

    @property
    def finished(self) -> bool:
        with self._cond:
            return self._prefix is not None and self._prefix.state.finished

    # -- reader thread ------------------------------------------------------------------------

    def split(self, txn: SourceTxn) -> tuple[SourceTxn, list[SourceTxn]]:
        """The transaction without the signal table, and the chunk transactions to write right
        after it."""
        if not self._sig:
            return txn, []
        data, signals = split_signals(txn.mutations, self.signal_table)
        snaps = tuple(s for s in txn.schema_snapshots if (s.schema_name, s.table_name) != self._sig)
        ddls = tuple(d for d in txn.ddls if (d.schema_name, d.table_name) != self._sig)
        if (len(data), len(snaps), len(ddls)) != (len(txn.mutations), len(txn.schema_snapshots),
                                                  len(txn.ddls)):
            txn = dataclasses.replace(txn, mutations=tuple(data), schema_snapshots=snaps, ddls=ddls)
        return txn, [self._chunk_txn(txn, e) for e in self.reconciler.feed(txn.position, data, signals)]

    def _chunk_txn(self, after: SourceTxn, e: ChunkEmission) -> SourceTxn:
        db, table = e.shape.key.db, e.shape.key.table
        info = self.tracker.declared(db, table)
        declare: tuple[pb.TableInfo, ...] = ()
        if info is None:
            declare = tuple(self.tracker.declare_seeded(
                [(db, table)], version_of(e.position.file_seq, e.position.offset)))
            info = self.tracker.declared(db, table)
        assert self._prefix is not None
        with self._cond:
            state = self._prefix.emitted(e.chunk, len(e.rows))
            self._cond.notify_all()
        mutation = e.mutation(stable_table_id(self.tracker.source, db, table),
                              info.version if info is not None else 0)
        # Not a source transaction: no GTID of its own (its position carries the GTID state of
        # the transaction it follows).
        return SourceTxn(position=e.position, gtid="", server_id=after.server_id,
                         ts_ms=after.ts_ms, file=after.file, offset=after.offset,
                         mutations=(mutation,), schema_snapshots=declare, ddls=(),
                         size=mutation.ByteSize(), snapshot=encode(state))

    # -- snapshot thread ----------------------------------------------------------------------

    def run(self, connection: dict[str, Any], chunk_size: int, parallelism: int,
            stop: threading.Event) -> None:
        """Every remaining table, chunk by chunk; returns when the reader recorded the last one."""
        assert self._prefix is not None
        conn = snapshot_connect(connection)
        try:
            while not stop.is_set():
                with self._cond:
                    st = self._prefix.state
                if st.finished:
                    break
                table = st.current_table
                db, _, name = table.partition(".")
                shape = load_shape(conn, db, name, st.surrogate_key(table))
                splitter = ChunkSplitter(conn, shape.key, SplitOptions(chunk_size=chunk_size),
                                         max_key_at_start=st.max_key,
                                         resume_after=st.last_chunk_end,
                                         chunks_done=st.chunks_done)
                with self._cond:
                    self._prefix.state = dataclasses.replace(self._prefix.state,
                                                             max_key=splitter.max_key)
                    if splitter.finished:   # empty table, or resumed past its last chunk
                        self._prefix.state = self._prefix.state.next_table()
                        continue
                run = TableRun(shape, splitter)
                run_signal_table(run, self.reconciler, lambda: snapshot_connect(connection),
                                 self.signal_table, parallelism, condition=st.condition(table))
                # The window closed in the reader before it recorded the chunk: wait for that.
                with self._cond:
                    while not (self._prefix.state.current_table != table
                               or self._prefix.state.finished or stop.is_set()):
                        self._cond.wait(0.5)
        finally:
            conn.close()
        if not stop.is_set():
            log.info("snapshot done", extra={"fields": {
                "snapshot_id": self._prefix.state.snapshot_id,
                "tables": len(self._prefix.state.tables),
                "rows": self._prefix.state.rows_done}})
