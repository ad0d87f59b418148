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
import re

from sluice.proto import sluice_pb2 as pb

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<comment>/\*(?![!M]).*?\*/|--[ \t][^\n]*|\#[^\n]*)
  | (?P<exec>/\*M?!\d*)            # executable comment opener: its content is code
  | (?P<execend>\*/)
  | (?P<quoted>`(?:[^`]|``)*`)
  | (?P<string>'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.|"")*")
  | (?P<number>\d+(?:\.\d+)?)
  | (?P<word>[A-Za-z_$@][\w$@]*)
  | (?P<punct>.)
""", re.VERBOSE | re.DOTALL)


@dataclasses.dataclass(frozen=True, slots=True)
class Tok:
    kind: str      # ident | string | number | word | punct
    text: str      # identifiers unquoted, words upper-cased, strings unescaped
    # Where the token is in the statement (end exclusive): an expression is kept as written.
    start: int = dataclasses.field(default=-1, compare=False)
    end: int = dataclasses.field(default=-1, compare=False)

    def is_(self, *words: str) -> bool:
        return self.kind == "word" and self.text in words


def _unescape(s: str) -> str:
    q, body = s[0], s[1:-1]
    body = body.replace(q + q, q)
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t", "0": "\0", "r": "\r"}.get(m.group(1), m.group(1)), body)


# ------------------------------------------------------------------------------------------------
# results
# ------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class TableDef:
    """A table shape as DDL describes it (mutable while ALTERs are applied)."""

    columns: list[pb.ColumnInfo]
    indexes: list[pb.IndexInfo]
    charset: str = ""
    collation: str = ""

    def copy(self) -> TableDef:
        return TableDef([_copy(c) for c in self.columns], [_copy(i) for i in self.indexes], self.charset,
                        self.collation)

    def column(self, name: str) -> pb.ColumnInfo | None:
        low = name.lower()
        return next((c for c in self.columns if c.name.lower() == low), None)


def _copy(m):  # type: ignore[no-untyped-def]
    n = type(m)()
    n.CopyFrom(m)
    return n


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


# ------------------------------------------------------------------------------------------------
# the reader
# ------------------------------------------------------------------------------------------------

class _Unparsed(Exception):
    pass


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


class _Reader:
    def __init__(self, toks: list[Tok], sql: str = "") -> None:
        self.t = toks
        self.i = 0
        self.sql = sql

    def text(self, first: Tok, last: Tok) -> str:
        """The statement's own text from first to last (inclusive); empty when unknown."""
        if not self.sql or first.start < 0 or last.end < first.start:
            return ""
        return self.sql[first.start:last.end]

    def peek(self, k: int = 0) -> Tok | None:
        j = self.i + k
        return self.t[j] if j < len(self.t) else None

    def next(self) -> Tok:
        tok = self.peek()
        if tok is None:
            raise _Unparsed("unexpected end")
        self.i += 1
        return tok

    def accept(self, *words: str) -> bool:
        tok = self.peek()
        if tok is not None and tok.is_(*words):
            self.i += 1
            return True
        return False

    def accept_punct(self, p: str) -> bool:
        tok = self.peek()
        if tok is not None and tok.kind == "punct" and tok.text == p:
            self.i += 1
            return True
        return False

    def expect(self, *words: str) -> None:
        if not self.accept(*words):
            raise _Unparsed(f"expected {words}")

    def expect_punct(self, p: str) -> None:
        if not self.accept_punct(p):
            raise _Unparsed(f"expected {p!r}")

    def at_end(self) -> bool:
        tok = self.peek()
        return tok is None or (tok.kind == "punct" and tok.text == ";")

    def ident(self) -> str:
        tok = self.next()
        if tok.kind == "ident":
            return tok.text
        if tok.kind == "word":
            return _orig_case(tok)
        if tok.kind == "string":  # MySQL accepts 'x' as a name in a few places
            return tok.text
        raise _Unparsed(f"expected a name, got {tok.text!r}")

    def name(self, default_db: str) -> tuple[str, str]:
        first = self.ident()
        if self.accept_punct("."):
            return first, self.ident()
        return default_db, first

    def skip_parens(self) -> list[Tok]:
        """Consume a balanced '( ... )' and return its inner tokens."""
        self.expect_punct("(")
        depth, start = 1, self.i
        while depth:
            tok = self.next()
            if tok.kind == "punct":
                depth += {"(": 1, ")": -1}.get(tok.text, 0)
        return self.t[start:self.i - 1]

    def skip_until_comma(self) -> None:
        """Skip to the next top-level ',' or ')' (not consumed) or the end."""
        depth = 0
        while not self.at_end():
            tok = self.peek()
            assert tok is not None
            if tok.kind == "punct":
                if tok.text == "(":
                    depth += 1
                elif tok.text == ")":
                    if depth == 0:
                        return
                    depth -= 1
                elif tok.text == "," and depth == 0:
                    return
            self.i += 1


def _orig_case(tok: Tok) -> str:
    """A name as written: bare words keep their original spelling for names."""
    return tok.orig if isinstance(tok, _Word) else tok.text


class _Word(Tok):
    """A bare word: upper-cased for keyword checks, original spelling kept for names."""

    __slots__ = ("orig",)

    def __init__(self, text: str, start: int = -1, end: int = -1) -> None:
        super().__init__("word", text.upper(), start, end)
        object.__setattr__(self, "orig", text)


def tokenize(sql: str) -> list[Tok]:
    toks: list[Tok] = []
    for m in _TOKEN.finditer(sql):
        kind = m.lastgroup
        text = m.group()
        if kind in ("ws", "comment", "exec", "execend"):
            continue
        a, b = m.span()
        if kind == "quoted":
            toks.append(Tok("ident", text[1:-1].replace("``", "`"), a, b))
        elif kind == "string":
            toks.append(Tok("string", _unescape(text), a, b))
        elif kind == "word":
            toks.append(_Word(text, a, b))
        else:
            toks.append(Tok(kind or "punct", text, a, b))
    return toks


