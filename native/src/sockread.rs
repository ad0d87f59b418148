//! The capture's binlog dump connection read natively (capture/binlog_stream.py `_refill`): the
//! wait for the socket and its reads run with the GIL released until at least one whole payload
//! is buffered, then the payloads are split (`events::split_into`) and handed back as one list.
//!
//! Why: live, the reader thread took and gave back the GIL twice per socket read (Python's
//! `select` and `recv` each release it), and a read that held part of a packet or of a
//! transaction cost one more round. Here a batch costs one hand-over however many reads it took.
//! When the last read was small (the socket was drained: events trickle), the reader gathers:
//! it sleeps `linger_ms`, then takes whatever came in one read, and again while each sleep brought
//! bytes (at most `linger_max_ms` in all, or until `chunk` bytes are buffered). A trickle is so
//! handed over in fewer, larger batches, and read in one wakeup per `linger_ms` rather than one
//! per packet the source sends (a wait on the socket returns for each: on a live source about one
//! per transaction, and a wakeup is what the reader's CPU goes to there). A read of `small` bytes
//! or more ends the gathering at once, so a source that keeps sending (catch-up) is read as fast
//! as it sends: the cap of the 4 ms sleep of the Python reader tried before (docs/benchmarks.md,
//! "Capture live: where the CPU goes") came from its 16 KiB buffered reads, which this read
//! (up to `chunk`) does not have.

use std::io;
use std::os::raw::{c_int, c_short, c_ulong, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::events::{has_payload, missing_bytes, split_into};

#[repr(C)]
struct PollFd {
    fd: c_int,
    events: c_short,
    revents: c_short,
}

const POLLIN: c_short = 0x001;

extern "C" {
    fn poll(fds: *mut PollFd, nfds: c_ulong, timeout: c_int) -> c_int;
    fn recv(fd: c_int, buf: *mut c_void, len: usize, flags: c_int) -> isize;
}

/// recv's flag: do not block, whatever the socket's mode (Python's socket without a timeout is
/// blocking).
const MSG_DONTWAIT: c_int = 0x40;

/// Waits until `fd` is readable (or hung up / in error: the next recv says which) -> false when
/// `timeout` passed first (None: no limit). Interrupted waits resume with the time left (PEP 475).
fn wait_readable(fd: c_int, timeout: Option<Duration>) -> io::Result<bool> {
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let ms: c_int = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                // round up: a 0.4 ms timeout must still wait, not poll once
                left.as_micros().div_ceil(1000).min(c_int::MAX as u128) as c_int
            }
        };
        let mut p = PollFd { fd, events: POLLIN, revents: 0 };
        // SAFETY: one valid pollfd for the duration of the call.
        let r = unsafe { poll(&mut p, 1, ms) };
        if r > 0 {
            return Ok(true);
        }
        if r == 0 {
            return Ok(false);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Why a read gave no payload: the peer closed the connection, or an error (its text).
enum Failure {
    Closed,
    Error(String),
}

/// One recv of up to `want` bytes appended to `buf` -> the bytes read; Ok(None) when the socket
/// had nothing after all (a non-blocking socket: Python's timeout mode, or `MSG_DONTWAIT` in
/// `flags`) or the call was interrupted.
fn recv_into(fd: c_int, buf: &mut Vec<u8>, want: usize, flags: c_int) -> Result<Option<usize>, Failure> {
    buf.reserve(want);
    let spare = buf.spare_capacity_mut();
    // SAFETY: recv writes at most `want` (<= spare.len()) bytes into the spare capacity, and
    // only the bytes it reports written are then counted as initialized.
    let n = unsafe { recv(fd, spare.as_mut_ptr() as *mut c_void, want, flags) };
    if n > 0 {
        unsafe { buf.set_len(buf.len() + n as usize) };
        return Ok(Some(n as usize));
    }
    if n == 0 {
        return Err(Failure::Closed);
    }
    let e = io::Error::last_os_error();
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
        _ => Err(Failure::Error(e.to_string())),
    }
}

/// The dump connection's reader: `fd` is the connection's socket (Python keeps owning it and
/// closes it); `seq` the sequence number of the next packet. Frozen, its state behind a lock
/// held through a read: `reads` stays readable from other threads (the capture's metrics) while
/// the reader thread waits without the GIL.
#[pyclass(module = "sluice_native", frozen)]
pub(crate) struct PacketReader {
    fd: c_int,
    state: Mutex<State>,
    reads: AtomicU64,
}

