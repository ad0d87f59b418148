from __future__ import annotations

import datetime as dt
import decimal

import pytest

from sluice.core.errors import InvalidArgument
from sluice.core.rowcodec import MySQLDateTime
from sluice.drainer.sql import ddl_sql, group, literal, ordered_sql, row_sql
from sluice.drainer.translator import DELETE, INSERT, UPDATE, UPSERT, Translator
from sluice.drainer.txn import MissingSchema
from sluice.proto import sluice_pb2 as pb
from tests.support.rows import Table, col, history_of, prewrite_value, schema_txn, txn

KINDS = Table(7, "db", "kinds", [
    col("id", "bigint(20)", nullable=False), col("u", "bigint(20) unsigned"), col("d", "double"),
    col("dec", "decimal(65,30)"), col("b", "varbinary(8)"), col("s", "varchar(20)"),
    col("day", "date"), col("at", "datetime(6)"), col("t", "time(6)"), col("j", "json"),
    col("e", "enum('x','y')"), col("bits", "bit(12)"), col("gen", "int(11)", generated=True)],
    primary=["id"], unique={"uk_s": ["s"]})


def translate(*changes: pb.RowChange, table: Table = KINDS, commit_ts: int = 20):
    h = history_of([schema_txn(10, table)])
    return Translator().translate(txn(prewrite_value(table.mutation(*changes)), commit_ts), h)


def test_a_transaction_translates_into_its_row_changes_in_source_order_with_typed_values():
    """A transaction translates into its row changes in source order, each decoded with the table
    shape in force at the transaction's commit_ts, and every Datum kind becomes a value MySQL
    stores back unchanged."""
    big_dec = decimal.Decimal("-" + "9" * 35 + "." + "1" * 30)
    row = dict(id=-(2**63), u=2**64 - 1, d=-1.5e300, dec=big_dec, b=b"\x00\xff'", s="ü'\\",
               day=dt.date(2024, 2, 29), at=dt.datetime(2024, 1, 2, 3, 4, 5, 6),
               t=dt.timedelta(hours=-838, minutes=-59, seconds=-59), j='{"a": [1]}', e="y",
               bits=0xABC)
    zero = dict(row, id=2, s="z", day=MySQLDateTime(), at=MySQLDateTime(2020, 0, 15, 1, 2, 3),
                t=dt.timedelta(hours=100, microseconds=1), u=None, d=None, dec=None, j=None, bits=None)
    [ins, upd, dele] = translate(KINDS.insert(**row), KINDS.update(row, {"id": 5}),
                                 KINDS.delete(**zero))
    assert [c.kind for c in (ins, upd, dele)] == [INSERT, UPDATE, DELETE]
    assert ins.shape.columns == ("id", "u", "d", "dec", "b", "s", "day", "at", "t", "j", "e", "bits", "gen")
    assert ins.after[:12] == (-(2**63), 2**64 - 1, -1.5e300, big_dec, b"\x00\xff'", "ü'\\",
                              dt.date(2024, 2, 29), dt.datetime(2024, 1, 2, 3, 4, 5, 6),
                              -dt.timedelta(hours=838, minutes=59, seconds=59), '{"a": [1]}', "y", 0xABC)
    assert ins.after[12] is None and ins.before is None and ins.commit_ts == 20
    # Zero dates and zero parts travel as text; TIME beyond 24 h as a timedelta.
    assert dele.before[6:9] == ("0000-00-00", "2020-00-15 01:02:03.000000",
                                dt.timedelta(hours=100, microseconds=1))
    assert upd.before[0] == -(2**63) and upd.after[0] == 5
    # SQL text of the values, exact.
    assert [literal(v) for v in ins.after[:12]] == [
        "-9223372036854775808", "18446744073709551615", "-1.5e+300", format(big_dec, "f"),
        "_binary X'00ff27'", "'ü\\'\\\\'", "'2024-02-29'", "'2024-01-02 03:04:05.000006'",
        "'-838:59:59'", "'{\\\"a\\\": [1]}'", "'y'", "2748"]


