"""Data and equality-delete files written by the driver and committed through the Iceberg Java
API: no Spark job (docs/spark.md "Direct writes").

The driver writes each file with pyarrow against the table's schema as it is at commit time
(`arrow_schema`: every field, nested list elements and map keys/values too, carries its Iceberg
field id as the parquet field id, so Iceberg reads columns by id, not by name), hands the bytes
to the table's FileIO (any warehouse Iceberg writes to; a local one is written directly), lets
Iceberg compute the file's metrics from the parquet footer (`ParquetUtil.fileMetrics`: counts
and bounds, which readers use to skip files), and commits it on the sink's branch with the
batch's summary in the snapshot: a changelog append (`newAppend`), a current table's last
images (`newAppend`, or with equality deletes ONE `newRowDelta().addRows(..).addDeletes(..)`),
the marker row (`newAppend`).

Invariants:
- A file is written only when every column maps exactly (`arrow_schema` refuses any Iceberg type
  it does not know: `Unmappable`) and the table is unpartitioned; otherwise `target()` returns
  None and the caller writes through Spark (writer.BatchFrame).
- Equality deletes apply only to data files of a strictly LOWER data sequence number (Iceberg
  spec, "Scan Planning": an equality delete file applies to a data file when the data file's
  data sequence number is strictly less than the delete's). The row delta that adds a batch's
  last images and the equality-delete file of the keys they replace is one commit, one sequence
  number: the deletes remove the older rows of those keys and never the new images.
"""
from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import re
import uuid
from typing import TYPE_CHECKING, Any

from sluice.core.errors import FailedPrecondition
from sluice.core.log import kv
from sluice.spark_sink import positions

if TYPE_CHECKING:
    from sluice.spark_sink.catalog import JavaClasses

log = logging.getLogger(__name__)

FIELD_ID = b"PARQUET:field_id"
# Key types whose equality Iceberg and Spark may disagree on (-0.0 vs 0.0, NaN): such a table
# keeps the SQL DELETE.
_NO_EQUALITY = ("FLOAT", "DOUBLE")
_DECIMAL = re.compile(r"decimal\((\d+),\s*(\d+)\)$")


class Unmappable(FailedPrecondition):
    """An Iceberg type (or a batch column) the direct path cannot write exactly."""


def supported(key_types: list[str]) -> bool:
    """Whether keys of these Spark types may be removed by an equality-delete file."""
    return not any(t.strip().upper() in _NO_EQUALITY for t in key_types)


def _pa() -> Any:
    import pyarrow as pa
    return pa


def _ided(name: str, typ: Any, fid: int, required: bool) -> Any:
    return _pa().field(name, typ, nullable=not required, metadata={FIELD_ID: str(fid).encode()})


def _arrow_type(t: Any) -> Any:
    """The Arrow type of an Iceberg type (JSON form of SchemaParser) as Iceberg's parquet
    readers expect it; nested fields carry their ids."""
    pa = _pa()
    if isinstance(t, str):
        simple = {"boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(),
                  "float": pa.float32(), "double": pa.float64(), "string": pa.string(),
                  "binary": pa.binary(), "date": pa.date32(),
                  "timestamptz": pa.timestamp("us", tz="UTC"), "timestamp": pa.timestamp("us")}
        if t in simple:
            return simple[t]
        m = _DECIMAL.match(t)
        if m:
            return pa.decimal128(int(m.group(1)), int(m.group(2)))
        raise Unmappable(f"no exact Arrow type for Iceberg type {t!r}")
    kind = t.get("type")
    if kind == "list":
        return pa.list_(_ided("element", _arrow_type(t["element"]), t["element-id"],
                              t.get("element-required", False)))
    if kind == "map":
        return pa.map_(_ided("key", _arrow_type(t["key"]), t["key-id"], True),
                       _ided("value", _arrow_type(t["value"]), t["value-id"],
                             t.get("value-required", False)))
    raise Unmappable(f"no exact Arrow type for Iceberg type {json.dumps(t)}")


def arrow_schema(schema_json: str) -> Any:
    """The Arrow schema (field ids on every field) of an Iceberg schema's JSON."""
    s = json.loads(schema_json)
    return _pa().schema([_ided(f["name"], _arrow_type(f["type"]), f["id"], f["required"])
                         for f in s["fields"]])


