//! Binlog events: the framing of one event (`parse_event`), the post-header of the rows events,
//! and the client/server packets around them (`split_packets`). Malformed bytes raise
//! DecodeError naming the byte.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use crate::endian::le;
use crate::DecodeError;

const XID_EVENT: u8 = 16;
const MARIADB_GTID_EVENT: u8 = 162;
const ROWS_EVENTS: [(u8, u32, bool); 6] = [
    (23, 1, false), (24, 2, false), (25, 3, false), // WRITE/UPDATE/DELETE_ROWS_EVENT_V1 (MariaDB)
    (30, 1, true), (31, 2, true), (32, 3, true),    // *_ROWS_EVENT v2 (MySQL 5.6+: extra data)
];

fn event_error(what: String) -> PyErr {
    DecodeError::new_err(what)
}

/// MySQL's length-encoded integer ("packed integer") at `pos` -> (value, next pos).
pub(crate) fn packed_int(b: &[u8], pos: usize) -> Option<(u64, usize)> {
    let first = *b.get(pos)?;
    let n = match first {
        0..=250 => return Some((first as u64, pos + 1)),
        252 => 2,
        253 => 3,
        254 => 8,
        _ => return None, // 251 is NULL, 255 is not a length
    };
    let raw = b.get(pos + 1..pos + 1 + n)?;
    Some((le(raw), pos + 1 + n))
}

/// One binlog network packet's payload (the OK byte 0x00, then one event) -> a tuple:
/// `(type, timestamp, server_id, event_size, log_pos, body_end, *fields)`.
/// `body_end` is where the event's body ends in `data` (before the CRC32 when `checksum`).
/// The fields, for the events the capture reads natively (the rest: none, parsed by the library):
///   rows events (v1, v2): `tp` (1 INSERT, 2 UPDATE, 3 DELETE: pb.MutationType), `table_id`,
///     `ncols`, `present` (columns-present bitmap), `present2` (UPDATE: the after image's,
///     else None), `rows_start` (the row images are `data[rows_start:body_end]`);
///   MariaDB GTID: `seq_no`, `domain_id`, `gtid_flags`;
///   XID: `xid`.
/// A packet that does not hold what its header says raises DecodeError naming the byte.
#[pyfunction]
pub(crate) fn parse_event<'py>(py: Python<'py>, data: &Bound<'py, PyBytes>, checksum: bool) -> PyResult<Bound<'py, PyTuple>> {
    let b = data.as_bytes();
    if b.len() < 20 || b[0] != 0 {
        return Err(event_error(format!("binlog packet of {} bytes is not an event (needs the OK byte and a 19-byte header)", b.len())));
    }
    let ts = le(&b[1..5]);
    let etype = b[5];
    let server_id = le(&b[6..10]);
    let event_size = le(&b[10..14]) as usize;
    let log_pos = le(&b[14..18]);
    if event_size + 1 != b.len() {
        return Err(event_error(format!("binlog event type {etype} says {event_size} bytes, its packet holds {}", b.len() - 1)));
    }
    let crc = if checksum { 4 } else { 0 };
    if event_size < 19 + crc {
        return Err(event_error(format!("binlog event type {etype} of {event_size} bytes is shorter than its header")));
    }
    let body_end = 1 + event_size - crc;
    let head = (etype, ts, server_id, event_size, log_pos, body_end);
    let short = |what: &str| event_error(format!("binlog event type {etype} of {event_size} bytes ends inside its {what}"));
    if let Some(&(_, tp, v2)) = ROWS_EVENTS.iter().find(|(t, _, _)| *t == etype) {
        let mut p = 20;
        if p + 8 > body_end {
            return Err(short("post-header"));
        }
        let table_id = le(&b[p..p + 6]);
        p += 8; // table id (6 bytes), flags (2)
        if v2 {
            if p + 2 > body_end {
                return Err(short("extra data"));
            }
            let extra = le(&b[p..p + 2]) as usize; // counts its own 2 bytes
            if extra < 2 || p + extra > body_end {
                return Err(short("extra data"));
            }
            p += extra;
        }
        let (ncols, q) = packed_int(&b[..body_end], p).ok_or_else(|| short("column count"))?;
        let ncols = ncols as usize;
        p = q;
        let nb = ncols.div_ceil(8);
        if p + nb > body_end {
            return Err(short("columns-present bitmap"));
        }
        let present = PyBytes::new(py, &b[p..p + nb]);
        p += nb;
        let present2 = if tp == 2 {
            if p + nb > body_end {
                return Err(short("after-image bitmap"));
            }
            let x = PyBytes::new(py, &b[p..p + nb]).into_any();
            p += nb;
            x
        } else {
            py.None().into_bound(py)
        };
        let (a, bb, c, d, e, f) = head;
        return (a, bb, c, d, e, f, tp, table_id, ncols, present, present2, p).into_pyobject(py);
    }
    if etype == MARIADB_GTID_EVENT {
        if 20 + 13 > body_end {
            return Err(short("GTID"));
        }
        let (a, bb, c, d, e, f) = head;
        return (a, bb, c, d, e, f, le(&b[20..28]), le(&b[28..32]), b[32]).into_pyobject(py);
    }
    if etype == XID_EVENT {
        if 20 + 8 > body_end {
            return Err(short("XID"));
        }
        let (a, bb, c, d, e, f) = head;
        return (a, bb, c, d, e, f, le(&b[20..28])).into_pyobject(py);
    }
    head.into_pyobject(py)
}

