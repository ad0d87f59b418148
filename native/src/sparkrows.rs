//! The Spark sink's per-row work: one TableMutation of a serialized `PrewriteValue` -> the
//! changelog row tuples the sink buffers, `(_op, _commit_ts, _seq, _schema_ver, _producer, _pos,
//! _ts_ms, _zero_dates, *values)`, straight from the wire bytes (prewrite.rs's walk and Datum
//! reading; no protobuf message per change, row or Datum).
//!
//! Narrow API (spark_sink/schema_changes.py is the only caller; Python keeps control flow,
//! errors and every invariant, Txn.mutations having checked the transaction first):
//! `SparkRows(total, visible_pos, native, modes, converters, names, index, width, key_full,
//! key_vis, datum_from, zero)`, compiled once per table shape and sink table state:
//! - `total` columns in a full row, `visible_pos` the positions of the visible ones;
//! - per visible column: `native` a bit mask of the Datum fields (field numbers) whose value is
//!   the Spark value as it is, `modes` (0 none, 1 TIMESTAMP, 2 DATE, 3 DECIMAL, 4 BINARY, 5 STRING: the
//!   kinds spark_sink/types.py's converter for that type turns into a value, done here the same
//!   way), `converters` the Python converter (types.py) every other kind goes to as a
//!   `pb.Datum` (`datum_from(bytes)`), `names` (for `_zero_dates`);
//! - `index`/`width`: where each visible value lands in the sink's columns (tables.row_index;
//!   None: in order);
//! - `key_full`/`key_vis`: the identity columns' positions in a full / visible-only row, or None
//!   to compare whole rows (a keyless table, or a key the shape does not have): an update whose
//!   identity changed is a delete and an insert.
//!
//! `decode(payload, start, end, seq, snapshot_chunk, meta, out) -> (rows, changes)` appends the
//! tuples of the mutation at `payload[start:end]` to `out`; `seq` is the transaction's change
//! index of its first change, `meta` `(commit_ts, version, producer, pos, ts_ms)`.
//!
//! Values (exactly spark_sink/types.py's `row_reader`, kept as the oracle of the differential
//! tests): NULL or no value -> None; a kind in the column's native mask as it is (int, uint ->
//! int; double -> float; str, json, decimal -> str); TIMESTAMP datetime -> an aware UTC
//! `datetime`, DATE datetime -> `date` (a ValueError of the constructor: a zero date, None
//! and the column named in `_zero_dates`); DECIMAL decimal -> `Decimal(text)`, int and uint ->
//! `Decimal(int)`; BINARY bytes -> `bytearray`; STRING (mode 5) time -> `[-]HH:MM:SS.ffffff`,
//! datetime -> `YYYY-MM-DD HH:MM:SS.ffffff`, int and uint -> their decimal text, valid UTF-8
//! bytes -> their text; anything else -> `converter(datum_from(datum bytes))` (its `zero` result is a
//! zero date). Identity comparison is the protobuf message equality of the Datums (or rows):
//! equal bytes are equal, other pairs are compared as messages by Python.
//!
//! Errors: bytes that are not protobuf wire format raise `DecodeError`; a row whose number of
//! values fits neither the full nor the visible columns `ColumnCountError(n)` (prewrite.rs's),
//! which Python turns into the sink's InvalidArgument; the converters' own errors pass through.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyList, PyString, PyTuple};

use crate::prewrite::{lacks, parse_change, parse_datum, utf8, wire_err, ColumnCountError, Value};
use crate::wire::Rd;
use crate::DecodeError;

const M_TS: u8 = 1;
const M_DATE: u8 = 2;
const M_DEC: u8 = 3;
const M_BYTES: u8 = 4;
const M_TEXT: u8 = 5;
const F_INT: u32 = 2;
const F_UINT: u32 = 3;
const F_DOUBLE: u32 = 4;
const F_DECIMAL: u32 = 5;
const F_STR: u32 = 7;

