"""The MySQL sink's former all-Python row decode (drainer/translator.py before the native core,
issue 23), kept only as the differential oracle of tests/unit/test_native_drainer_decode.py:
`Txn.rows` (upb messages) -> `decode_row` per image -> the values pymysql is given.
"""
from __future__ import annotations

import datetime as _dt
import decimal
from collections.abc import Sequence
from typing import Any

from sluice.core.rowcodec import MySQLDateTime, datum_to_python, row_to_dict
from sluice.drainer.translator import _DATE_TYPES, ApplyShape, RowChange, Translator, fold
from sluice.drainer.txn import SchemaLookup, Txn
from sluice.proto import sluice_pb2 as pb

_KIND_OF_OP = {"c": "insert", "u": "update", "d": "delete", "r": "upsert"}


def translate_changes(txn: Txn, schema: SchemaLookup, tr: Translator) -> list[RowChange]:
    """The former Translator.translate, whole (RowChanges with their causality keys): the
    baseline of bench/drainer_apply.py's decode stage and its sink side."""
    out = []
    for ev in txn.rows(schema):
        shape = tr.shape(ev.table_info, ev.schema, ev.table)
        before = decode_row(ev.before, ev.table_info, shape) if ev.before is not None else None
        after = decode_row(ev.after, ev.table_info, shape) if ev.after is not None else None
        keys: list[str] = []
        if before is not None:
            keys += row_keys(shape, before)
        if after is not None:
            for k in row_keys(shape, after):
                if k not in keys:
                    keys.append(k)
        out.append(RowChange(_KIND_OF_OP[ev.op], shape, txn.commit_ts, before, after, tuple(keys)))
    return out


def row_keys(shape: ApplyShape, values: Sequence[Any]) -> list[str]:
    """drainer/translator.py's former Python causality keys of one row image: the oracle of
    native/src/causality.rs (ApplyShape.keys)."""
    prefix = shape.qualified
    if shape.has_identity or shape.unique:
        out = []
        for key_prefix, cols, primary in shape.key_specs:
            if len(cols) == 1:
                v = values[cols[0]]
                if v is None and not primary:
                    continue
                out.append(key_prefix + fold(v))
                continue
            vals = [values[i] for i in cols]
            if not primary and None in vals:
                continue
            out.append(key_prefix + "\x00".join([fold(v) for v in vals]))
        if shape.has_identity:
            return out
    # No row identity: the full image is the only thing that names the row. The table key comes
    # first (routing hashes the first key): statements on such a table scan it and lock every
    # row they pass, so two workers on one keyless table would deadlock each other.
    full = f"{prefix}\x00*\x00" + "\x00".join("N" if v is None else fold(v) for v in values)
    return [f"{prefix}\x00**", full]


class PyTranslator(Translator):
    """A Translator taking the former all-Python path (bench baseline only)."""

    def translate(self, txn: Txn, schema: SchemaLookup) -> list[RowChange]:
        return translate_changes(txn, schema, self)


def translate_values(txn: Txn, schema: SchemaLookup, tr: Translator | None = None
                     ) -> list[tuple[str, str, tuple[Any, ...] | None, tuple[Any, ...] | None, tuple[str, ...]]]:
    """(kind, `schema`.`table`, before, after, causality keys) per row change, the old way."""
    return [(c.kind, c.shape.sql_name, c.before, c.after, c.keys)
            for c in translate_changes(txn, schema, tr or Translator())]


def sql_value(value: Any, data_type: str) -> Any:
    """A rowcodec Python value -> what pymysql must send so MySQL stores the source value."""
    if value is None:
        return None
    if isinstance(value, MySQLDateTime):
        # Zero dates and zero parts: Python's datetime cannot hold them, MySQL parses the text.
        if data_type in _DATE_TYPES:
            return f"{value.year:04d}-{value.month:02d}-{value.day:02d}"
        return str(value)
    if isinstance(value, _dt.datetime):
        # Datums are UTC and sink sessions run with time_zone '+00:00'.
        return value.replace(tzinfo=None)
    if data_type == "bit" and isinstance(value, bytes):
        # A binary string assigned to BIT is checked against the width byte-wise; the integer is exact.
        return int.from_bytes(value, "big")
    return value


