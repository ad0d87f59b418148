//! Sluice's native per-row work, one module per concept (docs/architecture.md lists them);
//! this file holds the module list, the crate-wide `DecodeError` and the Python registration.

mod prewrite;
mod wire;
mod txnjoin;
mod causality;
mod sqltext;
mod txnscan;
mod sparkrows;
mod endian;
mod rowdecoder;
mod events;
mod sockread;
mod pumpwrite;

use pyo3::create_exception;
use pyo3::exceptions::{PyValueError};
use pyo3::prelude::*;

use events::{parse_event, split_packets};
use rowdecoder::RowDecoder;

create_exception!(sluice_native, DecodeError, PyValueError, "A row image that does not match its column specs.");

#[pymodule]
fn sluice_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RowDecoder>()?;
    m.add_function(wrap_pyfunction!(parse_event, m)?)?;
    m.add_function(wrap_pyfunction!(split_packets, m)?)?;
    m.add_class::<sockread::PacketReader>()?; // the capture's dump connection (sockread.rs)
    // the capture's pump transactions and PREWRITE binlogs (pumpwrite.rs)
    m.add_function(wrap_pyfunction!(pumpwrite::prewrite_values, m)?)?;
    m.add_function(wrap_pyfunction!(pumpwrite::pump_items, m)?)?;
    m.add_function(wrap_pyfunction!(pumpwrite::prewrite_binlogs, m)?)?;
    m.add("DecodeError", m.py().get_type::<DecodeError>())?;
    // the drainer's side (prewrite.rs): Prewrite payloads -> the MySQL sink's SQL parameters
    m.add_class::<prewrite::MutationDecoder>()?;
    m.add_function(wrap_pyfunction!(prewrite::prewrite_mutations, m)?)?;
    m.add("ColumnCountError", m.py().get_type::<prewrite::ColumnCountError>())?;
    m.add("DecimalTextError", m.py().get_type::<prewrite::DecimalTextError>())?;
    // transaction envelopes (txnjoin.rs) and causality keys (causality.rs)
    m.add_function(wrap_pyfunction!(txnjoin::unframe, m)?)?;
    m.add_function(wrap_pyfunction!(txnjoin::join_framed, m)?)?;
    m.add_function(wrap_pyfunction!(txnjoin::join_binlogs, m)?)?;
    m.add_function(wrap_pyfunction!(txnjoin::commit_position, m)?)?;
    m.add("TxnError", m.py().get_type::<txnjoin::TxnError>())?;
    m.add_class::<causality::KeyBuilder>()?;
    m.add_class::<txnscan::TxnScanner>()?; // the capture's per-event loop (txnscan.rs)
    m.add_function(wrap_pyfunction!(sqltext::sql_values, m)?)?; // the MySQL sink's literals
    m.add_function(wrap_pyfunction!(sqltext::sql_list, m)?)?;
    m.add_class::<sparkrows::SparkRows>()?; // the Spark sink's row tuples and _pos (sparkrows.rs)
    m.add_function(wrap_pyfunction!(sparkrows::position_text, m)?)?;
    Ok(())
}
