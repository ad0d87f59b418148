"""Table shapes of the captured source: TableMap FULL metadata merged with parsed DDL.

Invariant: rows are always encoded with a shape whose columns are exactly the TableMap's columns
(names, order, types, signedness) of the rows event being encoded, and that shape has been
declared downstream (a schema snapshot or a DDL carrying it) in the same or an earlier committed
transaction of this capture run.

- Column facts come from the TableMap (FULL metadata), never from a later information_schema
  read, which would race with the replication lag. DDL adds what the binlog cannot say (JSON on
  MariaDB, unique keys, type text); it is merged per column only where the types agree.
- Table ids are stable per (source, db, table): a 63-bit hash of the three, so they survive
  restarts without any state; RENAME gives the new name its own id (DESIGN §8).
- Versions are the transaction's file position ((file_seq << 40) | offset), so a shape declared
  when a transaction is re-read after a crash gets the same version.
"""
from __future__ import annotations

import codecs
import dataclasses
import functools
import hashlib
import logging
import re
from collections.abc import Iterable

from pymysqlreplication.constants import CHARSET
from pymysqlreplication.constants import FIELD_TYPE as FT

from sluice.capture import ddl as ddlmod
from sluice.capture.types import BinColumn, RowDecoder, UndecodableRow, native_spec, sluice_native
from sluice.proto import sluice_pb2 as pb
from sluice.core.log import kv

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=65536)   # a pure function of names, asked at every TableMap
def stable_table_id(source: str, db: str, table: str) -> int:
    digest = hashlib.blake2b(f"{source}\0{db}\0{table}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") & ((1 << 63) - 1)) or 1


def version_of(file_seq: int, offset: int) -> int:
    return (file_seq << 40) | offset


class TableFilter:
    """Which tables are captured: include/exclude regexes (full match) on db and on "db.table";
    the loop-control mark table (`ignored`) is never captured, and a transaction touching it is
    dropped whole (core/marks.py); the signal table always is (`always`), and the capture strips
    it from what it writes."""

    def __init__(self, include_databases: Iterable[str] = (), exclude_databases: Iterable[str] = (),
                 include_tables: Iterable[str] = (), exclude_tables: Iterable[str] = (),
                 ignored: Iterable[str] = (), always: Iterable[str] = ()) -> None:
        def comp(xs: Iterable[str]) -> list[re.Pattern[str]]:
            return [re.compile(x) for x in xs]
        self._inc_db, self._exc_db = comp(include_databases), comp(exclude_databases)
        self._inc_t, self._exc_t = comp(include_tables), comp(exclude_tables)
        self._ignored = {x for x in ignored if x}
        # Decoded whatever the filters say (the signal table: its rows are read, then stripped).
        self._always = {x for x in always if x}
        self._cache: dict[tuple[str, str], bool] = {}

    def captures(self, db: str, table: str) -> bool:
        key = (db, table)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._decide(db, table)
        return hit

    def marks(self, db: str, table: str) -> bool:
        """Whether db.table is a loop-control mark table: a transaction touching it is dropped."""
        return bool(self._ignored) and f"{db}.{table}" in self._ignored

    @property
    def has_marks(self) -> bool:
        return bool(self._ignored)

    def captures_db(self, db: str) -> bool:
        if db in ("mysql", "information_schema", "performance_schema", "sys"):
            return False
        if self._inc_db and not any(p.fullmatch(db) for p in self._inc_db):
            return False
        return not any(p.fullmatch(db) for p in self._exc_db)

    def _decide(self, db: str, table: str) -> bool:
        full = f"{db}.{table}"
        if full in self._always:
            return True
        if full in self._ignored or not self.captures_db(db):
            return False
        if self._inc_t and not any(p.fullmatch(full) for p in self._inc_t):
            return False
        return not any(p.fullmatch(full) for p in self._exc_t)


# ------------------------------------------------------------------------------------------------
# TableMap -> columns
# ------------------------------------------------------------------------------------------------

