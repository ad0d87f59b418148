//! The drainer's transaction envelopes: a transaction's binlogs (framed as repeated field 1 of
//! DrainerPullResp, the form the merge carries) -> the fields `Txn` needs, straight from the wire
//! bytes (no protobuf message per binlog). drainer/txn.py is the only caller; the Python it
//! replaces (unframe + Txn.from_binlogs' join) lives on in tests/support/pyjoin.py as the
//! differential oracle.
//!
//! - `unframe(framed) -> [bytes, ...]`: the binlogs, in order.
//! - `commit_position(framed) -> (producer_id, position bytes or None)` of the last binlog (the
//!   COMMIT): the reader's look at a packed entry marked as positioned.
//! - `join_framed(framed, commit_ts)` / `join_binlogs(prewrite_parts, commit)` -> `(start_ts,
//!   commit_ts, producer_id, position, snapshot, prewrite_value, part_count, binlogs)`: the
//!   COMMIT (the last framed binlog) joined with its PREWRITE part(s) in part order. `position`
//!   and `snapshot` are the serialized sub-messages (the COMMIT's, else the first part's; None
//!   when neither has one), `prewrite_value` the parts' values joined; Python parses those.
//!   A ninth field, `facts`: the prewrite value checked whole in the same call (prewrite.rs's
//!   `prewrite_facts`: what upb's parse would refuse) -> `(has_ddl, has_schema_snapshots,
//!   source bytes or None, snapshot_chunk, prewrite_mutations' list)`, or the text saying why it
//!   is undecodable (Python makes that CorruptTxn; the drainer parses the message only on demand).
//!
//! Every check of the former Python join, in the same order and with the same reason text, raises
//! `TxnError(start_ts, commit_ts, reason)` (None where not known yet); Python makes it
//! CorruptTxn naming the pump. Protobuf rules kept: unknown fields and fields of an unexpected
//! wire type are skipped, the last scalar wins, repeated occurrences of a message field merge
//! (their bytes are concatenated, which parses as the merge), strings must be UTF-8.

use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::wire::Rd;

create_exception!(sluice_native, TxnError, PyValueError, "A transaction whose binlogs cannot be joined: args (start_ts, commit_ts, reason).");

const PREWRITE: i32 = 1;
const COMMIT: i32 = 2;

fn type_name(tp: i32) -> String {
    match tp {
        0 => "BINLOG_TYPE_UNSPECIFIED".into(),
        1 => "PREWRITE".into(),
        2 => "COMMIT".into(),
        3 => "ROLLBACK".into(),
        4 => "FAKE".into(),
        n => format!("type {n}"),
    }
}

/// A message's fields are well-formed wire format (nested messages are left to their parser).
fn check_wire(b: &[u8]) -> Result<(), String> {
    let mut r = Rd::new(b, 0, b.len());
    while r.more() {
        let (f, w) = r.tag()?;
        r.skip(w, f)?;
    }
    Ok(())
}

/// Field 1 (wire type 2) of a DrainerPullResp: the framed binlogs.
fn split(framed: &[u8]) -> Result<Vec<&[u8]>, String> {
    let mut r = Rd::new(framed, 0, framed.len());
    let mut out = Vec::new();
    while r.more() {
        let (f, w) = r.tag()?;
        if f == 1 && w == 2 {
            out.push(r.bytes()?);
        } else {
            r.skip(w, f)?;
        }
    }
    Ok(out)
}

#[derive(Default)]
struct Binlog<'a> {
    tp: i32,
    start_ts: i64,
    commit_ts: i64,
    prewrite_value: &'a [u8],
    part_no: u32,
    part_count: u32,
    producer_id: &'a str,
    position: Option<Vec<u8>>,
    snapshot: Option<Vec<u8>>,
}

fn merge_into(slot: &mut Option<Vec<u8>>, v: &[u8]) -> Result<(), String> {
    check_wire(v)?;
    slot.get_or_insert_with(Vec::new).extend_from_slice(v);
    Ok(())
}

fn parse_binlog(b: &[u8]) -> Result<Binlog<'_>, String> {
    let mut r = Rd::new(b, 0, b.len());
    let mut out = Binlog::default();
    while r.more() {
        let (f, w) = r.tag()?;
        match (f, w) {
            (1, 0) => out.tp = r.varint()? as i32,
            (2, 0) => out.start_ts = r.varint()? as i64,
            (3, 0) => out.commit_ts = r.varint()? as i64,
            (4, 2) => out.prewrite_value = r.bytes()?,
            (5, 0) => out.part_no = r.varint()? as u32,
            (6, 0) => out.part_count = r.varint()? as u32,
            (7, 2) => {
                let at = r.p;
                out.producer_id = std::str::from_utf8(r.bytes()?)
                    .map_err(|_| format!("producer_id at byte {at} is not UTF-8"))?;
            }
            (9, 2) => merge_into(&mut out.position, r.bytes()?)?,
            (10, 2) => merge_into(&mut out.snapshot, r.bytes()?)?,
            _ => r.skip(w, f)?,
        }
    }
    Ok(out)
}

type Joined = (i64, i64, String, Option<Py<PyBytes>>, Option<Py<PyBytes>>, Py<PyBytes>, u32, usize, Py<PyAny>);

fn err(start_ts: Option<i64>, commit_ts: Option<i64>, reason: String) -> PyErr {
    TxnError::new_err((start_ts, commit_ts, reason))
}

