"""DDL parsing (capture/ddl.py) and its effect on the capture's schema tracker.

The parser's invariant: a statement it does not understand is never guessed at — it becomes an
OTHER statement, or an ALTER without a shape (alter_ops None), so a wrong parse can cost a
redundant schema snapshot, never wrong rows. These tests pin what it does understand.
"""
from __future__ import annotations

import pytest

from sluice.capture import ddl
from sluice.capture.schema import SchemaTracker, TableFilter, stable_table_id
from sluice.proto import sluice_pb2 as pb

ALL_TYPES = """CREATE TABLE IF NOT EXISTS `shop`.`all types` (
  `id` BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  ti TINYINT(4) DEFAULT '0', si SMALLINT UNSIGNED ZEROFILL, mi MEDIUMINT, i INT(11) NOT NULL DEFAULT 5,
  ig INTEGER, zf INT ZEROFILL, b BOOL, bo BOOLEAN,
  d DECIMAL(65,30), n NUMERIC(10), dd DEC, f FLOAT(7,3), dbl DOUBLE PRECISION, r REAL,
  c CHAR(10) CHARACTER SET latin1 COLLATE latin1_bin, vc VARCHAR(300) COLLATE utf8mb4_bin,
  cv CHARACTER VARYING(20), bn BINARY(4), vb VARBINARY(10),
  tt TINYTEXT, t TEXT, mt MEDIUMTEXT, lt LONGTEXT, tb TINYBLOB, bl BLOB, mb MEDIUMBLOB, lb LONGBLOB,
  dt DATE, tm TIME(3), dtm DATETIME(6) DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
  ts TIMESTAMP NULL DEFAULT NULL, y YEAR,
  e ENUM('a','b''c','d,e') NOT NULL, s SET('x','y') DEFAULT 'x', bt BIT(12),
  j JSON, jm LONGTEXT CHECK (json_valid(jm)),
  g GEOMETRY, p POINT NOT NULL, gen INT AS (i + 1) VIRTUAL, cmt VARCHAR(5) COMMENT 'a, b (c)',
  u VARCHAR(20) UNIQUE,
  PRIMARY KEY (`id`), UNIQUE KEY `uk_c_vc` (c, vc(10)), KEY idx_i (i), INDEX (mi), FULLTEXT KEY ft (t),
  CONSTRAINT fk FOREIGN KEY (i) REFERENCES other(id) ON DELETE CASCADE,
  CONSTRAINT uq_si UNIQUE (si), CHECK (i > 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci COMMENT='x'"""


def cols(t: ddl.TableDef) -> dict[str, pb.ColumnInfo]:
    return {c.name: c for c in t.columns}


def shape(t: ddl.TableDef) -> tuple[list[str], list[tuple[str, list[str], bool]]]:
    return [c.name for c in t.columns], [(i.name, list(i.columns), i.primary) for i in t.indexes]


def base() -> ddl.TableDef:
    st = ddl.parse("CREATE TABLE t (id INT NOT NULL, a INT, b VARCHAR(10), c TEXT, "
                   "PRIMARY KEY (id), UNIQUE KEY ub (b))", "db")
    assert st is not None and st.table_def is not None
    return st.table_def


# ------------------------------------------------------------------------------------------------
# CREATE
# ------------------------------------------------------------------------------------------------

