//! The drainer's per-row work: the `repeated TableMutation` of a serialized `PrewriteValue`
//! (proto/sluice.proto) -> the Python values the MySQL sink binds as SQL parameters, straight
//! from the wire bytes (no protobuf message objects, no per-field Python wrappers).
//!
//! Narrow API (Python keeps control flow, errors and every invariant; drainer/txn.py and
//! drainer/translator.py are the only callers):
//! - `prewrite_mutations(payload) -> (snapshot_chunk, [(table_id, schema_name, table_name,
//!   table_version, start, end, changes, problem), ...])`: the mutations in wire order, each
//!   with the byte span of its TableMutation body in `payload`, its number of row changes and
//!   the first change that cannot be applied: `None`, or `(index, tp, image)` where `image` is
//!   the missing image ("before" / "after") or `None` for an unknown change type. Python turns a
//!   problem into CorruptTxn and an unknown table into MissingSchema, in the old order.
//! - `MutationDecoder(total, visible_pos, modes)`: compiled once per table shape (ApplyShape):
//!   `total` columns in a full row, `visible_pos` the positions of the visible ones, `modes` one
//!   per visible column (0 plain, 1 BIT: bytes -> int, 2 DATE: a date, not a datetime).
//!   `decode(payload, start, end) -> [(tp, before, after), ...]` for the mutation body at
//!   `payload[start:end]`: `tp` the MutationType number, `before` (UPDATE, DELETE) and `after`
//!   (INSERT, UPDATE, READ) tuples of visible values, else None. A row of `total` values drops
//!   the hidden ones; one of as many values as visible columns is taken as is.
//!   `changes(payload, start, end, keys, row_change, shape, commit_ts, insert_kind)`: the same
//!   walk, each change made here into `row_change(kind, shape, commit_ts, before, after,
//!   causality keys)` (the translator's RowChange; `keys` the shape's KeyBuilder, causality.rs):
//!   "update" and "delete" as such, INSERT as `insert_kind`, READ as "upsert". No Python runs
//!   per row but the RowChange constructor and the values' own.
//!
//! Values (exactly drainer/translator.py's former `decode_row`, kept in tests/support/
//! pytranslate.py as the differential oracle): NULL or an empty Datum -> None, int / uint ->
//! int, double -> float, decimal -> `decimal.Decimal(text)`, bytes -> bytes (BIT: big-endian
//! int), str and JSON -> str, datetime -> naive `datetime.datetime` (DATE: `datetime.date`),
//! zero dates and zero parts (the constructor's ValueError) -> the text MySQL parses
//! ("YYYY-MM-DD" for DATE, "YYYY-MM-DD HH:MM:SS.ffffff" else), TIME -> `datetime.timedelta`
//! (negative and beyond 24 h).
//!
//! Errors: bytes that are not protobuf wire format (or a datetime part beyond a C int) raise
//! `DecodeError` naming the byte or value; a row
//! of a wrong length raises `ColumnCountError(n)` and an undecodable decimal text
//! `DecimalTextError(column, text)` (column: visible index), which Python turns into the
//! codec's own error. Protobuf rules kept: unknown fields and fields of an unexpected wire
//! type are skipped, the last of a oneof wins, repeated occurrences of a message field merge.

use pyo3::create_exception;
use pyo3::exceptions::{PyValueError};
use pyo3::prelude::*;
use pyo3::intern;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

use crate::causality::KeyBuilder;
use crate::wire::{Rd, WireResult};
use crate::DecodeError;

create_exception!(sluice_native, ColumnCountError, PyValueError, "A row whose number of values fits neither the full nor the visible columns: args (n,).");
create_exception!(sluice_native, DecimalTextError, PyValueError, "A decimal Datum whose text decimal.Decimal refuses: args (column, text).");

const MODE_BIT: u8 = 1;
const MODE_DATE: u8 = 2;
// MutationType (proto/sluice.proto); READ (4, a snapshot row) is taken like an INSERT.
const TP_INSERT: i32 = 1;
const TP_UPDATE: i32 = 2;
const TP_DELETE: i32 = 3;