fn join(py: Python<'_>, prewrites: &[&[u8]], commit: &[u8], nbinlogs: usize) -> PyResult<Joined> {
    let c = parse_binlog(commit).map_err(|e| err(None, None, format!("undecodable commit binlog: {e}")))?;
    let (st, ct) = (c.start_ts, c.commit_ts);
    let fail = |reason: String| err(Some(st), Some(ct), reason);
    if c.tp != COMMIT {
        return Err(fail(format!("expected a COMMIT binlog, got {}", type_name(c.tp))));
    }
    if prewrites.is_empty() {
        return Err(fail("no prewrite binlog".into()));
    }
    // part_no -> the last binlog carrying it (a retried part may come twice)
    let mut parts: Vec<Option<Binlog<'_>>> = Vec::new();
    let mut count: u32 = 0;
    for (i, raw) in prewrites.iter().enumerate() {
        let p = parse_binlog(raw).map_err(|e| fail(format!("undecodable prewrite binlog #{i}: {e}")))?;
        if p.tp != PREWRITE || p.start_ts != st {
            return Err(fail(format!("binlog #{i} is {} start_ts {}, not a prewrite of this transaction",
                                    type_name(p.tp), p.start_ts)));
        }
        let n = p.part_count.max(1);
        if count != 0 && n != count {
            return Err(fail(format!("prewrite parts disagree on part_count ({count} vs {n})")));
        }
        count = n;
        if p.part_no >= n {
            return Err(fail(format!("prewrite part_no {} >= part_count {n}", p.part_no)));
        }
        let k = p.part_no as usize;
        if parts.len() <= k {
            // bounded by the number of binlogs given: a huge part_count alone allocates nothing
            parts.resize_with(k + 1, || None);
        }
        if let Some(seen) = &parts[k] {
            if seen.prewrite_value != p.prewrite_value {
                return Err(fail(format!("two different prewrite parts numbered {}", p.part_no)));
            }
        }
        parts[k] = Some(p);
    }
    if parts.len() < count as usize || parts.iter().any(|p| p.is_none()) {
        let missing: Vec<String> = (0..count as usize)
            .filter(|&i| parts.get(i).is_none_or(|p| p.is_none()))
            .map(|i| i.to_string())
            .collect();
        return Err(fail(format!("missing prewrite part(s) [{}] of {count}", missing.join(", "))));
    }
    let payload = if count == 1 {
        PyBytes::new(py, parts[0].as_ref().map_or(&[][..], |p| p.prewrite_value))
    } else {
        let total = parts.iter().flatten().map(|p| p.prewrite_value.len()).sum();
        PyBytes::new_with(py, total, |buf| {
            let mut at = 0;
            for p in parts.iter().flatten() {
                buf[at..at + p.prewrite_value.len()].copy_from_slice(p.prewrite_value);
                at += p.prewrite_value.len();
            }
            Ok(())
        })?
    };
    let first = parts[0].as_ref().expect("every part is present");
    let position = c.position.as_ref().or(first.position.as_ref()).map(|v| PyBytes::new(py, v).unbind());
    let snapshot = c.snapshot.as_ref().or(first.snapshot.as_ref()).map(|v| PyBytes::new(py, v).unbind());
    let producer = if c.producer_id.is_empty() { first.producer_id } else { c.producer_id };
    // the value checked and its facts read in one walk (prewrite.rs); a refusal is the facts'
    // place's text, so the join itself still answers as the former one did
    let facts = match crate::prewrite::prewrite_facts(py, payload.as_bytes())? {
        Ok(t) => t.into_any().unbind(),
        Err(why) => why.into_pyobject(py)?.into_any().unbind(),
    };
    Ok((st, ct, producer.to_owned(), position, snapshot, payload.unbind(), count, nbinlogs, facts))
}

/// The binlogs of a framed transaction (DrainerPullResp field 1), in order.
#[pyfunction]
pub fn unframe<'py>(py: Python<'py>, framed: &[u8]) -> PyResult<Bound<'py, PyList>> {
    let binlogs = split(framed).map_err(PyValueError::new_err)?;
    PyList::new(py, binlogs.into_iter().map(|b| PyBytes::new(py, b)))
}

/// A framed transaction joined: see the module doc. `commit_ts` (the merge's) names an
/// unframable transaction.
#[pyfunction]
pub fn join_framed(py: Python<'_>, framed: &[u8], commit_ts: Option<i64>) -> PyResult<Joined> {
    let binlogs = split(framed).map_err(|e| err(None, commit_ts, format!("unframable binlogs: {e}")))?;
    let Some((commit, prewrites)) = binlogs.split_last() else {
        return Err(err(None, commit_ts, "a transaction without binlogs".into()));
    };
    join(py, prewrites, commit, binlogs.len())
}

/// A COMMIT binlog joined with its PREWRITE part(s), given apart (any order).
#[pyfunction]
pub fn join_binlogs<'py>(py: Python<'py>, prewrite_parts: Vec<Bound<'py, PyBytes>>, commit: &[u8]) -> PyResult<Joined> {
    let parts: Vec<&[u8]> = prewrite_parts.iter().map(|v| v.as_bytes()).collect();
    join(py, &parts, commit, parts.len() + 1)
}

/// The producer and serialized position (None without one) of a framed transaction's last
/// binlog, its COMMIT: what the reader needs of a packed entry the pump marks as positioned.
#[pyfunction]
pub fn commit_position<'py>(py: Python<'py>, framed: &[u8]) -> PyResult<(String, Option<Bound<'py, PyBytes>>)> {
    let binlogs = split(framed).map_err(PyValueError::new_err)?;
    let Some(last) = binlogs.last() else {
        return Err(PyValueError::new_err("a transaction without binlogs"));
    };
    let c = parse_binlog(last).map_err(PyValueError::new_err)?;
    Ok((c.producer_id.to_owned(), c.position.map(|v| PyBytes::new(py, &v))))
}
