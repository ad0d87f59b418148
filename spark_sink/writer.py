"""A table's buffered changes -> the Spark writes that land them: the changelog append, the
current state's MERGE (keyed tables) or multiset rewrite (keyless ones), TRUNCATE, and the
value-keeping cast of a column whose type Iceberg cannot promote.

Rows arrive as tuples `(*CHANGELOG_META values, *values of the state's columns)`; they become an
Arrow table (built in C, no per-row pickling) and a Spark DataFrame from it.

Invariants:
- The current state of a keyed table applies, per key, the batch's last change by
  (`_commit_ts`, `_seq`): a delete removes the row, anything else replaces it.
- A keyless table keeps its exact multiset: each row image's count is its count before the batch
  plus the batch's creates minus its deletes (rewritten whole: keyless tables pay a full rewrite
  per batch, docs/spark.md).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from sluice.spark_sink.tables import CHANGELOG_META, CURRENT_META, TableState, q

_DECIMAL = re.compile(r"DECIMAL\((\d+),\s*(\d+)\)$")
BATCH_VIEW = "sluice_batch"
_OP, _CTS, _SEQ = 0, 1, 2
_META_WIDTH = len(CHANGELOG_META)


def arrow_type(spark_ddl: str) -> Any:
    """The Arrow type Spark reads as this Spark SQL type."""
    import pyarrow as pa
    t = spark_ddl.strip().upper()
    simple = {"INT": pa.int32(), "BIGINT": pa.int64(), "DOUBLE": pa.float64(),
              "FLOAT": pa.float32(), "STRING": pa.string(), "BINARY": pa.binary(),
              "BOOLEAN": pa.bool_(), "DATE": pa.date32(), "TIMESTAMP": pa.timestamp("us", tz="UTC"),
              "ARRAY<STRING>": pa.list_(pa.string())}
    if t in simple:
        return simple[t]
    m = _DECIMAL.match(t)
    if m:
        return pa.decimal128(int(m.group(1)), int(m.group(2)))
    raise ValueError(f"no Arrow type for Spark type {spark_ddl!r}")


def changelog_frame(spark: Any, st: TableState, rows: Sequence[tuple[Any, ...]]) -> Any:
    """The changelog DataFrame of rows: every changelog column (unmapped ones NULL)."""
    import pyarrow as pa
    cols = [*CHANGELOG_META, *((c.cl, c.stype) for c in st.columns)]
    extra = list(st.cl_extra)
    n = len(rows)
    data = list(zip(*rows)) if rows else [()] * len(cols)
    arrays = [pa.array(v, type=arrow_type(t)) for v, (_, t) in zip(data, cols)]
    arrays += [pa.nulls(n, type=arrow_type(t)) for _, t in extra]
    names = [c for c, _ in cols] + [c for c, _ in extra]
    return spark.createDataFrame(pa.Table.from_arrays(arrays, names=names))


def current_sql(st: TableState, target: str) -> str:
    """The statement that applies the batch view to a keyed current table."""
    names = [c.name for c in st.columns]
    keys = list(st.key)
    part = ", ".join(q(k) for k in keys)
    on = " AND ".join(f"t.{q(k)} <=> s.{q(k)}" for k in keys)
    assign = ", ".join(f"t.{q(n)} = s.{q(n)}" for n in [*names, *(m for m, _ in CURRENT_META)])
    ins_cols = ", ".join(q(n) for n in [*names, *(m for m, _ in CURRENT_META)])
    ins_vals = ", ".join(f"s.{q(n)}" for n in [*names, *(m for m, _ in CURRENT_META)])
    return (f"MERGE INTO {target} t USING (SELECT * FROM (SELECT *, row_number() OVER "
            f"(PARTITION BY {part} ORDER BY `_commit_ts` DESC, `_seq` DESC) AS `_rn` FROM "
            f"{BATCH_VIEW}) WHERE `_rn` = 1) s ON {on} "
            f"WHEN MATCHED AND s.`_op` = 'd' THEN DELETE "
            f"WHEN MATCHED THEN UPDATE SET {assign} "
            f"WHEN NOT MATCHED AND s.`_op` <> 'd' THEN INSERT ({ins_cols}) VALUES ({ins_vals})")


def keyless_sql(st: TableState, target: str) -> str:
    """The new multiset of a keyless current table: old counts plus creates minus deletes."""
    names = ", ".join(q(c.name) for c in st.columns)
    return (f"SELECT {names}, `_commit_ts`, `_zero_dates` FROM (SELECT {names}, "
            f"max(`_commit_ts`) AS `_commit_ts`, max(`_zero_dates`) AS `_zero_dates`, "
            f"sum(`_n`) AS `_n` FROM (SELECT {names}, `_commit_ts`, `_zero_dates`, 1 AS `_n` "
            f"FROM {target} UNION ALL SELECT {names}, `_commit_ts`, `_zero_dates`, "
            f"CASE WHEN `_op` = 'd' THEN -1 ELSE 1 END AS `_n` FROM {BATCH_VIEW}) u "
            f"GROUP BY {names}) g LATERAL VIEW explode(sequence(1, greatest(`_n`, 1))) x AS `_i` "
            f"WHERE `_n` > 0")


def write_changelog(spark: Any, st: TableState, rows: Sequence[tuple[Any, ...]], target: str) -> None:
    changelog_frame(spark, st, rows).writeTo(target).append()


def write_current(spark: Any, st: TableState, rows: Sequence[tuple[Any, ...]], target: str) -> None:
    frame = changelog_frame(spark, st, rows)
    frame.createOrReplaceTempView(BATCH_VIEW)
    try:
        if st.key:
            spark.sql(current_sql(st, target))
        else:
            from pyspark.sql import functions as F
            spark.sql(keyless_sql(st, target)).writeTo(target).overwrite(F.lit(True))
    finally:
        spark.catalog.dropTempView(BATCH_VIEW)


def truncate(spark: Any, target: str) -> None:
    spark.sql(f"DELETE FROM {target} WHERE true")


def lossy_cast_count(spark: Any, table: str, column: str, to: str) -> int:
    """Rows whose value would not survive CAST(column AS to)."""
    c = q(column)
    return int(spark.sql(f"SELECT count(*) FROM {table} WHERE {c} IS NOT NULL AND "
                         f"try_cast({c} AS {to}) IS NULL").collect()[0][0])
