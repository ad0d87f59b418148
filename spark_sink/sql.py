"""`sluice spark-sql "SELECT ..."`: run Spark SQL against the Sluice tables and print the result.

The session has the sink's catalog settings: `--config drainer.toml` (its `[to]` table), or
`--warehouse DIR` (the embedded catalog in that warehouse; `--catalog-type`, `--catalog-uri`
and `--catalog` for another catalog), so it reads exactly what the sink committed. Iceberg
readers see whole snapshots: a query never meets a half-written commit, and needs no retry.

`--tables` prints every table of the catalog: namespace, name, kind (current, changelog, or the
sink's `commits` marker table) and the commit_ts of the newest sink commit on its main branch.

`--as-of COMMIT_TS` (time travel across tables): the newest row of the sink's marker table
`<meta>._sluice_commits` with commit_ts <= COMMIT_TS names, for every table, the snapshot that
batch left; each table becomes a temporary view of that snapshot (`VERSION AS OF`), named as the
table (`orders`, `orders_changelog`) and as `<database>_<table>` (`shop_orders`, unambiguous
across source schemas). All views show one batch boundary: the last one at or before COMMIT_TS.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import decimal
import json
import os
import sys
import tomllib
from typing import Any

from sluice.core import config as _config
from sluice.core.errors import ConfigError, InvalidArgument
from sluice.spark_sink.config import SessionConfig
from sluice.spark_sink.tables import ident, q

COMMITS = "_sluice_commits"
CHANGELOG_SUFFIX = "_changelog"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sql", nargs="*", help="SQL statement(s); each argument is run in order, the "
                   "last one's result is printed (required unless --tables)")
    p.add_argument("--config", "-c", help="drainer TOML file: the session settings are read from "
                   "its [to] table (warehouse, catalog, master, spark-conf, ...)")
    p.add_argument("--warehouse", metavar="DIR", help="the sink's warehouse (dir or URI); "
                   "overrides --config")
    p.add_argument("--catalog-type", choices=("jdbc", "hive", "rest", "hadoop"),
                   help="the catalog's type (default: the config's, else jdbc)")
    p.add_argument("--catalog-uri", help="the catalog's URI (default: the config's, else the "
                   "embedded SQLite catalog in the warehouse)")
    p.add_argument("--catalog", help="the catalog's name in Spark SQL (default: the config's, "
                   "else 'sluice')")
    p.add_argument("--master", help="Spark master (default local[*])")
    p.add_argument("--json", action="store_true", help="print one JSON object per row")
    p.add_argument("--limit", type=int, default=1000, help="rows to print at most (default 1000)")
    p.add_argument("--tables", action="store_true", help="list every table of the catalog with "
                   "its kind and the commit_ts of its newest sink commit (no SQL)")
    p.add_argument("--as-of", type=int, metavar="COMMIT_TS",
                   help="query the tables as of this commit_ts: temporary views named as the "
                   "tables (and <database>_<table>) hold their state at the last batch "
                   "committed at or before it")
    p.add_argument("--meta-database", help="the sink's meta database, for --as-of (default: the "
                   "config's meta-database, else 'sluice')")


def to_table(config: str | None) -> dict[str, Any]:
    """The drainer config's [to] table (empty without a config)."""
    if not config:
        return {}
    try:
        with open(config, "rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{config}: config file not found") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{config}: invalid TOML: {e}") from None
    return dict(doc.get("to", doc))