#[pyclass(frozen, module = "sluice_native")]
pub struct SparkRows {
    total: usize,
    visible_pos: Vec<usize>,
    native: Vec<u32>,
    modes: Vec<u8>,
    converters: Vec<Py<PyAny>>,
    names: Vec<Py<PyAny>>,
    index: Option<Vec<i64>>,
    width: usize,
    key_full: Option<Vec<usize>>,
    key_vis: Option<Vec<usize>>,
    datum_from: Py<PyAny>,
    row_from: Py<PyAny>,
    zero: Py<PyAny>,
    utc: Py<PyAny>,
    datetime: Py<PyAny>,
    date: Py<PyAny>,
    decimal: Py<PyAny>,
}

/// One image: the Datum spans of its Row message(s) (a Row given twice merges: its columns
/// concatenate), and whether it holds any other field (then only Python compares it exactly).
fn datums(b: &[u8], spans: &[(usize, usize)], out: &mut Vec<(usize, usize)>) -> PyResult<bool> {
    out.clear();
    let mut foreign = false;
    for &(s, e) in spans {
        let mut r = Rd::new(b, s, e);
        while r.more() {
            let (f, w) = r.tag().map_err(|e| wire_err("row", e))?;
            if (f, w) == (1, 2) {
                out.push(r.span().map_err(|e| wire_err("row", e))?);
            } else {
                foreign = true;
                r.skip(w, f).map_err(|e| wire_err("row", e))?;
            }
        }
    }
    Ok(foreign)
}

impl SparkRows {
    /// Whether two Datums differ as protobuf messages (pb.Datum's ==).
    fn datum_differs(&self, py: Python<'_>, b: &[u8], x: (usize, usize), y: (usize, usize)) -> PyResult<bool> {
        if b[x.0..x.1] == b[y.0..y.1] {
            return Ok(false);
        }
        let from = self.datum_from.bind(py);
        let dx = from.call1((PyBytes::new(py, &b[x.0..x.1]),))?;
        let dy = from.call1((PyBytes::new(py, &b[y.0..y.1]),))?;
        dx.ne(dy)
    }

    /// Whether an update moves its row to another identity (SchemaChanges._key_changed).
    #[allow(clippy::too_many_arguments)] // the change's spans, as decode holds them
    fn key_changed(&self, py: Python<'_>, b: &[u8], ch_before: &[(usize, usize)], ch_after: &[(usize, usize)],
                   before: &[(usize, usize)], after: &[(usize, usize)], fb: bool, fa: bool) -> PyResult<bool> {
        let keys = if before.len() == self.total { &self.key_full } else { &self.key_vis };
        match keys {
            Some(idx) if !idx.is_empty() => {
                for &i in idx {
                    if i >= before.len() || i >= after.len() {
                        return Err(ColumnCountError::new_err((before.len().min(after.len()),)));
                    }
                    if self.datum_differs(py, b, before[i], after[i])? {
                        return Ok(true);
                    }
                }
                Ok(false)
            }
            _ => {
                if fb || fa || ch_before.len() != 1 || ch_after.len() != 1 {
                    // rows with other fields or given in pieces: pb.Row's own ==
                    let join = |spans: &[(usize, usize)]| {
                        let mut v = Vec::new();
                        for &(s, e) in spans {
                            v.extend_from_slice(&b[s..e]);
                        }
                        v
                    };
                    let from = self.row_from.bind(py);
                    let rb = from.call1((PyBytes::new(py, &join(ch_before)),))?;
                    let ra = from.call1((PyBytes::new(py, &join(ch_after)),))?;
                    return rb.ne(ra);
                }
                if before.len() != after.len() {
                    return Ok(true);
                }
                for (&x, &y) in before.iter().zip(after.iter()) {
                    if self.datum_differs(py, b, x, y)? {
                        return Ok(true);
                    }
                }
                Ok(false)
            }
        }
    }

