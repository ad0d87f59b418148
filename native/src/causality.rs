//! The MySQL sink's causality keys (drainer/translator.py's rule; drainer/causality.py routes on
//! them): one `KeyBuilder` per ApplyShape, `keys` / `insert_keys` / `update_keys` per row change.
//!
//! Only the common values are folded here, exactly as the Python `fold` does: an `int` (exact
//! type, fits 64 bits) -> "i<digits>", an ASCII `str` -> "s" + trailing spaces cut + ASCII
//! lower case (for ASCII text `str.lower` is exactly that), `bytes` -> "b<hex>". Everything else
//! — non-ASCII text above all, whose Unicode case folding (`str.casefold`, NFKD, combining marks
//! dropped) must stay exactly Python's, bool, Decimal, float, dates, None as a key part — goes to
//! the Python `fold` given at construction, so there is one folding rule, not two copies of the
//! Unicode tables. The former Python `row_keys` is the differential oracle in
//! tests/support/pykeys.py.
//!
//! Keys are built as UTF-8 bytes; a piece Python cannot encode as UTF-8 (a lone surrogate) is
//! taken with "surrogatepass" (invalid UTF-8, so the key is decoded back the same way): a key is
//! always the very string Python would have built.

use std::io::Write;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyInt, PyString, PyTuple};

const HEX: &[u8; 16] = b"0123456789abcdef";

#[pyclass(frozen)]
pub struct KeyBuilder {
    /// (key prefix "schema.table\0index\0", visible column positions, primary)
    specs: Vec<(Vec<u8>, Vec<usize>, bool)>,
    has_identity: bool,
    /// "schema.table": the table key and the full-image key of a table without identity
    table: Vec<u8>,
    fold: Py<PyAny>,
}

type Key = Vec<u8>;

/// A str's UTF-8 bytes; a lone surrogate (which Python text may hold) kept as `surrogatepass`
/// writes it, so no value is refused (sqltext.rs shares it).
pub(crate) fn put_str(s: &Bound<'_, PyString>, out: &mut Vec<u8>) -> PyResult<()> {
    match s.to_str() {
        Ok(t) => out.extend_from_slice(t.as_bytes()),
        Err(_) => {
            let b = s.call_method1("encode", ("utf-8", "surrogatepass"))?;
            out.extend_from_slice(b.cast::<PyBytes>()?.as_bytes());
        }
    }
    Ok(())
}

fn utf8_of(s: &Bound<'_, PyString>) -> PyResult<Vec<u8>> {
    let mut out = Vec::new();
    put_str(s, &mut out)?;
    Ok(out)
}

impl KeyBuilder {
    fn fold_into(&self, v: &Bound<'_, PyAny>, out: &mut Vec<u8>) -> PyResult<()> {
        if v.is_exact_instance_of::<PyInt>() {
            if let Ok(i) = v.extract::<i64>() {
                out.push(b'i');
                let _ = write!(out, "{i}");
                return Ok(());
            }
            if let Ok(u) = v.extract::<u64>() {
                out.push(b'i');
                let _ = write!(out, "{u}");
                return Ok(());
            }
        } else if v.is_exact_instance_of::<PyString>() {
            if let Ok(t) = v.cast::<PyString>()?.to_str() {
                if t.is_ascii() {
                    out.push(b's');
                    out.extend(t.trim_end_matches(' ').bytes().map(|c| c.to_ascii_lowercase()));
                    return Ok(());
                }
            }
        } else if v.is_exact_instance_of::<PyBytes>() {
            let b = v.cast::<PyBytes>()?.as_bytes();
            out.reserve(1 + 2 * b.len());
            out.push(b'b');
            for &c in b {
                out.push(HEX[(c >> 4) as usize]);
                out.push(HEX[(c & 15) as usize]);
            }
            return Ok(());
        }
        let folded = self.fold.bind(v.py()).call1((v,))?;
        put_str(folded.cast::<PyString>()?, out)
    }

