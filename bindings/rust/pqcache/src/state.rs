//! Sequence state (added in 0.5): truncate, fork, save and restore.

use std::any::Any;
use std::ffi::{c_int, c_void, CString};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;

use pqcache_sys as sys;

use crate::context::to_i64;
use crate::{Context, Error, Result, Status};

/// How many times [`Context::save`] sizes its buffer again when the
/// sequence grew between `pq_sequence_state_size` and the save (only a call
/// racing with the save, which pqcache.h forbids, makes it grow).
const SAVE_ATTEMPTS: usize = 3;

/// The `path` of the C function `op` as the NUL-terminated bytes the
/// library opens.
fn c_path(op: &str, path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        Error::invalid(
            op,
            format_args!("path is {path:?}; expected a path without NUL bytes"),
        )
    })
}

/// A state size the C function `op` reported, as a length this process can
/// allocate.
fn state_len(op: &str, bytes: u64) -> Result<usize> {
    usize::try_from(bytes).map_err(|_| {
        Error::new(
            Status::OutOfMemory,
            format!("{op}: a saved state of {bytes} bytes does not fit in this address space"),
        )
    })
}

/// What one step of a restore in pieces ([`Context::restore_begin`],
/// [`Context::restore_kv`]) did with the bytes it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use]
pub enum RestoreStep {
    /// The step read this many bytes from the start of the slice; the next
    /// step starts right after them.
    Consumed(usize),
    /// The slice ends before what the step reads (`PQ_ERR_BUFFER_TOO_SMALL`):
    /// nothing was read or added; the step needs this many bytes from the
    /// slice's start (the state's start for `restore_begin`, the next
    /// section's start for `restore_kv`). Call again with at least as many.
    NeedBytes(usize),
}

/// What [`Context::save_to`]'s callback writes to, and what went wrong there.
struct Sink<'a> {
    writer: &'a mut dyn Write,
    error: Option<std::io::Error>,
    panic: Option<Box<dyn Any + Send>>,
}

/// The `pq_write_fn` of [`Context::save_to`]: `user` is a `Sink`. A panic of
/// the writer is caught (it must not unwind into C) and resumed after the
/// library returns.
unsafe extern "C" fn write_to_sink(user: *mut c_void, data: *const c_void, size: usize) -> c_int {
    // SAFETY: save_to passes a live &mut Sink as `user`, used by this call
    // only; the library passes `size` readable bytes at `data`.
    let sink = unsafe { &mut *user.cast::<Sink<'_>>() };
    let bytes = if size == 0 {
        &[][..]
    } else {
        unsafe { std::slice::from_raw_parts(data.cast::<u8>(), size) }
    };
    match panic::catch_unwind(AssertUnwindSafe(|| sink.writer.write_all(bytes))) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            sink.error = Some(e);
            1
        }
        Err(payload) => {
            sink.panic = Some(payload);
            1
        }
    }
}

impl Context {
    /// Keeps the first `tokens` tokens of every layer of the sequence and
    /// drops the rest (`pq_sequence_truncate`), as when rejected speculative
    /// tokens are rolled back: the next decode step is as if the dropped
    /// tokens never came. A layer with `tokens` or fewer tokens is left as
    /// it is; a cut inside a layer's prefill rebuilds its index over the
    /// kept tokens; 0 empties the sequence (the next call on a layer is then
    /// [`Context::prefill`]). Errors: `NotFound`, `InvalidArgument` (more
    /// tokens than the longest layer holds), `OutOfMemory`. No other call on
    /// `seq_id` may run concurrently.
    pub fn truncate(&self, seq_id: u64, tokens: usize) -> Result<()> {
        let tokens = to_i64("pq_sequence_truncate", "tokens", tokens)?;
        self.library()
            .check(unsafe { (self.api().pq_sequence_truncate)(self.ptr(), seq_id, tokens) })
    }

    /// Adds `child_id` holding the same tokens, PQ index and selector state
    /// as `parent_id` (`pq_sequence_fork`), for requests that share a
    /// prompt or parallel samples. Full 256-token chunks are shared
    /// copy-on-write (counted once against the host memory limit); from
    /// then on each sequence grows on its own. Errors: `NotFound` (parent),
    /// `InvalidArgument` (child exists), `OutOfMemory`, `BadState` (a build
    /// of the parent failed).
    pub fn fork(&self, parent_id: u64, child_id: u64) -> Result<()> {
        self.library()
            .check(unsafe { (self.api().pq_sequence_fork)(self.ptr(), parent_id, child_id) })
    }