def _type_args(toks: list[Tok]) -> list[str]:
    return [t.text for t in toks if t.kind in ("number", "string")]


def _column(r: _Reader, name: str) -> tuple[pb.ColumnInfo, bool, bool]:
    """A column definition after its name: (column, is primary key, is unique)."""
    tok = r.next()
    if tok.kind != "word":
        raise _Unparsed(f"expected a type for column {name}")
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


def _index_columns(r: _Reader) -> list[str]:
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
            cols.append(_orig_case(t))
            first = False
    return cols


def _index_def(r: _Reader, table: TableDef) -> bool:
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
        return _orig_case(inner[2])
    return None


def _skip_index_name_and_type(r: _Reader) -> str:
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


def _create_body(r: _Reader) -> TableDef:
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


def _alter_ops(r: _Reader, default_db: str) -> tuple[list[tuple], tuple[str, str] | None]:
    ops: list[tuple] = []
    new_name = None
    while not r.at_end():
        if r.accept("ADD"):
            p = r.peek()
            if p is not None and p.is_("CONSTRAINT", "PRIMARY", "UNIQUE", "KEY", "INDEX", "FULLTEXT",
                                       "SPATIAL", "FOREIGN", "CHECK"):
                probe = TableDef([], [])
                if not _index_def(r, probe):
                    raise _Unparsed("ADD constraint")
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
            raise _Unparsed("charset conversion")
        else:
            raise _Unparsed(f"ALTER clause {r.peek()}")
        if not r.accept_punct(","):
            break
    return ops, new_name


def _placement(r: _Reader) -> tuple[str, str] | None:
    if r.accept("FIRST"):
        return ("first", "")
    if r.accept("AFTER"):
        return ("after", r.ident())
    return None


def _if_exists(r: _Reader) -> None:
    if r.accept("IF"):
        r.expect("EXISTS")


def _if_not_exists(r: _Reader) -> None:
    if r.accept("IF"):
        r.expect("NOT")
        r.expect("EXISTS")


