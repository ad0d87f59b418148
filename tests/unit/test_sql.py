"""Merge mode of the SQL builder: a worker batch reduced to its net effect per row identity."""
from __future__ import annotations

import pytest

from sluice.drainer import sql
from sluice.drainer.sql import batch_sql, ordered_sql
from sluice.drainer.translator import Translator
from tests.support.rows import Table, col, history_of, prewrite_value, schema_txn, txn

T = Table(1, "db", "t", [col("id", "int(11)", nullable=False), col("uk", "varchar(8)"),
                         col("v", "int(11)")], primary=["id"], unique={"uk": ["uk"]})
NAMES = Table(2, "db", "names", [col("name", "varchar(8)", nullable=False), col("v", "int(11)")],
              primary=["name"])
LOG = Table(3, "db", "log", [col("a", "int(11)"), col("s", "varchar(3)")])


def changes(*steps, table: Table = T):
    """Row changes of one table, one source transaction per step (commit order)."""
    h = history_of([schema_txn(10, T, NAMES, LOG)])
    tr = Translator()
    out = []
    for i, step in enumerate(steps):
        out += tr.translate(txn(prewrite_value(table.mutation(step)), 20 + i), h)
    return out


def stmts(chs, safe: bool = False) -> list[str]:
    return [s for s, _ in batch_sql(chs, [safe] * len(chs))]


def test_a_batch_becomes_its_net_effect_per_identity():
    """The statements built for a worker batch leave the downstream exactly as applying the
    batch's changes one by one in order would: one DELETE of the rows that existed and are gone,
    one INSERT of the new rows, one upsert of rows updated in place."""
    chs = changes(T.insert(id=1, uk="a", v=1), T.insert(id=2, v=1), T.update(dict(id=2, v=1), dict(v=2)),
                  T.update(dict(id=5, uk="e", v=0), dict(v=9)), T.delete(id=6, v=0),
                  T.insert(id=3, v=3), T.update(dict(id=3, v=3), dict(v=4)))
    assert stmts(chs) == [
        "DELETE FROM `db`.`t` WHERE `id` IN (6)",
        "INSERT INTO `db`.`t` (`id`,`uk`,`v`) VALUES (1,'a',1),(2,NULL,2),(3,NULL,4)",
        "INSERT INTO `db`.`t` (`id`,`uk`,`v`) VALUES (5,'e',9) ON DUPLICATE KEY UPDATE "
        "`id`=VALUES(`id`),`uk`=VALUES(`uk`),`v`=VALUES(`v`)",
    ]


def test_insert_update_delete_of_one_key_nets_to_nothing_or_a_delete():
    new = changes(T.insert(id=1, v=1), T.update(dict(id=1, v=1), dict(v=2)), T.delete(id=1, v=2))
    assert stmts(new) == []                    # never existed before the batch: nothing to do
    # Safe mode cannot trust "never existed" (a replay after a crash): it deletes.
    assert stmts(new, safe=True) == ["DELETE FROM `db`.`t` WHERE `id` IN (1)"]
    old = changes(T.update(dict(id=1, v=0), dict(v=1)), T.update(dict(id=1, v=1), dict(v=2)),
                  T.delete(id=1, v=2))
    assert stmts(old) == ["DELETE FROM `db`.`t` WHERE `id` IN (1)"]
    # Deleted and inserted again: the old row goes, the new one comes.
    again = changes(T.delete(id=1, uk="a", v=0), T.insert(id=1, uk="b", v=7))
    assert stmts(again) == ["DELETE FROM `db`.`t` WHERE `id` IN (1)",
                            "INSERT INTO `db`.`t` (`id`,`uk`,`v`) VALUES (1,'b',7)"]


def test_a_primary_key_change_is_a_delete_of_the_old_identity_and_an_insert_of_the_new():
    chs = changes(T.update(dict(id=1, uk="a", v=1), dict(id=2)), T.update(dict(id=2, uk="a", v=1), dict(id=3)))
    assert stmts(chs) == ["DELETE FROM `db`.`t` WHERE `id` IN (1)",
                          "INSERT INTO `db`.`t` (`id`,`uk`,`v`) VALUES (3,'a',1)"]