    /// The bytes [`Context::save`] would return now
    /// (`pq_sequence_state_size`); waits for the sequence's index builds.
    pub fn state_size(&self, seq_id: u64) -> Result<usize> {
        let mut bytes = 0u64;
        self.library().check(unsafe {
            (self.api().pq_sequence_state_size)(self.ptr(), seq_id, &mut bytes)
        })?;
        state_len("pq_sequence_state_size", bytes)
    }

    /// The sequence's state (every layer's K/V, PQ index, window position
    /// and selector state) in the versioned, checksummed format of
    /// docs/state-format.md, for [`Context::restore`] in this or another
    /// context of the same geometry. Sized with
    /// [`Context::state_size`], then `pq_sequence_save_buffer`; sized again
    /// if the library asks for more. Waits for the sequence's index builds.
    /// No call that changes `seq_id` may run concurrently.
    pub fn save(&self, seq_id: u64) -> Result<Vec<u8>> {
        let mut size = self.state_size(seq_id)?;
        let mut attempt = 1;
        loop {
            let mut state = Vec::<u8>::with_capacity(size);
            let mut written = 0u64;
            let status = unsafe {
                (self.api().pq_sequence_save_buffer)(
                    self.ptr(),
                    seq_id,
                    state.as_mut_ptr().cast(),
                    state.capacity() as u64,
                    &mut written,
                )
            };
            if status == sys::PQ_ERR_BUFFER_TOO_SMALL && attempt < SAVE_ATTEMPTS {
                // `written` is the size needed now.
                size = state_len("pq_sequence_save_buffer", written)?;
                attempt += 1;
                continue;
            }
            self.library().check(status)?;
            let written = state_len("pq_sequence_save_buffer", written)?;
            if written > state.capacity() {
                return Err(Error::new(
                    Status::Internal,
                    format!(
                        "pq_sequence_save_buffer reported {written} bytes written into {}",
                        state.capacity()
                    ),
                ));
            }
            // SAFETY: the library initialised the first `written` bytes.
            unsafe { state.set_len(written) };
            return Ok(state);
        }
    }