def session_config(config: str | None = None, warehouse: str | None = None,
                   catalog_type: str | None = None, catalog_uri: str | None = None,
                   catalog: str | None = None, master: str | None = None,
                   spark_conf: dict[str, str] | None = None) -> SessionConfig:
    """A reader's session settings: the sink config's [to] table, then the explicit overrides.
    An embedded catalog that does not exist yet is an error (a wrong --warehouse would
    otherwise show an empty catalog)."""
    if not config and not warehouse and not catalog_uri:
        raise ConfigError("spark: give --config (the Spark drainer's TOML) or --warehouse DIR "
                          "(the sink's warehouse)")
    fields = {_config.field_key(f) for f in SessionConfig.__dataclass_fields__}
    data = {k: v for k, v in to_table(config).items() if k in fields}
    for key, value in (("warehouse", warehouse), ("catalog-type", catalog_type),
                       ("catalog-uri", catalog_uri), ("catalog", catalog), ("master", master)):
        if value:
            data[key] = value
    data.setdefault("log-level", "ERROR")
    conf = dict(data.get("spark-conf") or {})
    conf.setdefault("spark.ui.showConsoleProgress", "false")
    conf.update(spark_conf or {})
    data["spark-conf"] = conf
    cfg = _config.from_dict(SessionConfig, data, config or "spark-sql")
    # Iceberg's SparkCatalog caches a loaded table until it goes unused for 30 s: a reader that
    # polls (the demo waiting for its probe row) would see the table as first loaded forever.
    # A reader wants the newest committed snapshot at every query.
    cache_key = f"spark.sql.catalog.{cfg.catalog}.cache-enabled"
    if cache_key not in cfg.spark_conf:
        cfg = dataclasses.replace(cfg, spark_conf={**cfg.spark_conf, cache_key: "false"})
    if cfg.sqlite_path and not os.path.exists(cfg.sqlite_path):
        raise ConfigError(f"spark: no catalog at {cfg.sqlite_path}: the warehouse "
                          f"{cfg.warehouse!r} holds no Sluice tables yet (is it the sink's "
                          "`warehouse`? the sink creates the catalog with its first start)")
    return cfg


def _session_config(args: argparse.Namespace) -> SessionConfig:
    return session_config(args.config, args.warehouse, args.catalog_type, args.catalog_uri,
                          args.catalog, args.master)


def _plain(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).hex()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, (_dt.datetime, _dt.date)):
        return v.isoformat()
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return v


