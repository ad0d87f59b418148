"""datafiles.arrow_schema: the Arrow schema a direct write's parquet file is written with, from
the Iceberg table's schema (no Spark session; pyiceberg is the independent oracle)."""
from __future__ import annotations

import decimal
import json
from typing import Any

import pyarrow as pa
import pytest

from sluice.spark_sink import datafiles as D

FIELDS: list[dict[str, Any]] = [
    {"id": 1, "name": "i", "required": True, "type": "int"},
    {"id": 2, "name": "l", "required": False, "type": "long"},
    {"id": 3, "name": "f", "required": False, "type": "float"},
    {"id": 4, "name": "d", "required": False, "type": "double"},
    {"id": 5, "name": "s", "required": False, "type": "string"},
    {"id": 6, "name": "b", "required": False, "type": "binary"},
    {"id": 7, "name": "o", "required": False, "type": "boolean"},
    {"id": 8, "name": "da", "required": False, "type": "date"},
    {"id": 9, "name": "tz", "required": False, "type": "timestamptz"},
    {"id": 10, "name": "ts", "required": False, "type": "timestamp"},
    {"id": 11, "name": "d9", "required": False, "type": "decimal(9, 4)"},
    {"id": 12, "name": "d38", "required": False, "type": "decimal(38, 10)"},
    {"id": 13, "name": "arr", "required": False,
     "type": {"type": "list", "element-id": 20, "element": "string", "element-required": False}},
    {"id": 14, "name": "m", "required": False,
     "type": {"type": "map", "key-id": 21, "key": "string", "value-id": 22, "value": "long",
              "value-required": False}},
]


def _small(t: pa.DataType) -> pa.DataType:
    """pyiceberg's large Arrow types as the plain ones (same parquet physical layout)."""
    if t == pa.large_string():
        return pa.string()
    if t == pa.large_binary():
        return pa.binary()
    if pa.types.is_large_list(t):
        f = t.value_field
        return pa.list_(f.with_type(_small(f.type)))
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(_small(t.key_field.type)),
                       t.item_field.with_type(_small(t.item_field.type)))
    return t


def test_every_field_and_nested_field_carries_its_iceberg_field_id_as_pyiceberg_writes_it() -> None:
    """Every Iceberg type the sink's tables use maps to the Arrow type pyiceberg's own writer
    uses (up to its large string/binary/list variants, the same in parquet), with the field's
    Iceberg id as the parquet field id on every field, list element, map key and map value, and
    required fields not nullable."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow
    from pyiceberg.schema import Schema
    text = json.dumps({"type": "struct", "schema-id": 0, "fields": FIELDS})
    ours = D.arrow_schema(text)
    theirs = schema_to_pyarrow(Schema.model_validate_json(text))
    assert len(ours) == len(theirs) == len(FIELDS)
    for a, b in zip(ours, theirs):
        assert a.name == b.name and a.nullable == b.nullable
        assert a.metadata == b.metadata, a.name
        assert a.type == _small(b.type), a.name
        if pa.types.is_list(a.type):
            assert a.type.value_field.metadata == {D.FIELD_ID: b"20"}
        if pa.types.is_map(a.type):
            assert a.type.key_field.metadata == {D.FIELD_ID: b"21"}
            assert a.type.item_field.metadata == {D.FIELD_ID: b"22"}
            assert not a.type.key_field.nullable


@pytest.mark.parametrize("iceberg", ["uuid", "time", "fixed[16]", "timestamp_ns",
                                     {"type": "struct", "fields": []}])
def test_a_type_without_an_exact_mapping_is_refused(iceberg: Any) -> None:
    """A type the direct path cannot write exactly is Unmappable (the table goes through
    Spark), never a guess."""
    text = json.dumps({"type": "struct", "fields": [
        {"id": 1, "name": "x", "required": False, "type": iceberg}]})
    with pytest.raises(D.Unmappable):
        D.arrow_schema(text)


def test_conform_casts_safely_and_refuses_what_does_not_fit() -> None:
    """A batch is cast to the table's types by name (case-insensitive), missing columns NULL;
    a value that does not fit raises, a batch column the table lacks is Unmappable, a NULL in
    a required column is refused."""
    schema = D.arrow_schema(json.dumps({"type": "struct", "fields": [
        {"id": 1, "name": "Id", "required": True, "type": "long"},
        {"id": 2, "name": "v", "required": False, "type": "decimal(5, 2)"},
        {"id": 3, "name": "w", "required": False, "type": "string"}]}))
    got = D.conform(pa.table({"id": pa.array([1, 2], pa.int32()),
                              "v": pa.array([None, decimal.Decimal(1)], pa.decimal128(4, 2))}),
                     schema)
    assert got.schema == schema
    assert got.to_pylist() == [{"Id": 1, "v": None, "w": None},
                               {"Id": 2, "v": decimal.Decimal("1.00"), "w": None}]
    with pytest.raises(D.FailedPrecondition, match="table db.t column v: the batch's values do "
                       "not fit the table's type decimal128.5, 2."):
        D.conform(pa.table({"id": [1], "v": pa.array([decimal.Decimal(10_000)],
                                                       pa.decimal128(10, 2))}), schema, "db.t")
    with pytest.raises(D.Unmappable, match="zz"):
        D.conform(pa.table({"id": [1], "zz": [1]}), schema)
    with pytest.raises(D.FailedPrecondition, match="table db.t column Id: the column is required"):
        D.conform(pa.table({"id": pa.array([None], pa.int64())}), schema, "db.t")