// ------------------------------------------------------------------------------------------------
// wire reading
// ------------------------------------------------------------------------------------------------

pub(crate) fn wire_err(what: &str, e: String) -> PyErr {
    DecodeError::new_err(format!("undecodable {what}: {e}"))
}

pub(crate) fn utf8<'py>(py: Python<'py>, b: &[u8], what: &str) -> PyResult<Bound<'py, PyString>> {
    match std::str::from_utf8(b) {
        Ok(s) => Ok(PyString::new(py, s)),
        Err(e) => Err(DecodeError::new_err(format!("{what} is not valid utf-8: invalid byte at position {}", e.valid_up_to()))),
    }
}

// ------------------------------------------------------------------------------------------------
// the walk: PrewriteValue -> mutations
// ------------------------------------------------------------------------------------------------

/// One RowChange body: its type and the spans of its before / after Row messages (a message
/// field that occurs more than once merges: a Row's repeated columns concatenate).
pub(crate) struct Change {
    pub(crate) tp: i32,
    pub(crate) before: Vec<(usize, usize)>,
    pub(crate) after: Vec<(usize, usize)>,
}

pub(crate) fn parse_change(b: &[u8], start: usize, end: usize) -> WireResult<Change> {
    let mut r = Rd::new(b, start, end);
    let mut ch = Change { tp: 0, before: Vec::new(), after: Vec::new() };
    while r.more() {
        let (f, w) = r.tag()?;
        match (f, w) {
            (1, 0) => ch.tp = r.varint()? as i32,
            (2, 2) => ch.before.push(r.span()?),
            (3, 2) => ch.after.push(r.span()?),
            _ => r.skip(w, f)?,
        }
    }
    Ok(ch)
}

/// The image a change of type `tp` lacks: Some("before"/"after"), Some(None) for an unknown
/// type, None when it is complete (drainer/txn.py's rule).
pub(crate) fn lacks(ch: &Change) -> Option<Option<&'static str>> {
    let (hb, ha) = (!ch.before.is_empty(), !ch.after.is_empty());
    match ch.tp {
        1 | 4 => (!ha).then_some(Some("after")),
        2 => (!hb || !ha).then_some(Some(if hb { "after" } else { "before" })),
        3 => (!hb).then_some(Some("before")),
        _ => Some(None),
    }
}

/// See the module doc.
#[pyfunction]
pub fn prewrite_mutations<'py>(py: Python<'py>, payload: &Bound<'py, PyBytes>) -> PyResult<(bool, Bound<'py, PyList>)> {
    let b = payload.as_bytes();
    let what = "prewrite value";
    let out = PyList::empty(py);
    let mut snapshot_chunk = false;
    let mut r = Rd::new(b, 0, b.len());
    while r.more() {
        let (f, w) = r.tag().map_err(|e| wire_err(what, e))?;
        match (f, w) {
            (2, 2) => {
                let (s, e) = r.span().map_err(|e| wire_err(what, e))?;
                out.append(mutation_entry(py, b, s, e)?)?;
            }
            (6, 0) => snapshot_chunk = r.varint().map_err(|e| wire_err(what, e))? != 0,
            _ => r.skip(w, f).map_err(|e| wire_err(what, e))?,
        }
    }
    Ok((snapshot_chunk, out))
}

// ------------------------------------------------------------------------------------------------
// the check: a whole PrewriteValue as upb parses it, and the facts the drainer's hot paths need
// ------------------------------------------------------------------------------------------------

// The messages of a PrewriteValue (proto/sluice.proto), for `ld`.
const M_PV: u8 = 0;
const M_TM: u8 = 1;
const M_RC: u8 = 2;
const M_ROW: u8 = 3;
const M_DATUM: u8 = 4;
const M_DT: u8 = 5;
const M_TIME: u8 = 6;
const M_DDL: u8 = 7;
const M_TI: u8 = 8;
const M_CI: u8 = 9;
const M_II: u8 = 10;
const M_SI: u8 = 11;