def test_a_unique_key_swap_deletes_both_rows_before_writing_either():
    # Rows 1 ('a') and 2 ('b') swap values through 'c'; an in-place upsert of row 2 with 'a'
    # would hit row 1's 'a' and update row 1 instead: rows that move a unique value are deleted
    # first and inserted again, the untouched-unique row 3 is upserted in place.
    chs = changes(T.update(dict(id=1, uk="a", v=0), dict(uk="c")), T.update(dict(id=2, uk="b", v=0), dict(uk="a")),
                  T.update(dict(id=1, uk="c", v=0), dict(uk="b")), T.update(dict(id=3, uk="z", v=0), dict(v=1)))
    assert stmts(chs) == [
        "DELETE FROM `db`.`t` WHERE `id` IN (1,2)",
        "INSERT INTO `db`.`t` (`id`,`uk`,`v`) VALUES (1,'b',0),(2,'a',0)",
        "INSERT INTO `db`.`t` (`id`,`uk`,`v`) VALUES (3,'z',1) ON DUPLICATE KEY UPDATE "
        "`id`=VALUES(`id`),`uk`=VALUES(`uk`),`v`=VALUES(`v`)",
    ]


def test_identities_equal_only_once_folded_fall_back_to_ordered_statements():
    # 'Abc' and 'abc' are one row under a _ci collation and two under _bin: no single net
    # effect fits both, the batch order does.
    chs = changes(NAMES.insert(name="Abc", v=1), NAMES.delete(name="abc", v=1), NAMES.insert(name="ABC", v=2),
                  table=NAMES)
    assert stmts(chs) == [s for s, _ in ordered_sql(chs, [False] * 3)]
    assert stmts(chs)[0] == "INSERT INTO `db`.`names` (`name`,`v`) VALUES ('Abc',1)"
    # Distinct once folded: merged.
    assert stmts(changes(NAMES.insert(name="Abc", v=1), NAMES.insert(name="x", v=2), table=NAMES)) == [
        "INSERT INTO `db`.`names` (`name`,`v`) VALUES ('Abc',1),('x',2)"]


def test_keyless_tables_keep_ordered_row_image_statements():
    chs = changes(LOG.insert(a=1, s="x"), LOG.delete(a=1, s="x"), LOG.insert(a=1, s="x"), table=LOG)
    assert stmts(chs) == [
        "INSERT INTO `db`.`log` (`a`,`s`) VALUES (1,'x')",
        "DELETE FROM `db`.`log` WHERE `a` = 1 AND `s` = 'x' LIMIT 1",
        "INSERT INTO `db`.`log` (`a`,`s`) VALUES (1,'x')",
    ]


def test_snapshot_reads_and_safe_mode_replace_every_final_row():
    chs = changes(T.read(id=1, uk="a", v=1), T.update(dict(id=2, uk="b", v=0), dict(v=5)))
    assert stmts(chs) == ["DELETE FROM `db`.`t` WHERE `id` IN (1)",
                          "REPLACE INTO `db`.`t` (`id`,`uk`,`v`) VALUES (1,'a',1)",
                          "INSERT INTO `db`.`t` (`id`,`uk`,`v`) VALUES (2,'b',5) ON DUPLICATE KEY UPDATE "
                          "`id`=VALUES(`id`),`uk`=VALUES(`uk`),`v`=VALUES(`v`)"]
    assert stmts(chs, safe=True) == ["DELETE FROM `db`.`t` WHERE `id` IN (1,2)",
                                     "REPLACE INTO `db`.`t` (`id`,`uk`,`v`) VALUES (1,'a',1),(2,'b',5)"]