def render_table(columns: list[str], rows: list[list[Any]]) -> str:
    cells = [[("NULL" if v is None else str(v)) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    line = "+".join("-" * (w + 2) for w in widths)
    out = [" | ".join(c.ljust(w) for c, w in zip(columns, widths)), line]
    out += [" | ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out)


def _kind(table: str) -> str:
    if table == COMMITS:
        return "commits"
    return "changelog" if table.endswith(CHANGELOG_SUFFIX) else "current"


def list_tables(spark: Any, catalog: str) -> tuple[list[str], list[list[Any]]]:
    """(columns, rows): every table of the catalog, its kind and the commit_ts of the newest
    sink commit among the ancestors of its main branch (NULL: none yet)."""
    rows: list[list[Any]] = []
    for (ns,) in sorted(spark.sql(f"SHOW NAMESPACES IN {q(catalog)}").collect()):
        names = sorted(r["tableName"] for r in spark.sql(f"SHOW TABLES IN {q(catalog, ns)}")
                       .collect() if not r["isTemporary"])
        for t in names:
            meta = q(catalog, ns, t)
            ts = spark.sql(
                f"SELECT max(CAST(s.summary['sluice.commit-ts'] AS BIGINT)) FROM {meta}.history h "
                f"JOIN {meta}.snapshots s ON h.snapshot_id = s.snapshot_id "
                "WHERE h.is_current_ancestor").collect()[0][0]
            rows.append([ns, t, _kind(t), ts])
    return ["namespace", "table", "kind", "commit_ts"], rows


@dataclasses.dataclass(frozen=True)
class AsOf:
    """What --as-of registered: the batch boundary the views show."""

    batch: int
    commit_ts: int
    views: list[str]
    missing: list[str]     # tables of the batch no longer in the catalog (dropped or renamed)


def register_as_of(spark: Any, catalog: str, meta_db: str, commit_ts: int) -> AsOf:
    """Temporary views of every table of the sink at the last batch boundary <= commit_ts."""
    if commit_ts < 0:
        raise InvalidArgument(f"--as-of must be a commit_ts >= 0, got {commit_ts}")
    meta = ident(meta_db)
    marker = q(catalog, meta, COMMITS)
    if not spark.catalog.tableExists(f"{catalog}.{meta}.{COMMITS}"):
        raise InvalidArgument(f"--as-of: no marker table {catalog}.{meta}.{COMMITS} (the sink's "
                              "`meta-database`; give --meta-database or --config)")
    found = spark.sql(f"SELECT batch, commit_ts, tables FROM {marker} WHERE commit_ts <= "
                      f"{int(commit_ts)} ORDER BY commit_ts DESC, batch DESC LIMIT 1").collect()
    if not found:
        first = spark.sql(f"SELECT min(commit_ts) FROM {marker}").collect()[0][0]
        raise InvalidArgument(
            f"--as-of {commit_ts}: no batch was committed at or before it (the first batch "
            f"ends at commit_ts {first})" if first is not None else
            f"--as-of {commit_ts}: the sink has committed no batch yet")
    batch, at, tables = found[0]
    entries = []
    for key, snapshot in sorted((tables or {}).items()):
        db, _, table = key.partition(".")
        if db == meta and table == COMMITS:
            continue
        entries.append((db, table, snapshot))
    plain = [t for _, t, _ in entries]
    views, missing = [], []
    for db, table, snapshot in entries:
        source = q(catalog, db, table)
        if not spark.catalog.tableExists(f"{catalog}.{db}.{table}"):
            missing.append(f"{db}.{table}")
            continue
        text = (f"SELECT * FROM {source} VERSION AS OF {int(snapshot)}" if snapshot is not None
                else f"SELECT * FROM {source} LIMIT 0")
        for name in ([table] if plain.count(table) == 1 else []) + [f"{db}_{table}"]:
            spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW {q(name)} AS {text}")
            views.append(name)
    return AsOf(int(batch), int(at), views, missing)


def _query(spark: Any, statements: list[str], limit: int) -> tuple[list[str], list[list[Any]]]:
    """(columns, rows) of the last statement."""
    df = None
    for stmt in statements:
        df = spark.sql(stmt)
    assert df is not None
    return df.columns, [[_plain(v) for v in r] for r in df.limit(limit).collect()]


def run(args: argparse.Namespace) -> int:
    # Usage errors are ConfigErrors: one line, exit 2 (before any JVM starts).
    if args.limit <= 0:
        raise ConfigError("--limit must be positive")
    if args.tables and (args.sql or args.as_of is not None):
        raise ConfigError("--tables takes no SQL and no --as-of")
    if not args.tables and not args.sql:
        raise ConfigError("give SQL to run (or --tables to list the tables)")
    from pyspark.logger import PySparkLogger

    from sluice.spark_sink.session import session
    # pyspark logs every failed SQL statement with its stack; the one-line message below is
    # what a user of this command needs.
    PySparkLogger.getLogger("SQLQueryContextLogger").disabled = True
    cfg = _session_config(args)
    spark = session(cfg)
    try:
        if args.tables:
            columns, rows = list_tables(spark, cfg.catalog)
        else:
            if args.as_of is not None:
                meta = args.meta_database or to_table(args.config).get("meta-database") or "sluice"
                got = register_as_of(spark, cfg.catalog, meta, args.as_of)
                sys.stderr.write(f"sluice spark-sql: --as-of {args.as_of}: the views show batch "
                                 f"{got.batch} (commit_ts {got.commit_ts}, the last batch "
                                 f"boundary <= {args.as_of}): {', '.join(got.views) or 'none'}\n")
                for m in got.missing:
                    sys.stderr.write(f"sluice spark-sql: --as-of: {m} is no longer in the "
                                     "catalog (dropped or renamed since); no view\n")
            columns, rows = _query(spark, list(args.sql), args.limit)
        if args.json:
            for r in rows:
                sys.stdout.write(json.dumps(dict(zip(columns, r)), ensure_ascii=False) + "\n")
        else:
            sys.stdout.write(render_table(columns, rows) + "\n")
        sys.stdout.flush()
        return 0
    except Exception as e:
        if type(e).__name__ in ("AnalysisException", "ParseException"):
            sys.stderr.write(f"sluice spark-sql: {str(e).splitlines()[0]}\n")
            return 1
        raise
    finally:
        spark.stop()
