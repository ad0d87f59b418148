"""The Spark sink's former all-Python row path (spark_sink/types.py `row_values`/`row_reader`
and SchemaChanges._buffer_txn/_row/_key_changed before native/src/sparkrows.rs, issue 23), kept
only as the differential oracle of tests/unit/test_spark_rows.py and the baseline of
bench/spark_rows.py: `Txn.rows` (upb messages) -> a generated reader per table version -> the
tuples the sink buffers.
"""
from __future__ import annotations

import time
from typing import Any

from sluice.core.errors import InvalidArgument, SluiceError
from sluice.core.position import format_position
from sluice.drainer.txn import Txn
from sluice.proto import sluice_pb2 as pb
from sluice.spark_sink import tables as T
from sluice.spark_sink.types import _ZERO, ColumnPlan, RowReader, plan_columns


def row_values(row: pb.Row, info: pb.TableInfo, plans: list[ColumnPlan]) -> tuple[list[Any], list[str] | None]:
    """(values of the visible columns in plan order, names of zero-date columns or None)."""
    datums = row.columns
    if len(datums) == len(info.columns) and len(plans) != len(datums):
        datums = [d for d, c in zip(datums, info.columns) if not c.hidden]
    if len(datums) != len(plans):
        raise InvalidArgument(
            f"row of {info.schema_name}.{info.table_name} (version {info.version}) has "
            f"{len(row.columns)} values for {len(info.columns)} columns ({len(plans)} visible)")
    out: list[Any] = []
    append = out.append
    zero: list[str] | None = None
    for d, p in zip(datums, plans):
        k = d.WhichOneof("value")
        if k in p.native:
            append(getattr(d, k))
        elif k is None or k == "null":
            append(None)
        else:
            v = p.convert(d)
            if v is _ZERO:
                zero = (zero or []) + [p.name]
                v = None
            append(v)
    return out, zero


def row_reader(info: pb.TableInfo, plans: list[ColumnPlan] | None = None) -> RowReader:
    """`row_values` for one TableInfo version as a function generated for its columns:
    `read(row, meta)` -> `(*meta, zero_dates, *values)`, the row as the sink lands it.

    The Spark sink's hot path (~9 Datums per changelog row): unrolled, each Datum is read by a
    direct attribute access for its native kinds, without the per-column loop, plan lookups and
    appends of `row_values`, into the final tuple (~40% less time per row). Rows in another
    shape (visible columns only, or a wrong count) take `row_values`: the same values or the
    same error."""
    plans = plan_columns(info) if plans is None else plans
    width = len(info.columns)

    def generic(row: pb.Row, meta: tuple[Any, ...]) -> tuple[Any, ...]:
        vals, zero = row_values(row, info, plans)
        return (*meta, zero, *vals)

    if not width:
        return generic
    env: dict[str, Any] = {"_ZERO": _ZERO, "_generic": generic}
    datums = [f"d{j}" for j in range(width)]
    src = ["def read(row, meta):",
           "    c = row.columns",
           f"    if len(c) != {width}:",
           "        return _generic(row, meta)",
           f"    {', '.join(datums)}, = c",
           "    zero = None"]
    visible = [j for j, c in enumerate(info.columns) if not c.hidden]
    for i, (j, p) in enumerate(zip(visible, plans)):
        env[f"conv{i}"], env[f"name{i}"] = p.convert, p.name
        src.append(f"    k = d{j}.WhichOneof('value')")
        branch = "if"
        for kind in sorted(p.native):   # kinds are proto field names: safe as attribute names
            src += [f"    {branch} k == {kind!r}:", f"        v{i} = d{j}.{kind}"]
            branch = "elif"
        src += [f"    {branch} k is None or k == 'null':", f"        v{i} = None",
                "    else:", f"        v{i} = conv{i}(d{j})",
                f"        if v{i} is _ZERO:", f"            zero = (zero or []) + [name{i}]",
                f"            v{i} = None"]
    src.append(f"    return (*meta, zero, {''.join(f'v{i}, ' for i in range(len(plans)))})")
    exec("\n".join(src), env)  # noqa: S102 - code generated from proto field names only
    return env["read"]  # type: ignore[no-any-return]