_INT_NAMES = {FT.TINY: "tinyint", FT.SHORT: "smallint", FT.INT24: "mediumint", FT.LONG: "int",
              FT.LONGLONG: "bigint"}
_BLOB_NAMES = {1: ("tinytext", "tinyblob"), 2: ("text", "blob"), 3: ("mediumtext", "mediumblob"),
               4: ("longtext", "longblob")}


def _bin_column(c: object) -> BinColumn:
    g = c.__dict__.get
    return BinColumn(type=c.type, max_length=g("max_length", 0) or 0, size=g("size", 0) or 0,  # type: ignore[attr-defined]
                     length_size=g("length_size", 0) or 0, fsp=g("fsp", 0) or 0,
                     precision=g("precision", 0) or 0, decimals=g("decimals", 0) or 0,
                     bits=g("bits", 0) or 0)


def _encoding(c: object, dbms: str) -> tuple[str | None, str]:
    """(python codec or None for binary, charset name) of a character column."""
    collation = getattr(c, "collation_name", None)
    enc = getattr(c, "character_set_name", None)
    if collation == "binary" or enc is None:
        return None, "binary" if collation == "binary" else ""
    charset_name = collation.split("_")[0] if collation else enc
    if charset_name == "latin1":
        enc = "cp1252"   # MySQL's latin1 is Windows-1252
    try:
        codecs.lookup(enc)
    except LookupError:
        raise UndecodableRow(f"column {c.name}: character set {charset_name} has no Python codec") from None  # type: ignore[attr-defined]
    return enc, charset_name


def map_columns(event: object) -> tuple[list[pb.ColumnInfo], list[BinColumn], list[str | None], list[str]]:
    """ColumnInfo, binary layout and text codec per column, and primary-key column names."""
    cols: list[pb.ColumnInfo] = []
    bins: list[BinColumn] = []
    encs: list[str | None] = []
    nullmask = event.null_bitmask  # type: ignore[attr-defined]
    dbms = getattr(event, "dbms", "mariadb") or "mariadb"
    for i, c in enumerate(event.columns):  # type: ignore[attr-defined]
        if not c.name:
            raise UndecodableRow(f"{event.schema}.{event.table}: the TableMap has no column names "  # type: ignore[attr-defined]
                                 "(set binlog_row_metadata=FULL on the source)")
        b = _bin_column(c)
        t = b.type
        enc: str | None = None
        charset = ""
        if t in (FT.VARCHAR, FT.VAR_STRING, FT.STRING, FT.BLOB, FT.ENUM, FT.SET):
            enc, charset = _encoding(c, dbms)
        ci = pb.ColumnInfo(name=c.name, nullable=bool(nullmask[i >> 3] >> (i & 7) & 1),
                           unsigned=bool(c.unsigned), charset=charset)
        if t in _INT_NAMES:
            ci.data_type = _INT_NAMES[t]
        elif t == FT.FLOAT:
            ci.data_type = "float"
        elif t == FT.DOUBLE:
            ci.data_type = "double"
        elif t == FT.NEWDECIMAL:
            ci.data_type, ci.precision, ci.scale = "decimal", b.precision, b.decimals
            ci.column_type = f"decimal({b.precision},{b.decimals})"
        elif t == FT.YEAR:
            ci.data_type = "year"
            ci.unsigned = False   # FULL metadata marks YEAR unsigned; its Datum is an int
        elif t in (FT.DATE, FT.NEWDATE):
            ci.data_type = "date"
        elif t in (FT.DATETIME, FT.DATETIME2, FT.TIMESTAMP, FT.TIMESTAMP2, FT.TIME, FT.TIME2):
            ci.data_type = {FT.DATETIME: "datetime", FT.DATETIME2: "datetime", FT.TIMESTAMP: "timestamp",
                            FT.TIMESTAMP2: "timestamp"}.get(t, "time")
            ci.scale = b.fsp
            ci.column_type = f"{ci.data_type}({b.fsp})" if b.fsp else ci.data_type
        elif t in (FT.VARCHAR, FT.VAR_STRING):
            ci.data_type, ci.length = ("varchar" if enc else "varbinary"), b.max_length
        elif t == FT.STRING:
            ci.data_type, ci.length = ("char" if enc else "binary"), b.max_length
        elif t == FT.BLOB:
            text, blob = _BLOB_NAMES.get(b.length_size, ("longtext", "longblob"))
            ci.data_type = text if enc else blob
        elif t in (FT.ENUM, FT.SET):
            ci.data_type = "enum" if t == FT.ENUM else "set"
            members = (c.enum_values or [""])[1:] if t == FT.ENUM else (c.set_values or [])
            ci.elements.extend(members)
            ci.column_type = f"{ci.data_type}(" + ",".join("'" + m.replace("'", "''") + "'" for m in members) + ")"
        elif t == FT.BIT:
            ci.data_type, ci.length = "bit", b.bits
            ci.column_type = f"bit({b.bits})"
        elif t == FT.JSON:
            ci.data_type = "json"
        elif t == FT.GEOMETRY:
            ci.data_type = "geometry"
        else:
            raise UndecodableRow(f"{event.schema}.{event.table}.{c.name}: column type code {t} is not supported")  # type: ignore[attr-defined]
        if not ci.column_type:
            ci.column_type = ci.data_type
        if ci.unsigned:
            ci.column_type += " unsigned"
        cols.append(ci)
        bins.append(b)
        encs.append(enc)
    pk_idx = getattr(event.optional_metadata, "simple_primary_key_list", None) or []  # type: ignore[attr-defined]
    prefixed = getattr(event.optional_metadata, "primary_keys_with_prefix", None) or {}  # type: ignore[attr-defined]
    pk = [cols[i].name for i in (pk_idx or sorted(prefixed)) if i < len(cols)]
    return cols, bins, encs, pk