def test_tables_are_merged_separately_and_long_batches_are_split(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(sql, "MAX_ROWS_PER_STATEMENT", 2)
    chs = changes(*[T.insert(id=i, v=i) for i in range(3)]) + changes(NAMES.insert(name="n", v=0), table=NAMES)
    assert stmts(chs) == [
        "INSERT INTO `db`.`names` (`name`,`v`) VALUES ('n',0)",
        "INSERT INTO `db`.`t` (`id`,`uk`,`v`) VALUES (0,NULL,0),(1,NULL,1)",
        "INSERT INTO `db`.`t` (`id`,`uk`,`v`) VALUES (2,NULL,2)",
    ]
    composite = Table(4, "db", "c", [col("a", "int(11)", nullable=False), col("b", "varchar(3)", nullable=False)],
                      primary=["a", "b"])
    h = history_of([schema_txn(10, composite)])
    cs = Translator().translate(txn(prewrite_value(composite.mutation(composite.delete(a=1, b="x"))), 20), h)
    assert stmts(cs) == ["DELETE FROM `db`.`c` WHERE (`a` = 1 AND `b` = 'x')"]


def test_merged_statements_lock_rows_in_identity_order_and_tables_in_name_order():
    """Concurrent workers lock their rows in one direction: a batch's merged statements list
    tables by name and rows by identity, whatever the source order."""
    chs = changes(T.insert(id=9, v=1), T.delete(id=7, v=0), T.insert(id=3, v=1), T.delete(id=5, v=0),
                  T.update(dict(id=8, v=0), dict(v=2)), T.update(dict(id=2, v=0), dict(v=3)))
    chs = changes(NAMES.insert(name="z", v=0), NAMES.insert(name="a", v=0), table=NAMES) + chs
    assert stmts(chs) == [
        "INSERT INTO `db`.`names` (`name`,`v`) VALUES ('a',0),('z',0)",
        "DELETE FROM `db`.`t` WHERE `id` IN (5,7)",
        "INSERT INTO `db`.`t` (`id`,`uk`,`v`) VALUES (3,NULL,1),(9,NULL,1)",
        "INSERT INTO `db`.`t` (`id`,`uk`,`v`) VALUES (2,NULL,3),(8,NULL,2) ON DUPLICATE KEY UPDATE "
        "`id`=VALUES(`id`),`uk`=VALUES(`uk`),`v`=VALUES(`v`)",
    ]


def test_create_table_sql_gives_the_downstream_the_source_shape() -> None:
    """create-tables' CREATE TABLE: the exact column type, character set and collation of
    character columns only, generated columns with their expression and kind (never NOT NULL),
    NULL spelled out, primary and unique keys, the table's charset and collation; names that
    are not plain charset/collation names are left out, never pasted into the statement."""
    from sluice.proto import sluice_pb2 as pb
    info = Table(9, "d b", "t`x", [col("id", "int(10) unsigned zerofill", nullable=False),
                                   col("k", "varchar(8)", nullable=False, charset="utf8mb4"),
                                   col("n", "int(11)", charset="utf8mb4"),
                                   col("g", "bigint(20)", generated=True)],
                 primary=["id"], unique={"uk": ["k"]}).info
    info.columns[1].collation = "utf8mb4_bin"
    info.columns[2].collation = "utf8mb4_bin"       # not a character column: ignored
    info.columns[3].generation_expression, info.columns[3].generated_stored = "(`id` * 2)", True
    info.collation = "utf8mb4_unicode_ci"
    assert sql.create_table_sql(info) == (
        "CREATE TABLE IF NOT EXISTS `d b`.`t``x` (`id` int(10) unsigned zerofill NOT NULL, "
        "`k` varchar(8) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, `n` int(11) NULL, "
        "`g` bigint(20) GENERATED ALWAYS AS (`id` * 2) STORED, PRIMARY KEY (`id`), "
        "UNIQUE KEY `uk` (`k`)) DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci")
    hidden = info.columns.add(name="old", data_type="int", column_type="int(11)", hidden=True)
    info.indexes.add(name="", columns=["old"], unique=True)         # on a dropped column: left out
    info.indexes.add(name="", columns=["k", "id"], unique=True)     # no name: the server names it
    assert hidden.hidden and sql.create_table_sql(info).endswith(
        "UNIQUE KEY `uk` (`k`), UNIQUE KEY (`k`,`id`)) DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci")
    info.collation = "x; DROP TABLE y"
    assert sql.create_table_sql(info).endswith("DEFAULT CHARSET=utf8mb4")
    assert sql.create_database_sql("we`ird") == "CREATE DATABASE IF NOT EXISTS `we``ird`"
    # JSON is an alias that brings its own charset, collation and check.
    assert sql.column_definition(pb.ColumnInfo(name="j", data_type="json", column_type="json",
                                               charset="utf8mb4", collation="utf8mb4_bin",
                                               nullable=True)) == "`j` json NULL"
    # A shape from a TableMap alone has no length in its type text (the byte length is used).
    assert sql.column_definition(pb.ColumnInfo(name="v", data_type="varchar", column_type="varchar",
                                               length=40, nullable=False)) == "`v` varchar(40) NOT NULL"
