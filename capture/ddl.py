"""DDL statements from the binlog -> structured effects (CREATE/ALTER/DROP/RENAME/TRUNCATE, databases).

Invariant: a statement this parser does not understand is never guessed at: it becomes an OTHER
statement (forwarded as text), or, for an ALTER whose clauses are not all understood, an ALTER
without a shape — the next TableMap of that table then declares the shape from the binlog itself
(`capture.schema`). So a wrong parse can cost a redundant schema snapshot, never wrong rows.

The parser is a tokenizer plus a small recursive reader for the subset of MySQL/MariaDB DDL that
changes table shapes. Column facts that the TableMap's FULL metadata already carries (names,
types, signedness, nullability, ENUM/SET members, the primary key) are authoritative there; what
the DDL adds is what the binlog cannot say: JSON columns on MariaDB (LONGTEXT with a json_valid
check), unique keys, column type text, generated columns.
"""
from __future__ import annotations

import dataclasses

from sluice.capture.ddl_lexer import Tok, TokenReader, Unparsed, orig_case, tokenize
from sluice.capture.table_def import TableDef, apply_alter
from sluice.proto import sluice_pb2 as pb

__all__ = ["Statement", "TableDef", "apply_alter", "parse", "tokenize"]


@dataclasses.dataclass(frozen=True)
class Statement:
    """One parsed DDL statement. `tables` are (db, table) pairs; RENAME lists (old, new) pairs."""

    tp: int                                   # pb.DDLType
    db: str = ""
    table: str = ""
    table_def: TableDef | None = None         # CREATE TABLE (columns given)
    like: tuple[str, str] | None = None       # CREATE TABLE ... LIKE db.t
    alter_ops: tuple[tuple, ...] | None = None  # ALTER: None when a clause was not understood
    new_name: tuple[str, str] | None = None   # ALTER ... RENAME TO
    drops: tuple[tuple[str, str], ...] = ()   # DROP TABLE a, b
    renames: tuple[tuple[tuple[str, str], tuple[str, str]], ...] = ()


_ALIASES = {
    "integer": "int", "int1": "tinyint", "int2": "smallint", "int3": "mediumint", "int4": "int",
    "int8": "bigint", "middleint": "mediumint", "bool": "tinyint", "boolean": "tinyint",
    "dec": "decimal", "numeric": "decimal", "fixed": "decimal", "real": "double",
    "float4": "float", "float8": "double", "character": "char", "nchar": "char",
    "nvarchar": "varchar", "long": "mediumtext", "serial": "bigint",
}
_GEOMETRY = {"geometry", "point", "linestring", "polygon", "multipoint", "multilinestring",
             "multipolygon", "geometrycollection"}
_NUMERIC = {"tinyint", "smallint", "mediumint", "int", "bigint", "float", "double", "decimal", "year"}
_TEMPORAL_FSP = {"time", "datetime", "timestamp"}


def _type_args(toks: list[Tok]) -> list[str]:
    return [t.text for t in toks if t.kind in ("number", "string")]


