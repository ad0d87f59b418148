"""The Iceberg catalog as the sink uses it: tables, schema operations, properties, snapshots.

Every schema operation is idempotent against the table as it is (`apply_ops` checks the live
schema before each step), so a DDL replayed after a crash between two steps finishes the
change instead of failing or doing it twice.

Commit properties: Iceberg's Spark writes put `CommitMetadata`'s thread-local properties into the
snapshot summary of every commit the calling thread makes (SQL MERGE and DELETE included), which
is how the sink's checkpoint (drainer, epoch, batch, commit_ts) lands in the same commit as the
data. PySpark pins each Python thread to one JVM thread, so the property set here is the one the
JVM commit reads.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import uuid
from collections.abc import Iterator
from typing import Any

from sluice.core.errors import SluiceError
from sluice.spark_sink.tables import (CHANGELOG_META, CURRENT_META, Op, TableState, UnmappableChange, q,
                                      sql_str)

log = logging.getLogger(__name__)

TABLE_PROPERTIES = {
    "format-version": "2",
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "50",
}


@dataclasses.dataclass(frozen=True)
class Summary:
    """The sink's checkpoint as a snapshot summary carries it."""

    drainer: str
    epoch: int
    batch: int
    commit_ts: int

    def props(self, **extra: str) -> dict[str, str]:
        return {"sluice.drainer": self.drainer, "sluice.epoch": str(self.epoch),
                "sluice.batch": str(self.batch), "sluice.commit-ts": str(self.commit_ts), **extra}

    @classmethod
    def of(cls, summary: dict[str, str] | None) -> Summary | None:
        """The sink's summary in a snapshot's, or None for a snapshot the sink did not make
        (a fence carries only drainer and epoch: see epoch_of)."""
        if not summary or "sluice.commit-ts" not in summary:
            return None
        return cls(summary.get("sluice.drainer", ""), int(summary.get("sluice.epoch", "0")),
                   int(summary.get("sluice.batch", "0")), int(summary["sluice.commit-ts"]))


def epoch_of(summary: dict[str, str] | None) -> tuple[str, int] | None:
    """(drainer, epoch) of any snapshot the sink made, fences included."""
    if not summary or "sluice.epoch" not in summary:
        return None
    return summary.get("sluice.drainer", ""), int(summary["sluice.epoch"])


@dataclasses.dataclass(frozen=True)
class Head:
    """What a table's main branch says about the sink: its head snapshot, the newest data
    summary on its ancestry, and the highest (drainer, epoch) of the snapshots above it."""

    snapshot: int | None
    summary: Summary | None
    top: tuple[str, int] | None


