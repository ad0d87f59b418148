"""`sluice capture --config capture.toml`: MariaDB binlog -> pumps, exactly once.

Invariant: the capture streams only after the source passed every start-up check (exit 2 with
one line otherwise) and after recovery fenced older epochs and found where the pumps' committed
prefix ends; it then reads strictly after that position, and every later connection of the run
resumes strictly after the last transaction it read.

Start position, the schema-snapshot transaction, threads and snapshots: docs/capture.md
("Start position", "Schema at start", "Threads") and docs/snapshots.md.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import signal
import threading
import time
from typing import Any

import pymysql

from sluice.capture import checks
from sluice.capture.config import CaptureConfig
from sluice.capture.metrics import CaptureMetrics
from sluice.capture.reader import (BinlogReader, SourceDisconnected, SourceTxn, file_seq_of,
                                   gtid_state_text, parse_gtid_state)
from sluice.capture.schema import SchemaTracker, TableFilter, version_of
from sluice.capture.snapshot.modes import SnapshotMode, StartState, decide, parse_mode
from sluice.capture.snapshot.progress import SnapshotState, decode, encode
from sluice.capture.snapshot.signals import InvalidSignal, parse_etcd_signal
from sluice.capture.snapshotter import READ_ONLY, SIGNAL_TABLE, Snapshotter, new_state
from sluice.capture.writer import GroupWriter
from sluice.client.pumps import PumpsClient
from sluice.client.producer import ProducerServer
from sluice.core.cli import check_etcd_reachable
from sluice.core import config as cfg
from sluice.core import errors
from sluice.core import log as logsetup
from sluice.core.etcd import Etcd
from sluice.core.position import format_position, is_empty
from sluice.core.registry import Registry, captured_tables_path, snapshot_progress_path
from sluice.core.rewind import delete_rewind, read_rewind
from sluice.core.tso_client import TSOClient
from sluice.proto import sluice_pb2 as pb
from sluice.core.log import kv

log = logging.getLogger(__name__)

_QUEUE = 1024
_END = object()
_STOP = object()
_SYSTEM_DBS = ("mysql", "information_schema", "performance_schema", "sys")
RECONNECT_BACKOFF_S = (0.2, 5.0)     # first and longest wait between reconnect attempts
RESTART_BACKOFF_S = (1.0, 30.0)      # first and longest wait between in-process restarts
RESTART_RESET_S = 60.0               # a run this long resets the restart backoff
# A pump, etcd or the TSO unreachable, or every pump refusing for disk space: the next
# incarnation can succeed. Anything else (a fenced epoch, a bad config, an unknown table_id,
# a purged position) needs a person and ends the process.
TRANSIENT = (errors.Unavailable, errors.ResourceExhausted, errors.DeadlineExceeded)
TICK_S = 0.1            # snapshot emission ticker (read-only chunks while the source idles)
SIGNAL_POLL_S = 0.25    # etcd signal channel
PUBLISH_S = 0.5         # snapshot progress to etcd


class _Disconnected:
    """Queue marker: the reader's connection ended; everything read before it is queued."""

    def __init__(self, error: SourceDisconnected, resume: str) -> None:
        self.error, self.resume = error, resume


def add_arguments(p: argparse.ArgumentParser) -> None:
    from sluice.core.cli import add_process_arguments
    add_process_arguments(p)
    p.add_argument("--check", action="store_true",
                   help="run the source start-up checks and exit (0: ok, 2: a check failed)")


def load_config(args: argparse.Namespace) -> CaptureConfig:
    config = cfg.load(CaptureConfig, args.config, list(args.overrides))
    config.validate(str(args.config or "<defaults>"))
    return config


def source_checks(config: CaptureConfig, saved_gtid: str | None) -> checks.SourceFacts:
    return checks.check_source(config.source.connection(), address=config.source.address(),
                               replica_server_id=config.source.server_id, saved_gtid=saved_gtid)