def test_causality_keys_cover_old_and_new_images_and_fold_text():
    [upd] = translate(KINDS.update(dict(id=1, s="Abc"), dict(id=2, s="x")))
    assert len(upd.keys) == 4  # PRIMARY and uk_s, before and after
    [a] = translate(KINDS.insert(id=3, s="ABC  "))
    [b] = translate(KINDS.insert(id=4, s="abc"))
    assert set(a.keys) & set(b.keys)  # one value for a case-insensitive unique index
    # A unique key holding NULL never conflicts: no key for it.
    [n] = translate(KINDS.insert(id=5, s=None))
    assert len(n.keys) == 1
    keyless = Table(8, "db", "log", [col("a", "int(11)"), col("f", "float")])
    [k] = translate(keyless.insert(a=1, f=0.5), table=keyless)
    # The whole table is one key too: its full-scan statements on two workers would deadlock.
    assert k.keys[0] == "db.log\x00**" and len(k.keys) == 2 and not k.shape.has_identity
    assert k.shape.identity == (0,)  # floats are left out of a row-image WHERE


def test_rows_are_decoded_with_the_shape_at_their_commit_ts():
    v1 = Table(9, "db", "t", [col("id", "int(11)", nullable=False), col("a", "int(11)")], ["id"])
    v2 = v1.add_column(col("b", "varchar(4)"))
    v3 = v2.drop_column("a")
    h = history_of([schema_txn(10, v1), txn(prewrite_value(ddl=v2.alter_ddl()), 20),
                    txn(prewrite_value(ddl=v3.alter_ddl()), 30)])
    tr = Translator()
    old = tr.translate(txn(prewrite_value(v1.mutation(v1.insert(id=1, a=7))), 15), h)
    mid = tr.translate(txn(prewrite_value(v2.mutation(v2.insert(id=2, a=8, b="x"))), 25), h)
    new = tr.translate(txn(prewrite_value(v3.mutation(v3.insert(id=3, b="y"))), 35), h)
    assert (old[0].shape.columns, old[0].after) == (("id", "a"), (1, 7))
    assert (mid[0].shape.columns, mid[0].after) == (("id", "a", "b"), (2, 8, "x"))
    assert (new[0].shape.columns, new[0].after) == (("id", "b"), (3, "y"))
    # A row carrying the hidden column's datum too decodes the same.
    full = pb.Row(columns=[*v3.row({"id": 4, "b": "z"}).columns[:1], pb.Datum(null=True),
                           v3.row({"id": 4, "b": "z"}).columns[1]])
    m = v3.mutation(pb.RowChange(tp=pb.INSERT, after=full))
    assert tr.translate(txn(prewrite_value(m), 36), h)[0].after == (4, "z")
    bad = v3.mutation(pb.RowChange(tp=pb.INSERT, after=pb.Row(columns=[pb.Datum(int=1)])))
    with pytest.raises(InvalidArgument, match="db.t .*has 1 values"):
        tr.translate(txn(prewrite_value(bad), 37), h)


def test_a_row_for_a_table_without_schema_names_table_id_and_commit_ts():
    stranger = Table(404, "db", "ghost", [col("id", "int(11)")], ["id"])
    h = history_of([schema_txn(10, KINDS)])
    with pytest.raises(MissingSchema, match=r"table id 404 \(db.ghost\) at commit_ts 77"):
        Translator().translate(txn(prewrite_value(stranger.mutation(stranger.insert(id=1))), 77), h)