# DDL types whose TableMap type differs: MariaDB logs JSON as LONGTEXT, spatial types as GEOMETRY,
# and its UUID / INET4 / INET6 as fixed BINARY (16 / 4 / 16 bytes, in text order): the DDL's type
# names what the bytes mean, so the sinks can render them (a UUID as its canonical text).
_SAME = {"json": {"longtext", "json"}, "geometry": {"geometry", "point", "linestring", "polygon",
         "multipoint", "multilinestring", "multipolygon", "geometrycollection", "longblob", "blob"},
         "uuid": {"binary"}, "inet4": {"binary"}, "inet6": {"binary"}}


def _compatible(map_col: pb.ColumnInfo, ddl_col: pb.ColumnInfo) -> bool:
    if ddl_col.data_type == map_col.data_type:
        return True
    return map_col.data_type in _SAME.get(ddl_col.data_type, ())


def merge(map_cols: list[pb.ColumnInfo], pk: list[str], model: ddlmod.TableDef | None) -> tuple[list[pb.ColumnInfo], list[pb.IndexInfo]]:
    """The shape rows are encoded with: the TableMap's columns, enriched from the DDL model."""
    out: list[pb.ColumnInfo] = []
    for mc in map_cols:
        dc = model.column(mc.name) if model is not None else None
        if dc is not None and _compatible(mc, dc):
            c = pb.ColumnInfo()
            c.CopyFrom(dc)
            c.name, c.unsigned, c.nullable = mc.name, mc.unsigned, mc.nullable
            if mc.charset:
                c.charset = mc.charset
            if mc.data_type in ("enum", "set"):
                del c.elements[:]
                c.elements.extend(mc.elements)
            if mc.data_type in ("varchar", "char", "varbinary", "binary", "bit"):
                c.length = mc.length
            out.append(c)
        else:
            out.append(mc)
    names = {c.name.lower() for c in out}
    indexes: list[pb.IndexInfo] = []
    if pk:
        indexes.append(pb.IndexInfo(name="PRIMARY", columns=pk, primary=True, unique=True))
    if model is not None:
        for idx in model.indexes:
            if not idx.primary and idx.unique and all(c.lower() in names for c in idx.columns):
                indexes.append(idx)
    return out, indexes