def run(args: argparse.Namespace) -> int:
    config = load_config(args)
    logsetup.setup(args.log_level, args.log_file)
    sp = config.start_position
    # Checked before touching the cluster, so a misconfigured source fails fast with exit 2.
    source_checks(config, sp[5:] if sp.startswith("gtid:") else None)
    if args.check:
        return 0
    check_etcd_reachable(config.etcd, config.security)
    metrics = CaptureMetrics()
    metrics.metrics.serve(config.metrics_addr)
    return run_restarting(config, metrics)


def run_restarting(config: CaptureConfig, metrics: CaptureMetrics,
                   sleep: Any = time.sleep) -> int:
    """Run the capture; after a transient failure start it over in this process, as a
    supervisor would restart it: a new incarnation bumps the producer epoch and recovers its
    position from the pumps (DESIGN §8), so nothing is written twice. A group whose commit was
    cut off stays in flight on its pump until the new epoch's TxnStatus decides it. While a
    non-offline pump stays unreachable, recovery fails and is retried with backoff: the capture
    waits for the pump (or for `sluice ctl pump offline/mark-lost`) instead of exiting."""
    backoff = RESTART_BACKOFF_S[0]
    while True:
        began = time.monotonic()
        try:
            return asyncio.run(Capture(config, metrics).run())
        except TRANSIENT as e:
            if time.monotonic() - began > RESTART_RESET_S:
                backoff = RESTART_BACKOFF_S[0]
            metrics.restarts.inc()
            metrics.set_state("restarting", error=f"{type(e).__name__}: {e}"[:300],
                              retry_in_s=backoff)
            sleep(backoff)
            backoff = min(backoff * 2, RESTART_BACKOFF_S[1])


def read_table_definitions(params: dict[str, Any], table_filter: TableFilter
                           ) -> list[tuple[str, str, str]]:
    """(db, table, SHOW CREATE TABLE text) of every base table outside the system databases.

    Not only the captured ones: a table renamed into the filter later needs its model too.
    """
    conn = pymysql.connect(**params, autocommit=True, connect_timeout=5)
    out: list[tuple[str, str, str]] = []
    try:
        cur = conn.cursor()
        cur.execute("SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES "
                    "WHERE TABLE_TYPE = 'BASE TABLE' AND TABLE_SCHEMA NOT IN (%s, %s, %s, %s) "
                    "ORDER BY TABLE_SCHEMA, TABLE_NAME", _SYSTEM_DBS)
        for db, table in cur.fetchall():
            if not table_filter.captures_db(db) and not table_filter.captures(db, table):
                # Cheap skip for databases outside the filter; RENAME across databases into
                # the filter then declares from the TableMap instead of the DDL model.
                continue
            try:
                cur.execute(f"SHOW CREATE TABLE `{db.replace('`', '``')}`.`{table.replace('`', '``')}`")
            except pymysql.err.ProgrammingError as e:
                if e.args and e.args[0] == 1146:   # dropped since the listing
                    continue
                raise
            row = cur.fetchone()
            if row is not None:
                out.append((db, table, row[1]))
    finally:
        conn.close()
    return out


def _progress_only(txn: SourceTxn) -> bool:
    """A row-less snapshot progress record: it ends its group, because the writer drops empty
    transactions that are not the last of a group and this one must reach the pumps."""
    return txn.snapshot is not None and txn.empty


def progress_doc(p: pb.SnapshotProgress) -> dict[str, Any]:
    """Snapshot progress as the JSON `sluice ctl snapshot status` shows."""
    st = decode(p)
    return {"snapshot_id": st.snapshot_id, "mode": st.mode, "tables": list(st.tables),
            "current_table": st.current_table, "chunks_done": st.chunks_done,
            "rows_done": st.rows_done, "finished": st.finished, "paused": st.paused,
            "conditions": [list(c) for c in st.conditions],
            "published_ms": int(time.time() * 1000)}


def earliest_state(oldest_gtid_list: str) -> str:
    """The GTID state at the start of the oldest binlog: one GTID per domain, the highest.

    Not "" when binlogs were purged: MariaDB refuses an empty start state for domains whose
    first transactions are gone, and the saved-position check would refuse it at a restart.
    """
    best: dict[int, tuple[int, int]] = {}
    for part in filter(None, (p.strip() for p in oldest_gtid_list.split(","))):
        d, srv, n = (int(x) for x in part.split("-"))
        if d not in best or n > best[d][1]:
            best[d] = (srv, n)
    return ",".join(f"{d}-{srv}-{n}" for d, (srv, n) in sorted(best.items()))