def decode_row(row: pb.Row, info: pb.TableInfo, shape: ApplyShape) -> tuple[Any, ...]:
    datums = row.columns
    n = len(datums)
    if n == len(shape.columns):
        visible = datums
    elif n == shape.total:
        visible = [datums[i] for i in shape.visible_pos]
    else:
        row_to_dict(row, info)  # raises the codec's error naming table, version and counts
        raise AssertionError("unreachable")
    out: list[Any] = []
    append = out.append
    # The common kinds inline (this is the drainer's hottest loop); the rest in _decode_other.
    for i, d in enumerate(visible):
        kind = d.WhichOneof("value")
        if kind == "int":
            append(d.int)
        elif kind == "str":
            append(d.str)
        elif kind is None or kind == "null":
            append(None)
        elif kind == "uint":
            append(d.uint)
        elif kind == "double":
            append(d.double)
        else:
            append(_decode_other(d, kind, i, shape))
    return tuple(out)


def _decode_other(d: pb.Datum, kind: str, i: int, shape: ApplyShape) -> Any:
    """sql_value(datum_to_python(d)) for the remaining kinds, without its generic dispatch."""
    if kind == "bytes":
        return int.from_bytes(d.bytes, "big") if i in shape.bit_columns else d.bytes
    if kind == "datetime":
        v = d.datetime
        try:
            if i in shape.date_columns:
                return _dt.date(v.year, v.month, v.day)
            # Datums are UTC and sink sessions run with time_zone '+00:00': naive UTC.
            return _dt.datetime(v.year, v.month, v.day, v.hour, v.minute, v.second, v.microsecond)
        except ValueError:
            pass  # zero dates and zero parts: sql_value writes them as text
    elif kind == "time":
        v = d.time
        td = _dt.timedelta(0, v.hours * 3600 + v.minutes * 60 + v.seconds, v.microseconds)
        return -td if v.negative else td
    elif kind == "decimal":
        try:
            return decimal.Decimal(d.decimal)
        except decimal.InvalidOperation:
            pass  # datum_to_python raises the codec's error naming the column
    return sql_value(datum_to_python(d, shape.infos[i]), shape.data_types[i])




class PyKeysTranslator(Translator):
    """Translator.translate as it was before the native causality keys (native decode, Python
    `row_keys`): the baseline of bench/drainer_apply.py's keys step."""

    def translate(self, txn: Txn, schema: SchemaLookup) -> list[RowChange]:
        from sluice.drainer.translator import DELETE, INSERT, UPDATE, UPSERT, decode_mutation
        _INSERT, _UPDATE, _DELETE = pb.INSERT, pb.UPDATE, pb.DELETE
        commit_ts = txn.commit_ts
        snapshot_chunk, mutations = txn.mutations(schema)
        out: list[RowChange] = []
        append = out.append
        insert_kind = UPSERT if snapshot_chunk else INSERT
        for m in mutations:
            shape = self.shape(m.info, m.schema, m.table)
            for tp, before, after in decode_mutation(txn, m, shape):
                if tp == _UPDATE:
                    keys = row_keys(shape, before)
                    for k in row_keys(shape, after):
                        if k not in keys:
                            keys.append(k)
                    append(RowChange(UPDATE, shape, commit_ts, before, after, tuple(keys)))
                elif tp == _DELETE:
                    append(RowChange(DELETE, shape, commit_ts, before, None, tuple(row_keys(shape, before))))
                else:
                    append(RowChange(insert_kind if tp == _INSERT else UPSERT, shape, commit_ts,
                                     None, after, tuple(dict.fromkeys(row_keys(shape, after)))))
        return out
