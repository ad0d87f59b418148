//! The capture's side of a group write: source transactions -> pump transactions (the serialized
//! PrewriteValue, position and snapshot progress of each) -> their PREWRITE binlogs, as protobuf
//! wire bytes. capture/writer.py and `SourceTxn.prewrite_values` (capture/assembler.py) are the
//! callers; the bytes are what the former Python builders wrote (capture/payload.py's
//! `source_info` / `prewrite_payloads`, client/binlogs.py's `prewrite` / `tail`), which the
//! differential tests keep as oracles: tests/unit/test_capture_payload.py (the message path) and
//! tests/unit/test_client_binlogs.py (tests/support/pywriter.py).
//!
//! Why native: that Python ran about fifteen small functions per source transaction on the
//! capture's event loop (~7 µs a transaction warm, more under load), each building a few bytes.
//!
//! - `prewrite_values(st, source_name, rows_cls) -> [bytes]`: a SourceTxn's PrewriteValue(s): one,
//!   or one per DDL when a statement acts on several tables (the schema snapshots travel with the
//!   first). Mutations of type `rows_cls` (capture/payload.py `RowsMutation`: the native decoder's
//!   row bytes) are written from their fields; any other (a snapshot chunk's pb.TableMutation)
//!   by its `SerializeToString()`.
//! - `pump_items(group, source_name, generation, rows_cls, item_cls, several, position_bytes)`:
//!   the group's pump transactions as `item_cls(value, position, snapshot)`. Empty transactions are
//!   dropped except the group's last. A transaction with one value and no snapshot progress (every
//!   live one) is done here; the others (several values, or snapshot progress, which need
//!   Position / SnapshotProgress messages altered) go to `several(st, values, generation)`, and a
//!   position that already carries a generation to `position_bytes(position, generation)`.
//! - `prewrite_binlogs(items, ident, first_start, now_ms, tp, encoded_cls)`: the PREWRITE binlogs,
//!   start_ts consecutive from `first_start`, as `encoded_cls(tp, start_ts, 0, raw, tail)`.
//!
//! Fields are written in field-number order with proto3 defaults omitted, as protobuf does: an
//! integer 0 is not written, a negative one takes ten bytes, an empty string is not written.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PySequence, PyString, PyTuple};

use crate::wire::{put_len_field as put_len, put_u32_field as put_int};

// Field numbers of the messages written here.
const MUT_TABLE_ID: u32 = 1; // TableMutation
const MUT_SCHEMA: u32 = 2;
const MUT_TABLE: u32 = 3;
const MUT_VERSION: u32 = 4;
const SRC_NAME: u32 = 1; // SourceInfo
const SRC_SERVER_ID: u32 = 2;
const SRC_GTID: u32 = 3;
const SRC_FILE: u32 = 4;
const SRC_POS: u32 = 5;
const SRC_TS_MS: u32 = 6;
const PV_MUTATION: u32 = 2; // PrewriteValue
const PV_DDL: u32 = 3;
const PV_SCHEMA: u32 = 4;
const PV_SOURCE: u32 = 5;
const PV_SNAPSHOT_CHUNK: u32 = 6;
const POS_GENERATION: u32 = 9; // Position.generation, its last field
const BL_TYPE: u32 = 1; // Binlog
const BL_START_TS: u32 = 2;
const BL_VALUE: u32 = 4;
const BL_POSITION: u32 = 9;
const BL_SNAPSHOT: u32 = 10;
const BL_TS_MS: u32 = 11;

/// A Python int as protobuf writes an int64/uint64: its two's complement bits.
fn int_of(v: &Bound<'_, PyAny>) -> PyResult<u64> {
    match v.extract::<i64>() {
        Ok(n) => Ok(n as u64),
        Err(_) => v.extract::<u64>(),
    }
}

fn put_str(out: &mut Vec<u8>, field: u32, s: &Bound<'_, PyAny>) -> PyResult<()> {
    let s = s.cast::<PyString>()?.to_str()?;
    if !s.is_empty() {
        put_len(out, field, s.as_bytes());
    }
    Ok(())
}