def _signature(info: pb.TableInfo) -> tuple:
    """What decoding and keying depend on: a change here needs a new declared version."""
    return (info.schema_name, info.table_name,
            tuple((c.name, c.data_type, c.unsigned, tuple(c.elements), c.scale, c.precision)
                  for c in info.columns),
            tuple((i.name, tuple(i.columns), i.primary, i.unique) for i in info.indexes))


class _ShapeKey:
    """A TableMap's column signature with its hash computed once: the key is memoised on the
    parsed-once TableMap event, and hashing the nested tuple (a dataclass hash per column) at
    every TableMap was a visible share of the capture's decode CPU."""

    __slots__ = ("value", "_hash")

    def __init__(self, value: tuple) -> None:
        self.value = value
        self._hash = hash(value)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, _ShapeKey) and self._hash == other._hash
                                 and self.value == other.value)


@dataclasses.dataclass(frozen=True, slots=True)
class TableEntry:
    """A TableMap resolved: the table's stable id, its shape and the row decoder for it."""

    table_id: int
    db: str
    table: str
    info: pb.TableInfo | None     # None when the table is not captured (filtered)
    decoder: RowDecoder | None


class SchemaTracker:
    """DDL models and declared shapes per (db, table) for one source."""

    def __init__(self, source: str, table_filter: TableFilter) -> None:
        self.source = source
        self.filter = table_filter
        self._models: dict[tuple[str, str], ddlmod.TableDef] = {}
        self._declared: dict[tuple[str, str], pb.TableInfo] = {}
        # Resolved entries by TableMap signature: a hit costs one dict lookup per TableMap.
        self._compiled: dict[_ShapeKey, TableEntry] = {}
        # The same entries by TableMap body, for the native per-transaction reader
        # (native/src/txnscan.rs): cleared with `_compiled`, so a body it knows resolves
        # exactly as `on_table_map` would (a hit, nothing to declare).
        self.scanner = sluice_native.TxnScanner()

    # -- state --------------------------------------------------------------------------------

    def reset_declared(self) -> None:
        """Nothing is known to be declared downstream (a restart or a re-read from a position)."""
        self._declared.clear()
        self._compiled.clear()
        self.scanner.clear()

    def seed(self, db: str, table: str, create_sql: str) -> None:
        """A model from SHOW CREATE TABLE (start-up): adds what only DDL says (JSON, unique keys)."""
        st = ddlmod.parse(create_sql, db)
        if st is not None and st.table_def is not None:
            self._models[(db, table)] = st.table_def

    def model(self, db: str, table: str) -> ddlmod.TableDef | None:
        return self._models.get((db, table))

    def seeded_tables(self) -> list[tuple[str, str]]:
        """Every (db, table) with a DDL model, sorted."""
        return sorted(self._models)

    def declare_seeded(self, tables: Iterable[tuple[str, str]], version: int) -> list[pb.TableInfo]:
        """Shapes of these captured tables from their DDL models, now declared downstream.

        For the schema-snapshot transaction the capture writes at its first start (and for tables
        that entered the filter while it was stopped), so a table that is never written still has
        a shape downstream. Rows are still encoded with the TableMap's shape: where it differs
        from the model's, the table's first TableMap declares it again (`on_table_map`).
        """
        out: list[pb.TableInfo] = []
        for db, table in tables:
            model = self._models.get((db, table))
            if model is None or not self.filter.captures(db, table):
                continue
            info = self._info_from_model(db, table, model, version)
            self._declared[(db, table)] = info
            out.append(info)
        return out

    def declared(self, db: str, table: str) -> pb.TableInfo | None:
        return self._declared.get((db, table))

    # -- rows ---------------------------------------------------------------------------------

    def on_table_map(self, event: object, version: int) -> tuple[TableEntry, pb.TableInfo | None]:
        """Resolve a TableMap: (entry, shape to declare in this transaction or None)."""
        db, table = event.schema, event.table  # type: ignore[attr-defined]
        tid = stable_table_id(self.source, db, table)
        if not self.filter.captures(db, table):
            return TableEntry(tid, db, table, None, None), None
        key = getattr(event, "_sluice_key", None)
        if key is None:
            key = _ShapeKey((db, table, tuple((c.type, c.name, c.unsigned, getattr(c, "collation_name", None),  # type: ignore[attr-defined]
                                               _bin_column(c), tuple(getattr(c, "enum_values", None) or ()),
                                               tuple(getattr(c, "set_values", None) or ()))
                                              for c in event.columns), bytes(event.null_bitmask)))  # type: ignore[attr-defined]
            # Kept on the event: a TableMap parsed once (capture/reader.py) hands it to the
            # events of equal bodies, which then skip this signature too.
            event._sluice_key = key  # type: ignore[attr-defined]
        hit = self._compiled.get(key)
        if hit is not None:
            return hit, None
        map_cols, bins, encs, pk = map_columns(event)
        cols, indexes = merge(map_cols, pk, self._models.get((db, table)))
        info = pb.TableInfo(table_id=tid, schema_name=db, table_name=table, columns=cols,
                            indexes=indexes, source=self.source)
        model = self._models.get((db, table))
        if model is not None:
            info.charset, info.collation = model.charset, model.collation
        declared = self._declared.get((db, table))
        to_declare = None
        if declared is not None and _signature(declared) == _signature(info):
            info = declared
        else:
            info.version = version
            self._declared[(db, table)] = info
            to_declare = info
        where = f"{db}.{table}"
        decoder = RowDecoder([native_spec(b, c, e, f"{where}.{c.name}")
                              for b, c, e in zip(bins, info.columns, encs)], where)
        entry = self._compiled[key] = TableEntry(tid, db, table, info, decoder)
        return entry, to_declare

    def learn_body(self, body: bytes, binlog_table_id: int, entry: TableEntry) -> None:
        """A TableMap body `on_table_map` resolved to `entry` (now in `_compiled`): the native
        scanner reads later transactions mapping the same body without Python. Entries with a
        decoder other than the native one (the differential tests' oracle) are not taught."""
        dec = entry.decoder
        if dec is None:
            self.scanner.learn(body, binlog_table_id, entry.table_id, entry, None,
                               self.filter.marks(entry.db, entry.table))
        elif isinstance(getattr(dec, "native", None), sluice_native.RowDecoder):
            self.scanner.learn(body, binlog_table_id, entry.table_id, entry, dec.native, False)

    # -- DDL ----------------------------------------------------------------------------------

    def on_ddl(self, query: str, default_db: str, version: int) -> list[pb.DDL]:
        """Apply one DDL query; the DDL binlogs (one per table it acts on) for captured tables."""
        st = ddlmod.parse(query, default_db)
        if st is None:
            return []
        self._compiled.clear()   # shapes may change; DDL is rare
        self.scanner.clear()
        out: list[pb.DDL] = []
        tp = st.tp
        if tp == pb.CREATE_DATABASE or tp == pb.DROP_DATABASE:
            if tp == pb.DROP_DATABASE:
                for k in [k for k in self._models if k[0] == st.db]:
                    del self._models[k]
                for k in [k for k in self._declared if k[0] == st.db]:
                    del self._declared[k]
            if self.filter.captures_db(st.db):
                out.append(pb.DDL(tp=tp, schema_name=st.db, query=query))
            return out
        if tp == pb.OTHER:
            if self.filter.captures_db(st.db or default_db):
                out.append(pb.DDL(tp=tp, schema_name=st.db or default_db, query=query))
            return out
        if tp == pb.CREATE_TABLE:
            model = st.table_def
            if model is None and st.like is not None:
                src = self._models.get(st.like)
                model = src.copy() if src is not None else None
            self._set_model(st.db, st.table, model)
            return self._table_ddl(tp, st.db, st.table, query, version)
        if tp == pb.ALTER_TABLE:
            key = (st.db, st.table)
            model = self._models.get(key)
            new_model = None
            if model is not None and st.alter_ops is not None:
                try:
                    new_model = ddlmod.apply_alter(model, st.alter_ops)
                except (KeyError, ValueError) as e:
                    log.warning("ALTER names an unknown column; shape will come from the next TableMap",
                                extra=kv(table=f"{st.db}.{st.table}", column=str(e)))
            self._set_model(st.db, st.table, new_model)
            if st.new_name is not None:
                return self._rename(((st.db, st.table), st.new_name), query, version, new_model)
            return self._table_ddl(tp, st.db, st.table, query, version)
        if tp == pb.DROP_TABLE:
            for db, table in st.drops:
                self._models.pop((db, table), None)
                was = self._declared.pop((db, table), None)
                if self.filter.captures(db, table):
                    d = pb.DDL(tp=tp, schema_name=db, table_name=table, query=query,
                               table_id=stable_table_id(self.source, db, table))
                    if was is not None:
                        d.table_id = was.table_id
                    out.append(d)
            return out
        if tp == pb.RENAME_TABLE:
            for old, new in st.renames:
                out.extend(self._rename((old, new), query, version, self._models.get(old)))
            return out
        if tp == pb.TRUNCATE_TABLE:
            return self._table_ddl(tp, st.db, st.table, query, version)
        return out

    def _set_model(self, db: str, table: str, model: ddlmod.TableDef | None) -> None:
        if model is None:
            self._models.pop((db, table), None)
        else:
            self._models[(db, table)] = model

    def _info_from_model(self, db: str, table: str, model: ddlmod.TableDef, version: int) -> pb.TableInfo:
        return pb.TableInfo(table_id=stable_table_id(self.source, db, table), schema_name=db,
                            table_name=table, version=version, columns=model.columns,
                            indexes=model.indexes, charset=model.charset, collation=model.collation,
                            source=self.source)

    def _table_ddl(self, tp: int, db: str, table: str, query: str, version: int) -> list[pb.DDL]:
        if not self.filter.captures(db, table):
            return []
        d = pb.DDL(tp=tp, schema_name=db, table_name=table, query=query,
                   table_id=stable_table_id(self.source, db, table))
        model = self._models.get((db, table))
        if tp == pb.TRUNCATE_TABLE:
            declared = self._declared.get((db, table))
            if declared is not None:
                d.table_info.CopyFrom(declared)
            return [d]
        if model is not None:
            info = self._info_from_model(db, table, model, version)
            d.table_info.CopyFrom(info)
            self._declared[(db, table)] = info
        else:
            self._declared.pop((db, table), None)
        return [d]

    def _rename(self, pair: tuple[tuple[str, str], tuple[str, str]], query: str, version: int,
                model: ddlmod.TableDef | None) -> list[pb.DDL]:
        (odb, otable), (ndb, ntable) = pair
        self._models.pop((odb, otable), None)
        declared = self._declared.pop((odb, otable), None)
        if model is not None:
            self._models[(ndb, ntable)] = model
        if not self.filter.captures(ndb, ntable):
            if self.filter.captures(odb, otable):
                # Leaving the filter: downstream sees the table go away.
                return [pb.DDL(tp=pb.DROP_TABLE, schema_name=odb, table_name=otable, query=query,
                               table_id=stable_table_id(self.source, odb, otable))]
            return []
        d = pb.DDL(tp=pb.RENAME_TABLE, schema_name=ndb, table_name=ntable, query=query,
                   old_schema_name=odb, old_table_name=otable,
                   table_id=stable_table_id(self.source, ndb, ntable))
        info: pb.TableInfo | None = None
        if model is not None:
            info = self._info_from_model(ndb, ntable, model, version)
        elif declared is not None:
            info = pb.TableInfo()
            info.CopyFrom(declared)
            info.table_id = d.table_id
            info.schema_name, info.table_name, info.version = ndb, ntable, version
        if info is not None:
            d.table_info.CopyFrom(info)
            self._declared[(ndb, ntable)] = info
        return [d]
