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

/// A path as the NUL-terminated bytes the library opens.
fn c_path(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| Error::invalid(format!("path {:?} contains a NUL byte", path)))
}

/// A state size the library reported, as a length this process can allocate.
fn state_len(bytes: u64) -> Result<usize> {
    usize::try_from(bytes).map_err(|_| {
        Error::new(
            Status::OutOfMemory,
            format!("a saved state of {bytes} bytes does not fit in this address space"),
        )
    })
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
        let tokens = to_i64(tokens, "tokens")?;
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
        state_len(bytes)
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
                size = state_len(written)?;
                attempt += 1;
                continue;
            }
            self.library().check(status)?;
            let written = state_len(written)?;
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
                Error::new(Status::Backend, format!("flushing the saved state: {io}"))
            }),
        }
    }

    /// Saves the sequence's state into the file at `path`, atomically
    /// (`pq_sequence_save_file`: a temporary file beside it, fsync, rename;
    /// on failure `path` is left as it was). A file system error is
    /// `Backend`, with the path and the OS's text.
    pub fn save_file(&self, seq_id: u64, path: impl AsRef<Path>) -> Result<()> {
        let path = c_path(path.as_ref())?;
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

    /// [`Context::restore`] from the file at `path`
    /// (`pq_sequence_restore_file`); a missing file is `NotFound`, a read
    /// error `Backend`.
    pub fn restore_file(&self, seq_id: u64, path: impl AsRef<Path>) -> Result<()> {
        let path = c_path(path.as_ref())?;
        self.library().check(unsafe {
            (self.api().pq_sequence_restore_file)(self.ptr(), seq_id, path.as_ptr())
        })
    }
}
