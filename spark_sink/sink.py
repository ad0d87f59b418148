"""SparkSink: commit-ordered transactions -> Apache Iceberg tables through Spark (docs/spark.md).

Per source table, `<db>.<table>_changelog` (every change) and `<db>.<table>` (current state).
Batches: `batch-rows` buffered changes or `batch-interval` seconds, and every flush(). A full
batch commits in the background while apply() buffers the next one (at most one commit in
flight, commits in batch order); flush() returns once everything applied is committed, and a
commit's error is raised by the next apply() or flush().

Invariant: exactly once (commit.py). Each table's commits carry the sink's checkpoint in their
snapshot summary; a batch commits its tables in a fixed order (each changelog, then its current
table), then a row in `<meta>._sluice_commits` (the marker). checkpoint() reports the last
marker's commit_ts; on open every table skips the transactions its own summary holds.

Schema changes (DDL, schema snapshots) are applied between batches, in stream order: what is
buffered commits first, then the tables change (tables.plan, catalog.apply_ops), then the
transaction's rows buffer under the new shape. A primary-key change (and any update of a
keyless table) lands in the changelog as a delete of the old image plus a create of the new
one, `_seq` 2i and 2i+1 for the transaction's i-th row change.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from sluice.core import failpoint
from sluice.core.errors import InvalidArgument, SluiceError
from sluice.core.position import format_position
from sluice.drainer.sink import (BackgroundSink, Capabilities, Checkpoint, SinkCheckpoint,
                                 options_to_config)
from sluice.drainer.txn import SchemaLookup, Txn
from sluice.proto import sluice_pb2 as pb
from sluice.spark_sink import tables as T
from sluice.spark_sink import writer as W
from sluice.spark_sink.catalog import Catalog, Summary
from sluice.spark_sink.commit import Fenced, LostRace, OwnedByAnother, Publisher
from sluice.spark_sink.config import SparkSinkConfig
from sluice.spark_sink.types import RowReader, row_reader
from sluice.core.log import kv

log = logging.getLogger(__name__)

COMMITS = "_sluice_commits"
COMMITS_COLUMNS = [("batch", "BIGINT"), ("epoch", "BIGINT"), ("drainer", "STRING"),
                   ("commit_ts", "BIGINT"), ("rows", "BIGINT"),
                   ("tables", "MAP<STRING, BIGINT>"), ("committed_at", "TIMESTAMP")]
STATE_PROPERTY = "sluice.state"
TABLES_PROPERTY = "sluice.tables"
_RACE_ATTEMPTS = 5


@dataclasses.dataclass
class _Buffer:
    rows: dict[int, list[tuple[Any, ...]]] = dataclasses.field(default_factory=dict)
    count: int = 0
    last_ts: int = 0
    first_mono: float = 0.0


@dataclasses.dataclass(frozen=True)
class Committed:
    """The last batch the marker table holds."""

    batch: int
    epoch: int
    commit_ts: int


class SparkSink(BackgroundSink):
    name = "spark"
    # flush() commits everything applied; periodic checkpoints use commit_soon() and successes().
    capabilities = Capabilities(follows_merge=True, background=True)

    def __init__(self, options: SparkSinkConfig, schema: SchemaLookup, source_name: str = "sluice",
                 epoch: int = 0, spark: Any = None, owner: str = "") -> None:
        self.cfg = options
        self._owner = owner or "sluice"
        self._schema = schema
        self._source = source_name
        self._epoch = int(epoch or 0)
        self._spark = spark
        self.catalog: Catalog | None = None
        self.publisher: Publisher | None = None
        self.meta_db = T.ident(options.meta_database)
        self._last: Committed | None = None
        self._states: dict[int, T.TableState] = {}
        self._readers: dict[tuple[int, int], tuple[RowReader, list[int] | None]] = {}
        self._key_index: dict[tuple[int, int, int], list[int]] = {}
        self._buf = _Buffer()
        self._failed: BaseException | None = None
        self._pending: concurrent.futures.Future[None] | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._successes: asyncio.Queue[SinkCheckpoint] = asyncio.Queue()
        self._since_maintenance = 0
        self.skipped = 0
        # Seconds per step since open (decode_s in apply(); convert/changelog/current/marker per
        # batch): what bench/spark_sink.py reports.
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
        """The JVM and the catalog, read-only (10-30 s on this machine): the sink's open() then
        finds the process's session ready."""
        from sluice.spark_sink.session import session
        cfg = options_to_config(SparkSinkConfig, options, "[to] spark sink")
        session(cfg).sql(f"SHOW NAMESPACES IN {T.q(cfg.catalog)}").collect()

    # -- the commit thread ----------------------------------------------------------------------
    # Every Spark call runs on one thread: Iceberg reads the commit properties from the JVM
    # thread of the caller, and PySpark pins one JVM thread per Python thread.

    def _thread(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="spark-commit")
        return self._pool

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.wrap_future(self._thread().submit(fn, *args))

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def spark(self) -> Any:
        return self._spark

    async def open(self, checkpoint: Checkpoint) -> None:
        await self._run(self._open_sync)
        if checkpoint.commit_ts > self.committed_ts and self._last is not None:
            log.info("drainer checkpoint is ahead of the spark marker table", extra=kv(drainer=checkpoint.commit_ts, spark=self.committed_ts))

    def _open_sync(self) -> None:
        if self._spark is None:
            from sluice.spark_sink.session import session
            self._spark = session(self.cfg)
        cat = self.catalog = Catalog(self._spark, self.cfg.catalog)
        pub = self.publisher = Publisher(cat, self._owner, self._epoch)
        if not cat.exists(self.meta_db, COMMITS):
            cat.create_table(self.meta_db, COMMITS, COMMITS_COLUMNS,
                             {"sluice.owner": self._owner, TABLES_PROPERTY: "[]"})
        props = cat.properties(self.meta_db, COMMITS)
        owner = props.get("sluice.owner", self._owner)
        if owner != self._owner:
            raise OwnedByAnother(
                f"spark sink: the tables under {self.cfg.catalog}.{self.meta_db} belong to drainer "
                f"'{owner}', not '{self._owner}': give each drainer its own meta-database and "
                "database pattern, or run the same drainer name")
        th = pub.open_table(self.meta_db, COMMITS)
        self._last = Committed(th.batch, self._epoch, th.commit_ts) if th.commit_ts else None
        self._states = {}
        for db, changelog in json.loads(props.get(TABLES_PROPERTY) or "[]"):
            if not cat.exists(db, changelog):
                continue
            text = cat.properties(db, changelog).get(STATE_PROPERTY)
            if not text:
                continue
            st = T.TableState.from_json(text)
            self._states[st.table_id] = st
        for st in self._states.values():
            pub.open_table(st.db, st.changelog)
            if not st.dropped and not st.skipped and cat.exists(st.db, st.name):
                pub.open_table(st.db, st.name)
                if cat.properties(st.db, st.name).get("write.merge.mode") != self.cfg.write_mode:
                    cat.set_write_mode(st.db, st.name, self.cfg.write_mode)
        log.info("spark sink open", extra=kv(epoch=self._epoch, batch=self._last.batch if self._last else 0, commit_ts=self.committed_ts, tables=len(self._states)))

    async def close(self) -> None:
        self._buf = _Buffer()
        fut, self._pending = self._pending, None
        try:
            if fut is not None:
                # Let the commit in flight finish (its error, e.g. Fenced, is the caller's).
                await asyncio.wrap_future(fut)
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=False)
                self._pool = None

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
                              "(it resumes after the last committed batch)")
        if self.publisher is None:
            raise SluiceError("spark sink is not open")

    # -- applying -------------------------------------------------------------------------------

    async def apply(self, batch: list[Txn]) -> None:
        if self._pending is not None and self._pending.done():
            await self._settle()
        self._check_usable()
        for txn in batch:
            if txn.commit_ts <= self.committed_ts:
                self.skipped += 1
                continue
            if self._changes_schema(txn):
                # Stream order: what is buffered lands in the old shape, then the tables change.
                await self._commit_all()
                try:
                    await self._run(self._schema_effects, txn)
                except T.UnmappableChange as e:
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
        """Nothing applied is uncommitted: no buffered rows, no commit in flight."""
        return self._pending is None and not self._buf.count

    def successes(self) -> asyncio.Queue[SinkCheckpoint]:
        """What is durable each time a background commit ends (success or failure)."""
        return self._successes

    async def _commit_all(self) -> None:
        await self._settle()
        self._start_commit()
        await self._settle()

    def _start_commit(self) -> None:
        assert self._pending is None
        buf, self._buf = self._buf, _Buffer()
        if not buf.count:
            return
        states = dict(self._states)
        self._pending = self._thread().submit(self._commit_sync, buf, states)
        loop, put = asyncio.get_running_loop(), self._successes.put_nowait

        def report(_f: concurrent.futures.Future[None]) -> None:
            try:
                loop.call_soon_threadsafe(put, self.checkpoint())
            except RuntimeError:   # the loop that started it is gone: nobody reads the report
                pass
        self._pending.add_done_callback(report)

    async def _settle(self) -> None:
        fut = self._pending
        if fut is None:
            return
        try:
            await asyncio.wrap_future(fut)
        except BaseException as e:
            if fut.done():   # (not when only our wait was cancelled: close() waits for it)
                self._pending = None
                if not fut.cancelled() and self._failed is None:
                    self._failed = e
            raise
        self._pending = None

    # -- schema effects (commit thread) ---------------------------------------------------------

    def _changes_schema(self, txn: Txn) -> bool:
        pv = txn.prewrite
        if pv.HasField("ddl"):
            return True
        for info in pv.schema_snapshots:
            if self._newer(info.table_id, info.version):
                return True
        return bool(self._unshaped(txn))

    def _newer(self, table_id: int, version: int) -> bool:
        st = self._states.get(table_id)
        return st is None or st.dropped or version > st.version

    def _unshaped(self, txn: Txn) -> list[pb.TableInfo]:
        """Shapes (from the schema history) of tables whose rows the sink cannot place yet: a
        table first met through its rows (the drainer started after its schema binlog), or rows
        of a version newer than the sink's."""
        out = []
        for m in txn.prewrite.mutations:
            st = self._states.get(m.table_id)
            if st is not None and not st.dropped and (not m.table_version or m.table_version <= st.version):
                continue
            info = self._schema.table_at(m.table_id, txn.commit_ts)
            if info is not None and self._newer(info.table_id, info.version) and not (
                    st is not None and st.skipped):
                out.append(info)
        return out

    def _policy(self, schema: str, table: str) -> str:
        return self.cfg.unmappable_policy(schema, table)

    def _db(self, schema: str) -> str:
        return T.ident(self.cfg.database.format(schema=schema, source=self._source))

    def _schema_effects(self, txn: Txn) -> None:
        """Fold a transaction's schema snapshots and DDL into the tables (docs/spark.md, "DDL")."""
        pv = txn.prewrite
        for info in pv.schema_snapshots:
            if self._newer(info.table_id, info.version):
                self._shape(info, "", txn.commit_ts, new_incarnation=False)
        self._ddl_effects(txn)
        for info in self._unshaped(txn):
            self._shape(info, "", txn.commit_ts, new_incarnation=False)

    def _ddl_effects(self, txn: Txn) -> None:
        ddl = txn.ddl
        if ddl is None:
            return
        what = ddl.query or pb.DDLType.Name(ddl.tp)
        if ddl.tp in (pb.CREATE_TABLE, pb.ALTER_TABLE, pb.TRUNCATE_TABLE):
            info = ddl.table_info if ddl.HasField("table_info") else None
            if info is None and ddl.table_id:
                info = self._schema.table_at(ddl.table_id, txn.commit_ts)
            if info is None:
                log.warning("DDL without a table shape; Iceberg tables unchanged",
                            extra=kv(ddl=ddl.query, commit_ts=txn.commit_ts))
                return
            old = self._states.get(info.table_id)
            if ddl.tp == pb.CREATE_TABLE:
                fresh = old is not None and (old.dropped or info.version > old.version)
                if old is None or fresh:
                    self._shape(info, what, txn.commit_ts, new_incarnation=old is not None)
            elif ddl.tp == pb.ALTER_TABLE:
                if old is None or info.version > old.version or old.dropped:
                    self._shape(info, what, txn.commit_ts, new_incarnation=False)
            else:
                if old is None or info.version > old.version:
                    self._shape(info, what, txn.commit_ts, new_incarnation=False)
                st = self._states.get(info.table_id)
                if st is not None and not st.skipped:
                    self._truncate(st, txn)
        elif ddl.tp == pb.RENAME_TABLE:
            self._rename(ddl, txn)
        elif ddl.tp == pb.DROP_TABLE:
            st = self._target(ddl.table_id, ddl.schema_name, ddl.table_name)
            if st is None:
                log.warning("DROP TABLE of a table the Spark sink never saw", extra=kv(table=f"{ddl.schema_name}.{ddl.table_name}", commit_ts=txn.commit_ts))
                return
            self._drop(st)
        elif ddl.tp == pb.DROP_DATABASE:
            for st in list(self._states.values()):
                if st.schema == ddl.schema_name and not st.dropped:
                    self._drop(st)
        elif ddl.tp == pb.CREATE_DATABASE:
            assert self.catalog is not None
            self.catalog.create_namespace(self._db(ddl.schema_name))

    def _target(self, table_id: int, schema: str, table: str) -> T.TableState | None:
        st = self._states.get(table_id) if table_id else None
        if st is not None:
            return st
        named = [s for s in self._states.values() if (s.schema, s.table) == (schema, table)]
        return min(named, key=lambda s: s.dropped, default=None)

    def _save_state(self, st: T.TableState) -> None:
        """The state as a property of its changelog, and the table list of the marker table."""
        assert self.catalog is not None
        cat = self.catalog
        old = self._states.get(st.table_id)
        self._states[st.table_id] = st
        self._readers = {k: v for k, v in self._readers.items() if k[0] != st.table_id}
        cat.set_properties(st.db, st.changelog, {STATE_PROPERTY: st.to_json()})
        listed = sorted({(s.db, s.changelog) for s in self._states.values()})
        if old is None or (old.db, old.changelog) != (st.db, st.changelog):
            cat.set_properties(self.meta_db, COMMITS, {TABLES_PROPERTY: json.dumps(listed)})

    def _shape(self, info: pb.TableInfo, ddl: str, commit_ts: int, new_incarnation: bool) -> None:
        assert self.catalog is not None and self.publisher is not None
        old = self._states.get(info.table_id)
        policy = self._policy(info.schema_name, info.table_name)
        try:
            st, ops = T.plan(old, info, self._db(info.schema_name), ddl, new_incarnation, policy)
        except T.UnmappableChange as e:
            if policy != "skip-table":
                raise T.UnmappableChange(f"{e}; runbook: docs/operations.md \"A schema change the "
                                         "Spark tables cannot follow\"") from None
            self._skip_table(old, info, str(e))
            return
        props = {"sluice.owner": self._owner, "sluice.table-id": str(info.table_id),
                 **{f"write.{op}.mode": self.cfg.write_mode for op in ("merge", "update", "delete")}}
        if old is not None and (old.db, old.name) != (st.db, st.name):
            # The same table id under other names (its rename reached the sink as a new shape):
            # the tables follow the names.
            for a, b in ((old.changelog, st.changelog), (old.name, st.name)):
                self.catalog.rename_table(old.db, a, st.db, b)
                self.publisher.rename(old.db, a, st.db, b)
        try:
            self._precheck(old, ops)
            self.catalog.apply_ops(st, ops, props, recast=lambda s, op: self._recast(s, op, commit_ts))
        except T.UnmappableChange as e:
            if policy != "skip-table":
                raise
            self._skip_table(old, info, str(e))
            return
        for op in ops:
            if op.kind == "create":
                self.publisher.open_table(st.db, st.changelog if op.table == "changelog" else st.name)
            elif op.kind == "drop_table":
                self.publisher.forget(st.db, st.name)
        self._save_state(st)
        log.info("spark table shape", extra=kv(table=f"{st.db}.{st.name}", version=st.version, incarnation=st.incarnation, ops=len(ops), ddl=ddl[:200]))

    def _precheck(self, old: T.TableState | None, ops: list[T.Op]) -> None:
        """Before any table changes: a cast of the current table that would lose a value."""
        assert self.catalog is not None
        for op in ops:
            if op.kind != "recast" or old is None or not self.catalog.exists(old.db, old.name):
                continue
            live = self.catalog.columns(old.db, old.name).get(op.column.lower())
            if live is None or live[1] == op.to:
                continue
            lost = W.lossy_cast_count(self._spark, self.catalog.ident(old.db, old.name),
                                      op.column, op.to)
            if lost:
                raise T.UnmappableChange(
                    f"spark sink: table {old.schema}.{old.table} column {op.column}: "
                    f"{op.old_type} -> {op.to} would lose {lost} value(s) of the current table; "
                    "set on-unmappable = \"as-string\" (or \"skip-table\") for it and restart")

    def _skip_table(self, old: T.TableState | None, info: pb.TableInfo, why: str) -> None:
        log.error("spark sink: skipping table after an unmappable change (on-unmappable = "
                  "skip-table)", extra=kv(table=f"{info.schema_name}.{info.table_name}", reason=why))
        if old is not None:
            self._save_state(dataclasses.replace(old, skipped=True, version=info.version))

    def _recast(self, st: T.TableState, op: T.Op, commit_ts: int) -> None:
        """Change a current-table column to a type Iceberg cannot promote to, keeping values:
        a new column filled with the cast, the old one dropped, the new one renamed."""
        assert self.catalog is not None and self.publisher is not None
        cat, spark = self.catalog, self._spark
        live = cat.columns(st.db, st.name)
        tmp = f"{op.column}__sluice_new"
        have, staged = live.get(op.column.lower()), live.get(tmp.lower())
        target = cat.ident(st.db, st.name)
        if have is not None and have[1] == op.to and staged is None:
            return   # done before a crash
        if have is not None and staged is None:
            cat.sql(f"ALTER TABLE {target} ADD COLUMN {T.q(tmp)} {op.to}")
        if have is not None:
            th = self.publisher.heads[(st.db, st.name)]
            summary = Summary(self._owner, self._epoch, th.batch, th.commit_ts)
            self.publisher.publish(st.db, st.name, summary, lambda b: spark.sql(
                f"UPDATE {b} SET {T.q(tmp)} = try_cast({T.q(op.column)} AS {op.to})"))
            cat.sql(f"ALTER TABLE {target} DROP COLUMN {T.q(op.column)}")
        cat.sql(f"ALTER TABLE {target} RENAME COLUMN {T.q(tmp)} TO {T.q(op.column)}")

    def _truncate(self, st: T.TableState, txn: Txn) -> None:
        """TRUNCATE: a `t` row in the changelog, the current table emptied, each committed with
        the truncate's commit_ts (so a replay skips it)."""
        assert self.publisher is not None and self.catalog is not None
        pub = self.publisher
        batch = self._last.batch if self._last else 0
        summary = Summary(self._owner, self._epoch, batch, txn.commit_ts)
        pos = format_position(txn.position) if txn.position is not None else None
        row = (T.TRUNCATED, txn.commit_ts, 0, st.version, txn.producer_id or None, pos, None, None,
               *([None] * len(st.columns)))
        if pub.heads[(st.db, st.changelog)].commit_ts < txn.commit_ts:
            self._with_retry(lambda: pub.publish(st.db, st.changelog, summary, lambda b: W.write_changelog(
                self._spark, st, [row], b)))
        if (st.db, st.name) in pub.heads and pub.heads[(st.db, st.name)].commit_ts < txn.commit_ts:
            self._with_retry(lambda: pub.publish(st.db, st.name, summary,
                                                 lambda b: W.truncate(self._spark, b)))

    def _rename(self, ddl: pb.DDL, txn: Txn) -> None:
        assert self.catalog is not None and self.publisher is not None
        st = self._target(0, ddl.old_schema_name, ddl.old_table_name)
        info = ddl.table_info if ddl.HasField("table_info") else None
        if st is None:
            if info is not None:   # a table first seen at its rename: a new table
                self._shape(info, ddl.query, txn.commit_ts, new_incarnation=False)
            return
        new_db = self._db(ddl.schema_name)
        new_name = T.ident(ddl.table_name)
        cat, pub = self.catalog, self.publisher
        if info is None:
            info = pb.TableInfo(table_id=ddl.table_id, schema_name=ddl.schema_name,
                                table_name=ddl.table_name, version=st.version)
        moved = T.renamed(st, info, new_db)
        # A dropped table's changelog still under the target name moves aside first.
        taken = self._target(0, ddl.schema_name, ddl.table_name)
        if taken is not None and taken.table_id != st.table_id and taken.dropped:
            aside = f"{taken.name}__dropped_{taken.table_id & 0xffffff:x}_{taken.incarnation}"
            cat.rename_table(taken.db, taken.changelog, taken.db, aside + T.CHANGELOG_SUFFIX)
            pub.rename(taken.db, taken.changelog, taken.db, aside + T.CHANGELOG_SUFFIX)
            self._states.pop(taken.table_id, None)
            self._save_state(dataclasses.replace(taken, name=aside, table_id=-abs(taken.table_id)))
        for old_t, new_t in ((st.changelog, moved.changelog), (st.name, moved.name)):
            cat.rename_table(st.db, old_t, new_db, new_t)
            pub.rename(st.db, old_t, new_db, new_t)
        if st.table_id != moved.table_id:
            self._states.pop(st.table_id, None)
        self._save_state(moved)
        if info.version > st.version and len(info.columns):
            self._shape(info, ddl.query, txn.commit_ts, new_incarnation=False)
        log.info("spark table renamed", extra=kv(old=f"{st.db}.{st.name}", new=f"{new_db}.{new_name}"))

    def _drop(self, st: T.TableState) -> None:
        """DROP TABLE: the current table goes; the changelog (the table's history) stays."""
        assert self.catalog is not None and self.publisher is not None
        self.catalog.drop_table(st.db, st.name)
        self.publisher.forget(st.db, st.name)
        self._save_state(dataclasses.replace(st, dropped=True))

    # -- buffering ------------------------------------------------------------------------------

    def _reader(self, st: T.TableState, info: pb.TableInfo) -> tuple[RowReader, list[int] | None]:
        key = (info.table_id, info.version)
        r = self._readers.get(key)
        if r is None:
            r = self._readers[key] = (row_reader(info), T.row_index(st, info))
        return r

    def _buffer_txn(self, txn: Txn) -> None:
        events = txn.rows(self._schema)
        if not events:
            return
        buf = self._buf
        pos = format_position(txn.position) if txn.position is not None else None
        src = txn.source
        ts_ms = (src.ts_ms if src is not None and src.ts_ms else
                 txn.position.ts_ms if txn.position is not None and txn.position.ts_ms else None)
        cts, producer = txn.commit_ts, txn.producer_id or None
        states, brows = self._states, buf.rows
        n = 0
        for ev in events:
            info = ev.table_info
            tid = ev.table_id
            st = states.get(tid)
            if st is not None and st.skipped:
                continue   # on-unmappable = skip-table
            if st is None or st.dropped:
                raise SluiceError(f"spark sink: rows for table {ev.schema}.{ev.table} (id {tid}) "
                                  "that has no Iceberg tables (no shape reached the sink)")
            read, index = self._reader(st, info)
            rows = brows.get(tid)
            if rows is None:
                rows = brows[tid] = []
            seq = ev.seq * 2
            op = ev.op
            if op == "d":
                rows.append(self._row(read, index, st, ev.before, ("d", cts, seq, info.version, producer, pos, ts_ms)))
            elif op == "u" and self._key_changed(st, info, ev.before, ev.after):  # type: ignore[arg-type]
                rows.append(self._row(read, index, st, ev.before, ("d", cts, seq, info.version, producer, pos, ts_ms)))
                rows.append(self._row(read, index, st, ev.after, ("c", cts, seq + 1, info.version, producer, pos, ts_ms)))
                n += 1
            else:
                rows.append(self._row(read, index, st, ev.after, (op, cts, seq, info.version, producer, pos, ts_ms)))
            n += 1
        buf.count += n
        buf.last_ts = cts
        if not buf.first_mono:
            buf.first_mono = time.monotonic()

    @staticmethod
    def _row(read: RowReader, index: list[int] | None, st: T.TableState, image: Any,
             meta: tuple[Any, ...]) -> tuple[Any, ...]:
        row = read(image, meta)
        if index is None:
            return row
        head = len(meta) + 1
        return (*row[:head], *T.reorder(row[head:], index, len(st.columns)))

    def _key_changed(self, st: T.TableState, info: pb.TableInfo, before: pb.Row, after: pb.Row) -> bool:
        """Whether an update moves its row to another identity (a keyless table's every update
        does), compared on the Datums."""
        if not st.key:
            return before != after
        b, a = before.columns, after.columns
        where = (info.table_id, info.version, len(b))
        idx = self._key_index.get(where)
        if idx is None:
            cols = [c for c in info.columns if len(b) == len(info.columns) or not c.hidden]
            names = [c.name.lower() for c in cols]
            keys = [k.lower() for k in st.key]
            idx = self._key_index[where] = ([names.index(k) for k in keys]
                                            if all(k in names for k in keys) else [])
        if not idx:
            return before != after
        return any(b[i] != a[i] for i in idx)

    # -- committing (commit thread) -------------------------------------------------------------

    def _with_retry(self, fn: Callable[[], None]) -> None:
        for attempt in range(1, _RACE_ATTEMPTS + 1):
            try:
                fn()
                return
            except LostRace:
                if attempt == _RACE_ATTEMPTS:
                    raise

    def _commit_sync(self, buf: _Buffer, states: dict[int, T.TableState]) -> None:
        assert self.publisher is not None and self.catalog is not None
        failpoint.inject("spark-before-commit")
        pub, spark = self.publisher, self._spark
        batch = (self._last.batch if self._last is not None else 0) + 1
        summary = Summary(self._owner, self._epoch, batch, buf.last_ts)
        order = sorted(buf.rows, key=lambda tid: (states[tid].db, states[tid].name))
        t0 = time.monotonic()
        timing = {"changelog_s": 0.0, "current_s": 0.0}
        for i, tid in enumerate(order):
            st, rows = states[tid], buf.rows[tid]
            # One DataFrame for both of the table's writes (rebuilt only if a lost race moved a
            # skip point below the rows it holds).
            frame: list[W.BatchFrame | None] = [None]

            def frame_for(skip: int, st: T.TableState = st, rows: list[Any] = rows) -> W.BatchFrame | None:
                f = frame[0]
                if f is not None and skip >= f.since:
                    return f
                low = min([skip] + [pub.heads[(st.db, t)].commit_ts for t in (st.changelog, st.name)
                                    if (st.db, t) in pub.heads])
                todo = [r for r in rows if r[1] > low]
                if not todo:
                    return None
                t = time.monotonic()
                f = frame[0] = W.BatchFrame(spark, st, todo, low)
                timing["convert_s"] = timing.get("convert_s", 0.0) + time.monotonic() - t
                return f

            for which, table in (("changelog", st.changelog), ("current", st.name)):
                t = time.monotonic()

                def one(which: str = which, table: str = table) -> None:
                    skip = pub.heads[(st.db, table)].commit_ts
                    if not any(r[1] > skip for r in reversed(rows)):
                        return
                    f = frame_for(skip)
                    assert f is not None
                    write = f.write_changelog if which == "changelog" else f.write_current
                    pub.publish(st.db, table, summary, lambda b: write(b, skip))
                self._with_retry(one)
                timing[f"{which}_s"] += time.monotonic() - t
                if i == 0 and which == "changelog":
                    failpoint.inject("spark-between-tables")
            if i == 0:
                failpoint.inject("spark-after-first-table")
        failpoint.inject("spark-before-marker")
        t1 = time.monotonic()
        heads = {f"{db}.{t}": th.snapshot for (db, t), th in pub.heads.items()}
        nrows = sum(len(buf.rows[t]) for t in order)

        def marker() -> None:
            # One row as SQL literals: a local relation planned in the JVM, instead of a Python
            # row pickled through createDataFrame with a schema string to parse.
            import datetime as _dt
            now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
            tables = ", ".join(f"{T.sql_str(k)}, CAST({v} AS BIGINT)" for k, v in sorted(heads.items()))
            values = (f"CAST({batch} AS BIGINT), CAST({self._epoch} AS BIGINT), "
                      f"{T.sql_str(self._owner)}, CAST({buf.last_ts} AS BIGINT), "
                      f"CAST({nrows} AS BIGINT), "
                      f"CAST(map({tables}) AS MAP<STRING, BIGINT>), TIMESTAMP '{now}+00:00'")
            pub.publish(self.meta_db, COMMITS, summary,
                        lambda b: spark.sql(f"INSERT INTO {b} VALUES ({values})"))
        self._with_retry(marker)
        failpoint.inject("spark-after-marker")
        self._last = Committed(batch, self._epoch, buf.last_ts)
        t2 = time.monotonic()
        for k, v in (*timing.items(), ("marker_s", t2 - t1), ("batch_s", t2 - t0)):
            self.timings[k] = self.timings.get(k, 0.0) + v
        self.timings["batches"] = self.timings.get("batches", 0) + 1
        log.info("spark batch committed", extra=kv(batch=batch, epoch=self._epoch, commit_ts=buf.last_ts, rows=nrows, tables=len(order), changelog_s=round(timing["changelog_s"], 2), current_s=round(timing["current_s"], 2), marker_s=round(t2 - t1, 2)))
        self._since_maintenance += 1
        if self.cfg.maintenance_every and self._since_maintenance >= self.cfg.maintenance_every:
            self._since_maintenance = 0
            self.maintain()

    def maintain(self) -> None:
        """Iceberg's maintenance procedures on every table, between commits (commit thread)."""
        from sluice.spark_sink.maintenance import maintain
        assert self.publisher is not None
        maintain(self, self.publisher)


__all__ = ["SparkSink", "Fenced", "OwnedByAnother"]
