"""One incarnation of the capture (one producer epoch): start-up, recovery of the position,
the schema-snapshot transaction and the snapshot plan; then `Streaming`. docs/capture.md
("Start position", "Schema at start").
"""
from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from typing import Any

from sluice.capture import checks
from sluice.capture.config import CaptureConfig
from sluice.capture.handoff import Handoff
from sluice.capture.metrics import CaptureMetrics
from sluice.capture.reader import BinlogReader, gtid_state_text, parse_gtid_state
from sluice.capture.schema import SchemaTracker, TableFilter, version_of
from sluice.capture.snapshot.modes import SnapshotMode, StartState, decide, parse_mode
from sluice.capture.snapshot.progress import SnapshotState, decode, encode
from sluice.capture.snapshotter import READ_ONLY, SIGNAL_TABLE, Snapshotter, new_state
from sluice.capture.writer import GroupWriter, stamped
from sluice.client.pumps import PumpsClient
from sluice.client.producer import ProducerServer
from sluice.core import errors
from sluice.core.etcd import Etcd
from sluice.core.position import format_position, is_empty
from sluice.core.registry import Registry, captured_tables_path
from sluice.core.rewind import delete_rewind, read_rewind
from sluice.core.tso_client import TSOClient
from sluice.proto import sluice_pb2 as pb
from sluice.core.log import kv
from sluice.capture.start import (_oldest_binlog, earliest_state, read_table_definitions,
                                  source_checks, start_snapshot_position)
from sluice.capture.streaming import _STOP, Streaming

log = logging.getLogger(__name__)

# A pump, etcd or the TSO unreachable, or every pump refusing for disk space: the next
# incarnation can succeed. Anything else (a fenced epoch, a bad config, an unknown table_id,
# a purged position) needs a person and ends the process.
TRANSIENT = (errors.Unavailable, errors.ResourceExhausted, errors.DeadlineExceeded)


class Capture(Streaming):
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
        self._reader_thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._stopping = False
        self._queue: Handoff | None = None
        self._writing = 0               # groups written and not yet committed (0, 1 or 2)
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
            await self._stop_reader()
            await self.producer.stop()
            await self.writer.close()
            await self.pumps.close()
            await self.tso.close()
            self.etcd.close()

    def _on_signal(self) -> None:
        self._stopping = True
        q = self._queue
        if q is not None:
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
            if self.writer.generation:
                at.generation = self.writer.generation   # `last` below carries it too
            await self.writer.write_items([stamped(value.SerializeToString(), at,
                                                   encode(state) if state else None,
                                                   self.writer.generation)])
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