class JavaClasses:
    """The JVM classes the sink calls, each resolved once. Why: py4j resolves `jvm.a.b.C` one
    package segment per round trip, and the JVM answers each segment that is no class with a
    ClassNotFoundException: measured 1.5–1.8 ms of JVM CPU per lookup, against 20–40 us per call
    on a resolved class (a data file's commit made about ten lookups)."""

    def __init__(self, spark: Any) -> None:
        self._spark = spark
        self.gateway = spark.sparkContext._gateway
        c = self.cls
        self.int = self.gateway.jvm.int
        self.Object = c("java.lang.Object")
        self.HashMap = c("java.util.HashMap")
        self.Spark3Util = c("org.apache.iceberg.spark.Spark3Util")
        self.SchemaParser = c("org.apache.iceberg.SchemaParser")
        self.DataFiles = c("org.apache.iceberg.DataFiles")
        self.FileMetadata = c("org.apache.iceberg.FileMetadata")
        self.FileFormat = c("org.apache.iceberg.FileFormat")
        self.MetricsConfig = c("org.apache.iceberg.MetricsConfig")
        self.ParquetUtil = c("org.apache.iceberg.parquet.ParquetUtil")
        self.ParquetFileReader = c("org.apache.iceberg.shaded.org.apache.parquet.hadoop.ParquetFileReader")
        self.Stream = c("java.util.stream.Stream")
        self.HadoopPath = c("org.apache.hadoop.fs.Path")
        self._footer: tuple[Any, Any] | None = None   # (ParquetIO.file, read options)

    def cls(self, fqn: str) -> Any:
        """The class `fqn` to call (static members, constructors): no round trip until used."""
        from py4j.java_gateway import JavaClass
        return JavaClass(fqn, self.gateway._gateway_client)

    def class_object(self, fqn: str) -> Any:
        """The java.lang.Class of `fqn` from the context class loader (the runtime jars'), for
        reflection on members py4j cannot reach (package-private, private static)."""
        loader = self.cls("java.lang.Thread").currentThread().getContextClassLoader()
        return self.cls("java.lang.Class").forName(fqn, True, loader)

    def parquet_metrics(self, input_file: Any, config: Any) -> Any:
        """What `ParquetUtil.fileMetrics(input_file, config)` returns, with read options made
        once. Why: fileMetrics opens the file with default options, which build a new Hadoop
        Configuration, and its first read parses the default XML resources out of the jars:
        about 10 ms of JVM CPU per file, a sixth of the sink's JVM CPU per batch (measured
        with Java Flight Recorder); here the options come from Spark's loaded configuration."""
        if self._footer is None:
            self._footer = self._footer_reading()
        to_parquet, options = self._footer
        args = self.gateway.new_array(self.Object, 1)
        args[0] = input_file
        reader = self.ParquetFileReader.open(to_parquet.invoke(None, args), options)
        try:
            return self.ParquetUtil.footerMetrics(reader.getFooter(), self.Stream.empty(), config)
        finally:
            reader.close()

    def _footer_reading(self) -> tuple[Any, Any]:
        # ParquetIO.file (package-private): Iceberg's InputFile as a parquet one, as fileMetrics does
        params = self.gateway.new_array(self.cls("java.lang.Class"), 1)
        params[0] = self.class_object("org.apache.iceberg.io.InputFile")
        to_parquet = self.class_object("org.apache.iceberg.parquet.ParquetIO") \
            .getDeclaredMethod("file", params)
        to_parquet.setAccessible(True)
        options = self.cls("org.apache.iceberg.shaded.org.apache.parquet.HadoopReadOptions") \
            .builder(self._spark._jsc.hadoopConfiguration()).build()
        return to_parquet, options


