//! SQL literals for the MySQL sink's merged statements (drainer/sql.py): `sql_values(rows, cols,
//! literal, parens=True)` renders a list of row tuples as `(v,v),(v,v)` (without parens: `v,v,v,v`),
//! the values `cols` names (every value when None); `sql_list(values, literal)` a list of values
//! as `v,v` (an `IN (...)` list).
//!
//! Only the common values are written here, exactly as drainer/sql.py's `literal` writes them:
//! `None` -> NULL, an `int` (exact type, fits 64 bits) -> its digits, a `str` (exact type) ->
//! quoted with pymysql's `escape_string` (NUL, `\`, LF, CR, ^Z, `"` and `'` backslash-escaped),
//! `bytes` -> `_binary X'<hex>'` (pymysql's `escape_bytes`). Everything else — floats, Decimals,
//! bools, dates, times, larger ints, subclasses — goes to the Python `literal` given, so there is
//! one rule for each of those (and its TypeError for a value SQL cannot hold). A `str` Python
//! cannot encode as UTF-8 (a lone surrogate) is taken with "surrogatepass" and the text decoded
//! back the same way: the result is always the very string Python would have built.

use std::io::Write;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyInt, PyList, PyString, PyTuple};

const HEX: &[u8; 16] = b"0123456789abcdef";

fn escape_into(s: &[u8], out: &mut Vec<u8>) {
    out.reserve(s.len() + 2);
    out.push(b'\'');
    // Runs of bytes that need no escape are copied whole (most text has none to escape).
    let mut run = 0;
    for (i, &c) in s.iter().enumerate() {
        let esc: &[u8] = match c {
            0 => b"\\0",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            0x1a => b"\\Z",
            b'"' => b"\\\"",
            b'\'' => b"\\'",
            _ => continue,
        };
        out.extend_from_slice(&s[run..i]);
        out.extend_from_slice(esc);
        run = i + 1;
    }
    out.extend_from_slice(&s[run..]);
    out.push(b'\'');
}

fn literal_into(v: &Bound<'_, PyAny>, literal: &Bound<'_, PyAny>, out: &mut Vec<u8>) -> PyResult<()> {
    if v.is_none() {
        out.extend_from_slice(b"NULL");
        return Ok(());
    }
    if v.is_exact_instance_of::<PyInt>() {
        if let Ok(i) = v.extract::<i64>() {
            let _ = write!(out, "{i}");
            return Ok(());
        }
        if let Ok(u) = v.extract::<u64>() {
            let _ = write!(out, "{u}");
            return Ok(());
        }
    } else if v.is_exact_instance_of::<PyString>() {
        let s = v.cast::<PyString>()?;
        match s.to_str() {
            Ok(t) => escape_into(t.as_bytes(), out),
            Err(_) => {
                let b = s.call_method1("encode", ("utf-8", "surrogatepass"))?;
                escape_into(b.cast::<PyBytes>()?.as_bytes(), out);
            }
        }
        return Ok(());
    } else if v.is_exact_instance_of::<PyBytes>() {
        let b = v.cast::<PyBytes>()?.as_bytes();
        out.reserve(11 + 2 * b.len());
        out.extend_from_slice(b"_binary X'");
        for &c in b {
            out.push(HEX[(c >> 4) as usize]);
            out.push(HEX[(c & 15) as usize]);
        }
        out.push(b'\'');
        return Ok(());
    }
    let text = literal.call1((v,))?;
    crate::causality::put_str(text.cast::<PyString>()?, out)
}

/// `(a,b),(c,d)` (parens) or `a,c` — the literals of `cols` of every row tuple, in order.
#[pyfunction]
#[pyo3(signature = (rows, cols, literal, parens=true))]
pub fn sql_values<'py>(
    py: Python<'py>,
    rows: &Bound<'py, PyList>,
    cols: Option<Vec<usize>>,
    literal: &Bound<'py, PyAny>,
    parens: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let mut out: Vec<u8> = Vec::with_capacity(64 * rows.len());
    for (r, row) in rows.iter().enumerate() {
        if r > 0 {
            out.push(b',');
        }
        let row = row.cast::<PyTuple>()?;
        if parens {
            out.push(b'(');
        }
        match &cols {
            Some(cols) => {
                for (j, &c) in cols.iter().enumerate() {
                    if j > 0 {
                        out.push(b',');
                    }
                    literal_into(&row.get_item(c)?, literal, &mut out)?;
                }
            }
            None => {
                for (j, v) in row.iter().enumerate() {
                    if j > 0 {
                        out.push(b',');
                    }
                    literal_into(&v, literal, &mut out)?;
                }
            }
        }
        if parens {
            out.push(b')');
        }
    }
    finish(py, out)
}

/// `a,b,c` — the literals of a list of values (an `IN (...)` list).
#[pyfunction]
pub fn sql_list<'py>(
    py: Python<'py>,
    values: &Bound<'py, PyList>,
    literal: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let mut out: Vec<u8> = Vec::with_capacity(12 * values.len());
    for (j, v) in values.iter().enumerate() {
        if j > 0 {
            out.push(b',');
        }
        literal_into(&v, literal, &mut out)?;
    }
    finish(py, out)
}

fn finish(py: Python<'_>, out: Vec<u8>) -> PyResult<Bound<'_, PyAny>> {
    match std::str::from_utf8(&out) {
        Ok(s) => Ok(PyString::new(py, s).into_any()),
        Err(_) => PyBytes::new(py, &out).call_method1("decode", ("utf-8", "surrogatepass")),
    }
}
