"""SparkSink: commit-ordered transactions -> per-table changelog parquet + views (docs/spark.md).

Invariant: exactly once. A micro-batch becomes visible in every table at one commit point
(commit.py); the sink's own commit table is the truth on open: transactions with
commit_ts <= the last committed record are skipped (the drainer's etcd checkpoint may be behind
it), recovery removes everything uncommitted, and checkpoint() reports the last committed
record's commit_ts with (batch, epoch) in sink_state.

Batches: `batch-rows` buffered rows or `batch-interval` seconds, and every flush(). A full
batch commits in the background while apply() buffers the next one (at most one commit in
flight, commits in batch order); flush() returns once everything applied is committed, and a
commit's error is raised by the next apply() or flush(). A primary-key change (and any update
of a keyless table) lands as a delete of the old image plus a create of the new one, `_seq` 2i
and 2i+1 for the transaction's i-th row change.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from sluice.core import failpoint
from sluice.core.errors import InvalidArgument, SluiceError
from sluice.core.position import format_position
from sluice.drainer.sink import Checkpoint, Sink, SinkCheckpoint, options_to_config
from sluice.drainer.txn import SchemaLookup, Txn
from sluice.proto import sluice_pb2 as pb
from sluice.spark_sink import parquet
from sluice.spark_sink import tables as T
from sluice.spark_sink.catalog import PartitionAdder
from sluice.spark_sink.commit import CommitRecord, Committer, Fenced
from sluice.spark_sink.config import SparkSinkConfig
from sluice.spark_sink.layout import Files, Layout, q, sql_str
from sluice.spark_sink.types import RowReader, row_reader

log = logging.getLogger(__name__)

_WRITE_THREADS = 4
_SHAPED = (pb.CREATE_TABLE, pb.ALTER_TABLE, pb.RENAME_TABLE, pb.TRUNCATE_TABLE)


@dataclasses.dataclass
class _Buffer:
    # Per table, rows as they land (META_COLUMNS then the values of the row's TableInfo
    # version, whose number is the row's _schema_ver); the versions' TableInfos beside them.
    rows: dict[int, list[tuple[Any, ...]]] = dataclasses.field(default_factory=dict)
    infos: dict[tuple[int, int], pb.TableInfo] = dataclasses.field(default_factory=dict)
    count: int = 0
    last_ts: int = 0
    first_mono: float = 0.0
    positions: dict[str, str] = dataclasses.field(default_factory=dict)


class SparkSink(Sink):
    name = "spark"
    checkpoint_follows_merge = True   # flush() commits everything applied
    # The drainer's periodic checkpoint calls commit_soon() (never waits) instead of flush(),
    # and saves again when the listener says a commit finished; `idle` says when the merge
    # watermark may be saved.
    commits_in_background = True

    def __init__(self, options: SparkSinkConfig, schema: SchemaLookup, source_name: str = "sluice",
                 epoch: int = 0, spark: Any = None, owner: str = "") -> None:
        self.cfg = options
        self._owner = owner   # the drainer's name: the tables' owner (commit.Committer._claim)
        self._schema = schema
        self._epoch = int(epoch or 0)
        self._spark = spark
        self.layout = Layout(options.root, options.meta_database, options.database, source_name)
        self.committer: Committer | None = None
        self.files: Files | None = None
        self._last: CommitRecord | None = None
        self._states: dict[int, T.TableState] = {}
        self._dirty: set[int] = set()          # state to persist before the next batch's files
        self._views_dirty: set[int] = set()    # views to (re)create after the next commit
        self._renamed: list[tuple[str, str]] = []   # views to drop after the next commit
        self._pre_views: set[int] = set()      # views to rewrite BEFORE the next commit point
        self._readers: dict[tuple[int, int], RowReader] = {}
        self._key_index: dict[tuple[int, int, int], list[int]] = {}   # Datum positions of the key
        self._buf = _Buffer()
        self._failed: BaseException | None = None
        # The commit in flight (its result: tables due for compaction) and its one thread.
        self._pending: concurrent.futures.Future[list[int]] | None = None
        self._committer_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._on_commit: Callable[[], None] | None = None
        self._partitions: PartitionAdder | None = None
        self._since_compact: dict[int, int] = {}
        self.skipped = 0
        # Seconds spent per commit step since open (convert, files, partitions, commit) and in
        # apply()'s decoding (decode_s): what bench/spark_sink.py reports.
        self.timings: dict[str, float] = {}

    @classmethod
    def from_options(cls, options: Any, **context: Any) -> SparkSink:
        cfg = options_to_config(SparkSinkConfig, options, "[to] spark sink")
        schema = context.get("schema")
        if schema is None:
            raise InvalidArgument("spark sink needs the drainer's schema lookup (context 'schema')")
        return cls(cfg, schema, context.get("source_name") or "sluice", context.get("epoch") or 0,
                   context.get("spark"), context.get("drainer_name") or "")

    @classmethod
    def prewarm(cls, options: Any) -> None:
        """The JVM and the Hive metastore client, read-only (20-60 s on this machine): the
        sink's open() then finds the process's session ready."""
        from sluice.spark_sink.session import session
        cfg = options_to_config(SparkSinkConfig, options, "[to] spark sink")
        session(cfg).sql("SHOW DATABASES").collect()

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def spark(self) -> Any:
        return self._spark

    async def open(self, checkpoint: Checkpoint) -> None:
        await asyncio.to_thread(self._open_sync)
        if checkpoint.commit_ts > self.committed_ts and self._last is not None:
            log.info("drainer checkpoint is ahead of the spark commit table", extra={"fields": {
                "drainer": checkpoint.commit_ts, "spark": self.committed_ts}})

    def _open_sync(self) -> None:
        if self._spark is None:
            from sluice.spark_sink.session import session
            self._spark = session(self.cfg)
        self.files = Files(self._spark)
        self._partitions = PartitionAdder(self._spark)
        self.committer = Committer(self._spark, self.layout, self.files, self._partitions)
        self._last = self.committer.open(self._epoch, self._owner)
        self._states = self._load_states()
        for tid, st in self._states.items():
            self._write_views(st)
        log.info("spark sink open", extra={"fields": {
            "epoch": self._epoch, "batch": self._last.batch if self._last else 0,
            "commit_ts": self.committed_ts, "tables": len(self._states)}})

    def _load_states(self) -> dict[int, T.TableState]:
        assert self.committer is not None
        out: dict[int, T.TableState] = {}
        for name in self.committer.raw_tables():
            rows = self._spark.sql(f"SHOW TBLPROPERTIES {q(self.layout.meta, name)} "
                                   f"('sluice.state')").collect()
            text = rows[0][1] if rows else ""
            if not text or "does not have property" in text:
                continue
            st = T.TableState.from_json(text)
            mark = self._view_mark(st)
            if mark is not None:
                st = dataclasses.replace(st, base_version=mark[0], base_upto=mark[1])
            out[st.table_id] = st
        return out

    def _view_mark(self, st: T.TableState) -> tuple[int, int] | None:
        try:
            rows = self._spark.sql(f"DESCRIBE TABLE EXTENDED {self.layout.view(st.db, st.table)}").collect()
        except Exception:  # noqa: BLE001 - no view yet
            return None
        for r in rows:
            if r[0] == "View Text":
                return T.parse_view_mark(r[1])
        return None

    async def close(self) -> None:
        self._buf = _Buffer()
        fut, self._pending = self._pending, None
        try:
            if fut is not None:
                # Let the commit in flight finish (its error, e.g. Fenced, is the caller's).
                await asyncio.wrap_future(fut)
        finally:
            if self._committer_pool is not None:
                self._committer_pool.shutdown(wait=False)
                self._committer_pool = None

    @property
    def committed_ts(self) -> int:
        return self._last.commit_ts if self._last is not None else 0

    def checkpoint(self) -> SinkCheckpoint:
        last = self._last
        if last is None:
            return SinkCheckpoint(0, {"epoch": self._epoch})
        return SinkCheckpoint(last.commit_ts, {"batch": last.batch, "epoch": last.epoch,
                                               "commit_ts": last.commit_ts})

    def _check_usable(self) -> None:
        if self._failed is not None:
            raise SluiceError(f"spark sink failed earlier ({self._failed}); restart the drainer "
                              "(recovery removes the uncommitted batch)")
        if self.committer is None:
            raise SluiceError("spark sink is not open")

    # -- applying -----------------------------------------------------------------------------

    async def apply(self, batch: list[Txn]) -> None:
        if self._pending is not None and self._pending.done():
            await self._settle()   # its error now, and the compactions it made due
        self._check_usable()
        for txn in batch:
            if txn.commit_ts <= self.committed_ts:
                self.skipped += 1
                continue
            pv = txn.prewrite
            if self._pending is not None and (pv.schema_snapshots or pv.HasField("ddl")):
                # Schema effects change table states, which a compaction after the commit in
                # flight rewrites too: one at a time.
                await self._settle()
            try:
                self._schema_effects(txn)
            except T.UnmappableChange as e:
                # Stop cleanly: everything before this DDL is committed, nothing after it.
                await self._commit_all()
                self._failed = e
                raise
            t = time.perf_counter()
            self._buffer_txn(txn)
            self.timings["decode_s"] = self.timings.get("decode_s", 0.0) + time.perf_counter() - t
            if self._buf.count >= self.cfg.batch_rows or (
                    self._buf.count and time.monotonic() - self._buf.first_mono >= self.cfg.batch_interval):
                await self._settle()
                self._start_commit()

    async def flush(self) -> None:
        await self._settle()
        self._check_usable()
        await self._commit_all()

    async def commit_soon(self) -> None:
        """Start committing what is buffered, unless a commit is still in flight; never waits
        for one (a finished one is settled first: its error is raised here)."""
        if self._pending is not None:
            if not self._pending.done():
                return
            await self._settle()
        self._check_usable()
        self._start_commit()

    @property
    def idle(self) -> bool:
        """Nothing applied is uncommitted: no buffered rows or state changes, no commit in flight."""
        return (self._pending is None and not self._buf.count and not self._dirty
                and not self._views_dirty and not self._renamed and not self._pre_views)

    def set_commit_listener(self, listener: Callable[[], None]) -> None:
        """Called from the commit thread after each background commit (success or failure)."""
        self._on_commit = listener

    async def _commit_all(self) -> None:
        await self._settle()
        self._start_commit()
        await self._settle()

    def _schema_effects(self, txn: Txn) -> None:
        """Fold a transaction's schema snapshots and DDL into the table states (docs/spark.md,
        "DDL effects"): CREATE/ALTER/RENAME change the shape (RENAME moves the views), TRUNCATE
        and a CREATE of a known table id add a truncate marker, DROP TABLE / DROP DATABASE
        remove the views."""
        pv = txn.prewrite
        for info in pv.schema_snapshots:
            self._evolve(info, "")
        ddl = txn.ddl
        if ddl is None:
            return
        what = ddl.query or pb.DDLType.Name(ddl.tp)
        if ddl.tp in _SHAPED:
            info = ddl.table_info if ddl.HasField("table_info") else None
            if info is None and ddl.table_id:
                info = self._schema.table_at(ddl.table_id, txn.commit_ts)
            if info is None:
                log.warning("DDL without a table shape; Spark tables unchanged",
                            extra={"fields": {"ddl": ddl.query, "commit_ts": txn.commit_ts}})
                return
            old = self._states.get(info.table_id)
            if ddl.tp == pb.CREATE_TABLE and old is not None and (
                    old.dropped or not info.version or info.version > old.version):
                # A new incarnation of a known table id (stable ids per name: DROP then CREATE):
                # its columns start fresh, whatever the old ones' types were.
                self._states[info.table_id] = T.recreated(old)
                self._states[info.table_id] = self._evolve(info, what, force=True)
            else:
                self._evolve(info, what)
            if ddl.tp == pb.TRUNCATE_TABLE or (ddl.tp == pb.CREATE_TABLE and old is not None):
                # The table starts empty here: rows before the marker leave the current state.
                # (A brand-new table id has no rows to hide; after a crash that persisted its
                # state but not its batch, the replayed CREATE adds a harmless marker.)
                self._truncate_marker(txn, info)
            return
        if ddl.tp == pb.DROP_TABLE:
            st = self._ddl_target(ddl)
            if st is None:
                log.warning("DROP TABLE of a table the Spark sink never saw", extra={"fields": {
                    "table": f"{ddl.schema_name}.{ddl.table_name}", "commit_ts": txn.commit_ts}})
                return
            self._drop(st)
        elif ddl.tp == pb.DROP_DATABASE:
            for st in list(self._states.values()):
                if st.schema == ddl.schema_name:
                    self._drop(st)

    def _ddl_target(self, ddl: pb.DDL) -> T.TableState | None:
        # A dropped state is still a target: the DROP may be replayed after a crash that
        # persisted the state but not the batch (its views then still exist).
        st = self._states.get(ddl.table_id) if ddl.table_id else None
        if st is not None:
            return st
        named = [s for s in self._states.values() if (s.schema, s.table) == (ddl.schema_name, ddl.table_name)]
        return min(named, key=lambda s: s.dropped, default=None)

    def _drop(self, st: T.TableState) -> None:
        """DROP TABLE: the views go after the batch holding the DROP commits; the raw and base
        tables (the table's whole history) stay in the meta database."""
        new = dataclasses.replace(st, dropped=True)
        self._states[st.table_id] = new
        self._dirty.add(st.table_id)
        self._renamed.append((st.db, st.table))
        self._views_dirty.discard(st.table_id)

    def _truncate_marker(self, txn: Txn, info: pb.TableInfo) -> None:
        st = self._states[info.table_id]
        if not st.cleared:
            # The views learn to filter by markers BEFORE the marker's batch commits (the filter
            # changes nothing until then), so the table empties exactly at that commit point.
            st = self._states[info.table_id] = dataclasses.replace(st, cleared=True)
            self._dirty.add(st.table_id)
            self._pre_views.add(st.table_id)
        buf = self._buf
        pos = format_position(txn.position) if txn.position is not None else None
        if pos and txn.producer_id:
            buf.positions[txn.producer_id] = pos
        rows = buf.rows.setdefault(info.table_id, [])
        buf.infos.setdefault((info.table_id, info.version), info)
        vals = [None] * sum(1 for c in info.columns if not c.hidden)
        rows.append((T.TRUNCATED, txn.commit_ts, 0, info.version, txn.producer_id or None, pos,
                     None, None, *vals))
        buf.count += 1
        buf.last_ts = txn.commit_ts
        if not buf.first_mono:
            buf.first_mono = time.monotonic()

    def _evolve(self, info: pb.TableInfo, ddl: str, force: bool = False) -> T.TableState:
        old = self._states.get(info.table_id)
        if not force and old is not None and info.version and info.version <= old.version:
            # Already folded in (a replay after a restart, or a repeated schema snapshot).
            return old
        new = T.evolve(old, info, self.layout, ddl)
        if new != old:
            if old is not None and not old.dropped and (old.db, old.table) != (new.db, new.table):
                self._renamed.append((old.db, old.table))
            self._states[info.table_id] = new
            self._dirty.add(info.table_id)
            self._views_dirty.add(info.table_id)
        return new

    def _buffer_txn(self, txn: Txn) -> None:
        events = txn.rows(self._schema)
        buf = self._buf
        if not events:
            return
        pos = format_position(txn.position) if txn.position is not None else None
        if pos and txn.producer_id:
            buf.positions[txn.producer_id] = pos
        src = txn.source
        ts_ms = (src.ts_ms if src is not None and src.ts_ms else
                 txn.position.ts_ms if txn.position is not None and txn.position.ts_ms else None)
        cts, producer = txn.commit_ts, txn.producer_id or None
        states, readers, brows = self._states, self._readers, buf.rows
        for ev in events:
            info = ev.table_info
            tid, ver = ev.table_id, info.version
            st = states.get(tid)
            if st is None or ver > st.version:
                st = self._evolve(info, "")
            read = readers.get((tid, ver))
            if read is None:
                read = readers[(tid, ver)] = row_reader(info)
            rows = brows.get(tid)
            if rows is None:
                rows = brows[tid] = []
            if (tid, ver) not in buf.infos:
                buf.infos[(tid, ver)] = info
            seq = ev.seq * 2
            op = ev.op
            if op == "d":
                rows.append(read(ev.before, ("d", cts, seq, ver, producer, pos, ts_ms)))  # type: ignore[arg-type]
            elif op == "u" and self._key_changed(st, info, ev.before, ev.after):  # type: ignore[arg-type]
                rows.append(read(ev.before, ("d", cts, seq, ver, producer, pos, ts_ms)))  # type: ignore[arg-type]
                rows.append(read(ev.after, ("c", cts, seq + 1, ver, producer, pos, ts_ms)))  # type: ignore[arg-type]
            else:
                rows.append(read(ev.after, (op, cts, seq, ver, producer, pos, ts_ms)))  # type: ignore[arg-type]
        buf.count += len(events)
        buf.last_ts = cts
        if not buf.first_mono:
            buf.first_mono = time.monotonic()

    def _key_changed(self, st: T.TableState, info: pb.TableInfo, before: pb.Row, after: pb.Row) -> bool:
        """Whether an update moves its row to another identity (a keyless table's every update
        does), compared on the Datums: the before image is converted only when it lands."""
        if not st.key:
            return before != after
        b, a = before.columns, after.columns
        where = (info.table_id, info.version, len(b))
        idx = self._key_index.get(where)
        if idx is None:
            cols = [c for c in info.columns if len(b) == len(info.columns) or not c.hidden]
            names = [c.name.lower() for c in cols]
            keys = [k.lower() for k in st.key]
            # A key column this (older) version lacks: compare whole rows.
            idx = self._key_index[where] = ([names.index(k) for k in keys]
                                            if all(k in names for k in keys) else [])
        if not idx:
            return before != after
        return any(b[i] != a[i] for i in idx)

    # -- committing ---------------------------------------------------------------------------

    def _start_commit(self) -> None:
        """Hand the buffer to the commit thread (the previous commit has settled)."""
        assert self._pending is None
        buf, self._buf = self._buf, _Buffer()
        if not buf.count and not self._dirty and not self._views_dirty and not self._renamed:
            return
        dirty, self._dirty = set(self._dirty), set()
        views, self._views_dirty = set(self._views_dirty), set()
        pre, self._pre_views = set(self._pre_views), set()
        renamed, self._renamed = list(self._renamed), []
        states = dict(self._states)
        if self._committer_pool is None:
            self._committer_pool = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="spark-commit")
        self._pending = self._committer_pool.submit(self._commit_sync, buf, states, dirty, views,
                                                    renamed, pre)
        if self._on_commit is not None:
            listener = self._on_commit
            self._pending.add_done_callback(lambda _f: listener())

    async def _settle(self) -> None:
        """Wait for the commit in flight, then run the compactions it made due."""
        fut = self._pending
        if fut is None:
            return
        try:
            due = await asyncio.wrap_future(fut)
        except BaseException as e:
            if fut.done():   # (not when only our wait was cancelled: close() waits for it)
                self._pending = None
                if not fut.cancelled() and self._failed is None:
                    self._failed = e
            raise
        self._pending = None
        if due and not self._dirty:
            # (With a state change waiting for the next batch, compaction waits for it too.)
            await asyncio.to_thread(self._compact_due, due)

    def _commit_sync(self, buf: _Buffer, states: dict[int, T.TableState], dirty: set[int],
                     views: set[int], renamed: list[tuple[str, str]], pre: set[int]) -> list[int]:
        """One batch's catalog and file work (the commit thread); returns the tables whose
        compaction is due."""
        for tid in sorted(dirty):
            self._persist_state(states[tid])
        for tid in sorted(pre):
            if tid not in views and not states[tid].dropped:
                self._write_views(states[tid], create=False)
        if buf.count:
            self._commit_batch(buf, states)
        for db, table in renamed:
            self._spark.sql(f"DROP VIEW IF EXISTS {self.layout.view(db, table)}")
            self._spark.sql(f"DROP VIEW IF EXISTS {self.layout.changelog(db, table)}")
        for tid in sorted(views):
            self._write_views(states[tid])
        due = []
        if buf.count and self.cfg.compact_every:
            for tid in buf.rows:
                n = self._since_compact[tid] = self._since_compact.get(tid, 0) + 1
                if n >= self.cfg.compact_every:
                    due.append(tid)
        return due

    def _compact_due(self, due: list[int]) -> None:
        for tid in due:
            if not self._states[tid].dropped:
                self.compact_table(tid)
            self._since_compact[tid] = 0

    def compact_table(self, table_id: int) -> T.TableState:
        """Compact one table, merge its small files (when configured) and empty the trash of
        what was replaced more than gc-grace ago. Call between batches (the sink's thread)."""
        from sluice.spark_sink.compaction import compact, empty_trash, merge_small_files
        if self._partitions is not None:
            self._partitions.forget()
        st = self._states[table_id] = compact(self, self._states[table_id])
        if self.cfg.merge_small_files:
            st = self._states[table_id] = merge_small_files(self, st)
        empty_trash(self)
        return st

    def _persist_state(self, st: T.TableState) -> None:
        if self._partitions is not None:
            self._partitions.forget()
        spark, raw, base = self._spark, self.layout.raw(st.table_id), self.layout.base(st.table_id)
        assert self.files is not None
        self.files.mkdirs(self.layout.raw_table_dir(st.table_id))
        self.files.mkdirs(self.layout.base_table_dir(st.table_id))
        spark.sql(T.create_raw_sql(st, self.layout))
        spark.sql(T.create_base_sql(st, self.layout))
        tables = (raw, base, self.layout.hist(st.table_id)) if st.hist else (raw, base)
        for table in tables:
            have = {f.name for f in spark.table(table).schema.fields}
            missing = [(n, t) for n, t in st.phys_columns() if n not in have]
            if missing:
                spark.sql(f"ALTER TABLE {table} ADD COLUMNS ("
                          + ", ".join(f"{q(n)} {t}" for n, t in missing) + ")")
        spark.sql(f"ALTER TABLE {raw} SET TBLPROPERTIES ('sluice.state' = "
                  f"{sql_str(st.to_json())})")

    def _write_views(self, st: T.TableState, create: bool = True) -> None:
        """(Re)write both views of st; create=False only alters views that already exist."""
        spark = self._spark
        if st.dropped:
            return
        spark.sql(f"CREATE DATABASE IF NOT EXISTS {q(st.db)}")
        for name, text in ((self.layout.changelog(st.db, st.table), T.changelog_sql(st, self.layout)),
                           (self.layout.view(st.db, st.table), T.current_view_sql(st, self.layout))):
            # ALTER VIEW is one metastore update; CREATE OR REPLACE would drop and re-create
            # (a reader in between would find no table).
            if spark.catalog.tableExists(name.replace("`", "")):
                spark.sql(f"ALTER VIEW {name} AS {text}")
            elif create:
                spark.sql(f"CREATE VIEW IF NOT EXISTS {name} AS {text}")

    def _table_rows(self, st: T.TableState, buf: _Buffer, table_id: int) -> list[tuple[Any, ...]]:
        """The table's buffered rows in its physical column order (as buffered when no column
        of their versions moved or was dropped: the common case)."""
        rows = buf.rows[table_id]
        width = len(st.physical)
        identity = list(range(width))
        moved = {ver: idx for (tid, ver), info in buf.infos.items()
                 if tid == table_id and (idx := T.phys_index(st, info)) != identity}
        if not moved:
            return rows
        meta = len(T.META_COLUMNS)
        ver_at = [name for name, _ in T.META_COLUMNS].index("_schema_ver")
        return [r if (idx := moved.get(r[ver_at])) is None
                else T.physical_row(r[:meta], list(r[meta:]), idx, width) for r in rows]

    def _write_table_files(self, st: T.TableState, rows: list[tuple[Any, ...]], batch: int) -> None:
        path = self.layout.raw_dir(st.table_id, self._epoch, batch)
        columns = (*T.META_COLUMNS, *st.physical)
        if parquet.is_local(path):
            parquet.write_rows(path, parquet.arrow_schema(columns), rows)
            return
        from pyspark.sql.types import StructType
        spark = self._spark
        schema = StructType.fromDDL(", ".join(f"{q(n)} {t}" for n, t in columns))
        df = spark.createDataFrame(rows, schema=schema, verifySchema=False)
        df = df.coalesce(max(1, min(spark.sparkContext.defaultParallelism, len(rows) // 50_000)))
        df.write.mode("overwrite").parquet(path)

    def _commit_batch(self, buf: _Buffer, states: dict[int, T.TableState]) -> None:
        assert self.committer is not None and self.files is not None
        spark, layout, epoch = self._spark, self.layout, self._epoch
        batch = (self._last.batch if self._last is not None else 0) + 1
        tables = sorted(buf.rows)
        t0 = time.monotonic()
        converted = {tid: self._table_rows(states[tid], buf, tid) for tid in tables}
        t1 = time.monotonic()
        if len(tables) == 1:
            self._write_table_files(states[tables[0]], converted[tables[0]], batch)
        else:
            # One Spark job per table at once: each job is mostly one task (small batches), so
            # serial jobs leave cores idle while Python pickles the next table's rows.
            with concurrent.futures.ThreadPoolExecutor(min(len(tables), _WRITE_THREADS)) as ex:
                for f in [ex.submit(self._write_table_files, states[tid], converted[tid], batch)
                          for tid in tables]:
                    f.result()
        del converted
        t2 = time.monotonic()
        failpoint.inject("spark-after-files")
        assert self._partitions is not None
        for i, tid in enumerate(tables):
            self._partitions.add(layout.meta, layout.raw_name(tid), {"_batch": batch, "_epoch": epoch},
                                 layout.raw_dir(tid, epoch, batch))
            if i == 0:
                failpoint.inject("spark-after-some-partitions")
        prev = self._last
        positions = {**(prev.positions if prev else {}), **buf.positions}
        versions = {**(prev.schema_versions if prev else {}),
                    **{str(tid): states[tid].version for tid in tables}}
        rec = CommitRecord(batch=batch, epoch=epoch, commit_ts=buf.last_ts, positions=positions,
                           schema_versions=versions, rows=sum(len(buf.rows[t]) for t in tables),
                           tables=tuple(tables), created_ms=int(time.time() * 1000))
        t3 = time.monotonic()
        self.committer.commit(rec)
        self._last = rec
        t4 = time.monotonic()
        for k, v in (("convert_s", t1 - t0), ("files_s", t2 - t1), ("partitions_s", t3 - t2),
                     ("commit_s", t4 - t3)):
            self.timings[k] = self.timings.get(k, 0.0) + v
        self.timings["batches"] = self.timings.get("batches", 0) + 1
        log.info("spark batch committed", extra={"fields": {
            "batch": batch, "epoch": epoch, "commit_ts": rec.commit_ts, "rows": rec.rows,
            "tables": len(tables), "convert_s": round(t1 - t0, 2), "files_s": round(t2 - t1, 2),
            "partitions_s": round(t3 - t2, 2), "commit_s": round(t4 - t3, 2)}})


__all__ = ["SparkSink", "Fenced"]