    fn row_keys(&self, values: &Bound<'_, PyTuple>, out: &mut Vec<Key>) -> PyResult<()> {
        if self.has_identity {
            'spec: for (prefix, cols, primary) in &self.specs {
                if !primary {
                    for &c in cols {
                        if values.get_item(c)?.is_none() {
                            continue 'spec;
                        }
                    }
                }
                let mut k = prefix.clone();
                for (j, &c) in cols.iter().enumerate() {
                    if j > 0 {
                        k.push(0);
                    }
                    self.fold_into(&values.get_item(c)?, &mut k)?;
                }
                out.push(k);
            }
            return Ok(());
        }
        // No row identity: the table key first (routing hashes the first key), then the image.
        let mut t = self.table.clone();
        t.extend_from_slice(b"\x00**");
        let mut k = self.table.clone();
        k.extend_from_slice(b"\x00*\x00");
        for (j, v) in values.iter().enumerate() {
            if j > 0 {
                k.push(0);
            }
            if v.is_none() {
                k.push(b'N');
            } else {
                self.fold_into(&v, &mut k)?;
            }
        }
        out.push(t);
        out.push(k);
        Ok(())
    }
}

fn to_tuple<'py>(py: Python<'py>, keys: &[Key]) -> PyResult<Bound<'py, PyTuple>> {
    let mut items: Vec<Bound<'py, PyAny>> = Vec::with_capacity(keys.len());
    for k in keys {
        match std::str::from_utf8(k) {
            Ok(s) => items.push(PyString::new(py, s).into_any()),
            Err(_) => items.push(PyBytes::new(py, k).call_method1("decode", ("utf-8", "surrogatepass"))?),
        }
    }
    PyTuple::new(py, items)
}

fn push_new(out: &mut Vec<Key>, k: Key) {
    if !out.contains(&k) {
        out.push(k);
    }
}

#[pymethods]
impl KeyBuilder {
    /// specs: (key prefix, column positions, primary) per unique index (ApplyShape.key_specs);
    /// fold: the Python fold for the values folded there.
    #[new]
    fn new(specs: Vec<(Bound<'_, PyString>, Vec<usize>, bool)>, has_identity: bool,
           qualified: Bound<'_, PyString>, fold: Py<PyAny>) -> PyResult<Self> {
        let mut out = Vec::with_capacity(specs.len());
        for (prefix, cols, primary) in specs {
            out.push((utf8_of(&prefix)?, cols, primary));
        }
        Ok(KeyBuilder { specs: out, has_identity, table: utf8_of(&qualified)?, fold })
    }

    /// The keys of one row image, in index order (a DELETE's).
    fn keys<'py>(&self, py: Python<'py>, values: &Bound<'py, PyTuple>) -> PyResult<Bound<'py, PyTuple>> {
        self.keys_of(py, values)
    }

    /// The keys of an inserted (or snapshot-read) image, each once.
    fn insert_keys<'py>(&self, py: Python<'py>, values: &Bound<'py, PyTuple>) -> PyResult<Bound<'py, PyTuple>> {
        self.insert_keys_of(py, values)
    }

    /// An update's keys: the before image's, then those of the after image not among them.
    fn update_keys<'py>(&self, py: Python<'py>, before: &Bound<'py, PyTuple>,
                        after: &Bound<'py, PyTuple>) -> PyResult<Bound<'py, PyTuple>> {
        self.update_keys_of(py, before, after)
    }
}

// The same three for the drainer's row changes built natively (prewrite.rs `changes`).
impl KeyBuilder {
    pub(crate) fn keys_of<'py>(&self, py: Python<'py>, values: &Bound<'py, PyTuple>) -> PyResult<Bound<'py, PyTuple>> {
        let mut out = Vec::with_capacity(self.specs.len().max(2));
        self.row_keys(values, &mut out)?;
        to_tuple(py, &out)
    }

    pub(crate) fn insert_keys_of<'py>(&self, py: Python<'py>, values: &Bound<'py, PyTuple>) -> PyResult<Bound<'py, PyTuple>> {
        let mut all = Vec::with_capacity(self.specs.len().max(2));
        self.row_keys(values, &mut all)?;
        let mut out = Vec::with_capacity(all.len());
        for k in all {
            push_new(&mut out, k);
        }
        to_tuple(py, &out)
    }

    pub(crate) fn update_keys_of<'py>(&self, py: Python<'py>, before: &Bound<'py, PyTuple>,
                                      after: &Bound<'py, PyTuple>) -> PyResult<Bound<'py, PyTuple>> {
        let mut out = Vec::with_capacity(2 * self.specs.len().max(2));
        self.row_keys(before, &mut out)?;
        let mut more = Vec::with_capacity(self.specs.len().max(2));
        self.row_keys(after, &mut more)?;
        for k in more {
            push_new(&mut out, k);
        }
        to_tuple(py, &out)
    }
}