def parse(sql: str, default_db: str) -> Statement | None:
    """The DDL effect of a query, or None when the query is not DDL we track (BEGIN, grants...).

    Raises nothing: a DDL statement it cannot read becomes OTHER (or an ALTER without ops).
    """
    toks = tokenize(sql)
    r = _Reader(toks, sql)
    try:
        return _statement(r, default_db)
    except (_Unparsed, IndexError, ValueError):
        first = toks[0].text if toks else ""
        if first == "ALTER" and len(toks) > 2 and toks[1].is_("TABLE", "ONLINE", "IGNORE"):
            r = _Reader(toks)
            r.expect("ALTER")
            r.accept("ONLINE")
            r.accept("IGNORE")
            try:
                r.expect("TABLE")
                _if_exists(r)
                db, table = r.name(default_db)
                return Statement(pb.ALTER_TABLE, db, table, alter_ops=None)
            except (_Unparsed, IndexError):
                pass
        if first in ("CREATE", "ALTER", "DROP", "RENAME", "TRUNCATE"):
            return Statement(pb.OTHER, default_db)
        return None


def _statement(r: _Reader, default_db: str) -> Statement | None:
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


def apply_alter(tdef: TableDef, ops: tuple[tuple, ...]) -> TableDef:
    """The shape after ALTER ops; raises KeyError when an op names a column the shape lacks.

    Idempotent for additions: ADD of a column or key the shape already has replaces it, so a
    statement replayed against a model that already reflects it leaves the model unchanged.
    """
    t = tdef.copy()

    def index_of(name: str) -> int:
        low = name.lower()
        for i, c in enumerate(t.columns):
            if c.name.lower() == low:
                return i
        raise KeyError(name)

    def place(col: pb.ColumnInfo, where: tuple[str, str] | None, default: int) -> None:
        if where is None:
            t.columns.insert(default, col)
        elif where[0] == "first":
            t.columns.insert(0, col)
        else:
            t.columns.insert(index_of(where[1]) + 1, col)

    def set_pk(name: str) -> None:
        t.indexes[:] = [i for i in t.indexes if not i.primary]
        t.indexes.insert(0, pb.IndexInfo(name="PRIMARY", columns=[name], primary=True, unique=True))

    def add_unique(idx: pb.IndexInfo) -> None:
        t.indexes[:] = [i for i in t.indexes if i.primary or i.name.lower() != idx.name.lower()]
        t.indexes.append(idx)

    for op in ops:
        kind = op[0]
        if kind == "add":
            _, col, where, primary, unique = op
            try:
                # Already there: the model is newer than this statement (seeded from SHOW CREATE
                # TABLE after a restart behind the source). Re-applying must not duplicate it.
                existing = index_of(col.name)
            except KeyError:
                place(col, where, len(t.columns))
            else:
                del t.columns[existing]
                place(col, where, existing)
            if primary:
                set_pk(col.name)
            elif unique:
                add_unique(pb.IndexInfo(name=col.name, columns=[col.name], unique=True))
        elif kind == "drop":
            i = index_of(op[1])
            name = t.columns[i].name.lower()
            del t.columns[i]
            for idx in list(t.indexes):
                if any(c.lower() == name for c in idx.columns):
                    kept = [c for c in idx.columns if c.lower() != name]
                    if kept:
                        del idx.columns[:]
                        idx.columns.extend(kept)
                    else:
                        t.indexes.remove(idx)
        elif kind == "modify":
            _, old, col, where, primary, unique = op
            i = index_of(old)
            old_name = t.columns[i].name
            del t.columns[i]
            place(col, where, i)
            if old_name != col.name:
                for idx in t.indexes:
                    cols = [col.name if c.lower() == old_name.lower() else c for c in idx.columns]
                    del idx.columns[:]
                    idx.columns.extend(cols)
            if primary:
                set_pk(col.name)
        elif kind == "rename_col":
            i = index_of(op[1])
            old_name = t.columns[i].name
            t.columns[i].name = op[2]
            for idx in t.indexes:
                cols = [op[2] if c.lower() == old_name.lower() else c for c in idx.columns]
                del idx.columns[:]
                idx.columns.extend(cols)
        elif kind == "add_index":
            for idx in op[1]:
                if idx.primary:
                    t.indexes[:] = [i for i in t.indexes if not i.primary]
                    t.indexes.insert(0, idx)
                elif idx.unique:
                    add_unique(idx)
        elif kind == "drop_pk":
            t.indexes[:] = [i for i in t.indexes if not i.primary]
        elif kind == "drop_index":
            t.indexes[:] = [i for i in t.indexes if i.name.lower() != op[1].lower() or i.primary]
        elif kind == "rename_index":
            for idx in t.indexes:
                if idx.name.lower() == op[1].lower():
                    idx.name = op[2]
    return t