def _column(r: TokenReader, name: str) -> tuple[pb.ColumnInfo, bool, bool]:
    """A column definition after its name: (column, is primary key, is unique)."""
    tok = r.next()
    if tok.kind != "word":
        raise Unparsed(f"expected a type for column {name}")
    raw = tok.text.lower()
    if raw == "double" and r.accept("PRECISION"):
        pass
    if raw in ("character", "char", "national") and r.accept("VARYING"):
        raw = "varchar"
    if raw == "national":
        raw = r.next().text.lower()
    if raw == "long" and r.accept("VARCHAR", "VARBINARY"):
        raw = "mediumtext"
    data_type = _ALIASES.get(raw, raw)
    col = pb.ColumnInfo(name=name, data_type=data_type, nullable=True)
    args: list[str] = []
    arg_text = ""
    p = r.peek()
    if p is not None and p.kind == "punct" and p.text == "(":
        inner = r.skip_parens()
        args = _type_args(inner)
        if data_type in ("enum", "set"):
            col.elements.extend(t.text for t in inner if t.kind == "string")
            arg_text = "(" + ",".join("'" + e.replace("'", "''") + "'" for e in col.elements) + ")"
        else:
            arg_text = "(" + ",".join(args) + ")"
    if raw in ("bool", "boolean"):
        arg_text = "(1)"
    if data_type in ("char", "varchar", "binary", "varbinary", "bit"):
        col.length = int(args[0]) if args else 1
    elif data_type == "decimal":
        col.precision = int(args[0]) if args else 10
        col.scale = int(args[1]) if len(args) > 1 else 0
    elif data_type in ("float", "double") and len(args) > 1:
        col.precision, col.scale = int(args[0]), int(args[1])
    elif data_type in _TEMPORAL_FSP:
        col.scale = int(args[0]) if args else 0
    primary = unique = zerofill = False
    check_json = False
    while not r.at_end():
        p = r.peek()
        assert p is not None
        if (p.kind == "punct" and p.text in (",", ")")) or p.is_("FIRST", "AFTER"):
            break
        if r.accept("UNSIGNED", "ZEROFILL"):
            col.unsigned = True    # ZEROFILL implies UNSIGNED
            zerofill = zerofill or p.text == "ZEROFILL"
        elif r.accept("PERSISTENT", "STORED"):
            col.generated_stored = True
        elif r.accept("SIGNED", "BINARY", "AUTO_INCREMENT", "VIRTUAL", "ALWAYS", "GENERATED",
                      "DESC", "ASC"):
            pass
        elif r.accept("NOT"):
            r.expect("NULL")
            col.nullable = False
        elif r.accept("NULL"):
            col.nullable = True
        elif r.accept("PRIMARY"):
            r.expect("KEY")
            primary = True
            col.nullable = False
        elif r.accept("UNIQUE"):
            r.accept("KEY")
            unique = True
        elif r.accept("KEY"):
            primary = True
            col.nullable = False
        elif r.accept("CHARACTER", "CHARSET"):
            r.accept("SET")
            col.charset = r.ident().lower()
        elif r.accept("COLLATE"):
            collation = r.ident().lower()
            col.collation = collation
            if not col.charset:
                col.charset = collation.split("_")[0]
        elif r.accept("DEFAULT", "ON", "COMMENT", "INVISIBLE", "COMPRESSED", "COLUMN_FORMAT",
                      "STORAGE", "REFERENCES", "SRID", "WITH", "WITHOUT"):
            if p.text in ("ON",):
                r.accept("UPDATE")
            if p.text == "INVISIBLE":
                continue
            # the clause's value: a literal, a name, a function call or a parenthesised expression
            if not r.at_end():
                q = r.peek()
                if q is not None and q.kind == "punct" and q.text == "(":
                    r.skip_parens()
                else:
                    r.next()
                    q = r.peek()
                    if q is not None and q.kind == "punct" and q.text == "(":
                        r.skip_parens()
        elif r.accept("AS"):
            opening = r.peek()
            r.skip_parens()
            col.generated = True
            assert opening is not None
            col.generation_expression = r.text(opening, r.t[r.i - 1])
        elif r.accept("CHECK"):
            named = _json_check_column(r.skip_parens())
            if named is not None and named.lower() == col.name.lower():
                check_json = True
        elif r.accept("CONSTRAINT"):
            if not (r.peek() or Tok("word", "")).is_("CHECK"):
                r.ident()
        else:
            r.next()  # anything else about a column does not change its shape
    if check_json and data_type in ("longtext", "text", "mediumtext", "tinytext"):
        col.data_type = data_type = "json"
    if data_type == "json":
        arg_text = ""
    if data_type in _GEOMETRY:
        col.data_type = "geometry" if data_type == "geometry" else data_type
    col.column_type = f"{data_type}{arg_text}" + (" unsigned" if col.unsigned else "") + \
        (" zerofill" if zerofill and data_type in _NUMERIC else "")
    return col, primary, unique


def _index_columns(r: TokenReader) -> list[str]:
    inner = r.skip_parens()
    cols, depth, first = [], 0, True
    for t in inner:
        if t.kind == "punct":
            if t.text == "(":
                depth += 1
            elif t.text == ")":
                depth -= 1
            elif t.text == "," and depth == 0:
                first = True
            continue
        if depth == 0 and first and t.kind in ("ident", "word"):
            cols.append(orig_case(t))
            first = False
    return cols