def test_create_table_reads_every_column_type_and_key() -> None:
    """CREATE TABLE gives each column's type, size, signedness, nullability, members and charset,
    the primary key and the unique keys (non-unique, fulltext and foreign keys add no shape)."""
    st = ddl.parse(ALL_TYPES, "dflt")
    assert st is not None and st.tp == pb.CREATE_TABLE
    assert (st.db, st.table) == ("shop", "all types")
    t = st.table_def
    assert t is not None and t.charset == "utf8mb4"
    c = cols(t)
    assert list(c)[:3] == ["id", "ti", "si"] and len(c) == 43
    expect = {   # name: (data_type, column_type, length, precision, scale, unsigned)
        "id": ("bigint", "bigint unsigned", 0, 0, 0, True),
        "ti": ("tinyint", "tinyint(4)", 0, 0, 0, False),
        "si": ("smallint", "smallint unsigned zerofill", 0, 0, 0, True),
        "zf": ("int", "int unsigned zerofill", 0, 0, 0, True),  # ZEROFILL implies UNSIGNED
        "ig": ("int", "int", 0, 0, 0, False),
        "b": ("tinyint", "tinyint(1)", 0, 0, 0, False),
        "bo": ("tinyint", "tinyint(1)", 0, 0, 0, False),
        "d": ("decimal", "decimal(65,30)", 0, 65, 30, False),
        "n": ("decimal", "decimal(10)", 0, 10, 0, False),
        "dd": ("decimal", "decimal", 0, 10, 0, False),
        "f": ("float", "float(7,3)", 0, 7, 3, False),
        "dbl": ("double", "double", 0, 0, 0, False),
        "r": ("double", "double", 0, 0, 0, False),
        "c": ("char", "char(10)", 10, 0, 0, False),
        "vc": ("varchar", "varchar(300)", 300, 0, 0, False),
        "cv": ("varchar", "varchar(20)", 20, 0, 0, False),
        "bn": ("binary", "binary(4)", 4, 0, 0, False),
        "vb": ("varbinary", "varbinary(10)", 10, 0, 0, False),
        "tt": ("tinytext", "tinytext", 0, 0, 0, False),
        "mt": ("mediumtext", "mediumtext", 0, 0, 0, False),
        "lb": ("longblob", "longblob", 0, 0, 0, False),
        "dt": ("date", "date", 0, 0, 0, False),
        "tm": ("time", "time(3)", 0, 0, 3, False),
        "dtm": ("datetime", "datetime(6)", 0, 0, 6, False),
        "ts": ("timestamp", "timestamp", 0, 0, 0, False),
        "y": ("year", "year", 0, 0, 0, False),
        "bt": ("bit", "bit(12)", 12, 0, 0, False),
        "j": ("json", "json", 0, 0, 0, False),
        "jm": ("json", "json", 0, 0, 0, False),            # MariaDB JSON: LONGTEXT + json_valid
        "g": ("geometry", "geometry", 0, 0, 0, False),
        "p": ("point", "point", 0, 0, 0, False),
    }
    for name, (dtype, ctype, length, precision, scale, unsigned) in expect.items():
        col = c[name]
        assert (col.data_type, col.column_type, col.length, col.precision, col.scale,
                col.unsigned) == (dtype, ctype, length, precision, scale, unsigned), name
    assert not c["id"].nullable and not c["i"].nullable and not c["e"].nullable and not c["p"].nullable
    assert c["ti"].nullable and c["ts"].nullable
    assert list(c["e"].elements) == ["a", "b'c", "d,e"] and c["e"].column_type == "enum('a','b''c','d,e')"
    assert list(c["s"].elements) == ["x", "y"]
    assert (c["c"].charset, c["vc"].charset) == ("latin1", "utf8mb4")
    assert c["gen"].generated and not c["i"].generated
    assert c["cmt"].column_type == "varchar(5)"          # a comment with ',' and '(' is skipped
    assert [(i.name, list(i.columns), i.primary, i.unique) for i in t.indexes] == [
        ("PRIMARY", ["id"], True, True), ("u", ["u"], False, True),
        ("uk_c_vc", ["c", "vc"], False, True), ("uq_si", ["si"], False, True)]


@pytest.mark.parametrize("check, json_cols", [
    ("a LONGTEXT CHECK (json_valid(a)), b TEXT", {"a"}),
    ("a LONGTEXT CHECK (json_valid(`a`) AND length(a) > 2), b TEXT", {"a"}),
    ("a LONGTEXT CHECK (NOT json_valid(a)), b TEXT", set()),
    ("a LONGTEXT CHECK (!json_valid(`a`)), b TEXT", set()),
    ("a LONGTEXT CHECK (length(a) > 2 OR json_valid(a)), b TEXT", set()),
    ("a LONGTEXT, b TEXT, CONSTRAINT cb CHECK (json_valid(`b`))", {"b"}),
    ("a LONGTEXT, b TEXT, CONSTRAINT cb CHECK (!json_valid(`b`))", set()),
    ("a LONGTEXT, b TEXT, CHECK (NOT json_valid(b)), CHECK (json_valid(a))", {"a"}),
    ("a INT CHECK (json_valid(a)), b TEXT", set()),
])
def test_a_text_column_is_json_only_when_its_check_starts_with_json_valid_of_it(
        check: str, json_cols: set[str]) -> None:
    """A text column is JSON when a CHECK clause starts with json_valid(<that column>), the
    rule the information_schema reader (core/table.py) applies: a negated or embedded
    json_valid, or one on a non-text column, leaves the column's type as declared."""
    st = ddl.parse(f"CREATE TABLE t (id INT PRIMARY KEY, {check})", "db")
    assert st is not None and st.table_def is not None
    got = {c.name for c in st.table_def.columns if c.data_type == "json"}
    assert got == json_cols


