"""`sluice ctl verify`: source tables compared with the MySQL downstream or the Spark tables.

Each source table is split by its primary key into chunks (capture/snapshot/chunks.py's
splitter, the snapshot's own); each chunk is read on both sides and reduced to a checksum over
canonical Python values; only a chunk whose checksums differ is compared row by row, naming the
differing keys (the first 10). Canonical values are the Spark column values of docs/types.md:
a source value goes through `rowcodec.python_to_datum` and the Spark sink's converter
(`spark_sink.types`), so BIGINT UNSIGNED is DECIMAL(20,0), TIME its text, a zero date NULL, ...;
then decimals compare by value, timestamps as UTC microseconds, bytes as bytes.

Invariant: a table is reported as matching only when the target holds exactly the source's
rows — every key of the source with equal values, and no other key (the last chunk is open
above, so rows past the source's greatest key are counted too). A keyless table is compared as
a whole multiset of rows (noted in the output), never by a guessed key.

The library entry point is `verify_tables(source, target, tables, chunk_rows)`; `sluice demo`
calls it with a Spark target. Exit codes: 0 all match, 1 a mismatch (or a runtime failure),
2 bad usage (one line).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import decimal
import hashlib
import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from sluice.capture.snapshot.chunks import ChunkSplitter, SplitOptions
from sluice.capture.snapshot.keys import NoSnapshotKey, after, at_most, load_shape
from sluice.core import errors, rowcodec
from sluice.core.table import read_table_info
from sluice.proto import sluice_pb2 as pb

from . import render
from .verify_sides import MySQLSide, MySQLTarget, SparkTarget, Target
from .context import Ctx

log = logging.getLogger(__name__)

MAX_SHOWN = 10
_UTC = _dt.timezone.utc


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Difference:
    kind: str                  # "changed" | "missing" (not in the target) | "extra" (only there)
    key: str                   # "id=5" / "order_id=3, line=2" / the whole row of a keyless table


@dataclasses.dataclass(frozen=True)
class TableResult:
    table: str                 # "db.table"
    key: tuple[str, ...]       # key columns; () for a keyless table
    chunks: int
    rows: int                  # source rows
    target_rows: int
    status: str                # "match" | "mismatch" | "no target table"
    differences: tuple[Difference, ...] = ()   # the first MAX_SHOWN
    different: int = 0         # how many keys differ in all
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "match"

    def first_difference(self) -> str:
        if self.status == "no target table":
            return f"{self.table}: no such table in the target"
        d = self.differences[0] if self.differences else None
        return f"{self.table}: {d.kind} row {d.key}" if d else f"{self.table}: {self.status}"

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["key"] = list(self.key)
        d["differences"] = [dataclasses.asdict(x) for x in self.differences]
        return d


# ---------------------------------------------------------------------------------------------
# Canonical values
# ---------------------------------------------------------------------------------------------

def canonical(v: Any) -> Any:
    """A value in the form both sides agree on (hashable, exact): decimals by value, timestamps
    as aware UTC datetimes with microseconds (a naive one is UTC: every session runs in UTC),
    bytes as bytes."""
    if v is None or isinstance(v, (str, int)) and not isinstance(v, bool):
        return v
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, decimal.Decimal):
        return ("D", format(v.normalize(), "f"))
    if isinstance(v, float):
        return ("F", repr(v))
    if isinstance(v, _dt.datetime):
        v = v.replace(tzinfo=_UTC) if v.tzinfo is None else v.astimezone(_UTC)
        return ("T", v.isoformat(timespec="microseconds"))
    if isinstance(v, _dt.date):
        return ("d", v.isoformat())
    if isinstance(v, (bytes, bytearray, memoryview)):
        return ("B", bytes(v))
    if isinstance(v, _dt.timedelta):
        return ("t", str(v))
    if isinstance(v, (list, tuple)):
        return tuple(canonical(x) for x in v)
    return ("?", str(v))


class SourceValues:
    """Source (pymysql) values -> the Spark column values of docs/types.md, per column."""

    def __init__(self, columns: Sequence[pb.ColumnInfo]) -> None:
        from sluice.spark_sink import types as sparktypes
        self.columns = list(columns)
        self._conv: list[Any] = []
        for c in self.columns:
            try:
                self._conv.append(sparktypes.converter(sparktypes.spark_type(c)))
            except errors.SluiceError:
                self._conv.append(None)      # no Spark mapping: compared as read

    def row(self, values: Sequence[Any]) -> tuple[Any, ...]:
        out = []
        for v, c, conv in zip(values, self.columns, self._conv):
            if v is None or conv is None:
                out.append(canonical(v))
                continue
            try:
                spark_value = conv(rowcodec.python_to_datum(v, c))
            except (errors.SluiceError, ValueError, TypeError, OverflowError):
                spark_value = v              # a value rowcodec cannot carry: compared as read
            out.append(canonical(spark_value if isinstance(spark_value, _PLAIN) else None))
        return tuple(out)


_PLAIN = (str, int, float, decimal.Decimal, _dt.date, bytes, bytearray, memoryview, _dt.timedelta)


def row_digest(row: tuple[Any, ...]) -> int:
    return int.from_bytes(hashlib.blake2b(repr(row).encode(), digest_size=16).digest(), "big")


@dataclasses.dataclass
class Checksum:
    """Order-independent: row count and the sum of the rows' 128-bit digests."""

    count: int = 0
    total: int = 0

    def add(self, row: tuple[Any, ...]) -> None:
        self.count += 1
        self.total = (self.total + row_digest(row)) % (1 << 128)