def start_snapshot_position(start: str, facts: checks.SourceFacts, oldest_file: str) -> pb.Position:
    """Where the first-start schema snapshot sits: just before the first transaction streamed.

    GTID-only at the start state, so it compares by GTIDs with every streamed transaction (file
    coordinates read separately could be behind a transaction committed meanwhile). With an
    empty GTID state the binlogs hold no transaction yet: the start of the oldest binlog.
    """
    pos = pb.Position(server_id=facts.server_id)
    state = parse_gtid_state(start)
    if state:
        pos.gtids.extend(pb.GtidPos(domain_id=d, server_id=s, seq_no=n)
                         for d, (s, n) in sorted(state.items()))
    else:
        pos.file_seq, pos.offset, pos.file_name = file_seq_of(oldest_file), 4, oldest_file
    return pos


def _oldest_binlog(params: dict[str, Any]) -> str:
    conn = pymysql.connect(**params, autocommit=True, connect_timeout=5)
    try:
        cur = conn.cursor()
        cur.execute("SHOW BINARY LOGS")
        rows = cur.fetchall()
        return str(rows[0][0]) if rows else ""
    finally:
        conn.close()


class Capture:
    """One incarnation of the capture (one producer epoch); `run_restarting` makes the next."""

    def __init__(self, config: CaptureConfig, metrics: CaptureMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or CaptureMetrics()
        self.etcd = Etcd(config.etcd, config.security)
        self.registry = Registry(self.etcd, config.cluster_id)
        self.tso = TSOClient(config.tso or None, config.cluster_id, etcd=self.etcd,
                             security=config.security)
        self.pumps = PumpsClient(config.etcd, config.cluster_id, security=config.security)
        self.writer = GroupWriter(self.pumps, self.tso, self.registry, config.producer_id,
                                  config.cluster_id, config.source.resolved_name(), config.security)
        host, _, port = config.addr.rpartition(":")
        self.producer = ProducerServer(config.etcd, config.cluster_id, config.producer_id,
                                       self.writer.decide, host=host or "127.0.0.1",
                                       port=int(port or 0), security=config.security)
        self.tracker = self._tracker()
        self._reader: BinlogReader | None = None
        self._stop = threading.Event()
        self._stopping = False
        self._queue: asyncio.Queue[object] | None = None
        self._writing = False
        self._committed_ts_ms = 0       # source time of the last committed transaction
        self.snapshotter: Snapshotter | None = None
        self._stop_after_snapshot = False
        self._put: Any = None
        self._committed_progress: pb.SnapshotProgress | None = None

    async def run(self) -> int:
        c = self.config
        self.metrics.set_state("starting")
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal)
        lag_task = loop.create_task(self._lag_loop(), name="capture-lag")
        try:
            await self.producer.start()
            await self.pumps.start()
            epoch = await self.producer.bump_epoch()
            pos = await self._take_rewind(await self.writer.recover(epoch))
            first_start = is_empty(pos)
            # The recorded position wins over the config on every start but the first (an empty
            # GTID state is a real position too: "from the first binlog").
            saved = None if first_start else gtid_state_text(pos.gtids)
            mode = parse_mode(c.snapshot_mode)
            on_source = True
            try:
                facts = await asyncio.to_thread(source_checks, c, saved)
            except checks.SavedPositionPurged as e:
                if mode is not SnapshotMode.WHEN_NEEDED:
                    raise
                # when_needed: the gap is lost from the binlog; a new snapshot of every captured
                # table replaces it (rows deleted inside the gap are not deleted downstream).
                log.warning("saved position purged from the source; snapshot-mode when_needed: "
                            "new snapshot, streaming from the source's current position",
                            extra=kv(problem=str(e)))
                on_source = False
                facts = await asyncio.to_thread(source_checks, c, None)
            if saved is not None and on_source:
                start = saved
            elif saved is not None:
                start = facts.gtid_binlog_pos
            elif c.start_position == "earliest" or c.start_timestamp_ms() is not None:
                start = earliest_state(facts.oldest_gtid_list)
            elif c.start_position == "latest":
                start = facts.gtid_binlog_pos
            else:
                start = c.start_position[5:]
            prog = self._committed_progress = self.writer.snapshot
            plan = decide(mode, StartState(
                has_position=not first_start, position_on_source=on_source,
                snapshot_started=prog is not None,
                snapshot_finished=prog is not None and prog.finished))
            last, state = await self._declare_tables(pos, start, facts,
                                                     new_snapshot=plan.snapshot == "new")
            if plan.snapshot == "resume":
                assert prog is not None
                state = decode(prog)
            elif plan.snapshot == "none" and prog is not None:
                # A finished snapshot is kept for status; an unfinished one (started by a
                # signal, or the initial one under no_data) is resumed, never abandoned.
                state = decode(prog)
            # Chunks are stamped after the last position written (a chunk's own position
            # continues its numbering).
            self.snapshotter = Snapshotter(
                signal_table=c.signal_table, tracker=self.tracker, start_position=last,
                state=state, connection=c.source.connection(), chunk_size=c.snapshot_chunk_size,
                parallelism=c.snapshot_parallelism, read_only=c.snapshot_read_only,
                on_chunk=self.metrics.on_snapshot_chunk)
            if plan.snapshot != "none":
                log.info("snapshot %s: %s", plan.snapshot, plan.reason,
                         extra=kv(tables=list(state.tables) if state else []))
            if not plan.stream and (state is None or state.finished):
                log.info("snapshot-mode %s: %s", c.snapshot_mode, plan.reason)
                self.metrics.set_state("stopped")
                return 0
            self._stop_after_snapshot = not plan.stream
            self.metrics.set_state("connected", source=c.source.address(), epoch=epoch,
                                   position=format_position(pos), after=start or "(first binlog)")
            await self._stream(start)
            self.metrics.set_state("stopped")
            return 0
        except Exception as e:
            if not isinstance(e, TRANSIENT):   # else run_restarting reports "restarting"
                self.metrics.set_state("failed", error=f"{type(e).__name__}: {e}"[:500])
            raise
        finally:
            self._stop.set()
            lag_task.cancel()
            if self._reader is not None:
                self._reader.close()
            await self.producer.stop()
            await self.writer.close()
            await self.pumps.close()
            await self.tso.close()
            self.etcd.close()

    def _on_signal(self) -> None:
        self._stopping = True
        q = self._queue
        if q is not None and not q.full():
            q.put_nowait(_STOP)

    def _tracker(self) -> SchemaTracker:
        c = self.config
        f = c.filter
        return SchemaTracker(c.source.resolved_name(), TableFilter(
            f.include_databases, f.exclude_databases, f.include_tables, f.exclude_tables,
            ignored=[c.mark_table], always=[c.signal_table]))

    # -- schema at start ----------------------------------------------------------------------

    async def _declare_tables(self, pos: pb.Position, start: str, facts: checks.SourceFacts,
                              new_snapshot: bool = False
                              ) -> tuple[pb.Position, SnapshotState | None]:
        """Seed DDL models from SHOW CREATE TABLE; write the schema-snapshot transaction of the
        captured tables not declared yet (all of them at the first start).

        With `new_snapshot`, that transaction is written in any case and records the new
        snapshot's progress, so a crash before its first chunk still resumes it. Returns the
        last position written and the new snapshot's state (None without one)."""
        c = self.config
        defs = await asyncio.to_thread(read_table_definitions, c.source.connection(),
                                       self.tracker.filter)
        for db, table, sql in defs:
            self.tracker.seed(db, table, sql)
        captured = sorted(f"{db}.{table}" for db, table, _ in defs
                          if self.tracker.filter.captures(db, table)
                          and f"{db}.{table}" != c.signal_table)
        key = captured_tables_path(c.producer_id)
        first_start = is_empty(pos)
        declared = None if first_start else await asyncio.to_thread(self.registry.get_json, key)
        todo = [x for x in captured if declared is None or x not in declared]
        state = new_state(captured, READ_ONLY if c.snapshot_read_only else SIGNAL_TABLE) \
            if new_snapshot else None
        last = pos
        if first_start or todo or state is not None:
            if first_start:
                oldest = "" if parse_gtid_state(start) else await asyncio.to_thread(
                    _oldest_binlog, c.source.connection())
                at = start_snapshot_position(start, facts, oldest)
            else:
                # Right after the last committed transaction, before the next one read.
                at = pb.Position()
                at.CopyFrom(pos)
                at.sub_seq = pos.sub_seq + 1
            infos = self.tracker.declare_seeded(
                [tuple(x.split(".", 1)) for x in todo],   # type: ignore[misc]
                version_of(at.file_seq, at.offset))
            value = pb.PrewriteValue(schema_snapshots=infos, source=pb.SourceInfo(
                name=c.source.resolved_name(), server_id=facts.server_id,
                ts_ms=int(time.time() * 1000)))
            await self.writer.write_items([(value, at, encode(state) if state else None)])
            last = at
            log.info("declared %d table(s) in a schema-snapshot transaction at %s",
                     len(infos), format_position(at),
                     extra=kv(first_start=first_start))
        if declared is None or set(captured) != set(declared):
            await asyncio.to_thread(self.registry.put_json, key, captured)
        return last, state

    async def _take_rewind(self, recovered: pb.Position) -> pb.Position:
        """Where to resume: after `recovered` (the pumps' greatest recorded position), unless
        `ctl position set` left a rewind of a higher generation — then after the rewind, and
        every position written from now on carries its generation (core/position.py: after
        every older one, so drainers' filters and the pumps' records move onto it). A rewind
        whose generation a pump already recorded was taken (the key is deleted after the first
        group committed at the new generation, or here if that was interrupted)."""
        c = self.config
        rewind, _ = await asyncio.to_thread(read_rewind, self.registry, c.producer_id)
        self.writer.generation = recovered.generation
        if rewind is None:
            return recovered
        if rewind.generation <= recovered.generation:
            await asyncio.to_thread(delete_rewind, self.registry, c.producer_id)
            log.info("rewind to %s was taken (the pumps record generation %d); key removed",
                     format_position(rewind), recovered.generation)
            return recovered
        log.warning("rewinding: resuming after %s instead of the recorded %s (set by `sluice ctl "
                    "position set`)", format_position(rewind), format_position(recovered))
        self.writer.generation = rewind.generation
        self.writer.after_first_commit = lambda: delete_rewind(self.registry, c.producer_id)
        return rewind

    # -- streaming ----------------------------------------------------------------------------

    def _start_reader(self, start: str, queue: asyncio.Queue[object]) -> None:
        c = self.config
        loop = asyncio.get_running_loop()

        def connected() -> None:
            loop.call_soon_threadsafe(lambda: self.metrics.set_state(
                "streaming", after=start or "(first binlog)"))

        reader = self._reader = BinlogReader(
            c.source.connection(), replica_server_id=c.source.server_id, tracker=self.tracker,
            gtid_state=start, heartbeat_s=c.heartbeat_s, on_connected=connected)
        put = self._put
        skip_before_ms = c.start_timestamp_ms()
        snap = self.snapshotter
        assert snap is not None

        def reader_thread() -> None:
            try:
                for txn in reader.transactions():
                    if self._stop.is_set():
                        return
                    # Read while the generator is suspended: the end of this transaction.
                    end = reader.assembler.last_event_end
                    if skip_before_ms is not None and txn.ts_ms < skip_before_ms:
                        txn = self._skipped(txn)
                    snap.process(txn, end)
                put(_END)
            except SourceDisconnected as e:
                if not self._stop.is_set():
                    put(_Disconnected(e, reader.assembler.resume_state()))
            except BaseException as e:  # noqa: BLE001 - handed to the loop, which raises it
                if not self._stop.is_set():
                    put(e)

        threading.Thread(target=reader_thread, name="binlog-reader", daemon=True).start()

    def _start_snapshot(self, queue: asyncio.Queue[object]) -> None:
        """The snapshot thread, the emission ticker and the etcd signal poller; a failure of
        the snapshot fails the capture (a restart resumes at the next chunk)."""
        snap = self.snapshotter
        assert snap is not None
        put = self._put

        def snapshot_thread() -> None:
            try:
                snap.run(self._stop)
            except BaseException as e:  # noqa: BLE001 - handed to the loop, which raises it
                if not self._stop.is_set():
                    put(e)

        def ticker() -> None:
            try:
                while not self._stop.wait(TICK_S):
                    snap.tick(self._reader)
            except BaseException as e:  # noqa: BLE001 - handed to the loop, which raises it
                if not self._stop.is_set():
                    put(e)

        for target, name in ((snapshot_thread, "snapshot"), (ticker, "snapshot-tick"),
                             (self._signal_poller, "etcd-signals")):
            threading.Thread(target=target, name=name, daemon=True).start()

    def _signal_poller(self) -> None:
        """Signals from etcd (read-only sources): polled, since they are rare; each key is
        applied once per process and deleted once its effect is committed (`_acked`)."""
        snap = self.snapshotter
        assert snap is not None
        prefix = self.registry.signals_prefix(self.config.producer_id)
        seen: set[str] = set()
        while not self._stop.wait(SIGNAL_POLL_S):
            for key in snap.committed(()):    # signals that changed nothing: no commit to wait for
                self._delete_key(key)
            try:
                kvs, _ = self.etcd.get_prefix(prefix)
            except errors.SluiceError as e:
                log.warning("etcd signals not read: %s", e)
                continue
            for value, meta in sorted(kvs, key=lambda kv: kv[1].create_revision):
                key = meta.key.decode() if isinstance(meta.key, bytes) else str(meta.key)
                if key in seen:
                    continue
                seen.add(key)
                try:
                    sig = parse_etcd_signal(key, value)
                except InvalidSignal as e:
                    log.error("etcd signal ignored: %s", e, extra=kv(key=key))
                    self._delete_key(key)
                    continue
                log.info("etcd signal received", extra=kv(key=key, signal=sig.id))
                snap.submit(sig, key)

    def _delete_key(self, key: str) -> None:
        try:
            self.etcd.delete(key)
        except errors.SluiceError as e:
            log.warning("etcd signal key %s not deleted: %s", key, e)

    def _skipped(self, txn: SourceTxn) -> SourceTxn:
        """A transaction committed before `start-position = timestamp:T`, made empty: it only
        carries the position forward (in the reader thread, which owns the tracker).

        Its DDL still shaped the tracker's models, but what it declared never goes downstream:
        the tracker forgets its declarations, so the next TableMap of each table declares again.
        """
        if txn.ddls or txn.schema_snapshots:
            self.tracker.reset_declared()
        return dataclasses.replace(txn, mutations=(), schema_snapshots=(), ddls=(), size=0)

    async def _stream(self, start: str) -> None:
        c = self.config
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[object] = asyncio.Queue(_QUEUE)
        self._queue = queue

        def put(item: object) -> None:
            asyncio.run_coroutine_threadsafe(queue.put(item), loop).result()
        self._put = put
        snap = self.snapshotter
        assert snap is not None
        snap.attach(put)
        if self._stop_after_snapshot:
            snap.on_finished = lambda: put(_STOP)     # initial_only: after the last chunk
        self._start_reader(start, queue)
        self._start_snapshot(queue)
        publish = loop.create_task(self._publish_progress(), name="snapshot-progress")
        try:
            await self._groups(queue)
        finally:
            publish.cancel()

    async def _groups(self, queue: asyncio.Queue[object]) -> None:
        c = self.config
        loop = asyncio.get_running_loop()
        snap = self.snapshotter
        assert snap is not None
        wait_s = c.group_max_wait_ms / 1000
        backoff = RECONNECT_BACKOFF_S[0]
        m = self.metrics
        held: object = None      # a marker that ended the previous group, handled first
        while not self._stopping:
            item, held = (held, None) if held is not None else (await queue.get(), None)
            if item is _END or item is _STOP:
                return
            if isinstance(item, _Disconnected):
                backoff = await self._reconnect(item, queue, backoff)
                continue
            if isinstance(item, BaseException):
                raise item
            group: list[SourceTxn] = [item]  # type: ignore[list-item]
            size = group[0].size
            deadline = loop.time() + wait_s
            while len(group) < c.group_max_txns and size < c.group_max_bytes \
                    and not _progress_only(group[-1]):
                try:
                    nxt = queue.get_nowait() if queue.qsize() else await asyncio.wait_for(
                        queue.get(), max(0.0, deadline - loop.time()))
                except asyncio.TimeoutError:
                    break
                if not isinstance(nxt, SourceTxn):
                    held = nxt    # a marker ends the group; handled first thing next round
                    break
                group.append(nxt)
                size += nxt.size
            t0 = time.monotonic()
            self._writing = True
            try:
                await self.writer.write_group(group)
            finally:
                self._writing = False
            backoff = RECONNECT_BACKOFF_S[0]
            self._committed_ts_ms = group[-1].ts_ms
            progress = [t.snapshot for t in group if t.snapshot is not None]
            if progress:
                self._committed_progress = progress[-1]
            for key in snap.committed(group):
                await asyncio.to_thread(self._delete_key, key)
            m.group_seconds.observe(time.monotonic() - t0)
            m.groups.inc()
            m.txns.inc(len(group))
            m.rows.inc(sum(len(mu.changes) for t in group for mu in t.mutations))
            m.lag.set(self.lag_s())

    async def _publish_progress(self) -> None:
        """The last committed snapshot progress, as JSON in etcd for `sluice ctl snapshot
        status` (at most every PUBLISH_S; a failed write is retried with the next change)."""
        key = self.registry.cluster_key(snapshot_progress_path(self.config.producer_id))
        published: pb.SnapshotProgress | None = None
        while True:
            await asyncio.sleep(PUBLISH_S)
            p = self._committed_progress
            if p is None or p is published:
                continue
            doc = progress_doc(p)
            try:
                await asyncio.to_thread(self.etcd.put, key, json.dumps(doc, sort_keys=True))
                published = p
            except errors.SluiceError as e:
                log.warning("snapshot progress not published: %s", e)

    async def _reconnect(self, lost: _Disconnected, queue: asyncio.Queue[object], backoff: float) -> float:
        """Everything read before the loss is written already (it was ahead in the queue)."""
        self.metrics.set_state("reconnecting", error=str(lost.error)[:300],
                               after=lost.resume or "(first binlog)")
        self.metrics.reconnects.inc()
        if self._reader is not None:
            self._reader.close()
        await asyncio.sleep(backoff)
        if not self._stopping:
            self._start_reader(lost.resume, queue)
        return min(backoff * 2, RECONNECT_BACKOFF_S[1])

    # -- lag ----------------------------------------------------------------------------------

    def lag_s(self) -> float:
        """now - source commit time of the last committed transaction; 0 when caught up.

        Caught up: the source's last event was a heartbeat (MariaDB sends one only after
        `heartbeat-s` without anything to send) and nothing read is waiting to be written.
        Source times have 1 s resolution (binlog event timestamps).
        """
        r, q = self._reader, self._queue
        idle = q is None or q.qsize() == 0
        if r is not None and r.caught_up and idle and not self._writing:
            return 0.0
        ts_ms = self._committed_ts_ms
        if not ts_ms and r is not None and r.assembler.last_event_ts:
            ts_ms = r.assembler.last_event_ts * 1000
        return max(0.0, time.time() - ts_ms / 1000) if ts_ms else 0.0

    async def _lag_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.metrics.lag.set(self.lag_s())
            self._snapshot_metrics()

    def _snapshot_metrics(self) -> None:
        st = self.snapshotter.state if self.snapshotter is not None else None
        if st is None:
            self.metrics.set_snapshot_state("none", 0)
            return
        left = 0 if st.finished else len(st.tables) - (
            st.tables.index(st.current_table) if st.current_table in st.tables else 0)
        self.metrics.set_snapshot_state(
            "finished" if st.finished else "paused" if st.paused else "running", left)