class PyRows:
    """The former buffering on a sink's state: `buffer_txn(txn)` fills `buf` (the sink's _Buffer)
    exactly as SparkSink._buffer_txn did."""

    def __init__(self, states: dict[int, T.TableState], schema: Any, buf: Any) -> None:
        self._states, self._schema, self._buf = states, schema, buf
        self._readers: dict[tuple[int, int], tuple[RowReader, list[int] | None]] = {}
        self._key_index: dict[tuple[int, int, int], list[int]] = {}

    def _reader(self, st: T.TableState, info: pb.TableInfo) -> tuple[RowReader, list[int] | None]:
        key = (info.table_id, info.version)
        r = self._readers.get(key)
        if r is None:
            r = self._readers[key] = (row_reader(info), T.row_index(st, info))
        return r

    def buffer_txn(self, txn: Txn) -> None:
        events = txn.rows(self._schema)
        if not events:
            return
        buf = self._buf
        pos = format_position(txn.position) if txn.position is not None else None
        src = txn.source
        ts_ms = (src.ts_ms if src is not None and src.ts_ms else
                 txn.position.ts_ms if txn.position is not None and txn.position.ts_ms else None)
        cts, producer = txn.commit_ts, txn.producer_id or None
        states, brows = self._states, buf.rows
        n = 0
        for ev in events:
            info = ev.table_info
            tid = ev.table_id
            st = states.get(tid)
            if st is not None and st.skipped:
                continue   # on-unmappable = skip-table
            if st is None or st.dropped:
                raise SluiceError(f"spark sink: rows for table {ev.schema}.{ev.table} (id {tid}) "
                                  "that has no Iceberg tables (no shape reached the sink)")
            read, index = self._reader(st, info)
            rows = brows.get(tid)
            if rows is None:
                rows = brows[tid] = []
            seq = ev.seq * 2
            op = ev.op
            if op == "d":
                rows.append(self._row(read, index, st, ev.before, ("d", cts, seq, info.version, producer, pos, ts_ms)))
            elif op == "u" and self._key_changed(st, info, ev.before, ev.after):  # type: ignore[arg-type]
                rows.append(self._row(read, index, st, ev.before, ("d", cts, seq, info.version, producer, pos, ts_ms)))
                rows.append(self._row(read, index, st, ev.after, ("c", cts, seq + 1, info.version, producer, pos, ts_ms)))
                n += 1
            else:
                rows.append(self._row(read, index, st, ev.after, (op, cts, seq, info.version, producer, pos, ts_ms)))
            n += 1
        buf.count += n
        buf.last_ts = cts
        if not buf.first_mono:
            buf.first_mono = time.monotonic()

    @staticmethod
    def _row(read: RowReader, index: list[int] | None, st: T.TableState, image: Any,
             meta: tuple[Any, ...]) -> tuple[Any, ...]:
        row = read(image, meta)
        if index is None:
            return row
        head = len(meta) + 1
        return (*row[:head], *T.reorder(row[head:], index, len(st.columns)))

    def _key_changed(self, st: T.TableState, info: pb.TableInfo, before: pb.Row, after: pb.Row) -> bool:
        """Whether an update moves its row to another identity (a keyless table's every update
        does), compared on the Datums."""
        if not st.key:
            return before != after
        b, a = before.columns, after.columns
        where = (info.table_id, info.version, len(b))
        idx = self._key_index.get(where)
        if idx is None:
            cols = [c for c in info.columns if len(b) == len(info.columns) or not c.hidden]
            names = [c.name.lower() for c in cols]
            keys = [k.lower() for k in st.key]
            idx = self._key_index[where] = ([names.index(k) for k in keys]
                                            if all(k in names for k in keys) else [])
        if not idx:
            return before != after
        return any(b[i] != a[i] for i in idx)