def test_create_table_inline_primary_key_makes_the_column_not_null() -> None:
    """An inline PRIMARY KEY is the table's key and implies NOT NULL; the default database
    applies to unqualified names."""
    st = ddl.parse("create table Orders (Id int primary key, code varchar(8) unique key)", "shop")
    assert st is not None and (st.db, st.table) == ("shop", "Orders")
    t = st.table_def
    assert t is not None
    assert shape(t) == (["Id", "code"], [("PRIMARY", ["Id"], True), ("code", ["code"], False)])
    assert not t.columns[0].nullable and t.columns[1].nullable


def test_create_table_like_select_and_replace() -> None:
    """CREATE ... LIKE names its source; CREATE ... SELECT has no model (its columns come from
    the SELECT: the TableMap declares them); CREATE OR REPLACE is a CREATE."""
    like = ddl.parse("CREATE TABLE t2 LIKE other.t", "db")
    assert like is not None and like.tp == pb.CREATE_TABLE and like.like == ("other", "t")
    for q in ("CREATE TABLE t3 AS SELECT * FROM t", "CREATE TABLE t4 (a int) SELECT 1 AS b",
              "CREATE TABLE t5 (SELECT 1)"):
        st = ddl.parse(q, "db")
        assert st is not None and st.tp == pb.CREATE_TABLE and st.table_def is None, q
    rep = ddl.parse("CREATE OR REPLACE TABLE t6 (a INT)", "db")
    assert rep is not None and rep.table_def is not None and shape(rep.table_def)[0] == ["a"]


def test_temporary_tables_and_non_ddl_are_not_tracked() -> None:
    """Temporary tables never reach a ROW binlog's data; BEGIN/GRANT are not DDL; other DDL
    (views, triggers, ALTER DATABASE) is forwarded as OTHER, never parsed into a shape."""
    for q in ("CREATE TEMPORARY TABLE x (a int)", "DROP TEMPORARY TABLE x", "BEGIN",
              "GRANT SELECT ON *.* TO x"):
        assert ddl.parse(q, "db") is None, q
    for q in ("CREATE VIEW v AS SELECT 1", "DROP VIEW v", "ALTER DATABASE d CHARACTER SET utf8",
              "CREATE TRIGGER tr BEFORE INSERT ON t FOR EACH ROW SET @a = 1", "CREATE TABLE"):
        st = ddl.parse(q, "db")
        assert st is not None and st.tp == pb.OTHER, q


def test_databases() -> None:
    assert ddl.parse("CREATE DATABASE IF NOT EXISTS `my db`", "x") == ddl.Statement(pb.CREATE_DATABASE, "my db")
    assert ddl.parse("CREATE SCHEMA s2", "x") == ddl.Statement(pb.CREATE_DATABASE, "s2")
    assert ddl.parse("DROP DATABASE IF EXISTS shop", "x") == ddl.Statement(pb.DROP_DATABASE, "shop")


