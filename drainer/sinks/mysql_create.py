"""create-tables: creating missing downstream databases and tables before their first row or
DDL (CREATE ... IF NOT EXISTS, shape from the schema history); never alters an existing table."""
from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from sluice.core.log import kv
from sluice.core.marks import APPLY_MARK
from sluice.drainer.sinks.mysql_checkpoint import _CheckpointTable, _q
from sluice.drainer.sinks.mysql_errors import CreateTableError, RetriesExhausted, SinkFenced, _is_mysql_error
from sluice.drainer.sinks.mysql_work import _CreateWork, _DDLWork
from sluice.drainer.sql import create_database_sql, create_table_sql, quote_id
from sluice.drainer.translator import RowChange
from sluice.drainer.txn import Txn
from sluice.proto import sluice_pb2 as pb

# One logger name for the whole sink, whichever part logs.
log = logging.getLogger("sluice.drainer.sinks.mysql")

_IF_NOT_EXISTS = re.compile(r"\bIF\s+NOT\s+EXISTS\b", re.IGNORECASE)
# System schemas are never created nor listed as known.
_SYSTEM_SCHEMAS = ("mysql", "information_schema", "performance_schema", "sys")


class _CreateTables(_CheckpointTable):
    """What exists downstream, and creating what is missing (a part of MySQLSink)."""

    def _load_known(self) -> None:
        """The downstream's databases and tables: only the missing ones cost a CREATE later."""
        assert self._control is not None
        skip = ",".join(_q(s) for s in _SYSTEM_SCHEMAS)
        with self._control.cursor() as cur:
            cur.execute(f"SELECT SCHEMA_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME NOT IN ({skip})")
            self._known_dbs = {r[0] for r in cur.fetchall()}
            cur.execute(f"SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES "
                        f"WHERE TABLE_SCHEMA NOT IN ({skip})")
            self._known_tables = {(r[0], r[1]) for r in cur.fetchall()}

    def _missing(self, commit_ts: int, infos: Sequence[pb.TableInfo], recheck: bool) -> _CreateWork | None:
        """The tables of infos not known to exist downstream (all of them with recheck)."""
        known = self._known_tables
        todo = tuple(i for i in infos if recheck or (i.schema_name, i.table_name) not in known)
        return _CreateWork(commit_ts, (), todo, declared=True) if todo else None

    def _row_tables(self, commit_ts: int, changes: list[RowChange], recheck: bool) -> _CreateWork | None:
        """Tables the rows go to that are not known to exist downstream, with their shape at
        commit_ts (the one the rows were decoded with)."""
        known = self._known_tables
        last = None
        todo: dict[tuple[str, str], pb.TableInfo] = {}
        for ch in changes:
            shape = ch.shape
            if shape is last:
                continue
            last = shape
            key = (shape.schema, shape.table)
            if (not recheck and key in known) or key in todo:
                continue
            info = self._schema.table_at(shape.table_id, commit_ts)
            if info is None:
                continue  # cannot happen: the rows were just decoded with it
            if (info.schema_name, info.table_name) != key:
                named = pb.TableInfo()
                named.CopyFrom(info)
                named.schema_name, named.table_name = key
                info = named
            todo[key] = info
        return _CreateWork(commit_ts, (), tuple(todo.values())) if todo else None

    def _ddl_target_work(self, txn: Txn, ddl: pb.DDL) -> _CreateWork | None:
        """What a DDL needs downstream before it runs: its database (`USE db`, CREATE TABLE in a
        database that existed before the capture started), and — outside safe mode — the table
        it alters, truncates, renames or drops, if that table predates the capture and was never
        created downstream. In safe mode (a replay) the table may be missing because a later DDL
        renamed or dropped it: creating it there would leave a stray table; the DDL's "does not
        exist" error is ignored instead."""
        if ddl.tp in (pb.CREATE_DATABASE, pb.DROP_DATABASE):
            return None
        dbs = {d for d in (ddl.schema_name, ddl.old_schema_name) if d}
        tables: list[pb.TableInfo] = []
        if ddl.tp in (pb.ALTER_TABLE, pb.TRUNCATE_TABLE, pb.RENAME_TABLE, pb.DROP_TABLE) \
                and not self._is_safe(txn.commit_ts):
            before = txn.commit_ts - 1
            info = self._schema.table_at(ddl.table_id, before) if ddl.table_id else None
            if info is None and ddl.tp == pb.RENAME_TABLE:
                info = self._schema.find(ddl.old_schema_name or ddl.schema_name, ddl.old_table_name, before)
            elif info is None and ddl.table_name:
                info = self._schema.find(ddl.schema_name, ddl.table_name, before)
            if info is not None:
                tables.append(info)
        todo_dbs = tuple(sorted(d for d in dbs if d not in self._known_dbs))
        todo = tuple(i for i in tables if (i.schema_name, i.table_name) not in self._known_tables)
        return _CreateWork(txn.commit_ts, todo_dbs, todo) if todo_dbs or todo else None

    def _forget(self, ddl: pb.DDL) -> None:
        """After a DDL: what it touched is checked again at next use."""
        if ddl.tp == pb.OTHER:
            self._known_tables.clear()    # could be anything (DROP VIEW, an unparsed statement)
            self._known_dbs.clear()
        elif ddl.tp == pb.DROP_DATABASE:
            self._known_dbs.discard(ddl.schema_name)
            self._known_tables = {k for k in self._known_tables if k[0] != ddl.schema_name}
        elif ddl.tp != pb.CREATE_DATABASE:
            self._known_tables.discard((ddl.schema_name, ddl.table_name))
            self._known_tables.discard((ddl.old_schema_name or ddl.schema_name, ddl.old_table_name))

    def _run_create(self, item: _CreateWork) -> None:
        """CREATE DATABASE / TABLE IF NOT EXISTS for what is still not known to exist; never
        alters a table that exists (whatever its shape)."""
        dbs = [d for d in item.databases if d not in self._known_dbs]
        tables = [i for i in item.tables if (i.schema_name, i.table_name) not in self._known_tables]
        for info in tables:
            if info.schema_name not in self._known_dbs and info.schema_name not in dbs:
                dbs.append(info.schema_name)
        if not dbs and not tables:
            return
        for d in dbs:
            self._create_one(item.commit_ts, "database", d, create_database_sql(d))
            self._known_dbs.add(d)
        for info in tables:
            key = (info.schema_name, info.table_name)
            created = self._create_one(item.commit_ts, "table", f"{info.schema_name}.{info.table_name}",
                                       create_table_sql(info))
            self._known_tables.add(key)
            if created and item.declared:
                self._declared_only.add(key)

    def _rows_written(self, changes: tuple[RowChange, ...]) -> None:
        last = None
        for ch in changes:
            if ch.shape is not last:
                last = ch.shape
                self._declared_only.discard((last.schema, last.table))

    def _yield_declared(self, item: _DDLWork) -> None:
        """Before a CREATE TABLE or RENAME (outside safe mode) whose new name is a table this
        sink created from a schema snapshot and never wrote to: drop that table, so the DDL
        creates it as the source did (a capture started from an old position declares current
        shapes before the binlog's own CREATE TABLE)."""
        ddl = item.ddl
        if ddl.tp not in (pb.CREATE_TABLE, pb.RENAME_TABLE) or self._is_safe(item.commit_ts):
            return
        if ddl.tp == pb.CREATE_TABLE and _IF_NOT_EXISTS.search(ddl.query):
            return   # the source kept its existing table too
        key = (ddl.schema_name, ddl.table_name)
        if key not in self._declared_only:
            return
        self._declared_only.discard(key)
        target = f"{key[0]}.{key[1]}"
        self._create_one(item.commit_ts, "replaced table", target,
                         f"DROP TABLE IF EXISTS {quote_id(key[0])}.{quote_id(key[1])}")
        self._known_tables.discard(key)

    def _create_one(self, commit_ts: int, kind: str, target: str, sql: str) -> bool:
        """Run one create-tables statement; whether it did something (not "already exists")."""
        done = [False]

        def attempt(_: int) -> None:
            if self._control is None:
                self._control = self._connect()
            with self._control.cursor() as cur:
                self._begin_fenced(cur)
                cur.execute("COMMIT")
                cur.execute(f"{APPLY_MARK} {sql}")
                # IF NOT EXISTS on something that exists is a note (1007 / 1050), not an error.
                cur.execute("SHOW WARNINGS")
                existed = any(int(w[1]) in (1007, 1050) for w in cur.fetchall())
            if not existed:
                log.info("mysql sink created a missing %s" if kind != "replaced table" else
                         "mysql sink dropped a table it created from a schema snapshot: a DDL creates it",
                         kind, extra=kv(target=target, commit_ts=commit_ts, sql=sql[:500]))
                if kind != "replaced table":
                    self._m.created.labels(kind).inc()
            done[0] = not existed

        try:
            self._retry(f"create-tables on {target} (commit_ts {commit_ts})", attempt, self._control_failed)
        except (SinkFenced, RetriesExhausted):
            raise
        except BaseException as e:
            if _is_mysql_error(e):
                raise CreateTableError(kind, target, commit_ts, sql, e) from e
            raise
        return done[0]