# ---------------------------------------------------------------------------------------------
# The comparison
# ---------------------------------------------------------------------------------------------

def _columns(source: MySQLSide, db: str, table: str) -> tuple[pb.ColumnInfo, ...]:
    """Columns of a keyless table (load_shape refuses to choose a key for it)."""
    with source.conn.cursor() as cur:
        return tuple(read_table_info(cur, db, table).columns)


def _split(table: str) -> tuple[str, str]:
    db, dot, name = table.partition(".")
    if not dot or not db or not name:
        raise errors.InvalidArgument(f"table {table!r}: want db.table")
    return db, name


def _key_text(names: Sequence[str], values: Sequence[Any]) -> str:
    def show(v: Any) -> str:
        if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str):
            v = v[1]
        if isinstance(v, bytes):
            return "0x" + v.hex()
        return repr(v) if isinstance(v, str) else str(v)
    return ", ".join(f"{n}={show(v)}" for n, v in zip(names, values))


class _Compare:
    """One table's comparison state."""

    def __init__(self, table: str, key: tuple[str, ...], names: Sequence[str],
                 key_index: Sequence[int]) -> None:
        self.table, self.key, self.names, self.key_index = table, key, list(names), list(key_index)
        self.diffs: list[Difference] = []
        self.different = 0

    def keyed(self, rows: Iterable[tuple[Any, ...]]) -> dict[tuple[Any, ...], tuple[Any, ...]]:
        return {tuple(r[i] for i in self.key_index): r for r in rows}

    def diff(self, src: dict[tuple[Any, ...], tuple[Any, ...]],
             dst: dict[tuple[Any, ...], tuple[Any, ...]]) -> None:
        for k in sorted(src.keys() | dst.keys(), key=repr):
            a, b = src.get(k), dst.get(k)
            if a == b:
                continue
            kind = "missing" if b is None else "extra" if a is None else "changed"
            self.note(kind, _key_text(self.key, k))

    def note(self, kind: str, text: str) -> None:
        self.different += 1
        if len(self.diffs) < MAX_SHOWN:
            self.diffs.append(Difference(kind, text))