class Catalog:
    """One Spark catalog (`spark.sql.catalog.<name>`), as seen from one SparkSession."""

    def __init__(self, spark: Any, name: str) -> None:
        self.spark = spark
        self.name = name
        self.java = JavaClasses(spark)
        field = self.java.class_object("org.apache.iceberg.spark.CommitMetadata") \
            .getDeclaredField("COMMIT_PROPERTIES")
        field.setAccessible(True)
        self._commit_props = field.get(None)   # a ThreadLocal<Map<String, String>>

    def ident(self, db: str, table: str, branch: str = "") -> str:
        parts = [self.name, db, table] + ([f"branch_{branch}"] if branch else [])
        return q(*parts)

    def sql(self, text: str) -> Any:
        return self.spark.sql(text)

    @contextlib.contextmanager
    def commit_properties(self, props: dict[str, str]) -> Iterator[None]:
        """Every commit this thread makes inside carries props in its snapshot summary."""
        m = self.java.HashMap()
        for k, v in props.items():
            m.put(k, v)
        self._commit_props.set(m)
        try:
            yield
        finally:
            self._commit_props.set(self.java.HashMap())

    # -- tables --------------------------------------------------------------------------------

    def create_namespace(self, db: str) -> None:
        self.sql(f"CREATE NAMESPACE IF NOT EXISTS {q(self.name, db)}")

    def exists(self, db: str, table: str) -> bool:
        return bool(self.spark.catalog.tableExists(f"{self.name}.{db}.{table}"))

    def columns(self, db: str, table: str) -> dict[str, tuple[str, str]]:
        """lower-case name -> (name, Spark type DDL) of the live table."""
        schema = self.spark.table(f"{self.name}.{db}.{table}").schema
        return {f.name.lower(): (f.name, f.dataType.simpleString().upper()) for f in schema.fields}

    def create_table(self, db: str, table: str, columns: list[tuple[str, str]],
                     props: dict[str, str]) -> None:
        self.create_namespace(db)
        cols = ", ".join(f"{q(n)} {t}" for n, t in columns)
        allp = {**TABLE_PROPERTIES, **props}
        tp = ", ".join(f"'{k}' = '{v}'" for k, v in allp.items())
        self.sql(f"CREATE TABLE IF NOT EXISTS {self.ident(db, table)} ({cols}) USING iceberg "
                 f"{self._unique_location(db, table)}TBLPROPERTIES ({tp})")

    def _unique_location(self, db: str, table: str) -> str:
        """A LOCATION clause no other table of the warehouse has, or "" when the catalog keeps no
        warehouse path we may choose under (a REST catalog's `warehouse` names one on the server,
        which picks; a Hadoop catalog allows only `<warehouse>/<db>/<table>`).

        Iceberg's default location is `<warehouse>/<db>/<table>`, and RENAME and DROP leave a
        table's files where they are: after `RENAME TABLE a TO b; CREATE TABLE a`, both tables
        would live in `<warehouse>/<db>/a`, and `remove_orphan_files` on either one deletes the
        other's data files (referenced by no snapshot of *its own*) once they are older than the
        cutoff. A name-plus-random-suffix directory per table keeps every location to one table."""
        conf = self.spark.conf
        pre = f"spark.sql.catalog.{self.name}"
        wh = conf.get(f"{pre}.warehouse", None)
        if not wh or conf.get(f"{pre}.type", None) not in ("jdbc", "hive"):
            return ""
        path = f"{wh.rstrip('/')}/{db}/{table}-{uuid.uuid4().hex[:12]}"
        return f"LOCATION {sql_str(path)} "

    def drop_table(self, db: str, table: str) -> None:
        # Not PURGE: the files stay for time travel until maintenance removes orphans.
        self.sql(f"DROP TABLE IF EXISTS {self.ident(db, table)}")

    def rename_table(self, db: str, table: str, new_db: str, new_table: str) -> None:
        if not self.exists(db, table) or self.exists(new_db, new_table):
            return
        self.create_namespace(new_db)
        # The new name is relative to the catalog (a catalog prefix would read as a namespace).
        self.sql(f"ALTER TABLE {self.ident(db, table)} RENAME TO {q(new_db, new_table)}")

    def properties(self, db: str, table: str) -> dict[str, str]:
        rows = self.sql(f"SHOW TBLPROPERTIES {self.ident(db, table)}").collect()
        return {r[0]: r[1] for r in rows}

    def set_properties(self, db: str, table: str, props: dict[str, str]) -> None:
        tp = ", ".join(f"'{k}' = {sql_str(v)}" for k, v in props.items())
        self.sql(f"ALTER TABLE {self.ident(db, table)} SET TBLPROPERTIES ({tp})")

    # -- schema operations ---------------------------------------------------------------------

    def set_write_mode(self, db: str, table: str, mode: str) -> None:
        self.set_properties(db, table, {f"write.{op}.mode": mode for op in ("merge", "update", "delete")})

    def create_for(self, st: TableState, which: str, props: dict[str, str]) -> None:
        if which == "changelog":
            self.create_table(st.db, st.changelog, [*CHANGELOG_META, *st.changelog_columns()], props)
        else:
            self.create_table(st.db, st.name, [*st.current_columns(), *CURRENT_META], props)

    def apply_ops(self, st: TableState, ops: list[Op], props: dict[str, str],
                  recast: Any = None) -> None:
        """Bring st's tables to st's shape; each op only where the live table still needs it.
        `recast(st, op)` rewrites a current-table column to a type Iceberg cannot promote to.

        Each ALTER is an Iceberg commit, so a run of adds (or drops) on one table is one
        statement. The two tables are independent (every op names one, and checks that table's
        live schema), so each table's ops run in their own order, the changelog's first."""
        for which in ("changelog", "current"):
            mine = [op for op in ops if op.table == which]
            i = 0
            while i < len(mine):
                j = i + 1
                if mine[i].kind in ("add", "drop"):
                    while j < len(mine) and mine[j].kind == mine[i].kind:
                        j += 1
                self._apply_run(st, mine[i:j], props, recast)
                i = j

    def _apply_run(self, st: TableState, run: list[Op], props: dict[str, str],
                   recast: Any) -> None:
        """One op, or a run of adds or of drops on one table (one commit)."""
        op = run[0]
        table = st.changelog if op.table == "changelog" else st.name
        if op.kind == "create":
            self.create_for(st, op.table, props)
            return
        if op.kind == "drop_table":
            self.drop_table(st.db, table)
            return
        if not self.exists(st.db, table):
            return
        live = self.columns(st.db, table)
        t = self.ident(st.db, table)
        have = live.get(op.column.lower())
        if op.kind == "add":
            todo = []
            for a in run:
                there = live.get(a.column.lower())
                if there is None:
                    todo.append(f"{q(a.column)} {a.to}")
                elif there[1] != a.to:
                    raise UnmappableChange(f"spark sink: table {st.db}.{table} column "
                                           f"{a.column}: exists as {there[1]}, wanted {a.to}")
            if todo:
                self.sql(f"ALTER TABLE {t} ADD COLUMNS ({', '.join(todo)})")
        elif op.kind == "drop":
            todo = [q(d.column) for d in run if d.column.lower() in live]
            if todo:
                self.sql(f"ALTER TABLE {t} DROP COLUMNS ({', '.join(todo)})")
        elif op.kind == "rename":
            # A target that exists is this rename done before a crash (targets are names
            # no other column of the state has).
            if have is not None and op.to.lower() not in live:
                self.sql(f"ALTER TABLE {t} RENAME COLUMN {q(op.column)} TO {q(op.to)}")
        elif op.kind == "widen":
            if have is not None and have[1] != op.to:
                self.sql(f"ALTER TABLE {t} ALTER COLUMN {q(op.column)} TYPE {op.to}")
        elif op.kind == "recast":
            recast(st, op)
        else:
            raise SluiceError(f"unknown schema operation {op.kind}")

    # -- snapshots ------------------------------------------------------------------------------

    def iceberg_table(self, db: str, table: str) -> Any:
        """The org.apache.iceberg.Table behind db.table, its metadata refreshed (what a query
        plans on: the catalog refreshes a cached table at every load)."""
        t = self.java.Spark3Util.loadIcebergTable(
            self.spark._jsparkSession, self.ident(db, table))
        t.refresh()
        return t

    def branch_head(self, db: str, table: str, branch: str = "main") -> int | None:
        ref = self.iceberg_table(db, table).refs().get(branch)
        return int(ref.snapshotId()) if ref is not None else None

    def head(self, db: str, table: str) -> Head:
        """Main's head and the newest sink summary on its ancestry. Snapshots other writers made
        (maintenance) carry none, fences only an epoch; the walk passes them.

        Read from the table's metadata through the Java API: the `.refs` and `.snapshots`
        metadata tables give the same answer but cost two Spark jobs, and this runs twice per
        table at every sink open and after every lost race or rewrite."""
        t = self.iceberg_table(db, table)
        ref = t.refs().get("main")
        if ref is None:
            return Head(None, None, None)
        head = int(ref.snapshotId())
        sid: int | None = head
        top: tuple[str, int] | None = None
        while sid is not None:
            snap = t.snapshot(sid)
            if snap is None:
                break    # expired: the ancestry ends here (as on the snapshots table)
            jsum = snap.summary()
            summary = {k: v for k in _SUMMARY_KEYS if (v := jsum.get(k)) is not None}
            e = epoch_of(summary)
            if e is not None and (top is None or e[1] > top[1]):
                top = e
            s = Summary.of(summary)
            if s is not None:
                return Head(head, s, top)
            parent = snap.parentId()
            sid = int(parent) if parent is not None else None
        return Head(head, None, top)


# The summary keys Summary.of and epoch_of read (fetched one by one over py4j).
_SUMMARY_KEYS = ("sluice.drainer", "sluice.epoch", "sluice.batch", "sluice.commit-ts")