    /// One visible value; `zero` gets the column's name when it is a zero date.
    fn value<'py>(&self, py: Python<'py>, b: &[u8], i: usize, (s, e): (usize, usize),
                  zero: &mut Option<Bound<'py, PyList>>) -> PyResult<Bound<'py, PyAny>> {
        let v = parse_datum(b, s, e).map_err(|e| wire_err("datum", e))?;
        let mask = self.native[i];
        let bit = |f: u32| mask & (1 << f) != 0;
        let made: Result<Bound<'py, PyAny>, Option<PyErr>> = match v {
            Value::Null => return Ok(py.None().into_bound(py)),
            Value::Int(x) if bit(F_INT) => return Ok(x.into_pyobject(py)?.into_any()),
            Value::Uint(x) if bit(F_UINT) => return Ok(x.into_pyobject(py)?.into_any()),
            Value::Double(x) if bit(F_DOUBLE) => return Ok(x.into_pyobject(py)?.into_any()),
            Value::Str(a, z) if bit(F_STR) => return Ok(utf8(py, &b[a..z], "text value")?.into_any()),
            Value::Decimal(a, z) if bit(F_DECIMAL) => return Ok(utf8(py, &b[a..z], "decimal text")?.into_any()),
            Value::Decimal(a, z) if self.modes[i] == M_DEC => {
                return self.decimal.bind(py).call1((utf8(py, &b[a..z], "decimal text")?,));
            }
            Value::Int(x) if self.modes[i] == M_DEC => return self.decimal.bind(py).call1((x,)),
            Value::Uint(x) if self.modes[i] == M_DEC => return self.decimal.bind(py).call1((x,)),
            Value::Bytes(a, z) if self.modes[i] == M_BYTES => return Ok(PyByteArray::new(py, &b[a..z]).into_any()),
            Value::Int(x) if self.modes[i] == M_TEXT => return Ok(PyString::new(py, &x.to_string()).into_any()),
            Value::Uint(x) if self.modes[i] == M_TEXT => return Ok(PyString::new(py, &x.to_string()).into_any()),
            Value::Time(t) if self.modes[i] == M_TEXT => {
                let sign = if t.negative { "-" } else { "" };
                return Ok(PyString::new(py, &format!("{sign}{:02}:{:02}:{:02}.{:06}", t.hours, t.minutes,
                                                     t.seconds, t.microseconds)).into_any());
            }
            Value::DateTime(d) if self.modes[i] == M_TEXT => {
                return Ok(PyString::new(py, &format!("{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:06}", d.year, d.month,
                                                     d.day, d.hour, d.minute, d.second, d.microsecond)).into_any());
            }
            // invalid UTF-8 goes to the converter (its surrogateescape decoding)
            Value::Bytes(a, z) if self.modes[i] == M_TEXT && std::str::from_utf8(&b[a..z]).is_ok() => {
                return Ok(utf8(py, &b[a..z], "text value")?.into_any());
            }
            Value::DateTime(d) if self.modes[i] == M_TS => self.datetime.bind(py).call1((
                d.year, d.month, d.day, d.hour, d.minute, d.second, d.microsecond, self.utc.bind(py))).map_err(Some),
            Value::DateTime(d) if self.modes[i] == M_DATE => self.date.bind(py).call1((d.year, d.month, d.day)).map_err(Some),
            _ => {
                // the converter's own errors pass through; only its `zero` result is a zero date
                let got = self.converters[i].bind(py).call1((self.datum_from.bind(py).call1((PyBytes::new(py, &b[s..e]),))?,))?;
                if !got.is(self.zero.bind(py)) {
                    return Ok(got);
                }
                Err(None)
            }
        };
        match made {
            Ok(x) => Ok(x),
            // a date the constructor refuses (ValueError: zero dates and zero parts) is NULL
            Err(Some(err)) if !err.is_instance_of::<PyValueError>(py) => Err(err),
            Err(_) => {
                let names = zero.get_or_insert_with(|| PyList::empty(py));
                names.append(self.names[i].bind(py))?;
                Ok(py.None().into_bound(py))
            }
        }
    }

    /// `(*head, zero_dates, *values)` for one image (its Datum spans).
    fn row<'py>(&self, py: Python<'py>, b: &[u8], ds: &[(usize, usize)], head: &[Bound<'py, PyAny>]) -> PyResult<Bound<'py, PyTuple>> {
        let n = ds.len();
        let nvis = self.visible_pos.len();
        let full = n == self.total;
        if !full && n != nvis {
            return Err(ColumnCountError::new_err((n,)));
        }
        let mut zero: Option<Bound<'py, PyList>> = None;
        let mut vals: Vec<Bound<'py, PyAny>> = Vec::with_capacity(nvis);
        for i in 0..nvis {
            let span = if full { ds[self.visible_pos[i]] } else { ds[i] };
            vals.push(self.value(py, b, i, span, &mut zero)?);
        }
        let mut items: Vec<Bound<'py, PyAny>> = Vec::with_capacity(head.len() + 1 + self.width.max(nvis));
        items.extend(head.iter().cloned());
        items.push(match zero {
            Some(z) => z.into_any(),
            None => py.None().into_bound(py),
        });
        match &self.index {
            None => items.extend(vals),
            Some(index) => {
                let at = items.len();
                items.extend((0..self.width).map(|_| py.None().into_bound(py)));
                for (v, &j) in vals.into_iter().zip(index.iter()) {
                    if j >= 0 && (j as usize) < self.width {
                        items[at + j as usize] = v;
                    }
                }
            }
        }
        PyTuple::new(py, items)
    }
}