def verify_table(source: MySQLSide, target: Target, table: str, chunk_rows: int = 10_000) -> TableResult:
    db, name = _split(table)
    if not source.exists(db, name):
        raise errors.NotFound(f"table {table} does not exist in the source {source.name}")
    if not target.exists(db, name):
        return TableResult(table, (), 0, 0, 0, "no target table")
    try:
        shape = load_shape(source.conn, db, name)
    except NoSnapshotKey:
        return _verify_keyless(source, target, db, name)
    columns = shape.columns
    names = [c.name for c in columns]
    conv = SourceValues(columns)
    tconv = conv.row if target.canonical_source else (lambda r: tuple(canonical(v) for v in r))
    cmp = _Compare(table, shape.key.columns, names, shape.key_index)
    chunked = target.supports_chunks(shape.key, columns)
    rest: dict[tuple[Any, ...], tuple[Any, ...]] | None = None
    target_rows = 0
    if not chunked:
        rest = cmp.keyed(tconv(r) for r in target.select(db, name, names, "", ()))
        target_rows = len(rest)
    rows = chunks = 0
    splitter = ChunkSplitter(source.conn, shape.key, SplitOptions(chunk_size=chunk_rows))
    bounds = [(c.lower, c.upper, c.last) for c in splitter] or [(None, None, True)]
    for lower, upper, last in bounds:
        chunks += 1
        parts: list[str] = []
        params: list[Any] = []
        if lower is not None:
            sql, p = after(shape.key, lower)
            parts.append(sql)
            params += p
        if not last:                       # the last chunk is open above: extra rows count
            assert upper is not None
            sql, p = at_most(shape.key, upper)
            parts.append(sql)
            params += p
        where = " AND ".join(parts)
        src = cmp.keyed(conv.row(r) for r in source.select(db, name, names, where, params))
        rows += len(src)
        if rest is None:
            dst = cmp.keyed(tconv(r) for r in target.select(db, name, names, where, params))
            target_rows += len(dst)
        else:
            dst = {k: rest.pop(k) for k in list(src) if k in rest}
            if last:
                dst.update(rest)
                rest.clear()
        a, b = Checksum(), Checksum()
        for r in src.values():
            a.add(r)
        for r in dst.values():
            b.add(r)
        if a != b:
            cmp.diff(src, dst)
    status = "match" if cmp.different == 0 else "mismatch"
    note = "" if chunked else "key not an integer: Spark side read whole, matched by key"
    return TableResult(table, shape.key.columns, chunks, rows, target_rows, status,
                       tuple(cmp.diffs), cmp.different, note)


def _verify_keyless(source: MySQLSide, target: Target, db: str, name: str) -> TableResult:
    table = f"{db}.{name}"
    columns = _columns(source, db, name)
    names = [c.name for c in columns]
    conv = SourceValues(columns)
    tconv = conv.row if target.canonical_source else (lambda r: tuple(canonical(v) for v in r))
    src = Counter(conv.row(r) for r in source.select(db, name, names, "", ()))
    dst = Counter(tconv(r) for r in target.select(db, name, names, "", ()))
    cmp = _Compare(table, (), names, [])
    for row in sorted((src - dst).keys(), key=repr):
        cmp.note("missing", "(" + _key_text(names, row) + ")")
    for row in sorted((dst - src).keys(), key=repr):
        cmp.note("extra", "(" + _key_text(names, row) + ")")
    return TableResult(table, (), 1, sum(src.values()), sum(dst.values()),
                       "match" if cmp.different == 0 else "mismatch", tuple(cmp.diffs),
                       cmp.different, "no primary key: compared as a whole multiset of rows")


def verify_tables(source: MySQLSide, target: Target, tables: Sequence[str] | None = None,
                  chunk_rows: int = 10_000) -> list[TableResult]:
    """Compare each source table ("db.table"; default: every non-system table) with the target."""
    if chunk_rows < 1:
        raise errors.InvalidArgument(f"--chunk-rows must be >= 1, got {chunk_rows}")
    names = list(tables) if tables else source.tables()
    return [verify_table(source, target, t, chunk_rows) for t in names]


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------