def _index_def(r: TokenReader, table: TableDef) -> bool:
    """A table-level key/constraint at r; True if one was read (else r is unchanged)."""
    start = r.i
    constraint_name = ""
    if r.accept("CONSTRAINT"):
        p = r.peek()
        if p is not None and not p.is_("PRIMARY", "UNIQUE", "FOREIGN", "CHECK"):
            constraint_name = r.ident()
    if r.accept("PRIMARY"):
        r.expect("KEY")
        _skip_index_name_and_type(r)
        cols = _index_columns(r)
        table.indexes[:] = [i for i in table.indexes if not i.primary]
        table.indexes.insert(0, pb.IndexInfo(name="PRIMARY", columns=cols, primary=True, unique=True))
        for c in table.columns:
            if c.name.lower() in {x.lower() for x in cols}:
                c.nullable = False
        r.skip_until_comma()
        return True
    if r.accept("UNIQUE"):
        r.accept("KEY", "INDEX")
        name = _skip_index_name_and_type(r) or constraint_name
        cols = _index_columns(r)
        table.indexes.append(pb.IndexInfo(name=name or (cols[0] if cols else ""), columns=cols, unique=True))
        r.skip_until_comma()
        return True
    if r.accept("KEY", "INDEX", "FULLTEXT", "SPATIAL", "FOREIGN", "CHECK", "PERIOD", "SYSTEM"):
        if r.t[r.i - 1].text == "CHECK":
            named = _json_check_column(r.skip_parens())
            if named is not None:
                c = table.column(named)
                if c is not None and c.data_type.endswith("text"):
                    c.data_type, c.column_type = "json", "json"
        r.skip_until_comma()
        return True
    r.i = start
    return False


def _json_check_column(inner: list[Tok]) -> str | None:
    """The column of a CHECK clause that starts with `json_valid(<column>)`, else None: the
    rule core/table.py applies to information_schema, so both readers type a column alike.
    Words elsewhere in the clause do not count: `NOT json_valid(j)` (MariaDB prints
    `!json_valid(`j`)`) is a text column that must NOT hold JSON."""
    if (len(inner) >= 4 and inner[0].is_("JSON_VALID") and inner[1].kind == "punct"
            and inner[1].text == "(" and inner[2].kind in ("word", "ident")
            and inner[3].kind == "punct" and inner[3].text == ")"):
        return orig_case(inner[2])
    return None


def _skip_index_name_and_type(r: TokenReader) -> str:
    name = ""
    p = r.peek()
    if p is not None and not (p.kind == "punct" and p.text == "("):
        if p.is_("USING"):
            r.next()
            r.next()
        else:
            name = r.ident()
            if r.accept("USING"):
                r.next()
    return name


def _create_body(r: TokenReader) -> TableDef:
    table = TableDef([], [])
    r.expect_punct("(")
    while True:
        if not _index_def(r, table):
            name = r.ident()
            col, primary, unique = _column(r, name)
            table.columns.append(col)
            if primary:
                table.indexes[:] = [i for i in table.indexes if not i.primary]
                table.indexes.insert(0, pb.IndexInfo(name="PRIMARY", columns=[name], primary=True, unique=True))
            elif unique:
                table.indexes.append(pb.IndexInfo(name=name, columns=[name], unique=True))
        if r.accept_punct(","):
            continue
        r.expect_punct(")")
        break
    while not r.at_end():
        if r.accept("DEFAULT"):
            continue
        if r.accept("CHARACTER", "CHARSET"):
            r.accept("SET")
            r.accept_punct("=")
            table.charset = r.ident().lower()
        elif r.accept("COLLATE"):
            r.accept_punct("=")
            table.collation = r.ident().lower()
            if not table.charset:
                table.charset = table.collation.split("_")[0]
        else:
            r.next()
    return table