/// `obj.SerializeToString()` (a protobuf message).
fn serialized<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    Ok(obj.call_method0(intern!(obj.py(), "SerializeToString"))?.cast_into::<PyBytes>()?)
}

/// A TableMutation's bytes: a RowsMutation's header fields and row bytes, else the message's.
fn put_mutation(out: &mut Vec<u8>, m: &Bound<'_, PyAny>, rows_cls: &Bound<'_, PyAny>) -> PyResult<()> {
    let py = m.py();
    if !m.get_type().is(rows_cls) {
        return Ok(put_len(out, PV_MUTATION, serialized(m)?.as_bytes()));
    }
    let mut body = Vec::with_capacity(256);
    put_int(&mut body, MUT_TABLE_ID, int_of(&m.getattr(intern!(py, "table_id"))?)?);
    put_str(&mut body, MUT_SCHEMA, &m.getattr(intern!(py, "schema_name"))?)?;
    put_str(&mut body, MUT_TABLE, &m.getattr(intern!(py, "table_name"))?)?;
    put_int(&mut body, MUT_VERSION, int_of(&m.getattr(intern!(py, "table_version"))?)?);
    let parts = m.getattr(intern!(py, "_parts"))?;
    for part in parts.cast::<PyList>()?.iter() {
        body.extend_from_slice(part.cast::<PyBytes>()?.as_bytes());
    }
    put_len(out, PV_MUTATION, &body);
    Ok(())
}

/// The SourceInfo's bytes of `st` read from `source_name`.
fn source_info(st: &Bound<'_, PyAny>, source_name: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    let py = st.py();
    let mut src = Vec::with_capacity(96);
    put_str(&mut src, SRC_NAME, source_name)?;
    put_int(&mut src, SRC_SERVER_ID, int_of(&st.getattr(intern!(py, "server_id"))?)?);
    put_str(&mut src, SRC_GTID, &st.getattr(intern!(py, "gtid"))?)?;
    put_str(&mut src, SRC_FILE, &st.getattr(intern!(py, "file"))?)?;
    put_int(&mut src, SRC_POS, int_of(&st.getattr(intern!(py, "offset"))?)?);
    put_int(&mut src, SRC_TS_MS, int_of(&st.getattr(intern!(py, "ts_ms"))?)?);
    Ok(src)
}

fn values_of<'py>(st: &Bound<'py, PyAny>, source_name: &Bound<'py, PyAny>,
                  rows_cls: &Bound<'py, PyAny>) -> PyResult<Vec<Vec<u8>>> {
    let py = st.py();
    let mut src = Vec::with_capacity(100);
    put_len(&mut src, PV_SOURCE, &source_info(st, source_name)?);
    let mut snaps = Vec::new();
    for s in st.getattr(intern!(py, "schema_snapshots"))?.try_iter()? {
        put_len(&mut snaps, PV_SCHEMA, serialized(&s?)?.as_bytes());
    }
    let ddls_obj = st.getattr(intern!(py, "ddls"))?;
    let ddls = ddls_obj.cast::<PySequence>()?;
    if ddls.len()? <= 1 {
        let mut v = Vec::with_capacity(512);
        for m in st.getattr(intern!(py, "mutations"))?.try_iter()? {
            put_mutation(&mut v, &m?, rows_cls)?;
        }
        if ddls.len()? == 1 {
            put_len(&mut v, PV_DDL, serialized(&ddls.get_item(0)?)?.as_bytes());
        }
        v.extend_from_slice(&snaps);
        v.extend_from_slice(&src);
        if !st.getattr(intern!(py, "snapshot"))?.is_none() {
            put_int(&mut v, PV_SNAPSHOT_CHUNK, 1);
        }
        return Ok(vec![v]);
    }
    let mut out = Vec::with_capacity(ddls.len()?);
    for (i, d) in ddls.try_iter()?.enumerate() {
        let mut v = Vec::new();
        put_len(&mut v, PV_DDL, serialized(&d?)?.as_bytes());
        if i == 0 {
            v.extend_from_slice(&snaps);
        }
        v.extend_from_slice(&src);
        out.push(v);
    }
    Ok(out)
}

