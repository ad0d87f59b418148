"""Builders for realistic binlogs: table shapes, row changes, DDL, whole transactions.

    users = Table(41, "shop", "users", [col("id", "bigint(20)", nullable=False),
                                        col("email", "varchar(64)"), col("score", "decimal(20,6)")],
                  primary=["id"], unique={"uk_email": ["email"]})
    value = prewrite_value(users.mutation(users.insert(id=1, email="a@x"),
                                          users.update({"id": 1}, {"email": "b@x"}, ...)))
    t = txn(value, commit_ts=ts)            # a drainer Txn, joined from real binlog payloads
    prewrites, commit = binlogs(value, start_ts, commit_ts)   # payloads for a pump

Values are Python values (int, str, Decimal, bytes, datetime, date, timedelta, MySQLDateTime,
None) encoded with core.rowcodec.python_to_datum against the column, so the Datums are what a
capture would produce. A row is given as a dict of visible column values (missing ones are NULL).

`RandomWorkload` generates commit-ordered random transactions over a few tables together with
the expected final table contents (an in-memory model), deterministically from a seed.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import decimal
import random
import re
from collections.abc import Iterable, Mapping
from typing import Any

from sluice.core.rowcodec import python_to_datum
from sluice.drainer.txn import SchemaHistory, Txn
from sluice.proto import sluice_pb2 as pb

_TYPE_RE = re.compile(r"^\s*(\w+)(?:\((.*?)\))?(.*)$")


def col(name: str, column_type: str, nullable: bool = True, generated: bool = False,
        charset: str = "") -> pb.ColumnInfo:
    """A ColumnInfo from MySQL column type text: "bigint(20) unsigned", "decimal(30,10)",
    "varchar(64)", "datetime(6)", "enum('a','b')", "bit(8)", "json"."""
    m = _TYPE_RE.match(column_type)
    if m is None:
        raise ValueError(f"cannot parse column type {column_type!r}")
    data_type, args, rest = m.group(1).lower(), m.group(2) or "", m.group(3).lower()
    c = pb.ColumnInfo(name=name, data_type=data_type, column_type=column_type, nullable=nullable,
                      unsigned="unsigned" in rest, generated=generated, charset=charset)
    if data_type in ("enum", "set"):
        c.elements.extend(re.findall(r"'((?:[^']|'')*)'", args))
    elif data_type in ("decimal", "numeric"):
        p, _, s = args.partition(",")
        c.precision, c.scale = int(p or 10), int(s or 0)
    elif data_type in ("datetime", "timestamp", "time"):
        c.scale = int(args or 0)
    elif args.isdigit():
        c.length = int(args)
    return c


@dataclasses.dataclass(frozen=True)
class Table:
    """One version of a table's shape, with builders for its rows and DDL."""

    table_id: int
    schema: str
    name: str
    columns: tuple[pb.ColumnInfo, ...]
    primary: tuple[str, ...] = ()
    unique: tuple[tuple[str, tuple[str, ...]], ...] = ()
    version: int = 1

    def __init__(self, table_id: int, schema: str, name: str, columns: Iterable[pb.ColumnInfo],
                 primary: Iterable[str] = (), unique: Mapping[str, Iterable[str]] | None = None,
                 version: int = 1) -> None:
        object.__setattr__(self, "table_id", table_id)
        object.__setattr__(self, "schema", schema)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "columns", tuple(columns))
        object.__setattr__(self, "primary", tuple(primary))
        object.__setattr__(self, "unique", tuple((k, tuple(v)) for k, v in (unique or {}).items()))
        object.__setattr__(self, "version", version)

    # -- shape --------------------------------------------------------------------------------

    @property
    def info(self) -> pb.TableInfo:
        indexes = []
        if self.primary:
            indexes.append(pb.IndexInfo(name="PRIMARY", columns=list(self.primary), primary=True))
        indexes += [pb.IndexInfo(name=n, columns=list(cols), unique=True) for n, cols in self.unique]
        return pb.TableInfo(table_id=self.table_id, schema_name=self.schema, table_name=self.name,
                            version=self.version, columns=list(self.columns), indexes=indexes,
                            charset="utf8mb4")

    @property
    def visible(self) -> list[pb.ColumnInfo]:
        return [c for c in self.columns if not c.hidden]

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"

    def add_column(self, column: pb.ColumnInfo) -> Table:
        return self._next(columns=(*self.columns, column))

    def drop_column(self, name: str) -> Table:
        """The next version with `name` hidden (kept so rows of older versions still decode)."""
        if name not in {c.name for c in self.visible}:
            raise KeyError(f"{self.qualified} has no visible column {name}")
        cols = []
        for c in self.columns:
            if c.name == name:
                hidden = pb.ColumnInfo()
                hidden.CopyFrom(c)
                hidden.hidden = True
                c = hidden
            cols.append(c)
        unique = {n: cs for n, cs in self.unique if name not in cs}
        return self._next(columns=tuple(cols), unique=unique)

    def rename(self, schema: str, name: str) -> Table:
        return self._next(schema=schema, name=name)

    def _next(self, **changes: Any) -> Table:
        kw: dict[str, Any] = dict(table_id=self.table_id, schema=self.schema, name=self.name,
                                  columns=self.columns, primary=self.primary,
                                  unique=dict(self.unique), version=self.version + 1)
        kw.update(changes)
        return Table(**kw)

    # -- rows ---------------------------------------------------------------------------------

    def row(self, values: Mapping[str, Any]) -> pb.Row:
        visible = self.visible
        unknown = set(values) - {c.name for c in visible}
        if unknown:
            raise KeyError(f"{self.qualified} has no visible column(s) {sorted(unknown)}")
        return pb.Row(columns=[python_to_datum(values.get(c.name), c) for c in visible])

    def insert(self, **values: Any) -> pb.RowChange:
        return pb.RowChange(tp=pb.INSERT, after=self.row(values))

    def read(self, **values: Any) -> pb.RowChange:
        return pb.RowChange(tp=pb.READ, after=self.row(values))

    def update(self, before: Mapping[str, Any], after: Mapping[str, Any]) -> pb.RowChange:
        """Full images: `after` keys not given are taken from `before`."""
        return pb.RowChange(tp=pb.UPDATE, before=self.row(before), after=self.row({**before, **after}))

    def delete(self, **before: Any) -> pb.RowChange:
        return pb.RowChange(tp=pb.DELETE, before=self.row(before))

    def mutation(self, *changes: pb.RowChange) -> pb.TableMutation:
        return pb.TableMutation(table_id=self.table_id, schema_name=self.schema, table_name=self.name,
                                table_version=self.version, changes=list(changes))

    # -- DDL ----------------------------------------------------------------------------------

    def create_ddl(self, query: str = "") -> pb.DDL:
        return pb.DDL(tp=pb.CREATE_TABLE, schema_name=self.schema, table_name=self.name, query=query,
                      table_info=self.info, table_id=self.table_id)

    def alter_ddl(self, query: str = "") -> pb.DDL:
        """This version is the shape after the ALTER."""
        return pb.DDL(tp=pb.ALTER_TABLE, schema_name=self.schema, table_name=self.name, query=query,
                      table_info=self.info, table_id=self.table_id)

    def truncate_ddl(self, query: str = "") -> pb.DDL:
        return pb.DDL(tp=pb.TRUNCATE_TABLE, schema_name=self.schema, table_name=self.name,
                      query=query, table_info=self.info, table_id=self.table_id)

    def drop_ddl(self, query: str = "") -> pb.DDL:
        return pb.DDL(tp=pb.DROP_TABLE, schema_name=self.schema, table_name=self.name, query=query,
                      table_id=self.table_id)

    def rename_ddl(self, old: Table, query: str = "") -> pb.DDL:
        """This version (new names) renamed from `old`."""
        return pb.DDL(tp=pb.RENAME_TABLE, schema_name=self.schema, table_name=self.name, query=query,
                      table_info=self.info, old_schema_name=old.schema, old_table_name=old.name,
                      table_id=self.table_id)


