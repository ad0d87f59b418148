//! The capture's per-event loop for the common transaction, natively: binlog packets (what the
//! reader's `_refill` split) -> one whole row transaction, so Python runs once per transaction
//! instead of once per event (capture/binlog_stream.py, capture/assembler.py).
//!
//! Narrow API: `TxnScanner()` holds TableMap bodies already resolved by the SchemaTracker
//! (`learn(body, table_id, stable_id, entry, decoder, marks)`, `clear()`: the tracker keeps it in
//! step with its own cache of resolved shapes). `scan(packets, i, checksum)` reads the event
//! group that starts with the GTID event `packets[i]` and returns `(next_index, txn)` when the
//! whole group is: a non-standalone MariaDB GTID, TableMaps whose bodies were learned, rows events
//! on tables mapped in the group (FULL row images, decoded by the table's `RowDecoder`), an XID.
//! `txn` = `((domain_id, server_id, seq_no, flags), gtid_ts, gtid_log_pos, gtid_event_size,
//! last_log_pos, last_ts, size, marked, mutations, events)`, `mutations` a list of `(entry,
//! changes, count)` (consecutive rows events of one stable table id joined: `changes` is their
//! `repeated RowChange` bytes as the decoder gives them).
//!
//! Anything else returns None and consumes nothing: a query (DDL, BEGIN/COMMIT), a TableMap not
//! learned, an unknown table_id, a column count or row-image bitmap that does not match, a row the
//! decoder refuses, a malformed packet. A group the packets read so far do not finish (nothing
//! else declined) returns `(len(packets), None)`: Python reads more and scans again. Python
//! then reads that group event by event as before, which keeps every check and error message
//! (the unknown table_id stays fatal there) in one place: this scanner never raises for the
//! binlog's content, it only declines.

use std::collections::HashMap;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::endian::le;
use crate::events::packed_int;
use crate::rowdecoder::RowDecoder;

const TABLE_MAP_EVENT: u8 = 19;
const XID_EVENT: u8 = 16;
const MARIADB_GTID_EVENT: u8 = 162;
const FL_STANDALONE: u8 = 1;
/// Bodies kept at most (a source with very many tables or shapes): then start again.
const MAX_BODIES: usize = 4096;

struct Known {
    table_id: u64,
    stable: u64,
    entry: Py<PyAny>,
    decoder: Option<Py<RowDecoder>>,
    full: Vec<u8>,
    marks: bool,
}

#[pyclass(module = "sluice_native")]
pub struct TxnScanner {
    bodies: HashMap<Vec<u8>, usize>,
    known: Vec<Known>,
}

/// (type, timestamp, log_pos, event_size, body_end) of a packet holding one whole event.
fn header(b: &[u8], checksum: bool) -> Option<(u8, u64, u64, usize, usize)> {
    if b.len() < 20 || b[0] != 0 {
        return None;
    }
    let event_size = le(&b[10..14]) as usize;
    let crc = if checksum { 4 } else { 0 };
    if event_size + 1 != b.len() || event_size < 19 + crc {
        return None;
    }
    Some((b[5], le(&b[1..5]), le(&b[14..18]), event_size, 1 + event_size - crc))
}

/// A rows event's post-header: (tp, table_id, ncols, present, present2, rows_start).
type RowsHead<'a> = (u32, u64, usize, &'a [u8], &'a [u8], usize);

fn rows_head(b: &[u8], etype: u8, body_end: usize) -> Option<RowsHead<'_>> {
    let (tp, v2) = match etype {
        23 => (1, false), 24 => (2, false), 25 => (3, false),
        30 => (1, true), 31 => (2, true), 32 => (3, true),
        _ => return None,
    };
    let mut p = 20;
    if p + 8 > body_end {
        return None;
    }
    let table_id = le(&b[p..p + 6]);
    p += 8;
    if v2 {
        if p + 2 > body_end {
            return None;
        }
        let extra = le(&b[p..p + 2]) as usize;
        if extra < 2 || p + extra > body_end {
            return None;
        }
        p += extra;
    }
    let (ncols, q) = packed_int(&b[..body_end], p)?;
    let ncols = ncols as usize;
    p = q;
    let nb = ncols.div_ceil(8);
    if p + nb > body_end {
        return None;
    }
    let present = &b[p..p + nb];
    p += nb;
    let present2: &[u8] = if tp == 2 {
        if p + nb > body_end {
            return None;
        }
        p += nb;
        &b[p - nb..p]
    } else {
        &[]
    };
    Some((tp, table_id, ncols, present, present2, p))
}

#[pymethods]
impl TxnScanner {
    #[new]
    fn new() -> Self {
        TxnScanner { bodies: HashMap::new(), known: Vec::new() }
    }

