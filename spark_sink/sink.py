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
from sluice.drainer.sink import (BackgroundSink, Capabilities, Checkpoint, SinkCheckpoint,
                                 options_to_config)
from sluice.drainer.txn import SchemaLookup, Txn
from sluice.spark_sink import tables as T
from sluice.spark_sink import datafiles as D
from sluice.spark_sink import positions as P
from sluice.spark_sink import writer as W
from sluice.spark_sink.catalog import Catalog, Summary
from sluice.spark_sink.commit import Fenced, LostRace, OwnedByAnother, Publisher
from sluice.spark_sink.config import SparkSinkConfig
from sluice.spark_sink.schema_changes import (COMMITS, COMMITS_COLUMNS, STATE_PROPERTY,
                                              TABLES_PROPERTY, SchemaChanges)
from sluice.spark_sink.types import RowReader
from sluice.core.log import kv

log = logging.getLogger(__name__)

_RACE_ATTEMPTS = 5
_WRITERS = 3     # branch writes of one batch running at once


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


class SparkSink(SchemaChanges, BackgroundSink):
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
        self._commit_wanted = False   # commit_soon came while a commit was in flight
        self._settling = 0            # coroutines awaiting the commit in flight
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._wpool: concurrent.futures.ThreadPoolExecutor | None = None
        self._successes: asyncio.Queue[SinkCheckpoint] = asyncio.Queue()
        self._since_maintenance = 0
        self.skipped = 0
        # How keyed current tables take a batch (`current-state`: writer.DELETE_KEYS or
        # writer.EQUALITY_DELETES; writer.MERGE and writer.DELETE_ALL only for
        # bench/spark_sink.py's same-table comparison).
        self.current_by = options.current_state
        # Seconds per step since open (decode_s in apply(); convert/changelog/current/marker per
        # batch): what bench/spark_sink.py reports.
        self.timings: dict[str, float] = {}
        # How each table's last write went ("direct": files through the Iceberg API, "spark"):
        # what the tests read.
        self.paths: dict[tuple[str, str], str] = {}
        # False: every write through Spark, as before datafiles.py (the path partitioned tables
        # still take); for the tests' differential comparison only, not a config key.
        self.direct_writes = True
        # The key columns of the current tables' data files (immutable: read once), for the
        # position deletes of current-state = "delete" (positions.py).
        self.key_cache = P.KeyCache()

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

    def _writers(self) -> concurrent.futures.ThreadPoolExecutor:
        """Threads for a batch's branch writes, which go to different tables at once (each
        thread sets its own commit properties; publishing stays on the commit thread)."""
        if self._wpool is None:
            self._wpool = concurrent.futures.ThreadPoolExecutor(
                _WRITERS, thread_name_prefix="spark-write")
        return self._wpool

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
            if self._wpool is not None:
                self._wpool.shutdown(wait=False)
                self._wpool = None

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
                await self._next_commit()

    async def flush(self) -> None:
        await self._settle()
        self._check_usable()
        await self._commit_all()

    async def commit_soon(self) -> None:
        """Start committing what is buffered; never waits for a commit in flight: then the
        next one starts when it ends (a finished one is settled first: its error is raised
        here)."""
        if self._pending is not None:
            if not self._pending.done():
                # Why not wait for the next call: under load a commit outlasts the checkpoint
                # interval, and rows buffered meanwhile would wait up to another interval.
                self._commit_wanted = True
                return
            await self._settle()
        self._check_usable()
        self._start_commit()

    @property
    def idle(self) -> bool:
        """Nothing applied is uncommitted: no buffered rows, no commit in flight or unsettled
        but failed."""
        fut = self._pending
        return not self._buf.count and (fut is None or fut.done() and not fut.cancelled()
                                        and fut.exception() is None)

    def successes(self) -> asyncio.Queue[SinkCheckpoint]:
        """What is durable each time a background commit ends (success or failure)."""
        return self._successes

    async def _commit_all(self) -> None:
        await self._next_commit()
        await self._settle()

    async def _next_commit(self) -> None:
        """Start a commit of what is buffered once none is in flight (the one a finished
        commit started by itself, for commit_soon, is waited for too)."""
        while self._pending is not None:
            await self._settle()
        self._check_usable()
        self._start_commit()

    def _start_commit(self) -> None:
        assert self._pending is None
        self._commit_wanted = False
        buf, self._buf = self._buf, _Buffer()
        if not buf.count:
            return
        states = dict(self._states)
        fut = self._pending = self._thread().submit(self._commit_sync, buf, states)
        loop, put = asyncio.get_running_loop(), self._successes.put_nowait

        def ended() -> None:
            put(self.checkpoint())
            # commit_soon came while this commit ran: start the next one now, unless someone
            # else already settles this one (apply, flush: they start their own) or it failed
            # (the next apply, flush or commit_soon raises its error).
            if (self._commit_wanted and self._pending is fut and not self._settling
                    and not fut.cancelled() and fut.exception() is None and self._failed is None):
                self._pending = None
                self._start_commit()

        def report(_f: concurrent.futures.Future[None]) -> None:
            try:
                loop.call_soon_threadsafe(ended)
            except RuntimeError:   # the loop that started it is gone: nobody reads the report
                pass
        fut.add_done_callback(report)

    async def _settle(self) -> None:
        fut = self._pending
        if fut is None:
            return
        self._settling += 1
        try:
            await asyncio.wrap_future(fut)
        except BaseException as e:
            if fut.done():   # (not when only our wait was cancelled: close() waits for it)
                if self._pending is fut:
                    self._pending = None
                if not fut.cancelled() and self._failed is None:
                    self._failed = e
            raise
        finally:
            self._settling -= 1
        if self._pending is fut:
            self._pending = None

    # -- schema effects (commit thread) ---------------------------------------------------------

    def _with_retry(self, fn: Callable[[], None]) -> None:
        for attempt in range(1, _RACE_ATTEMPTS + 1):
            try:
                fn()
                return
            except LostRace:
                if attempt == _RACE_ATTEMPTS:
                    raise

    def _publish_written(self, db: str, table: str, summary: Summary,
                         write: Callable[[], bool]) -> None:
        """fast_forward what a writer thread put on our branch of db.table; after a lost race
        (the branch is then back at main's new head) write again here and retry."""
        assert self.publisher is not None
        pub = self.publisher
        try:
            pub.fast_forward(db, table, summary)
            return
        except LostRace:
            pass

        def again() -> None:
            if write():
                pub.fast_forward(db, table, summary)
        self._with_retry(again)

    def _commit_sync(self, buf: _Buffer, states: dict[int, T.TableState]) -> None:
        assert self.publisher is not None and self.catalog is not None
        failpoint.inject("spark-before-commit")
        pub, spark = self.publisher, self._spark
        batch = (self._last.batch if self._last is not None else 0) + 1
        summary = Summary(self._owner, self._epoch, batch, buf.last_ts)
        order = sorted(buf.rows, key=lambda tid: (states[tid].db, states[tid].name))
        t0 = time.monotonic()
        timing = {"changelog_s": 0.0, "current_s": 0.0}
        # Every table's branch writes run at once (on the writer threads), then main moves
        # table by table in the fixed order; a write that lost a race is redone at its turn.
        jobs: list[tuple[int, str, str, Callable[[], bool], concurrent.futures.Future[bool]]] = []
        for tid in order:
            st, rows = states[tid], buf.rows[tid]
            # One Arrow table for both of the table's writes (rebuilt only if a lost race moved a
            # skip point below the rows it holds).
            frame: list[W.BatchFrame | None] = [None]

            def frame_for(skip: int, st: T.TableState = st, rows: list[Any] = rows,
                          frame: list[W.BatchFrame | None] = frame) -> W.BatchFrame | None:
                f = frame[0]
                if f is not None and skip >= f.since:
                    return f
                low = min([skip] + [pub.heads[(st.db, t)].commit_ts for t in (st.changelog, st.name)
                                    if (st.db, t) in pub.heads])
                todo = [r for r in rows if r[1] > low]
                if not todo:
                    return None
                t = time.monotonic()
                f = frame[0] = W.BatchFrame(spark, st, todo, low, self.current_by)
                timing["convert_s"] = timing.get("convert_s", 0.0) + time.monotonic() - t
                return f

            for which, table in (("changelog", st.changelog), ("current", st.name)):
                def write(which: str = which, table: str = table, st: T.TableState = st,
                          rows: list[Any] = rows, frame_for: Any = frame_for) -> bool:
                    """Our branch of the table gets the rows above its skip point; False: none."""
                    skip = pub.heads[(st.db, table)].commit_ts
                    if not any(r[1] > skip for r in reversed(rows)):
                        return False
                    f = frame_for(skip)
                    assert f is not None
                    direct = self._direct(st.db, table, summary)
                    if which == "changelog":
                        pub.write(st.db, table, summary,
                                  lambda b: f.write_changelog(b, skip, direct))
                    else:
                        pub.write(st.db, table, summary,
                                  lambda b: f.write_current(b, skip, direct))
                    self.paths[(st.db, table)] = f.paths.get(which, "")
                    return True
                if (st.db, table) in pub.heads:
                    frame_for(pub.heads[(st.db, table)].commit_ts)
                jobs.append((tid, which, table, write, self._writers().submit(write)))
        try:
            for tid, which, table, write, fut in jobs:
                st = states[tid]
                t = time.monotonic()
                wrote = fut.result()
                if wrote:
                    self._publish_written(st.db, table, summary, write)
                timing[f"{which}_s"] += time.monotonic() - t
                if tid == order[0] and which == "changelog":
                    failpoint.inject("spark-between-tables")
                if tid == order[0] and which == "current":
                    failpoint.inject("spark-after-first-table")
        finally:
            # Nothing of this batch is left writing when the commit ends (or fails).
            concurrent.futures.wait([j[4] for j in jobs])
        failpoint.inject("spark-before-marker")
        t1 = time.monotonic()
        heads = {f"{db}.{t}": th.snapshot for (db, t), th in pub.heads.items()}
        nrows = sum(len(buf.rows[t]) for t in order)

        def marker() -> None:
            # One row, as a file committed through the Iceberg API (no Spark job).
            import datetime as _dt
            import pyarrow as pa
            row = pa.table({
                "batch": pa.array([batch], pa.int64()), "epoch": pa.array([self._epoch], pa.int64()),
                "drainer": pa.array([self._owner], pa.string()),
                "commit_ts": pa.array([buf.last_ts], pa.int64()),
                "rows": pa.array([nrows], pa.int64()),
                "tables": pa.array([sorted(heads.items())], pa.map_(pa.string(), pa.int64())),
                "committed_at": pa.array([_dt.datetime.now(_dt.timezone.utc)],
                                         pa.timestamp("us", tz="UTC"))})

            def write(b: str) -> None:
                t = self._direct(self.meta_db, COMMITS, summary)()
                if t is None:
                    spark.createDataFrame(row).writeTo(b).append()
                else:
                    t.append(row)
            pub.publish(self.meta_db, COMMITS, summary, write)
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

    def _direct(self, db: str, table: str, summary: Summary) -> W.Direct:
        """Where db.table's writes on our branch go as files (datafiles.Target, loaded at write
        time: the schema the table has then), or None: through Spark."""
        assert self.publisher is not None
        pub = self.publisher

        def load() -> D.Target | None:
            if not self.direct_writes:
                return None
            return D.target(pub.catalog, db, table, pub.branch, summary.props(), self.key_cache)
        return load

    def maintain(self) -> None:
        """Iceberg's maintenance procedures on every table, between commits (commit thread)."""
        from sluice.spark_sink.maintenance import maintain
        assert self.publisher is not None
        maintain(self, self.publisher)


__all__ = ["SparkSink", "Fenced", "OwnedByAnother"]