def format_results(results: Sequence[TableResult]) -> list[str]:
    """The table `sluice ctl verify` prints (and `sluice demo` shows)."""
    rows = [[r.table, str(r.chunks), str(r.rows), str(r.target_rows), r.status.upper()
             if r.status != "match" else "match", r.note] for r in results]
    head = ["TABLE", "CHUNKS", "ROWS", "TARGET ROWS", "STATUS", "NOTE"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(head)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip()]
    out += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    for r in results:
        if r.status == "no target table":
            out.append(f"  {r.table}: no such table in the target")
        for d in r.differences:
            out.append(f"  {r.table}: {d.kind:<8} {d.key}")
        if r.different > len(r.differences):
            out.append(f"  {r.table}: ... {r.different - len(r.differences)} more")
    ok = sum(r.ok for r in results)
    out.append(f"{ok} of {len(results)} tables match" if ok < len(results) else
               f"all {len(results)} tables match ({sum(r.rows for r in results)} rows)")
    return out


# ---------------------------------------------------------------------------------------------
# `sluice ctl verify`
# ---------------------------------------------------------------------------------------------

def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("verify", parents=[common],
                       help="compare source tables with the MySQL downstream or the Spark tables")
    p.add_argument("--source", required=True, metavar="DSN",
                   help="the source: mysql://user:password@host:port")
    t = p.add_mutually_exclusive_group(required=True)
    t.add_argument("--target", metavar="DSN", help="a MySQL/MariaDB downstream: mysql://...")
    t.add_argument("--spark-config", metavar="TOML",
                   help="the Spark drainer's TOML: its [to] table gives the catalog (warehouse, "
                        "catalog-type, catalog-uri, ...) and the database pattern")
    t.add_argument("--warehouse", metavar="DIR",
                   help="instead of --spark-config: the Spark sink's warehouse (its embedded "
                        "catalog; database pattern {schema})")
    p.add_argument("--tables", metavar="DB.T,...", help="compare only these (default: every "
                   "table of the source outside mysql/sys/*_schema)")
    p.add_argument("--chunk-rows", type=int, default=10_000, metavar="N",
                   help="rows per checksum chunk (default 10000)")
    p.set_defaults(func=verify)


def spark_target_from(spark_config: str | None, warehouse: str | None = None,
                      jvm_output: str | None = None) -> SparkTarget:
    """A SparkTarget on the session the sink's config (its [to] table) describes; warehouse
    overrides the config's (or, alone, names the embedded catalog in that warehouse).
    jvm_output: a file for the JVM's own stdout/stderr (default: this process's)."""
    from sluice.spark_sink import sql as sparksql
    from sluice.spark_sink.session import session
    to = sparksql.to_table(spark_config)
    cfg = sparksql.session_config(spark_config, warehouse)
    return SparkTarget(session(cfg, jvm_output=jvm_output), str(to.get("database", "{schema}")), owns_session=True,
                       catalog=cfg.catalog)


def verify(ctx: Ctx, args: argparse.Namespace) -> int:
    tables = [t.strip() for t in args.tables.split(",") if t.strip()] if args.tables else None
    for t in tables or []:
        _split(t)
    if args.chunk_rows < 1:
        raise errors.InvalidArgument(f"--chunk-rows must be >= 1, got {args.chunk_rows}")
    source = MySQLSide(args.source, "--source")
    target: Target | None = None
    try:
        target = (MySQLTarget(args.target) if args.target else
                  spark_target_from(args.spark_config, args.warehouse))
        results = verify_tables(source, target, tables, args.chunk_rows)
    finally:
        source.close()
        if target is not None:
            target.close()
    if ctx.json:
        render.emit_json(ctx.out, {"match": all(r.ok for r in results),
                                   "tables": [r.to_json() for r in results]})
    else:
        for line in format_results(results):
            ctx.print(line)
    return 0 if all(r.ok for r in results) else 1


__all__ = ["Difference", "TableResult", "MySQLSide", "MySQLTarget", "SparkTarget", "Target",
           "canonical", "verify_table", "verify_tables", "format_results", "spark_target_from"]
