"""A micro-batch's parquet files written from Python with pyarrow, for a local `root`.

Why: `spark.createDataFrame(rows)` pickles every row into the JVM and costs more than the rest
of the commit together (docs/benchmarks.md, Spark sink); pyarrow builds the columns in C and
writes the same parquet a Spark writer would read back, in a fraction of the time. A `root` on
another file system (hdfs://, s3a://) keeps the Spark writer.

Invariant: the files are exactly what the Spark writer would produce for the table's schema —
every column under its catalog name with the Parquet type Spark reads as that Spark SQL type —
and they are on disk (file and directory fsynced) before the batch's partition is registered, so
a commit point never names files a machine crash could lose.
"""
from __future__ import annotations

import os
import re
import shutil
from collections.abc import Sequence
from typing import Any

from sluice.core.fsync import fsync_path

__all__ = ["is_local", "local_path", "arrow_schema", "write_rows"]

_DECIMAL = re.compile(r"DECIMAL\((\d+),\s*(\d+)\)$")


def is_local(path: str) -> bool:
    """A plain path or a file: URI (what pyarrow can write directly)."""
    return "://" not in path or path.startswith("file:")


def local_path(path: str) -> str:
    if path.startswith("file://"):
        return path[len("file://"):]
    if path.startswith("file:"):
        return path[len("file:"):]
    return path


def arrow_type(spark_ddl: str) -> Any:
    """The Arrow type that lands in Parquet as what Spark reads as this Spark SQL type."""
    import pyarrow as pa
    t = spark_ddl.strip().upper()
    simple = {"TINYINT": pa.int8(), "SMALLINT": pa.int16(), "INT": pa.int32(),
              "BIGINT": pa.int64(), "DOUBLE": pa.float64(), "FLOAT": pa.float32(),
              "STRING": pa.string(), "BINARY": pa.binary(), "BOOLEAN": pa.bool_(),
              "DATE": pa.date32(), "TIMESTAMP": pa.timestamp("us", tz="UTC"),
              "ARRAY<STRING>": pa.list_(pa.string())}
    if t in simple:
        return simple[t]
    m = _DECIMAL.match(t)
    if m:
        return pa.decimal128(int(m.group(1)), int(m.group(2)))
    raise ValueError(f"no Arrow type for Spark type {spark_ddl!r}")


def arrow_schema(columns: Sequence[tuple[str, str]]) -> Any:
    import pyarrow as pa
    return pa.schema([pa.field(name, arrow_type(t)) for name, t in columns])


def write_rows(path: str, schema: Any, rows: Sequence[Sequence[Any]],
               rows_per_file: int = 1_000_000) -> None:
    """Replace directory `path` by parquet files holding `rows` (tuples in schema order)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    d = local_path(path)
    if os.path.exists(d):
        shutil.rmtree(d)   # an earlier attempt of this (uncommitted) batch
    os.makedirs(d)
    for part, start in enumerate(range(0, max(len(rows), 1), rows_per_file)):
        chunk = rows[start:start + rows_per_file]
        cols = list(zip(*chunk)) if chunk else [()] * len(schema)
        table = pa.Table.from_arrays(
            [pa.array(c, type=f.type) for c, f in zip(cols, schema)], schema=schema)
        name = os.path.join(d, f"part-{part:05d}.snappy.parquet")
        pq.write_table(table, name, compression="snappy", coerce_timestamps="us",
                       allow_truncated_timestamps=False)
        fsync_path(name)
    fsync_path(d)
    fsync_path(os.path.dirname(d))