#[pymethods]
impl SparkRows {
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (total, visible_pos, native, modes, converters, names, index, width, key_full, key_vis, datum_from, row_from, zero))]
    fn new(py: Python<'_>, total: usize, visible_pos: Vec<usize>, native: Vec<u32>, modes: Vec<u8>,
           converters: Vec<Py<PyAny>>, names: Vec<Py<PyAny>>, index: Option<Vec<i64>>, width: usize,
           key_full: Option<Vec<usize>>, key_vis: Option<Vec<usize>>, datum_from: Py<PyAny>,
           row_from: Py<PyAny>, zero: Py<PyAny>) -> PyResult<Self> {
        let n = visible_pos.len();
        if native.len() != n || modes.len() != n || converters.len() != n || names.len() != n {
            return Err(PyValueError::new_err("one native mask, mode, converter and name per visible column"));
        }
        if let Some(&p) = visible_pos.iter().find(|&&p| p >= total) {
            return Err(PyValueError::new_err(format!("visible position {p} outside a row of {total} columns")));
        }
        // str and json share one value reading: a mask must take both or neither
        if native.iter().any(|&m| (m >> F_STR & 1) != (m >> 10 & 1)) {
            return Err(PyValueError::new_err("a native mask takes str and json together"));
        }
        let dt = py.import("datetime")?;
        Ok(SparkRows {
            total,
            visible_pos,
            native,
            modes,
            converters,
            names,
            index,
            width,
            key_full,
            key_vis,
            datum_from,
            row_from,
            zero,
            utc: dt.getattr("timezone")?.getattr("utc")?.unbind(),
            datetime: dt.getattr("datetime")?.unbind(),
            date: dt.getattr("date")?.unbind(),
            decimal: py.import("decimal")?.getattr("Decimal")?.unbind(),
        })
    }

    /// See the module doc.
    #[allow(clippy::too_many_arguments)]
    fn decode<'py>(&self, py: Python<'py>, payload: &Bound<'py, PyBytes>, start: usize, end: usize,
                   seq: usize, snapshot_chunk: bool, meta: &Bound<'py, PyTuple>,
                   out: &Bound<'py, PyList>) -> PyResult<(usize, usize)> {
        let b = payload.as_bytes();
        if start > end || end > b.len() {
            return Err(PyValueError::new_err(format!("mutation [{start}, {end}) outside a payload of {} bytes", b.len())));
        }
        let (cts, ver, producer, pos, ts_ms) = (meta.get_item(0)?, meta.get_item(1)?, meta.get_item(2)?,
                                                meta.get_item(3)?, meta.get_item(4)?);
        let op = |s: &str| PyString::intern(py, s).into_any();
        let (op_c, op_r, op_u, op_d) = (op("c"), op("r"), op("u"), op("d"));
        let (mut bd, mut ad) = (Vec::new(), Vec::new());
        let mut r = Rd::new(b, start, end);
        let (mut changes, mut rows) = (0usize, 0usize);
        while r.more() {
            let (f, w) = r.tag().map_err(|e| wire_err("table mutation", e))?;
            if (f, w) != (5, 2) {
                r.skip(w, f).map_err(|e| wire_err("table mutation", e))?;
                continue;
            }
            let (s, e) = r.span().map_err(|e| wire_err("table mutation", e))?;
            let ch = parse_change(b, s, e).map_err(|e| wire_err("row change", e))?;
            if let Some(image) = lacks(&ch) {
                return Err(DecodeError::new_err(format!(
                    "row change #{changes} of type {} lacks its {} image", ch.tp, image.unwrap_or("known type's"))));
            }
            let s2 = ((seq + changes) * 2).into_pyobject(py)?.into_any();
            let head = |o: &Bound<'py, PyAny>, sq: &Bound<'py, PyAny>| {
                [o.clone(), cts.clone(), sq.clone(), ver.clone(), producer.clone(), pos.clone(), ts_ms.clone()]
            };
            match ch.tp {
                1 | 4 => {
                    datums(b, &ch.after, &mut ad)?;
                    let o = if snapshot_chunk || ch.tp == 4 { &op_r } else { &op_c };
                    out.append(self.row(py, b, &ad, &head(o, &s2))?)?;
                    rows += 1;
                }
                3 => {
                    datums(b, &ch.before, &mut bd)?;
                    out.append(self.row(py, b, &bd, &head(&op_d, &s2))?)?;
                    rows += 1;
                }
                _ => {
                    let fb = datums(b, &ch.before, &mut bd)?;
                    let fa = datums(b, &ch.after, &mut ad)?;
                    if self.key_changed(py, b, &ch.before, &ch.after, &bd, &ad, fb, fa)? {
                        let s3 = ((seq + changes) * 2 + 1).into_pyobject(py)?.into_any();
                        out.append(self.row(py, b, &bd, &head(&op_d, &s2))?)?;
                        out.append(self.row(py, b, &ad, &head(&op_c, &s3))?)?;
                        rows += 2;
                    } else {
                        out.append(self.row(py, b, &ad, &head(&op_u, &s2))?)?;
                        rows += 1;
                    }
                }
            }
            changes += 1;
        }
        Ok((rows, changes))
    }
}