/// The serialized PrewriteValue(s) of one source transaction.
#[pyfunction]
pub(crate) fn prewrite_values<'py>(py: Python<'py>, st: &Bound<'py, PyAny>, source_name: &Bound<'py, PyAny>,
                                   rows_cls: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
    let values = values_of(st, source_name, rows_cls)?;
    PyList::new(py, values.iter().map(|v| PyBytes::new(py, v)))
}

/// A group's pump transactions (see the module's doc).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub(crate) fn pump_items<'py>(py: Python<'py>, group: &Bound<'py, PyAny>, source_name: &Bound<'py, PyAny>,
                              generation: u64, rows_cls: &Bound<'py, PyAny>, item_cls: &Bound<'py, PyAny>,
                              several: &Bound<'py, PyAny>, position_bytes: &Bound<'py, PyAny>)
                              -> PyResult<Bound<'py, PyList>> {
    let group = group.cast::<PySequence>()?;
    let n = group.len()?;
    let out = PyList::empty(py);
    for i in 0..n {
        let st = group.get_item(i)?;
        let empty = !(st.getattr(intern!(py, "mutations"))?.is_truthy()?
            || st.getattr(intern!(py, "schema_snapshots"))?.is_truthy()?
            || st.getattr(intern!(py, "ddls"))?.is_truthy()?);
        if empty && i + 1 != n {
            continue;
        }
        let values = values_of(&st, source_name, rows_cls)?;
        if values.len() == 1 && st.getattr(intern!(py, "snapshot"))?.is_none() {
            let position = st.getattr(intern!(py, "position"))?;
            let pos = if generation == 0 {
                serialized(&position)?
            } else if int_of(&position.getattr(intern!(py, "generation"))?)? == 0 {
                // generation is Position's last field: appended, the bytes are protobuf's
                let mut b = serialized(&position)?.as_bytes().to_vec();
                put_int(&mut b, POS_GENERATION, generation);
                PyBytes::new(py, &b)
            } else {
                position_bytes.call1((position, generation))?.cast_into::<PyBytes>()?
            };
            out.append(item_cls.call1((PyBytes::new(py, &values[0]), pos, py.None()))?)?;
            continue;
        }
        let values = PyList::new(py, values.iter().map(|v| PyBytes::new(py, v)))?;
        for item in several.call1((st, values, generation))?.try_iter()? {
            out.append(item?)?;
        }
    }
    Ok(out)
}

/// The PREWRITE binlogs of a group's pump transactions (see the module's doc).
#[pyfunction]
pub(crate) fn prewrite_binlogs<'py>(py: Python<'py>, items: &Bound<'py, PyAny>, ident: &[u8], first_start: u64,
                                    now_ms: i64, tp: u8, encoded_cls: &Bound<'py, PyAny>)
                                    -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for (i, item) in items.try_iter()?.enumerate() {
        let item = item?;
        let t = item.cast::<PyTuple>()?;
        let (value, position, snapshot) = (t.get_item(0)?, t.get_item(1)?, t.get_item(2)?);
        let start = first_start + i as u64;
        let mut tail = Vec::with_capacity(ident.len() + 128);
        tail.extend_from_slice(ident);
        if !position.is_none() {
            put_len(&mut tail, BL_POSITION, position.cast::<PyBytes>()?.as_bytes());
        }
        if !snapshot.is_none() {
            put_len(&mut tail, BL_SNAPSHOT, snapshot.cast::<PyBytes>()?.as_bytes());
        }
        put_int(&mut tail, BL_TS_MS, now_ms as u64);
        let value = value.cast::<PyBytes>()?.as_bytes();
        let mut raw = Vec::with_capacity(value.len() + tail.len() + 24);
        put_int(&mut raw, BL_TYPE, tp as u64);
        put_int(&mut raw, BL_START_TS, start);
        if !value.is_empty() {
            put_len(&mut raw, BL_VALUE, value);
        }
        raw.extend_from_slice(&tail);
        out.append(encoded_cls.call1((tp, start, 0, PyBytes::new(py, &raw), PyBytes::new(py, &tail)))?)?;
    }
    Ok(out)
}