enum Ld {
    Other,
    Str,
    Msg(u8),
}

/// What a length-delimited field of message `m` is: a proto3 string (upb refuses bad UTF-8), a
/// sub-message, or bytes / unknown (taken as is).
fn ld(m: u8, f: u64) -> Ld {
    match (m, f) {
        (M_PV, 2) => Ld::Msg(M_TM),
        (M_PV, 3) => Ld::Msg(M_DDL),
        (M_PV, 4) => Ld::Msg(M_TI),
        (M_PV, 5) => Ld::Msg(M_SI),
        (M_TM, 2 | 3) => Ld::Str,
        (M_TM, 5) => Ld::Msg(M_RC),
        (M_RC, 2 | 3) => Ld::Msg(M_ROW),
        (M_ROW, 1) => Ld::Msg(M_DATUM),
        (M_DATUM, 5 | 7 | 10) => Ld::Str,
        (M_DATUM, 8) => Ld::Msg(M_DT),
        (M_DATUM, 9) => Ld::Msg(M_TIME),
        (M_DDL, 2 | 3 | 4 | 6 | 7) => Ld::Str,
        (M_DDL, 5) => Ld::Msg(M_TI),
        (M_TI, 2 | 3 | 7 | 8 | 9) => Ld::Str,
        (M_TI, 5) => Ld::Msg(M_CI),
        (M_TI, 6) => Ld::Msg(M_II),
        (M_CI, 1 | 2 | 3 | 9 | 10 | 13 | 14) => Ld::Str,
        (M_II, 1 | 2) => Ld::Str,
        (M_SI, 1 | 3 | 4) => Ld::Str,
        _ => Ld::Other,
    }
}

/// The check's reader: one-byte varints (nearly every tag and length) read inline, the rest by
/// `Rd`; tags as upb reads them (at most 5 bytes, within 32 bits).
struct Ck<'a> {
    b: &'a [u8],
    p: usize,
    end: usize,
}

impl<'a> Ck<'a> {
    #[inline(always)]
    fn varint(&mut self) -> WireResult<u64> {
        let b = &self.b[..self.end];
        let p = self.p;
        if p + 1 < b.len() || p < b.len() && b[p] < 0x80 {
            let x = b[p];
            if x < 0x80 {
                self.p = p + 1;
                return Ok(x as u64);
            }
            let y = b[p + 1];
            if y < 0x80 {
                self.p = p + 2;
                return Ok((x & 0x7F) as u64 | (y as u64) << 7);
            }
        }
        let mut r = Rd::new(self.b, self.p, self.end);
        let v = r.varint()?;
        self.p = r.p;
        Ok(v)
    }

    #[inline(always)]
    fn tag(&mut self) -> WireResult<(u64, u8)> {
        let at = self.p;
        let t = self.varint()?;
        if self.p - at > 5 || t > u32::MAX as u64 {
            return Err(format!("tag at byte {at} beyond 32 bits"));
        }
        if t >> 3 == 0 {
            return Err(format!("field number 0 at byte {at}"));
        }
        Ok((t >> 3, (t & 7) as u8))
    }

    #[inline(always)]
    fn span(&mut self) -> WireResult<(usize, usize)> {
        let at = self.p;
        let n = self.varint()?;
        if n > (self.end - self.p) as u64 {
            return Err(format!("length {n} at byte {at} runs past the end of its message (byte {})", self.end));
        }
        let s = self.p;
        self.p += n as usize;
        Ok((s, self.p))
    }