# ------------------------------------------------------------------------------------------------
# ALTER
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("query, columns, indexes", [
    ("ALTER TABLE t ADD COLUMN d INT AFTER a, ADD e JSON FIRST",
     ["e", "id", "a", "d", "b", "c"], [("PRIMARY", ["id"], True), ("ub", ["b"], False)]),
    ("ALTER TABLE db.t ADD (x INT, y INT UNIQUE)",
     ["id", "a", "b", "c", "x", "y"],
     [("PRIMARY", ["id"], True), ("ub", ["b"], False), ("y", ["y"], False)]),
    ("ALTER TABLE t ADD COLUMN IF NOT EXISTS z INT, ALGORITHM=INPLACE, LOCK=NONE",
     ["id", "a", "b", "c", "z"], [("PRIMARY", ["id"], True), ("ub", ["b"], False)]),
    ("ALTER TABLE t DROP COLUMN a, DROP b", ["id", "c"], [("PRIMARY", ["id"], True)]),
    ("ALTER TABLE t MODIFY COLUMN a BIGINT UNSIGNED NOT NULL FIRST",
     ["a", "id", "b", "c"], [("PRIMARY", ["id"], True), ("ub", ["b"], False)]),
    ("ALTER TABLE t CHANGE b bb VARCHAR(20) AFTER c",
     ["id", "a", "c", "bb"], [("PRIMARY", ["id"], True), ("ub", ["bb"], False)]),
    ("ALTER TABLE t RENAME COLUMN c TO cc",
     ["id", "a", "b", "cc"], [("PRIMARY", ["id"], True), ("ub", ["b"], False)]),
    ("ALTER TABLE t ADD UNIQUE INDEX ua (a), DROP INDEX ub, RENAME INDEX ua TO ua2",
     ["id", "a", "b", "c"], [("PRIMARY", ["id"], True), ("ua2", ["a"], False)]),
    ("ALTER TABLE t DROP PRIMARY KEY, ADD PRIMARY KEY (id, a)",
     ["id", "a", "b", "c"], [("PRIMARY", ["id", "a"], True), ("ub", ["b"], False)]),
    ("ALTER ONLINE TABLE t ADD COLUMN w INT, ALTER COLUMN a SET DEFAULT 3, ENGINE=InnoDB",
     ["id", "a", "b", "c", "w"], [("PRIMARY", ["id"], True), ("ub", ["b"], False)]),
    ("CREATE UNIQUE INDEX ux ON t (c(10))", ["id", "a", "b", "c"],
     [("PRIMARY", ["id"], True), ("ub", ["b"], False), ("ux", ["c"], False)]),
    ("CREATE INDEX ix ON t (a)", ["id", "a", "b", "c"], [("PRIMARY", ["id"], True), ("ub", ["b"], False)]),
    ("DROP INDEX ub ON t", ["id", "a", "b", "c"], [("PRIMARY", ["id"], True)]),
])
def test_alter_clauses_change_the_shape(query: str, columns: list[str],
                                        indexes: list[tuple[str, list[str], bool]]) -> None:
    """ADD (with FIRST/AFTER, several at once), DROP, MODIFY, CHANGE, RENAME COLUMN and the key
    clauses give the shape the server has after the statement; keys follow renamed columns."""
    st = ddl.parse(query, "db")
    assert st is not None and st.tp == pb.ALTER_TABLE and (st.db, st.table) == ("db", "t")
    assert st.alter_ops is not None
    assert shape(ddl.apply_alter(base(), st.alter_ops)) == (columns, indexes)


def test_alter_modify_takes_the_new_definition() -> None:
    st = ddl.parse("ALTER TABLE t MODIFY a BIGINT UNSIGNED NOT NULL", "db")
    assert st is not None and st.alter_ops is not None
    a = cols(ddl.apply_alter(base(), st.alter_ops))["a"]
    assert (a.data_type, a.column_type, a.unsigned, a.nullable) == ("bigint", "bigint unsigned", True, False)


def test_alter_rename_to_moves_the_table() -> None:
    st = ddl.parse("ALTER TABLE t RENAME TO other.t2", "db")
    assert st is not None and st.new_name == ("other", "t2") and st.alter_ops == ()


def test_alter_clauses_not_understood_give_an_alter_without_shape() -> None:
    """A clause the parser cannot follow (charset conversion, partitioning, garbage) yields an
    ALTER with alter_ops None: the next TableMap declares the shape instead."""
    for q in ("ALTER TABLE t CONVERT TO CHARACTER SET utf8mb4", "ALTER TABLE t PARTITION BY HASH(id)",
              "ALTER TABLE db.t ADD COLUMN a INT, FROBNICATE"):
        st = ddl.parse(q, "db")
        assert st is not None and st.tp == pb.ALTER_TABLE and st.alter_ops is None, q
        assert (st.db, st.table) == ("db", "t")