def _alter_ops(r: TokenReader, default_db: str) -> tuple[list[tuple], tuple[str, str] | None]:
    ops: list[tuple] = []
    new_name = None
    while not r.at_end():
        if r.accept("ADD"):
            p = r.peek()
            if p is not None and p.is_("CONSTRAINT", "PRIMARY", "UNIQUE", "KEY", "INDEX", "FULLTEXT",
                                       "SPATIAL", "FOREIGN", "CHECK"):
                probe = TableDef([], [])
                if not _index_def(r, probe):
                    raise Unparsed("ADD constraint")
                ops.append(("add_index", probe.indexes))
            else:
                r.accept("COLUMN")
                _if_not_exists(r)
                if r.accept_punct("("):
                    while True:
                        n = r.ident()
                        col, primary, unique = _column(r, n)
                        ops.append(("add", col, None, primary, unique))
                        if not r.accept_punct(","):
                            break
                    r.expect_punct(")")
                else:
                    n = r.ident()
                    col, primary, unique = _column(r, n)
                    ops.append(("add", col, _placement(r), primary, unique))
        elif r.accept("DROP"):
            if r.accept("PRIMARY"):
                r.expect("KEY")
                ops.append(("drop_pk",))
            elif r.accept("INDEX", "KEY"):
                _if_exists(r)
                ops.append(("drop_index", r.ident()))
            elif r.accept("FOREIGN", "CHECK", "CONSTRAINT"):
                if r.t[r.i - 1].text == "FOREIGN":
                    r.expect("KEY")
                _if_exists(r)
                ops.append(("drop_index", r.ident()))
            else:
                r.accept("COLUMN")
                _if_exists(r)
                ops.append(("drop", r.ident()))
        elif r.accept("MODIFY"):
            r.accept("COLUMN")
            _if_exists(r)
            n = r.ident()
            col, primary, unique = _column(r, n)
            ops.append(("modify", n, col, _placement(r), primary, unique))
        elif r.accept("CHANGE"):
            r.accept("COLUMN")
            _if_exists(r)
            old = r.ident()
            n = r.ident()
            col, primary, unique = _column(r, n)
            ops.append(("modify", old, col, _placement(r), primary, unique))
        elif r.accept("RENAME"):
            if r.accept("COLUMN"):
                old = r.ident()
                r.expect("TO")
                ops.append(("rename_col", old, r.ident()))
            elif r.accept("INDEX", "KEY"):
                old = r.ident()
                r.expect("TO")
                ops.append(("rename_index", old, r.ident()))
            else:
                r.accept("TO", "AS")
                new_name = r.name(default_db)
        elif r.accept("ALTER"):
            r.accept("COLUMN")
            r.ident()
            r.skip_until_comma()   # SET/DROP DEFAULT: no shape change
        elif r.accept("ENGINE", "AUTO_INCREMENT", "COMMENT", "ROW_FORMAT", "ALGORITHM", "LOCK",
                      "FORCE", "KEY_BLOCK_SIZE", "STATS_PERSISTENT", "PAGE_CHECKSUM",
                      "TRANSACTIONAL", "ORDER", "ENABLE", "DISABLE", "DEFAULT"):
            r.skip_until_comma()
        elif r.accept("CONVERT", "CHARACTER", "CHARSET", "COLLATE"):
            # CONVERT TO CHARACTER SET changes column charsets: let the TableMap say so.
            raise Unparsed("charset conversion")
        else:
            raise Unparsed(f"ALTER clause {r.peek()}")
        if not r.accept_punct(","):
            break
    return ops, new_name


def _placement(r: TokenReader) -> tuple[str, str] | None:
    if r.accept("FIRST"):
        return ("first", "")
    if r.accept("AFTER"):
        return ("after", r.ident())
    return None


def _if_exists(r: TokenReader) -> None:
    if r.accept("IF"):
        r.expect("EXISTS")


def _if_not_exists(r: TokenReader) -> None:
    if r.accept("IF"):
        r.expect("NOT")
        r.expect("EXISTS")


def parse(sql: str, default_db: str) -> Statement | None:
    """The DDL effect of a query, or None when the query is not DDL we track (BEGIN, grants...).

    Raises nothing: a DDL statement it cannot read becomes OTHER (or an ALTER without ops).
    """
    toks = tokenize(sql)
    r = TokenReader(toks, sql)
    try:
        return _statement(r, default_db)
    except (Unparsed, IndexError, ValueError):
        first = toks[0].text if toks else ""
        if first == "ALTER" and len(toks) > 2 and toks[1].is_("TABLE", "ONLINE", "IGNORE"):
            r = TokenReader(toks)
            r.expect("ALTER")
            r.accept("ONLINE")
            r.accept("IGNORE")
            try:
                r.expect("TABLE")
                _if_exists(r)
                db, table = r.name(default_db)
                return Statement(pb.ALTER_TABLE, db, table, alter_ops=None)
            except (Unparsed, IndexError):
                pass
        if first in ("CREATE", "ALTER", "DROP", "RENAME", "TRUNCATE"):
            return Statement(pb.OTHER, default_db)
        return None