    /// Skip a field that is not checked further; groups nest at most 100 deep counting the
    /// messages around them (upb's limit).
    fn skip(&mut self, w: u8, f: u64, depth: u32) -> WireResult<()> {
        match w {
            0 => self.varint().map(|_| ()),
            2 => self.span().map(|_| ()),
            1 | 5 => {
                let n = if w == 1 { 8 } else { 4 };
                if self.end - self.p < n {
                    return Err(format!("truncated fixed{} at byte {}", n * 8, self.p));
                }
                self.p += n;
                Ok(())
            }
            3 => {
                if depth >= 100 {
                    return Err(format!("groups nested deeper than 100 at byte {}", self.p));
                }
                loop {
                    if self.p >= self.end {
                        return Err(format!("unterminated group {f} at byte {}", self.p));
                    }
                    let (g, gw) = self.tag()?;
                    if gw == 4 {
                        if g != f {
                            return Err(format!("group {f} closed by end tag {g} at byte {}", self.p));
                        }
                        return Ok(());
                    }
                    self.skip(gw, g, depth + 1)?;
                }
            }
            _ => Err(format!("wire type {w} of field {f} at byte {}", self.p)),
        }
    }

    /// The field whose tag was just read: a string's UTF-8, a sub-message whole, else skipped.
    #[inline(always)]
    fn field(&mut self, m: u8, f: u64, w: u8, depth: u32) -> WireResult<()> {
        if w != 2 {
            return self.skip(w, f, depth);
        }
        let (a, z) = self.span()?;
        match ld(m, f) {
            Ld::Str => std::str::from_utf8(&self.b[a..z]).map(|_| ()).map_err(|e| {
                format!("string field {f} at byte {a} is not UTF-8 (invalid byte at {})", a + e.valid_up_to())
            }),
            Ld::Msg(sub) => check(self.b, sub, a, z, depth + 1),
            Ld::Other => Ok(()),
        }
    }
}

/// Message `m` at `b[s..e]` and everything in it is what upb's parse accepts: wire format,
/// UTF-8 strings, nesting.
fn check(b: &[u8], m: u8, s: usize, e: usize, depth: u32) -> WireResult<()> {
    let mut r = Ck { b, p: s, end: e };
    while r.p < r.end {
        let (f, w) = r.tag()?;
        r.field(m, f, w, depth)?;
    }
    Ok(())
}

/// A joined PrewriteValue checked whole, as upb's parse would (so an undecodable one is refused
/// where the transaction is joined), and in the same walk what the drainer's hot paths read
/// without parsing it: `(has_ddl, has_schema_snapshots, source, snapshot_chunk, mutations)`:
/// `source` the SourceInfo's bytes (occurrences concatenated: they parse as the merge) or None,
/// `mutations` exactly `prewrite_mutations`' list. Err: why the value is undecodable.
pub(crate) fn prewrite_facts<'py>(py: Python<'py>, b: &[u8]) -> PyResult<Result<Bound<'py, PyTuple>, String>> {
    let out = PyList::empty(py);
    let (mut has_ddl, mut has_snapshots, mut snapshot_chunk) = (false, false, false);
    let mut source: Option<Vec<u8>> = None;
    let mut r = Ck { b, p: 0, end: b.len() };
    while r.p < r.end {
        let (f, w) = match r.tag() {
            Ok(t) => t,
            Err(e) => return Ok(Err(e)),
        };
        let at = r.p;
        if let Err(e) = r.field(M_PV, f, w, 0) {
            return Ok(Err(e));
        }
        match (f, w) {
            (2, 2) => {
                let (s, e) = Rd::new(b, at, r.p).span().expect("checked");
                out.append(mutation_entry(py, b, s, e)?)?;
            }
            (3, 2) => has_ddl = true,
            (4, 2) => has_snapshots = true,
            (5, 2) => {
                let v = Rd::new(b, at, r.p).bytes().expect("checked");
                source.get_or_insert_with(Vec::new).extend_from_slice(v);
            }
            (6, 0) => snapshot_chunk = Rd::new(b, at, r.p).varint().expect("checked") != 0,
            _ => {}
        }
    }
    let source = source.map(|v| PyBytes::new(py, &v).into_any()).unwrap_or_else(|| py.None().into_bound(py));
    Ok(Ok((has_ddl, has_snapshots, source, snapshot_chunk, out).into_pyobject(py)?))
}