    /// A TableMap body (the event's bytes after its 19-byte header, without the checksum) as the
    /// SchemaTracker resolved it: `entry` is handed back in `scan`'s mutations; `decoder` is the
    /// table's native RowDecoder, None for a table outside the filter (its rows are counted in
    /// the size only, and `marks` says whether they mark the transaction as a sink's own).
    #[pyo3(signature = (body, table_id, stable_id, entry, decoder, marks))]
    fn learn(&mut self, body: &[u8], table_id: u64, stable_id: u64, entry: Py<PyAny>,
             decoder: Option<Py<RowDecoder>>, marks: bool) {
        if self.bodies.contains_key(body) {
            return;
        }
        if self.bodies.len() >= MAX_BODIES {
            self.clear();
        }
        let full = match &decoder {
            Some(d) => {
                let n = d.get().cols.len();
                let mut f = vec![0xFFu8; n / 8];
                if n % 8 != 0 {
                    f.push(((1u16 << (n % 8)) - 1) as u8);
                }
                f
            }
            None => Vec::new(),
        };
        self.bodies.insert(body.to_vec(), self.known.len());
        self.known.push(Known { table_id, stable: stable_id, entry, decoder, full, marks });
    }

    /// Forget every body (the tracker's resolved shapes changed: DDL, a re-read).
    fn clear(&mut self) {
        self.bodies.clear();
        self.known.clear();
    }

    fn __len__(&self) -> usize {
        self.bodies.len()
    }

    /// The whole event group starting at `packets[i]` (see the module doc), or None.
    fn scan<'py>(&self, py: Python<'py>, packets: &Bound<'py, PyList>, i: usize, checksum: bool)
                 -> PyResult<Option<(usize, Bound<'py, PyAny>)>> {
        let n = packets.len();
        if i >= n {
            return Ok(None);
        }
        let first = packets.get_item(i)?;
        let Ok(first) = first.cast::<PyBytes>() else { return Ok(None) };
        let b = first.as_bytes();
        let Some((etype, gts, glog, gsize, gend)) = header(b, checksum) else { return Ok(None) };
        if etype != MARIADB_GTID_EVENT || 20 + 13 > gend || b[32] & FL_STANDALONE != 0 {
            return Ok(None);
        }
        let (seq, domain, flags) = (le(&b[20..28]), le(&b[28..32]), b[32]);
        let server_id = le(&b[6..10]);
        let (mut last_log, mut last_ts) = (glog, gts);
        let mut size = 0usize;
        let mut marked = false;
        // table_id -> known index, mapped in this group (a later TableMap of an id replaces it)
        let mut maps: Vec<(u64, usize)> = Vec::new();
        // (known index of the group's first event, stable id, changes, count)
        let mut groups: Vec<(usize, u64, Vec<u8>, usize)> = Vec::new();
        let mut k = i + 1;
        while k < n {
            let item = packets.get_item(k)?;
            let Ok(pkt) = item.cast::<PyBytes>() else { return Ok(None) };
            let b = pkt.as_bytes();
            let Some((etype, ts, log_pos, _, body_end)) = header(b, checksum) else { return Ok(None) };
            k += 1;
            match etype {
                TABLE_MAP_EVENT => {
                    let Some(&idx) = self.bodies.get(&b[20..body_end]) else { return Ok(None) };
                    let tid = self.known[idx].table_id;
                    match maps.iter_mut().find(|(t, _)| *t == tid) {
                        Some(slot) => slot.1 = idx,
                        None => maps.push((tid, idx)),
                    }
                }
                XID_EVENT => {
                    if 20 + 8 > body_end {
                        return Ok(None);
                    }
                }
                _ => {
                    let Some((tp, table_id, ncols, present, present2, start)) = rows_head(b, etype, body_end)
                        else { return Ok(None) };
                    let Some(&(_, idx)) = maps.iter().find(|(t, _)| *t == table_id) else { return Ok(None) };
                    let known = &self.known[idx];
                    size += body_end - start;
                    let Some(dec) = &known.decoder else {
                        marked |= known.marks;
                        if log_pos != 0 { last_log = log_pos; }
                        if ts != 0 { last_ts = ts; }
                        continue;
                    };
                    let dec = dec.get();
                    if ncols != dec.cols.len() || present != known.full.as_slice()
                        || (tp == 2 && present2 != known.full.as_slice()) {
                        return Ok(None);
                    }
                    let Ok((changes, count)) = dec.decode(py, pkt, tp, start, Some(body_end)) else {
                        return Ok(None);
                    };
                    match groups.last_mut() {
                        Some(g) if g.1 == known.stable => {
                            g.2.extend_from_slice(changes.as_bytes());
                            g.3 += count;
                        }
                        _ => groups.push((idx, known.stable, changes.as_bytes().to_vec(), count)),
                    }
                }
            }
            if log_pos != 0 {
                last_log = log_pos;
            }
            if ts != 0 {
                last_ts = ts;
            }
            if etype == XID_EVENT {
                let muts = PyList::empty(py);
                for (idx, _, changes, count) in &groups {
                    muts.append((self.known[*idx].entry.clone_ref(py), PyBytes::new(py, changes), *count))?;
                }
                let txn = ((domain, server_id, seq, flags), gts, glog, gsize, last_log, last_ts, size,
                           marked, muts, k - i).into_pyobject(py)?;
                return Ok(Some((k, txn.into_any())));
            }
        }
        // Nothing declined, but the group goes on past the packets read so far.
        Ok(Some((n, py.None().into_bound(py))))
    }
}