// ------------------------------------------------------------------------------------------------
// `_pos`: a Position's text, as core/position.py's format_position writes it
// ------------------------------------------------------------------------------------------------

/// The sequence number a binlog file name ends with (`\.(\d+)$`): Some(None) when it has none,
/// None when only Python can say (non-ASCII or a newline: `\d` and `$` have Unicode rules).
fn file_seq_of(name: &[u8]) -> Option<Option<u128>> {
    if name.iter().any(|&c| c >= 0x80 || c == b'\n') {
        return None;
    }
    let digits = name.iter().rev().take_while(|c| c.is_ascii_digit()).count();
    if digits == 0 || digits == name.len() || name[name.len() - digits - 1] != b'.' {
        return Some(None);
    }
    let mut v: u128 = 0;
    for &c in &name[name.len() - digits..] {
        v = v.saturating_mul(10).saturating_add((c - b'0') as u128);
    }
    Some(Some(v))
}

/// `format_position(Position.FromString(raw))` for a Position in canonical form (as
/// `SerializeToString` writes it), or None where Python must write it (a MySQL GTID set, a file
/// name that is not ASCII). Bytes that are not a Position raise DecodeError.
#[pyfunction]
pub fn position_text<'py>(py: Python<'py>, raw: &[u8]) -> PyResult<Option<Bound<'py, PyString>>> {
    let err = |e: String| wire_err("position", e);
    let (mut file_seq, mut offset, mut sub_seq, mut ts_ms, mut server_id, mut generation) = (0u64, 0u64, 0u64, 0i64, 0u32, 0u32);
    let mut name: &[u8] = &[];
    let mut gtids: Vec<(u32, u32, u64)> = Vec::new();
    let mut r = Rd::new(raw, 0, raw.len());
    while r.more() {
        let (f, w) = r.tag().map_err(err)?;
        match (f, w) {
            (1, 0) => file_seq = r.varint().map_err(err)?,
            (2, 0) => offset = r.varint().map_err(err)?,
            (3, 0) => sub_seq = r.varint().map_err(err)?,
            (4, 2) => {
                let (s, e) = r.span().map_err(err)?;
                name = &raw[s..e];
            }
            (5, 2) => {
                let (s, e) = r.span().map_err(err)?;
                let mut g = Rd::new(raw, s, e);
                let mut v = (0u32, 0u32, 0u64);
                while g.more() {
                    let (gf, gw) = g.tag().map_err(err)?;
                    match (gf, gw) {
                        (1, 0) => v.0 = g.varint().map_err(err)? as u32,
                        (2, 0) => v.1 = g.varint().map_err(err)? as u32,
                        (3, 0) => v.2 = g.varint().map_err(err)?,
                        _ => g.skip(gw, gf).map_err(err)?,
                    }
                }
                gtids.push(v);
            }
            (6, 2) => {
                let (s, e) = r.span().map_err(err)?;
                if s != e {
                    return Ok(None);
                }
            }
            (7, 0) => ts_ms = r.varint().map_err(err)? as i64,
            (8, 0) => server_id = r.varint().map_err(err)? as u32,
            (9, 0) => generation = r.varint().map_err(err)? as u32,
            _ => r.skip(w, f).map_err(err)?,
        }
    }
    if file_seq == 0 && offset == 0 && gtids.is_empty() {
        return Ok(Some(PyString::new(py, "empty")));
    }
    let name = match std::str::from_utf8(name) {
        Ok(s) => s,
        Err(_) => return Ok(None),
    };
    let mut parts: Vec<String> = Vec::with_capacity(2);
    let mut extra: Vec<String> = Vec::with_capacity(4);
    if file_seq != 0 || offset != 0 {
        if !name.is_empty() {
            match file_seq_of(name.as_bytes()) {
                None => return Ok(None),
                Some(seq) if seq != Some(file_seq as u128) => extra.push(format!("file-seq={file_seq}")),
                Some(_) => {}
            }
            parts.push(format!("{name}:{offset}#{sub_seq}"));
        } else {
            parts.push(format!("{file_seq:06}:{offset}#{sub_seq}"));
        }
    } else {
        if !name.is_empty() {
            extra.push(format!("file={name}"));
        }
        if sub_seq != 0 {
            extra.push(format!("sub-seq={sub_seq}"));
        }
    }
    if !gtids.is_empty() {
        let list: Vec<String> = gtids.iter().map(|(d, s, n)| format!("{d}-{s}-{n}")).collect();
        parts.push(format!("gtid={}", list.join(",")));
    }
    if server_id != 0 {
        extra.push(format!("server-id={server_id}"));
    }
    if ts_ms != 0 {
        extra.push(format!("ts-ms={ts_ms}"));
    }
    if generation != 0 {
        extra.push(format!("gen={generation}"));
    }
    parts.extend(extra);
    Ok(Some(PyString::new(py, &parts.join(" "))))
}