/// The complete MySQL packets at the start of `buf` (bytes read from a connection), the first
/// with sequence number `seq` -> `(payloads, consumed, next_seq, bad_seq)`: each payload as one
/// bytes object (a payload of 16 MB or more comes in several packets: joined), `consumed` the
/// bytes they took (an incomplete packet at the end stays for the next read), `bad_seq` the
/// sequence number of the first packet out of order (the payloads before it are returned, its
/// payload is not consumed), or -1.
#[pyfunction]
pub(crate) fn split_packets<'py>(py: Python<'py>, buf: &[u8], seq: u8) -> PyResult<(Bound<'py, PyList>, usize, u8, i32)> {
    let out = PyList::empty(py);
    let (used, seq, bad) = split_into(py, buf, seq, &out)?;
    Ok((out, used, seq, bad))
}

/// `split_packets` appending the payloads to `out` -> `(consumed, next_seq, bad_seq)`; shared
/// with the native socket reader (sockread.rs).
pub(crate) fn split_into(py: Python<'_>, buf: &[u8], seq: u8, out: &Bound<'_, PyList>) -> PyResult<(usize, u8, i32)> {
    const MAX: usize = 0xFF_FFFF;
    let (mut pos, mut seq) = (0usize, seq);
    let mut joined: Vec<u8> = Vec::new();
    loop {
        // one logical payload: packets while their length is the maximum
        let (mut p, mut s) = (pos, seq);
        let mut parts: Vec<(usize, usize)> = Vec::new();
        let complete = loop {
            if p + 4 > buf.len() {
                break false;
            }
            let n = le(&buf[p..p + 3]) as usize;
            if buf[p + 3] != s {
                return Ok((pos, seq, buf[p + 3] as i32));
            }
            if p + 4 + n > buf.len() {
                break false;
            }
            parts.push((p + 4, p + 4 + n));
            p += 4 + n;
            s = s.wrapping_add(1);
            if n < MAX {
                break true;
            }
        };
        if !complete {
            return Ok((pos, seq, -1));
        }
        let payload = if parts.len() == 1 {
            PyBytes::new(py, &buf[parts[0].0..parts[0].1])
        } else {
            joined.clear();
            for (a, b) in &parts {
                joined.extend_from_slice(&buf[*a..*b]);
            }
            PyBytes::new(py, &joined)
        };
        out.append(payload)?;
        pos = p;
        seq = s;
    }
}

/// Whether `buf` starts with at least one whole payload (all its packets), or a packet whose
/// sequence number is not `seq` (which `split_into` reports at once): what the socket reader
/// reads until, without the GIL.
pub(crate) fn has_payload(buf: &[u8], seq: u8) -> bool {
    const MAX: usize = 0xFF_FFFF;
    let (mut p, mut s) = (0usize, seq);
    loop {
        if p + 4 > buf.len() {
            return false;
        }
        if buf[p + 3] != s {
            return true;
        }
        let n = le(&buf[p..p + 3]) as usize;
        if p + 4 + n > buf.len() {
            return false;
        }
        p += 4 + n;
        s = s.wrapping_add(1);
        if n < MAX {
            return true;
        }
    }
}

/// The bytes the payload starting `buf` still lacks (0 when it is whole or unknown yet): a big
/// packet is read at once, not a read per socket buffer.
pub(crate) fn missing_bytes(buf: &[u8]) -> usize {
    let mut p = 0usize;
    loop {
        if p + 4 > buf.len() {
            return 0;
        }
        let n = le(&buf[p..p + 3]) as usize;
        if p + 4 + n > buf.len() {
            return p + 4 + n - buf.len();
        }
        p += 4 + n;
        if n < 0xFF_FFFF {
            return 0;
        }
    }
}