struct State {
    buf: Vec<u8>,            // bytes read and not yet handed back (an incomplete payload)
    seq: u8,
    failed: Option<Failure>, // a failure while lingering, after whole payloads: the next read's
}

impl State {
    /// Reads (no GIL) until a whole payload is buffered, then gathers as the module says.
    fn fill(&mut self, fd: c_int, reads: &AtomicU64, timeout: Option<Duration>, chunk: usize,
            small: usize, linger: Duration, linger_max: Duration) -> Result<(), Failure> {
        let mut last = 0usize;
        while !has_payload(&self.buf, self.seq) {
            if !wait_readable(fd, timeout).map_err(|e| Failure::Error(e.to_string()))? {
                return Err(Failure::Error("timed out".into()));
            }
            let want = chunk.max(missing_bytes(&self.buf));
            if let Some(n) = recv_into(fd, &mut self.buf, want, 0)? {
                reads.fetch_add(1, Ordering::Relaxed);
                last = n;
            }
        }
        if linger.is_zero() || last >= small {
            return Ok(());
        }
        let end = Instant::now() + linger_max;
        while self.buf.len() < chunk {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            std::thread::sleep(left.min(linger));
            match recv_into(fd, &mut self.buf, chunk, MSG_DONTWAIT) {
                Ok(Some(n)) => {
                    reads.fetch_add(1, Ordering::Relaxed);
                    if n >= small {
                        break; // the source is sending faster than a trickle: hand it over
                    }
                }
                Ok(None) => break, // nothing came while we slept: the trickle paused
                Err(f) => {
                    self.failed = Some(f);
                    break;
                }
            }
        }
        Ok(())
    }
}

#[pymethods]
impl PacketReader {
    #[new]
    fn new(fd: c_int, seq: u8) -> Self {
        PacketReader { fd, state: Mutex::new(State { buf: Vec::new(), seq, failed: None }),
                       reads: AtomicU64::new(0) }
    }

    /// Socket reads so far (sluice_capture_source_reads_total).
    #[getter]
    fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// Bytes already read from the connection by someone else (its buffered reader), first.
    fn feed(&self, data: &[u8]) -> PyResult<()> {
        self.state()?.buf.extend_from_slice(data);
        Ok(())
    }

    /// The next payloads -> `(payloads, next_seq, bad_seq, error)`, as `split_packets` says for
    /// the first three; with the GIL released while it waits and reads. `error` (payloads then
    /// empty): None, "" when the peer closed the connection, or the error's text ("timed out"
    /// when `timeout` seconds passed without a byte; None: no limit). A failure met while
    /// lingering after whole payloads is returned by the next call, after them.
    #[pyo3(signature = (timeout, chunk, small, linger_ms, linger_max_ms))]
    fn read<'py>(&self, py: Python<'py>, timeout: Option<f64>, chunk: usize, small: usize,
                 linger_ms: f64, linger_max_ms: f64)
                 -> PyResult<(Bound<'py, PyList>, u8, i32, Option<String>)> {
        let mut st = self.state()?;
        let out = PyList::empty(py);
        if !has_payload(&st.buf, st.seq) {
            let failed = match st.failed.take() {
                Some(f) => Err(f),
                None => {
                    let timeout = timeout.map(|t| Duration::from_secs_f64(t.max(0.0)));
                    let linger = Duration::from_secs_f64(linger_ms.max(0.0) / 1000.0);
                    let linger_max = Duration::from_secs_f64(linger_max_ms.max(0.0) / 1000.0);
                    let (fd, reads) = (self.fd, &self.reads);
                    let st = &mut *st;
                    py.detach(|| st.fill(fd, reads, timeout, chunk.max(1), small, linger, linger_max))
                }
            };
            if let Err(f) = failed {
                let text = match f {
                    Failure::Closed => String::new(),
                    Failure::Error(t) => t,
                };
                return Ok((out, st.seq, -1, Some(text)));
            }
        }
        let (used, seq, bad) = split_into(py, &st.buf, st.seq, &out)?;
        st.buf.drain(..used);
        st.seq = seq;
        Ok((out, seq, bad, None))
    }
}

impl PacketReader {
    /// The state, for the one thread that reads (a second one at once is a caller's bug: refused
    /// rather than waited for, which could deadlock on the GIL).
    fn state(&self) -> PyResult<MutexGuard<'_, State>> {
        self.state.try_lock().map_err(|_| {
            PyRuntimeError::new_err("sluice_native.PacketReader used by two threads at once")
        })
    }
}