def _statement(r: TokenReader, default_db: str) -> Statement | None:
    if r.accept("CREATE"):
        r.accept("OR") and r.expect("REPLACE")
        if r.accept("TEMPORARY"):
            return None   # never in a ROW binlog's data; nothing downstream to track
        if r.accept("DATABASE", "SCHEMA"):
            _if_not_exists(r)
            return Statement(pb.CREATE_DATABASE, r.ident())
        unique = r.accept("UNIQUE")
        r.accept("FULLTEXT", "SPATIAL")
        if r.accept("INDEX"):
            _if_not_exists(r)
            name = r.ident()
            r.expect("ON")
            db, table = r.name(default_db)
            cols = _index_columns(r)
            idx = [pb.IndexInfo(name=name, columns=cols, unique=True)] if unique else []
            return Statement(pb.ALTER_TABLE, db, table, alter_ops=(("add_index", idx),))
        if not r.accept("TABLE"):
            return Statement(pb.OTHER, default_db)
        _if_not_exists(r)
        db, table = r.name(default_db)
        if r.accept("LIKE"):
            return Statement(pb.CREATE_TABLE, db, table, like=r.name(default_db))
        p = r.peek()
        if p is not None and p.kind == "punct" and p.text == "(":
            # "CREATE TABLE t (a int) SELECT ..." or "CREATE TABLE t (SELECT ...)": the TableMap
            # of the inserted rows declares the shape.
            q = r.peek(1)
            if q is not None and q.is_("SELECT", "WITH"):
                return Statement(pb.CREATE_TABLE, db, table)
            body_start = r.i
            tdef = _create_body(r)
            if any(t.is_("SELECT") for t in r.t[body_start:r.i]):
                # "CREATE TABLE t (a int) SELECT b ...": the SELECT adds columns the body does
                # not list; the TableMap of the inserted rows declares the shape.
                return Statement(pb.CREATE_TABLE, db, table)
            return Statement(pb.CREATE_TABLE, db, table, table_def=tdef)
        return Statement(pb.CREATE_TABLE, db, table)   # CREATE TABLE ... AS SELECT
    if r.accept("ALTER"):
        r.accept("ONLINE")
        r.accept("IGNORE")
        if r.accept("DATABASE", "SCHEMA"):
            return Statement(pb.OTHER, default_db)
        if not r.accept("TABLE"):
            return Statement(pb.OTHER, default_db)
        _if_exists(r)
        db, table = r.name(default_db)
        ops, new_name = _alter_ops(r, default_db)
        return Statement(pb.ALTER_TABLE, db, table, alter_ops=tuple(ops), new_name=new_name)
    if r.accept("DROP"):
        if r.accept("DATABASE", "SCHEMA"):
            _if_exists(r)
            return Statement(pb.DROP_DATABASE, r.ident())
        if r.accept("TEMPORARY"):
            return None
        if r.accept("INDEX"):
            _if_exists(r)
            name = r.ident()
            r.expect("ON")
            db, table = r.name(default_db)
            return Statement(pb.ALTER_TABLE, db, table, alter_ops=(("drop_index", name),))
        if not r.accept("TABLE"):
            return Statement(pb.OTHER, default_db)
        _if_exists(r)
        drops = [r.name(default_db)]
        while r.accept_punct(","):
            drops.append(r.name(default_db))
        return Statement(pb.DROP_TABLE, drops[0][0], drops[0][1], drops=tuple(drops))
    if r.accept("RENAME"):
        if not r.accept("TABLE", "TABLES"):
            return Statement(pb.OTHER, default_db)
        pairs = []
        while True:
            old = r.name(default_db)
            r.expect("TO")
            pairs.append((old, r.name(default_db)))
            if not r.accept_punct(","):
                break
        return Statement(pb.RENAME_TABLE, pairs[0][1][0], pairs[0][1][1], renames=tuple(pairs))
    if r.accept("TRUNCATE"):
        r.accept("TABLE")
        db, table = r.name(default_db)
        return Statement(pb.TRUNCATE_TABLE, db, table)
    return None