fn mutation_entry<'py>(py: Python<'py>, b: &[u8], start: usize, end: usize) -> PyResult<Bound<'py, PyTuple>> {
    let what = "table mutation";
    let mut r = Rd::new(b, start, end);
    let (mut table_id, mut version) = (0i64, 0i64);
    let (mut schema, mut table): (&[u8], &[u8]) = (&[], &[]);
    let mut changes = 0usize;
    let mut problem: Option<(usize, i32, Option<&'static str>)> = None;
    while r.more() {
        let (f, w) = r.tag().map_err(|e| wire_err(what, e))?;
        match (f, w) {
            (1, 0) => table_id = r.varint().map_err(|e| wire_err(what, e))? as i64,
            (2, 2) => {
                let (s, e) = r.span().map_err(|e| wire_err(what, e))?;
                schema = &b[s..e];
            }
            (3, 2) => {
                let (s, e) = r.span().map_err(|e| wire_err(what, e))?;
                table = &b[s..e];
            }
            (4, 0) => version = r.varint().map_err(|e| wire_err(what, e))? as i64,
            (5, 2) => {
                let (s, e) = r.span().map_err(|e| wire_err(what, e))?;
                if problem.is_none() {
                    let ch = parse_change(b, s, e).map_err(|e| wire_err("row change", e))?;
                    if let Some(image) = lacks(&ch) {
                        problem = Some((changes, ch.tp, image));
                    }
                }
                changes += 1;
            }
            _ => r.skip(w, f).map_err(|e| wire_err(what, e))?,
        }
    }
    let schema = utf8(py, schema, "schema_name")?;
    let table = utf8(py, table, "table_name")?;
    let problem = match problem {
        None => py.None().into_bound(py),
        Some((i, tp, image)) => (i, tp, image).into_pyobject(py)?.into_any(),
    };
    (table_id, schema, table, version, start, end, changes, problem).into_pyobject(py)
}

// ------------------------------------------------------------------------------------------------
// the decoder: one mutation's changes -> tuples of SQL parameters
// ------------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Default)]
pub(crate) struct DateTime {
    pub(crate) year: i32,
    pub(crate) month: u32,
    pub(crate) day: u32,
    pub(crate) hour: u32,
    pub(crate) minute: u32,
    pub(crate) second: u32,
    pub(crate) microsecond: u32,
}

#[derive(Clone, Copy, Default)]
pub(crate) struct Time {
    pub(crate) negative: bool,
    pub(crate) hours: u32,
    pub(crate) minutes: u32,
    pub(crate) seconds: u32,
    pub(crate) microseconds: u32,
}

pub(crate) enum Value {
    Null,
    Int(i64),
    Uint(u64),
    Double(f64),
    Decimal(usize, usize),
    Bytes(usize, usize),
    Str(usize, usize),
    DateTime(DateTime),
    Time(Time),
}

fn parse_datetime(b: &[u8], (s, e): (usize, usize), v: &mut DateTime) -> WireResult<()> {
    let mut r = Rd::new(b, s, e);
    while r.more() {
        let (f, w) = r.tag()?;
        if w != 0 || !(1..=7).contains(&f) {
            r.skip(w, f)?;
            continue;
        }
        let x = r.varint()?;
        match f {
            1 => v.year = x as i32,
            2 => v.month = x as u32,
            3 => v.day = x as u32,
            4 => v.hour = x as u32,
            5 => v.minute = x as u32,
            6 => v.second = x as u32,
            _ => v.microsecond = x as u32,
        }
    }
    Ok(())
}

