"""Equality deletes: the keys a batch removes from a keyed current table, as one Iceberg
equality-delete file committed on the sink's branch through the Iceberg API (the way Flink CDC
keeps an upsert table), instead of a `DELETE ... WHERE key IN (...)` Spark job that scans the
table (`current-state = "equality-deletes"`, docs/spark.md).

The driver writes the file with pyarrow (the key columns, each carrying its Iceberg field id as
the parquet field id), hands the bytes to the table's FileIO (so any warehouse Iceberg writes to
works, not only a local directory), lets Iceberg compute the file's metrics (`ParquetUtil
.fileMetrics`: bounds per key column, which readers use to skip data files), and commits it with
`newRowDelta().addDeletes(...).toBranch(branch)`, the batch's summary in the snapshot.

Invariant: the delete commit comes BEFORE the append of the batch's last images, so the images
get a higher data sequence number and the file's deletes (which apply only to data files of a
lower sequence number) do not hit them; one fast_forward publishes both (commit.py).
"""
from __future__ import annotations

import io
import logging
import uuid
from typing import Any

from sluice.core.errors import FailedPrecondition
from sluice.core.log import kv

log = logging.getLogger(__name__)

# Key types whose equality Iceberg and Spark may disagree on (-0.0 vs 0.0, NaN): such a table
# keeps the SQL DELETE.
_NO_EQUALITY = ("FLOAT", "DOUBLE")


def supported(key_types: list[str]) -> bool:
    return not any(t.strip().upper() in _NO_EQUALITY for t in key_types)


def commit_equality_deletes(catalog: Any, db: str, table: str, branch: str, keys: Any,
                            props: dict[str, str]) -> bool:
    """Commit `keys` (an Arrow table of key columns named as the current table's) as an
    equality-delete file on `branch` of db.table, the snapshot summary carrying props.
    False (nothing written): the table is partitioned (the file would need partition values;
    the sink's tables are not), the caller runs the SQL DELETE instead."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    spark = catalog.spark
    jvm = spark._jvm
    ice = catalog.iceberg_table(db, table)
    spec = ice.spec()
    if not spec.isUnpartitioned():
        log.info("spark sink: partitioned current table, equality deletes not used",
                 extra=kv(table=f"{db}.{table}"))
        return False
    schema = ice.schema()
    fields, ids = [], []
    for name in keys.column_names:
        f = schema.caseInsensitiveFindField(name)
        if f is None:
            raise FailedPrecondition(f"spark sink: table {db}.{table} has no column {name!r} for its "
                             "equality deletes")
        ids.append(int(f.fieldId()))
        fields.append(pa.field(str(f.name()), keys.schema.field(name).type,
                               nullable=bool(f.isOptional()),
                               metadata={b"PARQUET:field_id": str(f.fieldId()).encode()}))
    data = pa.Table.from_arrays(keys.columns, schema=pa.schema(fields))
    buf = io.BytesIO()
    # Decimals as integers where they fit (as Iceberg's own writers store them).
    pq.write_table(data, buf, compression="zstd", store_decimal_as_integer=True)
    body = buf.getvalue()
    path = ice.locationProvider().newDataLocation(f"{uuid.uuid4().hex}-eq-deletes.parquet")
    out = ice.io().newOutputFile(path).create()
    try:
        out.write(body)
    finally:
        out.close()
    metrics = jvm.org.apache.iceberg.parquet.ParquetUtil.fileMetrics(
        ice.io().newInputFile(path), jvm.org.apache.iceberg.MetricsConfig.forTable(ice))
    jids = spark.sparkContext._gateway.new_array(jvm.int, len(ids))
    for i, fid in enumerate(ids):
        jids[i] = fid
    delete_file = (jvm.org.apache.iceberg.FileMetadata.deleteFileBuilder(spec)
                   .ofEqualityDeletes(jids).withPath(path)
                   .withFormat(jvm.org.apache.iceberg.FileFormat.PARQUET)
                   .withFileSizeInBytes(len(body)).withRecordCount(data.num_rows)
                   .withMetrics(metrics).build())
    delta = ice.newRowDelta().addDeletes(delete_file).toBranch(branch)
    for k, v in props.items():
        delta = delta.set(k, v)
    delta.commit()
    return True
