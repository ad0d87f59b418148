"""The two sides `sluice ctl verify` reads: a MySQL/MariaDB server (the source, or the MySQL
downstream as the target) and the Spark current-state tables (the target), behind one `Target`
protocol the comparison (`ctl/verify.py`) uses.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

from sluice.capture.snapshot.keys import KeySpec
from sluice.core import errors
from sluice.core.secrets import mask_dsn
from sluice.core.table import quote_ident
from sluice.proto import sluice_pb2 as pb

SYSTEM_DATABASES = frozenset({"mysql", "information_schema", "performance_schema", "sys"})
_UTC = _dt.timezone.utc


@dataclasses.dataclass(frozen=True)
class MySQLDSN:
    host: str
    port: int
    user: str
    password: str = dataclasses.field(repr=False)

    @classmethod
    def parse(cls, dsn: str, what: str) -> MySQLDSN:
        try:
            u = urllib.parse.urlsplit(dsn)
            port = u.port or 3306
        except ValueError as e:
            raise errors.ConfigError(f"{what} {mask_dsn(dsn)}: {e}") from None
        if u.scheme not in ("mysql", "mariadb") or not u.hostname:
            raise errors.ConfigError(f"{what} {mask_dsn(dsn)}: want mysql://user:password@host:port")
        return cls(u.hostname, port, urllib.parse.unquote(u.username or "root"),
                   urllib.parse.unquote(u.password or ""))

    def __str__(self) -> str:
        return f"mysql://{self.user}:***@{self.host}:{self.port}"


class MySQLSide:
    """A MySQL/MariaDB server read over pymysql, TIMESTAMPs in UTC (as the capture reads them)."""

    def __init__(self, dsn: str | MySQLDSN, what: str = "--source") -> None:
        import pymysql
        self.dsn = dsn if isinstance(dsn, MySQLDSN) else MySQLDSN.parse(dsn, what)
        try:
            self.conn = pymysql.connect(host=self.dsn.host, port=self.dsn.port, user=self.dsn.user,
                                        password=self.dsn.password, charset="utf8mb4",
                                        autocommit=True, connect_timeout=5,
                                        init_command="SET time_zone = '+00:00'")
        except pymysql.err.OperationalError as e:
            code = e.args[0] if e.args else 0
            text = f"{what} {self.dsn}: cannot connect: {e.args[-1] if e.args else e}"
            # Access denied / unknown database: the command is wrong; anything else: runtime.
            raise (errors.ConfigError(text) if code in (1044, 1045, 1049) else
                   errors.Unavailable(text)) from None
        self.name = str(self.dsn)

    def close(self) -> None:
        self.conn.close()

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self.conn.cursor() as cur:
            cur.execute(sql, params or None)
            return list(cur.fetchall())

    def tables(self, databases: Iterable[str] = ()) -> list[str]:
        dbs = list(databases)
        where = ("TABLE_SCHEMA IN (" + ",".join(["%s"] * len(dbs)) + ")") if dbs else \
            "TABLE_SCHEMA NOT IN (" + ",".join(["%s"] * len(SYSTEM_DATABASES)) + ")"
        rows = self.query("SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE "
                          f"TABLE_TYPE = 'BASE TABLE' AND {where} ORDER BY 1, 2",
                          dbs or sorted(SYSTEM_DATABASES))
        return [f"{d}.{t}" for d, t in rows]

    def exists(self, db: str, table: str) -> bool:
        return bool(self.query("SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s "
                               "AND TABLE_NAME = %s", (db, table)))

    def select(self, db: str, table: str, columns: Sequence[str], where: str,
               params: Sequence[Any]) -> Iterator[tuple[Any, ...]]:
        cols = ", ".join(quote_ident(c) for c in columns)
        w = f" WHERE {where}" if where else ""
        yield from self.query(f"SELECT {cols} FROM {quote_ident(db)}.{quote_ident(table)}{w}", params)


class Target(Protocol):
    name: str
    canonical_source: bool    # True: its values are source values (convert like the source's)

    def exists(self, db: str, table: str) -> bool: ...
    def supports_chunks(self, spec: KeySpec, columns: Sequence[pb.ColumnInfo]) -> bool: ...
    def select(self, db: str, table: str, columns: Sequence[str], where: str,
               params: Sequence[Any]) -> Iterator[tuple[Any, ...]]: ...
    def close(self) -> None: ...


class MySQLTarget(MySQLSide):
    canonical_source = True

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn, "--target")

    def supports_chunks(self, spec: KeySpec, columns: Sequence[pb.ColumnInfo]) -> bool:
        return True    # same SQL, same collations as the source


class SparkTarget:
    """The Spark current-state tables (`<db>.<table>`, Iceberg) through a SparkSession on the
    sink's catalog. Chunk predicates are used only for integer keys: Spark compares strings by
    code point, MySQL by collation, so other keys are read whole and matched by key."""

    canonical_source = False

    def __init__(self, spark: Any, database_format: str = "{schema}", source: str = "",
                 owns_session: bool = False, catalog: str = "") -> None:
        self.spark = spark
        self.database_format = database_format
        self.source = source
        self.catalog = catalog or spark.conf.get("spark.sql.defaultCatalog")
        self.name = "spark"
        self._owns = owns_session

    def database(self, db: str) -> str:
        """The catalog namespace of source schema db (the sink's `database` pattern)."""
        from sluice.spark_sink.tables import ident
        return ident(self.database_format.format(schema=db, source=self.source))

    def view(self, db: str, table: str) -> str:
        """The current-state table of db.table, quoted (the name kept from the views' days)."""
        from sluice.spark_sink.tables import ident, q
        return q(self.catalog, self.database(db), ident(table))

    def changelog(self, db: str, table: str) -> str:
        from sluice.spark_sink.tables import ident, q
        return q(self.catalog, self.database(db), ident(table) + "_changelog")

    def exists(self, db: str, table: str) -> bool:
        from sluice.spark_sink.tables import ident
        return bool(self.spark.catalog.tableExists(
            f"{self.catalog}.{self.database(db)}.{ident(table)}"))

    def supports_chunks(self, spec: KeySpec, columns: Sequence[pb.ColumnInfo]) -> bool:
        return spec.integer

    def select(self, db: str, table: str, columns: Sequence[str], where: str,
               params: Sequence[Any]) -> Iterator[tuple[Any, ...]]:
        cols = ", ".join(quote_ident(c) for c in columns)
        sql = f"SELECT {cols} FROM {self.view(db, table)}"
        if where:
            parts = where.split("%s")
            assert len(parts) == len(params) + 1
            sql += " WHERE " + "".join(p + (str(int(v)) if i < len(params) else "")
                                       for i, (p, v) in enumerate(zip(parts, [*params, 0])))
        for r in self.spark.sql(sql).toLocalIterator():
            # PySpark hands TIMESTAMPs over as naive local times of this process: make them
            # instants (astimezone reads a naive datetime as local time).
            yield tuple(v.astimezone(_UTC) if isinstance(v, _dt.datetime) and v.tzinfo is None
                        else v for v in r)

    def close(self) -> None:
        if self._owns:
            self.spark.stop()