fn parse_time(b: &[u8], (s, e): (usize, usize), v: &mut Time) -> WireResult<()> {
    let mut r = Rd::new(b, s, e);
    while r.more() {
        let (f, w) = r.tag()?;
        if w != 0 || !(1..=5).contains(&f) {
            r.skip(w, f)?;
            continue;
        }
        let x = r.varint()?;
        match f {
            1 => v.negative = x != 0,
            2 => v.hours = x as u32,
            3 => v.minutes = x as u32,
            4 => v.seconds = x as u32,
            _ => v.microseconds = x as u32,
        }
    }
    Ok(())
}

pub(crate) fn parse_datum(b: &[u8], s: usize, e: usize) -> WireResult<Value> {
    let mut r = Rd::new(b, s, e);
    let mut v = Value::Null;
    while r.more() {
        let (f, w) = r.tag()?;
        v = match (f, w) {
            (1, 0) => {
                r.varint()?;
                Value::Null
            }
            (2, 0) => {
                let z = r.varint()?;
                Value::Int(((z >> 1) as i64) ^ -((z & 1) as i64))
            }
            (3, 0) => Value::Uint(r.varint()?),
            (4, 1) => {
                let x = r.fixed(8)?;
                Value::Double(f64::from_le_bytes(x.try_into().unwrap()))
            }
            (5, 2) => {
                let (a, z) = r.span()?;
                Value::Decimal(a, z)
            }
            (6, 2) => {
                let (a, z) = r.span()?;
                Value::Bytes(a, z)
            }
            (7, 2) | (10, 2) => {
                let (a, z) = r.span()?;
                Value::Str(a, z)
            }
            (8, 2) => {
                let mut d = if let Value::DateTime(d) = v { d } else { DateTime::default() };
                parse_datetime(b, r.span()?, &mut d)?;
                Value::DateTime(d)
            }
            (9, 2) => {
                let mut t = if let Value::Time(t) = v { t } else { Time::default() };
                parse_time(b, r.span()?, &mut t)?;
                Value::Time(t)
            }
            _ => {
                r.skip(w, f)?;
                v
            }
        };
    }
    Ok(v)
}

#[pyclass(frozen, module = "sluice_native")]
pub struct MutationDecoder {
    total: usize,
    visible_pos: Vec<usize>,
    modes: Vec<u8>,
    decimal: Py<PyAny>,
    invalid_operation: Py<PyAny>,
    date: Py<PyAny>,
    datetime: Py<PyAny>,
    timedelta: Py<PyAny>,
    int_from_bytes: Py<PyAny>,
}

