"""tables.plan: a new table shape -> the state after it and the Iceberg schema operations."""
from __future__ import annotations

import pytest

from sluice.spark_sink import tables as T
from tests.support.rows import Table, col


def _t(cols: list, version: int = 1, primary: tuple[str, ...] = ("id",)) -> Table:
    return Table(7, "s", "t", cols, primary=primary, version=version)


V1 = _t([col("id", "int(11)", nullable=False), col("a", "int(11)"), col("b", "varchar(10)")])


def ops(o: list[T.Op]) -> list[tuple[str, str, str, str]]:
    return [(x.kind, x.table, x.column, x.to) for x in o]


def test_a_new_table_creates_both_tables_with_the_source_columns() -> None:
    st, o = T.plan(None, V1.info, "s")
    assert ops(o) == [("create", "changelog", "", ""), ("create", "current", "", "")]
    assert [(c.name, c.stype, c.cl) for c in st.columns] == [
        ("id", "INT", "id"), ("a", "INT", "a"), ("b", "STRING", "b")]
    assert st.key == ("id",) and st.changelog == "t_changelog"


def test_add_drop_promote_rename_by_field_id() -> None:
    """ADD adds to both; DROP leaves the changelog column (history); INT -> BIGINT promotes in
    place; a RENAME the statement spells out renames in both tables (same field id)."""
    st, _ = T.plan(None, V1.info, "s")
    v2 = _t([col("id", "int(11)", nullable=False), col("a", "bigint(20)"), col("c", "varchar(5)")],
            version=2)
    st2, o = T.plan(st, v2.info, "s", "ALTER TABLE t MODIFY a BIGINT, ADD c VARCHAR(5), DROP b")
    assert ops(o) == [("widen", "changelog", "a", "BIGINT"), ("widen", "current", "a", "BIGINT"),
                      ("add", "changelog", "c", "STRING"), ("add", "current", "c", "STRING"),
                      ("drop", "current", "b", "")]
    assert st2.cl_extra == (("b", "STRING"),)
    v3 = _t([col("id", "int(11)", nullable=False), col("a2", "bigint(20)"), col("c", "varchar(5)")],
            version=3)
    st3, o = T.plan(st2, v3.info, "s", "ALTER TABLE t RENAME COLUMN a TO a2")
    assert ops(o) == [("rename", "changelog", "a", "a2"), ("rename", "current", "a", "a2")]
    assert [c.cl for c in st3.columns] == ["id", "a2", "c"]


def test_a_type_change_iceberg_cannot_promote_moves_the_changelog_column_aside() -> None:
    st, _ = T.plan(None, V1.info, "s")
    v2 = _t([col("id", "int(11)", nullable=False), col("a", "varchar(20)"), col("b", "varchar(10)")],
            version=2)
    st2, o = T.plan(st, v2.info, "s", "ALTER TABLE t MODIFY a VARCHAR(20)")
    assert ops(o) == [("rename", "changelog", "a", "a__v1"), ("add", "changelog", "a", "STRING"),
                      ("recast", "current", "a", "STRING")]
    assert ("a__v1", "INT") in st2.cl_extra


def test_a_change_spark_cannot_cast_the_mysql_way_is_unmappable_unless_as_string() -> None:
    st, _ = T.plan(None, V1.info, "s")
    v2 = _t([col("id", "int(11)", nullable=False), col("a", "varbinary(8)"), col("b", "varchar(10)")],
            version=2)
    with pytest.raises(T.UnmappableChange, match=r"s\.t column a: INT -> BINARY"):
        T.plan(st, v2.info, "s", "ALTER TABLE t MODIFY a VARBINARY(8)")
    st2, o = T.plan(st, v2.info, "s", "ALTER TABLE t MODIFY a VARBINARY(8)", policy="as-string")
    assert [c.stype for c in st2.columns] == ["INT", "STRING", "STRING"]


def test_a_new_incarnation_starts_the_current_table_again_and_keeps_the_old_columns() -> None:
    st, _ = T.plan(None, V1.info, "s")
    v2 = _t([col("id", "varchar(10)", nullable=False), col("y", "text")], version=3)
    st2, o = T.plan(st, v2.info, "s", "CREATE TABLE t ...", new_incarnation=True)
    assert o[0] == T.Op("drop_table", "current") and o[-1] == T.Op("create", "current")
    assert ("rename", "changelog", "id", "id__v1") in ops(o)
    assert st2.incarnation == 2 and [c.name for c in st2.columns] == ["id", "y"]
    assert {n for n, _ in st2.cl_extra} == {"id__v1", "a", "b"}


def test_state_round_trips_through_json() -> None:
    st, _ = T.plan(None, V1.info, "s")
    assert T.TableState.from_json(st.to_json()) == st


def _row(op: str, cts: int, seq: int, *values: object) -> tuple:
    return (op, cts, seq, 1, None, None, None, None, *values)


def test_the_merge_reads_only_each_keys_last_change_of_the_batch() -> None:
    """latest_mask marks, per key, the change with the highest (_commit_ts, _seq) — a delete
    included — and nothing else; a composite key compares all its columns."""
    from sluice.spark_sink import writer as W
    st, _ = T.plan(None, V1.info, "s")
    rows = [_row("c", 10, 0, 1, 5, "a"), _row("c", 10, 2, 2, 6, "b"), _row("u", 11, 0, 1, 7, "a"),
            _row("d", 12, 0, 2, 6, "b"), _row("c", 12, 2, 3, 1, "c")]
    assert W.latest_mask(st, rows) == [False, False, True, True, True]
    # Out of stream order (a defensive path): still the highest (_commit_ts, _seq) wins.
    swapped = [rows[2], rows[0], rows[4], rows[3], rows[1]]
    assert W.latest_mask(st, swapped) == [True, False, True, True, False]
    two = _t([col("id", "int(11)", nullable=False), col("a", "int(11)", nullable=False),
              col("b", "varchar(10)")], primary=("id", "a"))
    st2, _ = T.plan(None, two.info, "s")
    assert W.latest_mask(st2, [_row("c", 1, 0, 1, 1, "x"), _row("c", 1, 2, 1, 2, "y"),
                               _row("u", 2, 0, 1, 1, "z")]) == [False, True, True]
    table = W.batch_arrow(st, rows)
    assert table.column(W.LATEST).to_pylist() == [False, False, True, True, True]
    assert table.column("id").to_pylist() == [1, 2, 1, 2, 3]
    keyless, _ = T.plan(None, _t(V1.columns, primary=()).info, "s")
    assert W.LATEST not in W.batch_arrow(keyless, rows).column_names