def test_ordered_statements_merge_rows_but_never_reorder_across_a_key():
    """The statements built for a batch leave the downstream exactly as applying the batch's
    changes one by one in order would (ordered form: the fallback of merge mode)."""
    t = Table(1, "db", "t", [col("id", "int(11)", nullable=False), col("v", "int(11)")], ["id"])
    changes = translate(t.insert(id=1, v=1), t.insert(id=2, v=1), t.delete(id=1, v=1),
                        t.insert(id=3, v=1), t.insert(id=1, v=2), t.delete(id=3, v=1), table=t)
    sqls = [s for s, _ in ordered_sql(changes, [False] * len(changes))]
    assert sqls == [
        "INSERT INTO `db`.`t` (`id`,`v`) VALUES (1,1),(2,1),(3,1)",
        "DELETE FROM `db`.`t` WHERE `id` IN (1,3)",
        "INSERT INTO `db`.`t` (`id`,`v`) VALUES (1,2)",
    ]


def test_safe_mode_statements_are_idempotent_upserts():
    t = Table(1, "db", "t", [col("a", "int(11)", nullable=False), col("b", "varchar(3)", nullable=False),
                             col("v", "int(11)")], ["a", "b"])
    changes = translate(t.insert(a=1, b="x", v=1), t.update(dict(a=1, b="x", v=1), dict(a=2)),
                        t.delete(a=2, b="x", v=1), table=t)
    assert [s for s, _ in ordered_sql(changes, [True] * 3)] == [
        "REPLACE INTO `db`.`t` (`a`,`b`,`v`) VALUES (1,'x',1)",
        "DELETE FROM `db`.`t` WHERE (`a` = 1 AND `b` = 'x')",
        "REPLACE INTO `db`.`t` (`a`,`b`,`v`) VALUES (2,'x',1)",
        "DELETE FROM `db`.`t` WHERE (`a` = 2 AND `b` = 'x')",
    ]
    assert row_sql(changes[1], False) == [
        "UPDATE `db`.`t` SET `a` = 2,`b` = 'x',`v` = 1 WHERE `a` = 1 AND `b` = 'x'"]
    # A snapshot read is always an upsert; generated columns are never written.
    [r] = translate(KINDS.read(id=1, s="q"))
    assert r.kind == UPSERT
    assert row_sql(r, False)[0].startswith("REPLACE INTO `db`.`kinds` (`id`,`u`,")
    assert "`gen`" not in row_sql(r, False)[0]
    keyless = Table(8, "db", "log", [col("a", "int(11)"), col("s", "varchar(3)")])
    [d] = translate(keyless.delete(a=1, s=None), table=keyless)
    assert row_sql(d, True) == ["DELETE FROM `db`.`log` WHERE `a` = 1 AND `s` IS NULL LIMIT 1"]
    assert len(group(changes, [True] * 3)) == 4


def test_ddl_statements_use_the_source_text_or_the_structure():
    t = Table(1, "db", "t", [col("id", "int(11)", nullable=False), col("v", "varchar(3)")], ["id"])
    assert ddl_sql(t.create_ddl("CREATE TABLE t (id int)"), None) == ["USE `db`", "CREATE TABLE t (id int)"]
    assert ddl_sql(t.create_ddl(), None) == [
        "CREATE TABLE IF NOT EXISTS `db`.`t` (`id` int(11) NOT NULL, `v` varchar(3) NULL, PRIMARY KEY (`id`)) "
        "DEFAULT CHARSET=utf8mb4"]
    t2 = t.add_column(col("w", "int(11)")).drop_column("v")
    assert ddl_sql(t2.alter_ddl(), t.info) == [
        "ALTER TABLE `db`.`t` ADD COLUMN IF NOT EXISTS `w` int(11) NULL, DROP COLUMN IF EXISTS `v`"]
    r = t.rename("db2", "u")
    assert ddl_sql(r.rename_ddl(t), t.info) == ["RENAME TABLE `db`.`t` TO `db2`.`u`"]
    assert ddl_sql(t.truncate_ddl(), t.info) == ["TRUNCATE TABLE `db`.`t`"]
    assert ddl_sql(t.drop_ddl(), t.info) == ["DROP TABLE IF EXISTS `db`.`t`"]
    with pytest.raises(ValueError, match="no query text"):
        ddl_sql(pb.DDL(tp=pb.OTHER, schema_name="db"), None)