def database_ddl(tp: int, schema: str, query: str = "") -> pb.DDL:
    return pb.DDL(tp=tp, schema_name=schema, query=query)


# --------------------------------------------------------------------------------------------
# Transactions
# --------------------------------------------------------------------------------------------

def prewrite_value(*mutations: pb.TableMutation, ddl: pb.DDL | None = None,
                   snapshots: Iterable[Table | pb.TableInfo] = (), source: pb.SourceInfo | None = None,
                   snapshot_chunk: bool = False) -> pb.PrewriteValue:
    value = pb.PrewriteValue(schema_version=1, mutations=list(mutations), snapshot_chunk=snapshot_chunk)
    for t in snapshots:
        value.schema_snapshots.append(t.info if isinstance(t, Table) else t)
    if ddl is not None:
        value.ddl.CopyFrom(ddl)
    if source is not None:
        value.source.CopyFrom(source)
    return value


def binlogs(value: pb.PrewriteValue, start_ts: int, commit_ts: int, producer: str = "cap-1",
            parts: int = 1, position: pb.Position | None = None) -> tuple[list[bytes], bytes]:
    """(prewrite part payloads, commit payload) as a producer writes them to a pump."""
    raw = value.SerializeToString()
    size = max(1, -(-len(raw) // parts))
    prewrites = [pb.Binlog(tp=pb.PREWRITE, start_ts=start_ts, prewrite_value=raw[i * size:(i + 1) * size],
                           part_no=i, part_count=parts if parts > 1 else 0,
                           producer_id=producer).SerializeToString() for i in range(parts)]
    commit = pb.Binlog(tp=pb.COMMIT, start_ts=start_ts, commit_ts=commit_ts, producer_id=producer)
    if position is not None:
        commit.position.CopyFrom(position)
    return prewrites, commit.SerializeToString()


def txn(value: pb.PrewriteValue, commit_ts: int, start_ts: int | None = None,
        pump_id: str = "pump-1", producer: str = "cap-1") -> Txn:
    """A drainer Txn joined from real payloads (the path the drainer takes)."""
    prewrites, commit = binlogs(value, commit_ts - 1 if start_ts is None else start_ts, commit_ts,
                                producer=producer)
    return Txn.from_binlogs(prewrites, commit, pump_id=pump_id)


def schema_txn(commit_ts: int, *tables: Table) -> Txn:
    """A schema-snapshot transaction declaring tables (the first capture of each)."""
    return txn(prewrite_value(snapshots=tables), commit_ts)


def ddl_txn(commit_ts: int, ddl: pb.DDL) -> Txn:
    return txn(prewrite_value(ddl=ddl), commit_ts)


def history_of(txns: Iterable[Txn]) -> SchemaHistory:
    """The schema history a drainer records for these transactions."""
    h = SchemaHistory()
    for t in txns:
        h.apply(t)
    return h


# --------------------------------------------------------------------------------------------
# A random workload with its expected result
# --------------------------------------------------------------------------------------------

def workload_tables(schema: str, base_id: int = 100, keyless: bool = True) -> list[Table]:
    """Three (or four) tables covering the key shapes and every Datum kind."""
    tables = [
        Table(base_id + 1, schema, "accounts", [
            col("id", "bigint(20)", nullable=False), col("email", "varchar(48)"),
            col("balance", "decimal(30,6)"), col("flags", "bigint(20) unsigned"),
            col("seen", "datetime(6)"), col("born", "date"), col("dur", "time(6)"),
            col("blob", "varbinary(32)"), col("ratio", "double"), col("doc", "json"),
            col("state", "enum('new','active','closed')"), col("bits", "bit(8)")],
            primary=["id"], unique={"uk_email": ["email"]}),
        Table(base_id + 2, schema, "ledger", [
            col("acct", "int(11)", nullable=False), col("seq", "varchar(16)", nullable=False),
            col("amount", "bigint(20)"), col("note", "text")],
            primary=["acct", "seq"]),
        Table(base_id + 3, schema, "tags", [
            col("tag", "varchar(24)", nullable=False), col("weight", "int(11)")],
            unique={"uk_tag": ["tag"]}),  # no PK: the NOT NULL unique key is the identity
    ]
    if keyless:
        tables.append(Table(base_id + 4, schema, "events", [
            col("kind", "varchar(8)"), col("n", "int(11)")]))
    return tables


def create_sql(t: Table) -> str:
    from sluice.drainer.sql import create_table_sql  # the sink's own generator, from TableInfo
    return create_table_sql(t.info, if_not_exists=False)


class RandomWorkload:
    """Deterministic random transactions over `workload_tables`, with the expected end state.

    Each transaction holds 1..max_rows changes: inserts, updates, deletes, primary-key changes,
    and unique-key swaps between two rows inside one transaction. `model[table][key] = row`
    (keyless tables: a list of rows). Transaction i has commit_ts first_ts + i*step.
    """

    def __init__(self, seed: int, schema: str, keys: int = 300, max_rows: int = 5,
                 keyless: bool = True, base_id: int = 100) -> None:
        self.rng = random.Random(seed)
        self.tables = workload_tables(schema, base_id, keyless)
        self.keys = keys
        self.max_rows = max_rows
        self.model: dict[str, Any] = {t.name: ({} if t.name != "events" else []) for t in self.tables}
        self._emails: dict[str, int] = {}
        self._tags: set[str] = set()
        self.rows = 0

    # values ------------------------------------------------------------------------------------

    def _account(self, i: int) -> dict[str, Any]:
        r = self.rng
        return {
            "id": i, "email": None, "balance": decimal.Decimal(r.randint(-10**12, 10**12)) / 1000000,
            "flags": r.choice([0, 1, 2**63, 2**64 - 1, r.randint(0, 2**64 - 1)]),
            "seen": _dt.datetime(2024, 1, 1) + _dt.timedelta(microseconds=r.randint(0, 10**14)),
            "born": r.choice([_dt.date(1999, 12, 31), _dt.date(2024, 2, 29), None]),
            "dur": _dt.timedelta(microseconds=r.randint(-838 * 3600 * 10**6, 838 * 3600 * 10**6)),
            "blob": r.randbytes(r.randint(0, 8)), "ratio": r.choice([0.5, -1.25, 1e100, None]),
            "doc": r.choice(['{"a": 1}', '[1, 2, "x"]', None]),
            "state": r.choice(["new", "active", "closed"]), "bits": r.randint(0, 255),
        }

    def _free_email(self) -> str:
        while True:
            e = f"u{self.rng.randint(0, self.keys * 2)}@x"
            if e not in self._emails:
                return e

    # changes -----------------------------------------------------------------------------------

    def next_value(self) -> pb.PrewriteValue:
        muts: list[pb.TableMutation] = []
        for _ in range(self.rng.randint(1, self.max_rows)):
            t = self.rng.choice(self.tables)
            change = getattr(self, f"_change_{t.name}")(t, muts)
            if change is not None:
                muts.append(t.mutation(change))
        if not muts:
            t = self.tables[0]
            muts.append(t.mutation(self._insert_account(t)))
        self.rows += sum(len(m.changes) for m in muts)
        return prewrite_value(*muts)

    def _insert_account(self, t: Table) -> pb.RowChange:
        m = self.model["accounts"]
        i = self.rng.randint(0, self.keys * 3)
        while i in m:
            i = self.rng.randint(0, self.keys * 3)
        row = self._account(i)
        if self.rng.random() < 0.6:
            row["email"] = self._free_email()
            self._emails[row["email"]] = i
        m[i] = row
        return t.insert(**row)

    def _change_accounts(self, t: Table, muts: list[pb.TableMutation]) -> pb.RowChange | None:
        m = self.model["accounts"]
        r = self.rng.random()
        if not m or r < 0.3:
            return self._insert_account(t)
        i = self.rng.choice(list(m))
        old = m[i]
        if r < 0.45:
            del m[i]
            if old["email"] is not None:
                del self._emails[old["email"]]
            return t.delete(**old)
        if r < 0.55:
            # Primary-key change.
            j = self.rng.randint(0, self.keys * 3)
            if j in m:
                return None
            new = {**old, "id": j}
            del m[i]
            m[j] = new
            if new["email"] is not None:
                self._emails[new["email"]] = j
            return t.update(old, new)
        if r < 0.7 and len(self._emails) >= 2:
            # Two rows swap their unique emails through NULL, inside this transaction.
            a, b = self.rng.sample(sorted(self._emails), 2)
            ia, ib = self._emails[a], self._emails[b]
            ra, rb = m[ia], m[ib]
            ra0, ra1 = dict(ra), {**ra, "email": None}
            rb1 = {**rb, "email": a}
            ra2 = {**ra1, "email": b}
            muts.append(t.mutation(t.update(ra0, ra1), t.update(rb, rb1)))
            m[ia], m[ib] = ra2, rb1
            self._emails[a], self._emails[b] = ib, ia
            return t.update(ra1, ra2)
        new = {**old, **{k: v for k, v in self._account(i).items() if k not in ("id", "email")}}
        m[i] = new
        return t.update(old, new)

    def _change_ledger(self, t: Table, muts: list[pb.TableMutation]) -> pb.RowChange | None:
        m = self.model["ledger"]
        r = self.rng.random()
        key = (self.rng.randint(0, self.keys // 10), f"s{self.rng.randint(0, 20)}")
        if key not in m:
            row = {"acct": key[0], "seq": key[1], "amount": self.rng.randint(-2**63, 2**63 - 1),
                   "note": self.rng.choice(["", "ünïcødé 🚀", "it's \\ quoted", None])}
            m[key] = row
            return t.insert(**row)
        old = m[key]
        if r < 0.4:
            del m[key]
            return t.delete(**old)
        new = {**old, "amount": self.rng.randint(-1000, 1000)}
        m[key] = new
        return t.update(old, new)

    def _change_tags(self, t: Table, muts: list[pb.TableMutation]) -> pb.RowChange | None:
        m = self.model["tags"]
        tag = f"tag{self.rng.randint(0, self.keys // 5)}"
        if tag not in m:
            row = {"tag": tag, "weight": self.rng.randint(0, 9)}
            m[tag] = row
            return t.insert(**row)
        old = m[tag]
        r = self.rng.random()
        if r < 0.4:
            del m[tag]
            return t.delete(**old)
        if r < 0.6:
            new_tag = f"tag{self.rng.randint(0, self.keys // 5)}"
            if new_tag in m:
                return None
            new = {**old, "tag": new_tag}
            del m[tag]
            m[new_tag] = new
            return t.update(old, new)
        new = {**old, "weight": self.rng.randint(0, 9)}
        m[tag] = new
        return t.update(old, new)

    def _change_events(self, t: Table, muts: list[pb.TableMutation]) -> pb.RowChange | None:
        m: list[dict[str, Any]] = self.model["events"]
        if not m or self.rng.random() < 0.5:
            row = {"kind": self.rng.choice(["a", "b", "c", None]), "n": self.rng.randint(0, self.keys)}
            m.append(row)
            return t.insert(**row)
        i = self.rng.randrange(len(m))
        old = m[i]
        if self.rng.random() < 0.5:
            del m[i]
            return t.delete(**old)
        new = {**old, "n": self.rng.randint(0, self.keys)}
        m[i] = new
        return t.update(old, new)

    def transactions(self, count: int, first_ts: int, step: int = 1) -> list[Txn]:
        """A schema-snapshot transaction at first_ts, then `count` random ones."""
        out = [schema_txn(first_ts, *self.tables)]
        for i in range(1, count + 1):
            out.append(txn(self.next_value(), first_ts + i * step))
        return out

    def expected(self, t: Table) -> list[tuple]:
        """The model's rows of t as sorted tuples of downstream (pymysql) values."""
        rows = self.model[t.name]
        rows = rows.values() if isinstance(rows, dict) else rows
        return sorted((tuple(downstream_value(r.get(c.name), c) for c in t.visible) for r in rows),
                      key=repr)


def downstream_value(v: Any, c: pb.ColumnInfo) -> Any:
    """What pymysql reads back for a value written to column c (for comparisons)."""
    if v is None:
        return None
    dt = c.data_type
    if dt == "bit":
        return v.to_bytes(max(1, (c.length + 7) // 8 if c.length else 1), "big") if isinstance(v, int) else v
    if dt == "double" or dt == "float":
        return float(v)
    if dt == "decimal":
        return decimal.Decimal(v).quantize(decimal.Decimal(1).scaleb(-c.scale))
    if dt == "json":
        return v
    return v


def fetch_rows(conn: Any, t: Table) -> list[tuple]:
    """The downstream rows of t (visible columns) sorted like RandomWorkload.expected."""
    cols = ",".join(f"`{c.name}`" for c in t.visible)
    with conn.cursor() as cur:
        cur.execute(f"SELECT {cols} FROM `{t.schema}`.`{t.name}`")
        return sorted((tuple(r) for r in cur.fetchall()), key=repr)
