"""`sluice spark-sql "SELECT ..."`: run Spark SQL against the Sluice tables and print the result.

The session uses the same catalog settings as the sink (`--config` with the drainer's `[to]`
table, or `--warehouse DIR` for the embedded catalog), so it reads exactly what the sink committed.

`--as-of COMMIT_TS` (time travel): every table of the sink's meta database becomes a temporary
view of its state as of that commit_ts, named as the table (`accounts`) and as
`<database>_<table>` (`shop_accounts`, unambiguous across source schemas), read from the full
changelog (base versions and merged files included) — slower than the current-state views.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import decimal
import json
import re
import sys
import time
import tomllib
from typing import Any

from sluice.core import config as _config
from sluice.core.errors import ConfigError, InvalidArgument
from sluice.spark_sink.config import SessionConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sql", nargs="+", help="SQL statement(s); each argument is run in order, the "
                   "last one's result is printed")
    p.add_argument("--config", "-c", help="drainer TOML file: the session settings are read from "
                   "its [to] table (master, warehouse, catalog, spark-conf, ...)")
    p.add_argument("--warehouse", help="the Iceberg warehouse directory or URI (overrides --config; "
                   "its embedded catalog, `<warehouse>/catalog.db`, is read)")
    p.add_argument("--master", help="Spark master (default local[*])")
    p.add_argument("--json", action="store_true", help="print one JSON object per row")
    p.add_argument("--limit", type=int, default=1000, help="rows to print at most (default 1000)")
    p.add_argument("--as-of", type=int, metavar="COMMIT_TS",
                   help="query the tables as of this commit_ts: temporary views named as the "
                   "tables (and <database>_<table>) hold their state at that point")
    p.add_argument("--meta-database", help="the sink's meta database, for --as-of (default: the "
                   "config's meta-database, else 'sluice')")


def _to_table(args: argparse.Namespace) -> dict[str, Any]:
    """The drainer config's [to] table (empty without --config)."""
    if not args.config:
        return {}
    try:
        with open(args.config, "rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{args.config}: config file not found") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{args.config}: invalid TOML: {e}") from None
    return dict(doc.get("to", doc))


def _session_config(args: argparse.Namespace) -> SessionConfig:
    data: dict[str, Any] = {}
    if args.config:
        to = _to_table(args)
        fields = {_config.field_key(f) for f in SessionConfig.__dataclass_fields__}
        data = {k: v for k, v in to.items() if k in fields}
    if args.warehouse:
        data["warehouse"] = args.warehouse
    if args.master:
        data["master"] = args.master
    data.setdefault("log-level", "ERROR")
    conf = dict(data.get("spark-conf") or {})
    conf.setdefault("spark.ui.showConsoleProgress", "false")
    data["spark-conf"] = conf
    return _config.from_dict(SessionConfig, data, args.config or "spark-sql")


def _plain(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).hex()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, (_dt.datetime, _dt.date)):
        return v.isoformat()
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def render_table(columns: list[str], rows: list[list[Any]]) -> str:
    cells = [[("NULL" if v is None else str(v)) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    line = "+".join("-" * (w + 2) for w in widths)
    out = [" | ".join(c.ljust(w) for c, w in zip(columns, widths)), line]
    out += [" | ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out)


def register_as_of(spark: Any, meta_db: str, commit_ts: int) -> list[str]:
    """Temporary views of every (not dropped) table of the sink in meta_db as of commit_ts;
    returns their names."""
    from sluice.spark_sink.layout import Layout, q
    from sluice.spark_sink.tables import TableState, as_of_sql
    if commit_ts < 0:
        raise InvalidArgument(f"--as-of must be a commit_ts >= 0, got {commit_ts}")
    layout = Layout("/", meta_db, "{schema}", "")
    if not spark.catalog.databaseExists(layout.meta):
        raise InvalidArgument(f"--as-of: no meta database {meta_db!r} (the sink's "
                              "`meta-database`; give --meta-database or --config)")
    states = []
    for t in spark.catalog.listTables(layout.meta):
        if not t.name.endswith("_raw"):
            continue
        rows = spark.sql(f"SHOW TBLPROPERTIES {q(layout.meta, t.name)} ('sluice.state')").collect()
        text = rows[0][1] if rows else ""
        if text and "does not have property" not in text:
            st = TableState.from_json(text)
            if not st.dropped:
                states.append(st)
    names: list[str] = []
    tables = [st.table for st in states]
    for st in states:
        text = as_of_sql(st, layout, commit_ts)
        for name in ([st.table] if tables.count(st.table) == 1 else []) + [f"{st.db}_{st.table}"]:
            spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW {q(name)} AS {text}")
            names.append(name)
    return names


# A read planned while the sink's compaction or retention changes the catalog can find a
# partition row or a file gone between listing and reading (CI: "MetaException(message:No such
# database row)" in a third JVM during merges). Such a read-only query is run again; the next
# plan sees the catalog after the change (views read only committed batches either way).
_TRANSIENT = ("No such database row", "NoSuchObjectException", "FileNotFoundException")
_READ_ONLY = re.compile(r"^\s*(SELECT|WITH|SHOW|DESCRIBE|DESC|EXPLAIN)\b", re.IGNORECASE)
_ATTEMPTS = 3


def _query(spark: Any, statements: list[str], limit: int) -> tuple[list[str], list[list[Any]]]:
    """(columns, rows) of the last statement, a read-only query retried on a catalog race."""
    for attempt in range(1, _ATTEMPTS + 1):
        try:
            df = None
            for stmt in statements:
                df = spark.sql(stmt)
            assert df is not None
            return df.columns, [[_plain(v) for v in r] for r in df.limit(limit).collect()]
        except Exception as e:
            if (attempt == _ATTEMPTS or not all(map(_READ_ONLY.match, statements))
                    or not any(m in str(e) for m in _TRANSIENT)):
                raise
            sys.stderr.write("sluice spark-sql: the catalog changed under the query (a "
                             "compaction or retention pass); running it again\n")
            time.sleep(0.5 * attempt)
    raise AssertionError("unreachable")


def run(args: argparse.Namespace) -> int:
    if args.limit <= 0:
        raise InvalidArgument("--limit must be positive")
    from sluice.spark_sink.session import session
    spark = session(_session_config(args))
    try:
        if args.as_of is not None:
            meta = args.meta_database or _to_table(args).get("meta-database") or "sluice"
            register_as_of(spark, meta, args.as_of)
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
