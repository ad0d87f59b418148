"""Schema changes and batch assembly for SparkSink: DDL effects, table shaping, buffering rows."""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import time

from sluice_native import ColumnCountError, DecodeError, SparkRows, position_text
from collections.abc import Callable
from typing import Any

from sluice.core import failpoint
from sluice.core.errors import InvalidArgument, SluiceError
from sluice.core.position import format_position
from sluice.drainer.sink import (BackgroundSink, Capabilities, Checkpoint, SinkCheckpoint,
                                 options_to_config)
from sluice.drainer.txn import CorruptTxn, SchemaLookup, Txn
from sluice.proto import sluice_pb2 as pb
from sluice.spark_sink import tables as T
from sluice.spark_sink import writer as W
from sluice.spark_sink.catalog import Catalog, Summary
from sluice.spark_sink.commit import Fenced, LostRace, OwnedByAnother, Publisher
from sluice.spark_sink.config import SparkSinkConfig
from sluice.spark_sink.types import _ZERO, converter, plan_columns
from sluice.core.log import kv

log = logging.getLogger(__name__)
log = logging.getLogger("sluice.spark_sink.sink")

COMMITS = "_sluice_commits"
COMMITS_COLUMNS = [("batch", "BIGINT"), ("epoch", "BIGINT"), ("drainer", "STRING"),
                   ("commit_ts", "BIGINT"), ("rows", "BIGINT"),
                   ("tables", "MAP<STRING, BIGINT>"), ("committed_at", "TIMESTAMP")]
STATE_PROPERTY = "sluice.state"
TABLES_PROPERTY = "sluice.tables"


_DATUM_FIELDS = {f.name: f.number for f in pb.Datum.DESCRIPTOR.fields}
# Converters (spark_sink/types.py) whose main kind the native decoder reads the same way.
_MODES = {converter("TIMESTAMP"): 1, converter("DATE"): 2, converter("DECIMAL(10,0)"): 3,
          converter("BINARY"): 4, converter("STRING"): 5}


def spark_rows(st: T.TableState, info: pb.TableInfo) -> SparkRows:
    """The native decoder (native/src/sparkrows.rs) of rows of shape `info` into the tuples the
    sink buffers for state `st`: types.py's column plans, the column order of the sink's tables
    (tables.row_index) and the identity columns `_key_changed` compared."""
    plans = plan_columns(info, {c.name.lower(): c.stype for c in st.columns})
    cols = list(info.columns)
    visible = [j for j, c in enumerate(cols) if not c.hidden]
    index = T.row_index(st, info)

    def key_pos(names: list[str]) -> list[int] | None:
        keys = [k.lower() for k in st.key]
        if not keys or not all(k in names for k in keys):
            return None     # a keyless table, or a key this shape lacks: whole rows compare
        return [names.index(k) for k in keys]

    return SparkRows(
        len(cols), visible,
        [sum(1 << _DATUM_FIELDS[k] for k in p.native) for p in plans],
        [_MODES.get(p.convert, 0) for p in plans], [p.convert for p in plans],
        [p.name for p in plans], index, len(st.columns),
        key_pos([c.name.lower() for c in cols]),
        key_pos([cols[j].name.lower() for j in visible]),
        pb.Datum.FromString, pb.Row.FromString, _ZERO)


class SchemaChanges:
    """Per-table DDL/schema handling and row buffering; mixed into SparkSink (moved verbatim)."""

    def _changes_schema(self, txn: Txn) -> bool:
        # The facts the join read (Txn.is_ddl, has_schema_snapshots, mutation_versions): the
        # PrewriteValue is parsed only for a transaction that does change a schema.
        if txn.is_ddl:
            return True
        if txn.has_schema_snapshots:
            for info in txn.prewrite.schema_snapshots:
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
        states = self._states
        for table_id, version in txn.mutation_versions():
            st = states.get(table_id)
            if st is not None and not st.dropped and (not version or version <= st.version):
                continue
            info = self._schema.table_at(table_id, txn.commit_ts)
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

    def _reader(self, st: T.TableState, info: pb.TableInfo) -> SparkRows:
        """The native decoder of rows of shape `info` into the sink's tuples for state `st`."""
        key = (info.table_id, info.version)
        r = self._readers.get(key)
        if r is None:
            r = self._readers[key] = spark_rows(st, info)
        return r

    def _buffer_txn(self, txn: Txn) -> None:
        """The transaction's rows as the sink's tuples, `(_op, _commit_ts, _seq, _schema_ver,
        _producer, _pos, _ts_ms, _zero_dates, *values)`, decoded natively from the Prewrite
        bytes (native/src/sparkrows.rs); Txn.mutations checks the transaction first (MissingSchema,
        CorruptTxn), in the order Txn.rows would."""
        snapshot_chunk, spans = txn.mutations(self._schema)
        if not spans:
            return
        buf = self._buf
        states, brows = self._states, buf.rows
        meta: tuple[Any, ...] | None = None
        seq = n = 0
        touched: list[tuple[int, int]] = []   # (table id, rows buffered before this transaction)
        try:
            for i, m in enumerate(spans):
                info = m.info
                tid = info.table_id
                st = states.get(tid)
                if st is None or st.dropped or st.skipped:
                    changes = m.count
                    if st is not None and st.skipped or not changes:
                        # on-unmappable = skip-table: its changes still count in the rows' _seq
                        seq += changes
                        continue
                    raise SluiceError(f"spark sink: rows for table {m.schema}.{m.table} (id {tid}) "
                                      "that has no Iceberg tables (no shape reached the sink)")
                if meta is None:
                    meta = self._meta(txn)
                rows = brows.get(tid)
                if rows is None:
                    rows = brows[tid] = []
                touched.append((tid, len(rows)))
                try:
                    added, changes = self._reader(st, info).decode(
                        m.payload, m.start, m.end, seq, snapshot_chunk,
                        (meta[0], info.version, *meta[1:]), rows)
                except ColumnCountError as e:
                    raise InvalidArgument(
                        f"row of {info.schema_name}.{info.table_name} (version {info.version}) has "
                        f"{e.args[0]} values for {len(info.columns)} columns "
                        f"({sum(not c.hidden for c in info.columns)} visible)") from None
                except DecodeError as e:
                    raise CorruptTxn(txn.pump_id, txn.start_ts, txn.commit_ts,
                                     f"{m.schema}.{m.table} (table id {tid}): {e}") from None
                seq += changes
                n += added
        except BaseException:
            # A transaction is buffered whole or not at all: what it added before the error goes.
            for tid, before in reversed(touched):
                rows = brows.get(tid)
                if rows is not None:
                    del rows[before:]
                    if not rows:
                        del brows[tid]
            raise
        if not seq:
            return
        buf.count += n
        buf.last_ts = txn.commit_ts
        if not buf.first_mono:
            buf.first_mono = time.monotonic()

    @staticmethod
    def _meta(txn: Txn) -> tuple[Any, ...]:
        """(_commit_ts, _producer, _pos, _ts_ms) of a transaction's rows."""
        pos = txn.position
        src = txn.source
        ts_ms = (src.ts_ms if src is not None and src.ts_ms else
                 pos.ts_ms if pos is not None and pos.ts_ms else None)
        text = None
        if pos is not None:
            # natively from the wire form; format_position where only Python can (MySQL GTID
            # sets, non-ASCII file names)
            text = position_text(pos.SerializeToString()) or format_position(pos)
        return (txn.commit_ts, txn.producer_id or None, text, ts_ms)

    # -- committing (commit thread) -------------------------------------------------------------