def test_apply_alter_replays_additions_idempotently() -> None:
    """ADD of a column or key the model already has (a model seeded from SHOW CREATE TABLE,
    newer than the statement being replayed) replaces it instead of duplicating it."""
    t = base()
    st = ddl.parse("ALTER TABLE t ADD COLUMN a BIGINT, ADD UNIQUE KEY ub (b)", "db")
    assert st is not None and st.alter_ops is not None
    after = ddl.apply_alter(t, st.alter_ops)
    assert shape(after) == shape(t)
    assert cols(after)["a"].data_type == "bigint"


def test_apply_alter_names_an_unknown_column() -> None:
    st = ddl.parse("ALTER TABLE t DROP COLUMN nope", "db")
    assert st is not None and st.alter_ops is not None
    with pytest.raises(KeyError):
        ddl.apply_alter(base(), st.alter_ops)


# ------------------------------------------------------------------------------------------------
# RENAME, TRUNCATE, DROP
# ------------------------------------------------------------------------------------------------

def test_rename_multiple_pairs() -> None:
    st = ddl.parse("RENAME TABLE a TO b, other.c TO db2.`d d`", "db")
    assert st is not None and st.tp == pb.RENAME_TABLE
    assert st.renames == ((("db", "a"), ("db", "b")), (("other", "c"), ("db2", "d d")))
    one = ddl.parse("RENAME TABLES x TO y", "db")
    assert one is not None and one.renames == ((("db", "x"), ("db", "y")),)


def test_truncate() -> None:
    for q, target in (("TRUNCATE TABLE db2.t", ("db2", "t")), ("truncate t", ("db", "t"))):
        st = ddl.parse(q, "db")
        assert st is not None and st.tp == pb.TRUNCATE_TABLE and (st.db, st.table) == target


def test_drop_multiple_tables() -> None:
    """DROP TABLE lists every table (the server's own "generated by server" comment ignored)."""
    st = ddl.parse("DROP TABLE IF EXISTS a, other.b, `we``ird` /* generated by server */", "db")
    assert st is not None and st.tp == pb.DROP_TABLE
    assert st.drops == (("db", "a"), ("other", "b"), ("db", "we`ird"))


# ------------------------------------------------------------------------------------------------
# the tracker's view of DDL
# ------------------------------------------------------------------------------------------------

def test_tracker_multi_table_ddl_is_one_ddl_per_captured_table() -> None:
    """DROP TABLE a, b and RENAME TABLE a TO b, c TO d act on several tables: one DDL binlog per
    captured table (the capture writes them at one position with sub_seq 0, 1, ...)."""
    tr = SchemaTracker("src", TableFilter(include_databases=["app"]))
    tr.seed("app", "a", "CREATE TABLE a (id INT PRIMARY KEY)")
    tr.seed("app", "c", "CREATE TABLE c (id INT PRIMARY KEY, v TEXT)")
    renames = tr.on_ddl("RENAME TABLE a TO b, c TO d, x.y TO x.z", "app", 7)
    assert [(d.tp, d.old_table_name, d.table_name) for d in renames] == [
        (pb.RENAME_TABLE, "a", "b"), (pb.RENAME_TABLE, "c", "d")]
    assert [c.name for c in renames[1].table_info.columns] == ["id", "v"]
    assert renames[1].table_info.table_id == stable_table_id("src", "app", "d")
    drops = tr.on_ddl("DROP TABLE b, d, x.z", "app", 8)
    assert [(d.tp, d.table_name) for d in drops] == [(pb.DROP_TABLE, "b"), (pb.DROP_TABLE, "d")]


def test_tracker_declares_a_table_renamed_into_the_filter() -> None:
    """A table entering the filter by RENAME carries its shape (from the seeded model), so it
    has a shape downstream before its first row; one leaving it is a DROP downstream."""
    tr = SchemaTracker("src", TableFilter(include_tables=[r"app\.live_.*"]))
    tr.seed("app", "staging", "CREATE TABLE staging (id INT PRIMARY KEY, doc JSON)")
    (enter,) = tr.on_ddl("RENAME TABLE staging TO live_1", "app", 9)
    assert enter.tp == pb.RENAME_TABLE and enter.HasField("table_info")
    assert [(c.name, c.data_type) for c in enter.table_info.columns] == [("id", "int"), ("doc", "json")]
    assert tr.declared("app", "live_1") is not None
    (leave,) = tr.on_ddl("ALTER TABLE live_1 RENAME TO archive", "app", 10)
    assert (leave.tp, leave.table_name) == (pb.DROP_TABLE, "live_1")