impl MutationDecoder {
    fn value<'py>(&self, py: Python<'py>, b: &[u8], i: usize, v: Value) -> PyResult<Bound<'py, PyAny>> {
        Ok(match v {
            Value::Null => py.None().into_bound(py),
            Value::Int(x) => x.into_pyobject(py)?.into_any(),
            Value::Uint(x) => x.into_pyobject(py)?.into_any(),
            Value::Double(x) => x.into_pyobject(py)?.into_any(),
            Value::Str(s, e) => utf8(py, &b[s..e], "text value")?.into_any(),
            Value::Bytes(s, e) => {
                let raw = &b[s..e];
                if self.modes[i] == MODE_BIT {
                    if raw.len() <= 8 {
                        raw.iter().fold(0u64, |acc, &x| (acc << 8) | x as u64).into_pyobject(py)?.into_any()
                    } else {
                        self.int_from_bytes.bind(py).call1((PyBytes::new(py, raw), "big"))?
                    }
                } else {
                    PyBytes::new(py, raw).into_any()
                }
            }
            Value::Decimal(s, e) => {
                let text = utf8(py, &b[s..e], "decimal text")?;
                match self.decimal.bind(py).call1((&text,)) {
                    Ok(d) => d,
                    Err(err) if err.is_instance(py, self.invalid_operation.bind(py)) => {
                        return Err(DecimalTextError::new_err((i, text.unbind())));
                    }
                    Err(err) => return Err(err),
                }
            }
            Value::DateTime(d) => {
                // Python's constructors take C ints: a part beyond one is a corrupt value, not a
                // zero part (the old path let their OverflowError escape unnamed).
                let parts = [d.month, d.day, d.hour, d.minute, d.second, d.microsecond];
                if parts.iter().any(|&x| x > i32::MAX as u32) {
                    return Err(DecodeError::new_err(format!(
                        "datetime value of column #{i} has a part beyond 2147483647: {}-{}-{} {}:{}:{}.{}",
                        d.year, d.month, d.day, d.hour, d.minute, d.second, d.microsecond)));
                }
                let made = if self.modes[i] == MODE_DATE {
                    self.date.bind(py).call1((d.year, d.month, d.day))
                } else {
                    self.datetime.bind(py).call1((d.year, d.month, d.day, d.hour, d.minute, d.second, d.microsecond))
                };
                match made {
                    Ok(x) => x,
                    // zero dates and zero parts: Python's datetime cannot hold them, MySQL parses the text
                    Err(err) if err.is_instance_of::<PyValueError>(py) => {
                        let text = if self.modes[i] == MODE_DATE {
                            format!("{:04}-{:02}-{:02}", d.year, d.month, d.day)
                        } else {
                            format!("{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:06}", d.year, d.month, d.day,
                                    d.hour, d.minute, d.second, d.microsecond)
                        };
                        PyString::new(py, &text).into_any()
                    }
                    Err(err) => return Err(err),
                }
            }
            Value::Time(t) => {
                let secs = t.hours as u64 * 3600 + t.minutes as u64 * 60 + t.seconds as u64;
                let td = self.timedelta.bind(py).call1((0u32, secs, t.microseconds))?;
                if t.negative { td.neg()? } else { td }
            }
        })
    }

    /// One image (the Row spans of one change) -> a tuple of visible values.
    fn row<'py>(&self, py: Python<'py>, b: &[u8], spans: &[(usize, usize)],
                datums: &mut Vec<(usize, usize)>) -> PyResult<Bound<'py, PyTuple>> {
        datums.clear();
        for &(s, e) in spans {
            let mut r = Rd::new(b, s, e);
            while r.more() {
                let (f, w) = r.tag().map_err(|e| wire_err("row", e))?;
                if (f, w) == (1, 2) {
                    datums.push(r.span().map_err(|e| wire_err("row", e))?);
                } else {
                    r.skip(w, f).map_err(|e| wire_err("row", e))?;
                }
            }
        }
        let n = datums.len();
        let nvis = self.visible_pos.len();
        let mut vals: Vec<Bound<'py, PyAny>> = Vec::with_capacity(nvis);
        if n == nvis {
            for (i, &(s, e)) in datums.iter().enumerate() {
                let v = parse_datum(b, s, e).map_err(|e| wire_err("datum", e))?;
                vals.push(self.value(py, b, i, v)?);
            }
        } else if n == self.total {
            for (i, &p) in self.visible_pos.iter().enumerate() {
                let (s, e) = datums[p];
                let v = parse_datum(b, s, e).map_err(|e| wire_err("datum", e))?;
                vals.push(self.value(py, b, i, v)?);
            }
        } else {
            return Err(ColumnCountError::new_err((n,)));
        }
        PyTuple::new(py, vals)
    }
}

#[pymethods]
impl MutationDecoder {
    #[new]
    fn new(py: Python<'_>, total: usize, visible_pos: Vec<usize>, modes: Vec<u8>) -> PyResult<Self> {
        if visible_pos.len() != modes.len() {
            return Err(PyValueError::new_err(format!("{} visible positions, {} modes", visible_pos.len(), modes.len())));
        }
        if let Some(&p) = visible_pos.iter().find(|&&p| p >= total) {
            return Err(PyValueError::new_err(format!("visible position {p} outside a row of {total} columns")));
        }
        let dt = py.import("datetime")?;
        let dec = py.import("decimal")?;
        Ok(MutationDecoder {
            total,
            visible_pos,
            modes,
            decimal: dec.getattr("Decimal")?.unbind(),
            invalid_operation: dec.getattr("InvalidOperation")?.unbind(),
            date: dt.getattr("date")?.unbind(),
            datetime: dt.getattr("datetime")?.unbind(),
            timedelta: dt.getattr("timedelta")?.unbind(),
            int_from_bytes: py.get_type::<pyo3::types::PyInt>().getattr("from_bytes")?.unbind(),
        })
    }