    /// Streams the sequence's state (the bytes of [`Context::save`]) to
    /// `writer` as the library produces it (`pq_sequence_save`), without
    /// holding it all in memory; flushes `writer` at the end. A write error
    /// fails the save with `Backend`, its message ending with the I/O
    /// error; a panic of the writer is resumed once the library returned.
    pub fn save_to<W: Write>(&self, seq_id: u64, mut writer: W) -> Result<()> {
        let mut sink = Sink {
            writer: &mut writer,
            error: None,
            panic: None,
        };
        let status = unsafe {
            (self.api().pq_sequence_save)(
                self.ptr(),
                seq_id,
                Some(write_to_sink),
                (&mut sink as *mut Sink<'_>).cast(),
            )
        };
        // Read the message before anything else can call the library.
        let result = self.library().check(status);
        if let Some(payload) = sink.panic.take() {
            panic::resume_unwind(payload);
        }
        match (result, sink.error.take()) {
            (Err(mut e), Some(io)) => {
                e.message = format!("{}: {io}", e.message);
                Err(e)
            }
            (Err(e), None) => Err(e),
            (Ok(()), _) => writer.flush().map_err(|io| {
                Error::new(
                    Status::Backend,
                    format!("pq_sequence_save: flushing the writer after the saved state: {io}"),
                )
            }),
        }
    }

    /// Saves the sequence's state into the file at `path`, atomically
    /// (`pq_sequence_save_file`: a temporary file beside it, fsync, rename;
    /// on failure `path` is left as it was). A file system error is
    /// `Backend`, with the path and the OS's text.
    pub fn save_file(&self, seq_id: u64, path: impl AsRef<Path>) -> Result<()> {
        let path = c_path("pq_sequence_save_file", path.as_ref())?;
        self.library()
            .check(unsafe { (self.api().pq_sequence_save_file)(self.ptr(), seq_id, path.as_ptr()) })
    }

    /// Adds `seq_id` from a state [`Context::save`] produced, in this or
    /// another context of the same geometry (`pq_sequence_restore`). Every
    /// section is checked first: the whole sequence is added or nothing.
    /// Its selections and fetched rows equal the saved sequence's. Errors:
    /// `InvalidArgument` (`seq_id` exists), `Corrupt` (truncated or damaged
    /// bytes), `Incompatible` (another format version or geometry),
    /// `OutOfMemory`.
    pub fn restore(&self, seq_id: u64, state: &[u8]) -> Result<()> {
        self.library().check(unsafe {
            (self.api().pq_sequence_restore)(
                self.ptr(),
                seq_id,
                state.as_ptr().cast(),
                state.len() as u64,
            )
        })
    }

    /// Begins a restore in pieces, for a state that arrives in parts (a
    /// shared tier, a network): reads the state's description from the
    /// start of `state` (header, every layer's PQ index and selector state,
    /// about 1% of the bytes, saved before any K/V; `state` may hold more)
    /// and adds `seq_id` (`pq_sequence_restore_begin`). The whole sequence's
    /// memory is reserved now. Its PQ selections work at once and equal the
    /// saved sequence's; every call that needs K/V (fetch, attend, append,
    /// prefill, truncate, fork, save) and a select with another selector is
    /// `BadState` until [`Context::restore_kv`] has brought that layer's.
    /// Returns [`RestoreStep::Consumed`] with the bytes read (the next
    /// `restore_kv` starts there), or [`RestoreStep::NeedBytes`] with the
    /// bytes needed from the state's start if `state` is shorter than the
    /// description (nothing is added). Errors: as [`Context::restore`].
    pub fn restore_begin(&self, seq_id: u64, state: &[u8]) -> Result<RestoreStep> {
        self.restore_step(
            "pq_sequence_restore_begin",
            state,
            |data, size, out| unsafe {
                (self.api().pq_sequence_restore_begin)(self.ptr(), seq_id, data, size, out)
            },
        )
    }

    /// Reads exactly one next section of a restore begun with
    /// [`Context::restore_begin`] (`pq_sequence_restore_kv`): `bytes` starts
    /// at the first byte not yet read (the sum of the bytes consumed so far)
    /// and may hold more. The sections are each layer's K/V in layer order,
    /// then the end section; after the end section the sequence is complete
    /// and further calls are `BadState`. Returns [`RestoreStep::Consumed`]
    /// with the section's size, or [`RestoreStep::NeedBytes`] with it when
    /// `bytes` is shorter. A section that fails its checksum or comes out of
    /// order is `Corrupt` and changes nothing (the right bytes may be given
    /// again); K/V that do not fit the layer or hold a NaN or Inf are
    /// `Corrupt` and end the restore (the sequence must be removed).
    /// Calls for one `seq_id` must not overlap; selections on it may run
    /// meanwhile.
    pub fn restore_kv(&self, seq_id: u64, bytes: &[u8]) -> Result<RestoreStep> {
        self.restore_step("pq_sequence_restore_kv", bytes, |data, size, out| unsafe {
            (self.api().pq_sequence_restore_kv)(self.ptr(), seq_id, data, size, out)
        })
    }

    /// One `pq_sequence_restore_begin` or `_kv` call (`op`) over `bytes`:
    /// `PQ_ERR_BUFFER_TOO_SMALL` becomes [`RestoreStep::NeedBytes`].
    fn restore_step(
        &self,
        op: &str,
        bytes: &[u8],
        call: impl FnOnce(*const c_void, u64, *mut u64) -> sys::pq_status,
    ) -> Result<RestoreStep> {
        // An empty slice still passes a non-NULL pointer (a dangling, aligned
        // one): the library then sees a short state, not a NULL argument.
        let mut consumed = 0u64;
        let status = call(bytes.as_ptr().cast(), bytes.len() as u64, &mut consumed);
        if status == sys::PQ_ERR_BUFFER_TOO_SMALL {
            return Ok(RestoreStep::NeedBytes(state_len(op, consumed)?));
        }
        self.library().check(status)?;
        let consumed = state_len(op, consumed)?;
        if consumed > bytes.len() {
            return Err(Error::new(
                Status::Internal,
                format!("{op} reported {consumed} bytes read of {}", bytes.len()),
            ));
        }
        Ok(RestoreStep::Consumed(consumed))
    }

    /// [`Context::restore`] from the file at `path`
    /// (`pq_sequence_restore_file`); a missing file is `NotFound`, a read
    /// error `Backend`.
    pub fn restore_file(&self, seq_id: u64, path: impl AsRef<Path>) -> Result<()> {
        let path = c_path("pq_sequence_restore_file", path.as_ref())?;
        self.library().check(unsafe {
            (self.api().pq_sequence_restore_file)(self.ptr(), seq_id, path.as_ptr())
        })
    }
}