def test_tracker_declare_seeded_covers_only_captured_tables() -> None:
    """The first-start schema snapshot declares the captured tables' seeded shapes."""
    tr = SchemaTracker("src", TableFilter(exclude_tables=[r"app\.secret"]))
    tr.seed("app", "t", "CREATE TABLE t (id INT PRIMARY KEY, code VARCHAR(8) UNIQUE)")
    tr.seed("app", "secret", "CREATE TABLE secret (id INT PRIMARY KEY)")
    infos = tr.declare_seeded(tr.seeded_tables(), 42)
    assert [(i.schema_name, i.table_name, i.version) for i in infos] == [("app", "t", 42)]
    assert [list(i.columns) for i in infos[0].indexes] == [["id"], ["code"]]
    assert tr.declared("app", "t") is infos[0] and tr.declared("app", "secret") is None


def test_show_create_table_keeps_what_a_downstream_create_needs() -> None:
    """What the MySQL sink's create-tables needs from SHOW CREATE TABLE and that TableMaps cannot
    say: generation expressions exactly as written (with their kind), column and table
    collations, ZEROFILL in the column type; a later TableMap of the seeded table keeps them."""
    sql = """CREATE TABLE `t` (
      `id` int(10) unsigned zerofill NOT NULL,
      `a` varchar(10) CHARACTER SET latin1 COLLATE latin1_swedish_ci DEFAULT NULL,
      `b` varchar(10) COLLATE utf8mb4_bin NOT NULL DEFAULT 'x(y)',
      `g` int(11) GENERATED ALWAYS AS (`id` + char_length(`b`)) VIRTUAL,
      `s` varchar(40) AS (concat(`b`,'-'',)',`id`)) PERSISTENT,
      PRIMARY KEY (`id`), UNIQUE KEY `ub` (`b`)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci"""
    st = ddl.parse(sql, "db")
    assert st is not None and st.table_def is not None
    c = {x.name: x for x in st.table_def.columns}
    assert c["id"].column_type == "int(10) unsigned zerofill"
    assert (c["a"].charset, c["a"].collation) == ("latin1", "latin1_swedish_ci")
    assert (c["b"].charset, c["b"].collation) == ("utf8mb4", "utf8mb4_bin")
    assert (c["g"].generated, c["g"].generation_expression, c["g"].generated_stored) == (
        True, "(`id` + char_length(`b`))", False)
    assert (c["s"].generation_expression, c["s"].generated_stored) == ("(concat(`b`,'-'',)',`id`))", True)
    assert not c["b"].generation_expression
    assert (st.table_def.charset, st.table_def.collation) == ("utf8mb4", "utf8mb4_unicode_ci")
    tracker = SchemaTracker("src", TableFilter())
    tracker.seed("db", "t", sql)
    (info,) = tracker.declare_seeded([("db", "t")], version=5)
    assert info.collation == "utf8mb4_unicode_ci" and info.columns[3].generation_expression


def test_uuid_and_inet_columns_keep_their_ddl_type_over_the_tablemaps_binary() -> None:
    """MariaDB logs UUID / INET4 / INET6 columns as fixed BINARY in the TableMap: the row shape
    keeps the DDL's type (what the bytes mean), so it equals the CREATE's shape (no second
    version whose BINARY a sink could not reconcile with the CREATE's UUID)."""
    from sluice.capture.schema import merge
    st = ddl.parse("CREATE TABLE g (id INT PRIMARY KEY, u UUID, a4 INET4, a6 INET6, p POINT)", "db")
    assert st is not None and st.table_def is not None
    model = st.table_def
    assert [c.data_type for c in model.columns][:4] == ["int", "uuid", "inet4", "inet6"]
    tablemap = [pb.ColumnInfo(name="id", data_type="int"),
                pb.ColumnInfo(name="u", data_type="binary", length=16),
                pb.ColumnInfo(name="a4", data_type="binary", length=4),
                pb.ColumnInfo(name="a6", data_type="binary", length=16),
                pb.ColumnInfo(name="p", data_type="geometry")]
    out, _ = merge(tablemap, ["id"], model)
    assert [c.data_type for c in out][:4] == ["int", "uuid", "inet4", "inet6"]