    /// See the module doc.
    fn decode<'py>(&self, py: Python<'py>, payload: &Bound<'py, PyBytes>, start: usize, end: usize) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        self.each_change(py, payload, start, end, |tp, before, after| out.append((tp, before, after)))?;
        Ok(out)
    }

    /// See the module doc: `decode` with each change made into a `row_change(kind, shape,
    /// commit_ts, before, after, keys)` here.
    #[allow(clippy::too_many_arguments)]
    fn changes<'py>(&self, py: Python<'py>, payload: &Bound<'py, PyBytes>, start: usize, end: usize,
                    keys: PyRef<'py, KeyBuilder>, row_change: &Bound<'py, PyAny>, shape: &Bound<'py, PyAny>,
                    commit_ts: &Bound<'py, PyAny>, insert_kind: &Bound<'py, PyString>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        self.each_change(py, payload, start, end, |tp, before, after| {
            let (kind, k) = match tp {
                TP_UPDATE => (intern!(py, "update"),
                              keys.update_keys_of(py, before.cast::<PyTuple>()?, after.cast::<PyTuple>()?)?),
                TP_DELETE => (intern!(py, "delete"), keys.keys_of(py, before.cast::<PyTuple>()?)?),
                _ => (if tp == TP_INSERT { insert_kind } else { intern!(py, "upsert") },
                      keys.insert_keys_of(py, after.cast::<PyTuple>()?)?),
            };
            out.append(row_change.call1((kind, shape, commit_ts, before, after, k))?)
        })?;
        Ok(out)
    }
}

impl MutationDecoder {
    /// `f(tp, before, after)` for every row change of the mutation body at payload[start:end],
    /// in order; the images are tuples of visible values, or None where the type has none.
    fn each_change<'py, F>(&self, py: Python<'py>, payload: &Bound<'py, PyBytes>, start: usize, end: usize,
                           mut f: F) -> PyResult<()>
    where
        F: FnMut(i32, Bound<'py, PyAny>, Bound<'py, PyAny>) -> PyResult<()>,
    {
        let b = payload.as_bytes();
        if start > end || end > b.len() {
            return Err(PyValueError::new_err(format!("mutation [{start}, {end}) outside a payload of {} bytes", b.len())));
        }
        let mut datums = Vec::new();
        let mut r = Rd::new(b, start, end);
        let mut index = 0usize;
        while r.more() {
            let (fi, w) = r.tag().map_err(|e| wire_err("table mutation", e))?;
            if (fi, w) != (5, 2) {
                r.skip(w, fi).map_err(|e| wire_err("table mutation", e))?;
                continue;
            }
            let (s, e) = r.span().map_err(|e| wire_err("table mutation", e))?;
            let ch = parse_change(b, s, e).map_err(|e| wire_err("row change", e))?;
            if let Some(image) = lacks(&ch) {
                return Err(DecodeError::new_err(format!(
                    "row change #{index} of type {} lacks its {} image", ch.tp, image.unwrap_or("known type's"))));
            }
            let before = if ch.tp == TP_UPDATE || ch.tp == TP_DELETE {
                self.row(py, b, &ch.before, &mut datums)?.into_any()
            } else {
                py.None().into_bound(py)
            };
            let after = if ch.tp != TP_DELETE {
                self.row(py, b, &ch.after, &mut datums)?.into_any()
            } else {
                py.None().into_bound(py)
            };
            f(ch.tp, before, after)?;
            index += 1;
        }
        Ok(())
    }
}