def conform(data: Any, schema: Any, table: str = "") -> Any:
    """data (an Arrow table) as `schema` (of `table`, for messages): columns matched by name
    (case-insensitively, as Spark resolves them), each cast safely to the table's type, columns
    the batch lacks as NULLs. A batch column the table lacks is Unmappable; a value that does not
    fit its column, or a NULL in a required one, is FailedPrecondition naming table and column."""
    pa = _pa()
    by_name = {n.lower(): i for i, n in enumerate(data.column_names)}
    want = {f.name.lower() for f in schema}
    extra = [n for n in data.column_names if n.lower() not in want]
    if extra:
        raise Unmappable(f"batch columns {extra} are not in the table")
    arrays = []
    for f in schema:
        i = by_name.get(f.name.lower())
        if i is None:
            arrays.append(pa.nulls(data.num_rows, type=f.type))
            continue
        col = data.column(i)
        if not f.nullable and col.null_count:
            raise FailedPrecondition(f"spark sink: table {table} column {f.name}: the column is "
                                     "required (NOT NULL) in Iceberg and the batch has NULLs in it")
        if col.type != f.type:
            try:
                col = col.cast(f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise FailedPrecondition(
                    f"spark sink: table {table} column {f.name}: the batch's values do not fit "
                    f"the table's type {f.type} ({e})") from None
        arrays.append(col)
    return pa.Table.from_arrays(arrays, schema=schema)


@dataclasses.dataclass
class Target:
    """One Iceberg table's branch that files go to, as the table is now (refreshed): its Java
    `Table`, its Arrow schema, and the snapshot summary every commit carries."""

    java: JavaClasses
    ice: Any
    name: str
    branch: str
    props: dict[str, str]
    schema: Any       # pyarrow.Schema with field ids
    key_cache: positions.KeyCache | None = None   # for position deletes (positions.py)

    # -- files ---------------------------------------------------------------------------------

    def _write(self, data: Any, suffix: str) -> tuple[str, int]:
        import pyarrow.parquet as pq
        path = self.ice.locationProvider().newDataLocation(f"{uuid.uuid4().hex}-{suffix}.parquet")
        # Decimals as integers where they fit, as Iceberg's own writers store them.
        options = {"compression": "zstd", "store_decimal_as_integer": True}
        local = positions.local_path(path)
        if local is not None:
            # A local warehouse: pyarrow writes the file itself. Through the FileIO the bytes
            # would cross py4j as base64 text, decoded char by char in the JVM (measured: a
            # tenth of the JVM's CPU per batch). The file is only referenced once committed,
            # so a crash mid-write leaves an orphan, as a crash inside the FileIO's stream would.
            os.makedirs(os.path.dirname(local), exist_ok=True)
            pq.write_table(data, local, **options)
            return path, os.path.getsize(local)
        buf = io.BytesIO()
        pq.write_table(data, buf, **options)
        body = buf.getvalue()
        out = self.ice.io().newOutputFile(path).create()
        try:
            out.write(body)
        finally:
            out.close()
        return path, len(body)

    def _metrics(self, path: str, config: Any = None) -> Any:
        """Iceberg's metrics of the written file under `config` (default: the table's)."""
        j = self.java
        return j.parquet_metrics(self.ice.io().newInputFile(path),
                                 config if config is not None else j.MetricsConfig.forTable(self.ice))

    def data_file(self, data: Any) -> Any:
        """data (already in self.schema) as a parquet data file of the table."""
        path, size = self._write(data, "data")
        j = self.java
        return (j.DataFiles.builder(self.ice.spec()).withPath(path)
                .withFormat(j.FileFormat.PARQUET).withFileSizeInBytes(size)
                .withMetrics(self._metrics(path)).build())

    def equality_delete_file(self, keys: Any) -> Any:
        """keys (an Arrow table of key columns named as the table's) as an equality-delete
        file on those columns."""
        pa = _pa()
        by_name = {f.name.lower(): f for f in self.schema}
        fields, ids = [], []
        for name in keys.column_names:
            f = by_name.get(name.lower())
            if f is None:
                raise FailedPrecondition(f"spark sink: table {self.name} has no column {name!r} "
                                         "for its equality deletes")
            fields.append(f)
            ids.append(int(f.metadata[FIELD_ID]))
        data = conform(keys.rename_columns([f.name for f in fields]), pa.schema(fields), self.name)
        path, size = self._write(data, "eq-deletes")
        j = self.java
        jids = j.gateway.new_array(j.int, len(ids))
        for i, fid in enumerate(ids):
            jids[i] = fid
        return (j.FileMetadata.deleteFileBuilder(self.ice.spec()).ofEqualityDeletes(jids)
                .withPath(path).withFormat(j.FileFormat.PARQUET).withFileSizeInBytes(size)
                .withRecordCount(data.num_rows).withMetrics(self._metrics(path)).build())

    def position_delete_file(self, rows: Any) -> Any:
        """rows (file_path, pos; sorted) as a position-delete file."""
        pa = _pa()
        schema = pa.schema([_ided("file_path", pa.string(), positions.FILE_PATH_ID, True),
                            _ided("pos", pa.int64(), positions.POS_ID, True)])
        data = pa.Table.from_arrays([rows.column("file_path"), rows.column("pos")], schema=schema)
        path, size = self._write(data, "deletes")
        j = self.java
        # The position-delete metrics config keeps whole file_path bounds: readers match a
        # delete file to the data files it can touch by them.
        metrics = self._metrics(path, j.MetricsConfig.forPositionDelete())
        return (j.FileMetadata.deleteFileBuilder(self.ice.spec()).ofPositionDeletes()
                .withPath(path).withFormat(j.FileFormat.PARQUET).withFileSizeInBytes(size)
                .withRecordCount(data.num_rows).withMetrics(metrics).build())

    def find_positions(self, keys: Any) -> positions.Positions | None:
        """Where the rows of these keys (an Arrow table of key columns named as the table's)
        are on the branch; None: not exactly here (the caller deletes through Spark)."""
        if self.key_cache is None:
            return None
        by_name = {f.name.lower(): f for f in self.schema}
        fields = [by_name.get(n.lower()) for n in keys.column_names]
        if any(f is None for f in fields):
            return None
        typed = conform(keys.rename_columns([f.name for f in fields]),
                        _pa().schema(fields), self.name)
        ids = tuple(int(f.metadata[FIELD_ID]) for f in fields)
        return positions.find(self.ice, self.branch, typed, ids, self.key_cache, self.name)

    # -- commits -------------------------------------------------------------------------------

    def _commit(self, op: Any) -> None:
        op = op.toBranch(self.branch)
        for k, v in self.props.items():
            op = op.set(k, v)
        op.commit()

    def append(self, data: Any) -> None:
        """One append snapshot of data (any Arrow table with the table's column names) on the
        branch; with no rows, an empty snapshot that still carries the summary (what a Spark
        append of no rows commits too)."""
        op = self.ice.newAppend()
        if data.num_rows:
            op = op.appendFile(self.data_file(conform(data, self.schema, self.name)))
        self._commit(op)

    def row_delta(self, data: Any, keys: Any) -> None:
        """ONE commit: the rows of data added, every older row of the keys removed (equality
        deletes, same sequence number: they do not apply to data's rows)."""
        op = self.ice.newRowDelta()
        if data.num_rows:
            op = op.addRows(self.data_file(conform(data, self.schema, self.name)))
        if keys.num_rows:
            op = op.addDeletes(self.equality_delete_file(keys))
        self._commit(op)

    def position_delta(self, data: Any, found: positions.Positions) -> None:
        """ONE commit: the rows of data added, the rows at `found` deleted (position deletes
        name older files only, so never data's rows). Validated from the snapshot the positions
        were found at: a referenced file removed since (a rewrite) fails the commit."""
        op = self.ice.newRowDelta()
        if data.num_rows:
            op = op.addRows(self.data_file(conform(data, self.schema, self.name)))
        if found.rows.num_rows:
            op = op.addDeletes(self.position_delete_file(found.rows))
            if found.snapshot_id is not None:
                op = op.validateFromSnapshot(found.snapshot_id)
            from py4j.java_collections import ListConverter
            op = op.validateDataFilesExist(ListConverter().convert(
                found.files, self.java.gateway._gateway_client)).validateDeletedFiles()
        self._commit(op)


def target(catalog: Any, db: str, table: str, branch: str, props: dict[str, str],
           key_cache: positions.KeyCache | None = None) -> Target | None:
    """The branch of db.table to write files to, or None when Spark must write it instead (a
    partitioned table: its files would need partition values; a type arrow_schema cannot map
    exactly)."""
    ice = catalog.iceberg_table(db, table)
    name = f"{db}.{table}"
    if not ice.spec().isUnpartitioned():
        log.debug("spark sink: partitioned table, written through Spark", extra=kv(table=name))
        return None
    try:
        schema = _schema_of(catalog.java.SchemaParser.toJson(ice.schema()))
    except Unmappable as e:
        log.debug("spark sink: table written through Spark", extra=kv(table=name, reason=str(e)))
        return None
    return Target(catalog.java, ice, name, branch, dict(props), schema, key_cache)


_SCHEMAS: dict[str, Any] = {}


def _schema_of(schema_json: str) -> Any:
    s = _SCHEMAS.get(schema_json)
    if s is None:
        if len(_SCHEMAS) > 1000:
            _SCHEMAS.clear()
        s = _SCHEMAS[schema_json] = arrow_schema(schema_json)
    return s
