use std::fmt;

use pqcache_sys as sys;

/// Why a call failed: the library's `pq_status` (never `PQ_OK`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// An argument is NULL, out of range or inconsistent with the
    /// configuration. Also used for the argument errors this crate finds
    /// before calling the library (a slice shorter than its shape, a
    /// selection for another head count), whose messages read as the
    /// library's: the C function, the argument, its value, what was expected.
    InvalidArgument,
    /// An allocation failed or the context's host memory limit would be exceeded.
    OutOfMemory,
    /// The call is valid but not now (for example select before prefill).
    BadState,
    /// The sequence, plug-in, device, or (for [`crate::Library::load`]) the
    /// library itself does not exist.
    NotFound,
    /// A valid request this build or backend does not implement.
    Unsupported,
    /// The compute backend (for example the CUDA plug-in) reported an error.
    Backend,
    /// A bug in libpqcache.
    Internal,
    /// An output buffer is too small; the library wrote the size it needs
    /// (added in 0.4, which returned `InvalidArgument` before). Methods that
    /// own their buffers ([`crate::Context::select`]) grow them and retry.
    BufferTooSmall,
    /// Saved sequence state that is not intact: truncated, a checksum or
    /// magic number that does not match, an inconsistent field (added in
    /// 0.5). Nothing was restored.
    Corrupt,
    /// Saved sequence state that is intact but cannot be restored here: a
    /// format version this library does not read, or another geometry than
    /// the context's (added in 0.5). Nothing was restored.
    Incompatible,
    /// A code this crate does not know (a newer library).
    Unknown(i32),
}

impl Status {
    /// The status of a failing `pq_status` code (`None` for `PQ_OK`).
    pub fn from_code(code: i32) -> Option<Status> {
        Some(match code {
            sys::PQ_OK => return None,
            sys::PQ_ERR_INVALID_ARGUMENT => Status::InvalidArgument,
            sys::PQ_ERR_OUT_OF_MEMORY => Status::OutOfMemory,
            sys::PQ_ERR_BAD_STATE => Status::BadState,
            sys::PQ_ERR_NOT_FOUND => Status::NotFound,
            sys::PQ_ERR_UNSUPPORTED => Status::Unsupported,
            sys::PQ_ERR_BACKEND => Status::Backend,
            sys::PQ_ERR_INTERNAL => Status::Internal,
            sys::PQ_ERR_BUFFER_TOO_SMALL => Status::BufferTooSmall,
            sys::PQ_ERR_CORRUPT => Status::Corrupt,
            sys::PQ_ERR_INCOMPATIBLE => Status::Incompatible,
            other => Status::Unknown(other),
        })
    }

    /// The `pq_status` value.
    pub fn code(self) -> i32 {
        match self {
            Status::InvalidArgument => sys::PQ_ERR_INVALID_ARGUMENT,
            Status::OutOfMemory => sys::PQ_ERR_OUT_OF_MEMORY,
            Status::BadState => sys::PQ_ERR_BAD_STATE,
            Status::NotFound => sys::PQ_ERR_NOT_FOUND,
            Status::Unsupported => sys::PQ_ERR_UNSUPPORTED,
            Status::Backend => sys::PQ_ERR_BACKEND,
            Status::Internal => sys::PQ_ERR_INTERNAL,
            Status::BufferTooSmall => sys::PQ_ERR_BUFFER_TOO_SMALL,
            Status::Corrupt => sys::PQ_ERR_CORRUPT,
            Status::Incompatible => sys::PQ_ERR_INCOMPATIBLE,
            Status::Unknown(code) => code,
        }
    }

    /// The C constant's name, e.g. `"PQ_ERR_INVALID_ARGUMENT"`.
    pub fn name(self) -> &'static str {
        match self {
            Status::InvalidArgument => "PQ_ERR_INVALID_ARGUMENT",
            Status::OutOfMemory => "PQ_ERR_OUT_OF_MEMORY",
            Status::BadState => "PQ_ERR_BAD_STATE",
            Status::NotFound => "PQ_ERR_NOT_FOUND",
            Status::Unsupported => "PQ_ERR_UNSUPPORTED",
            Status::Backend => "PQ_ERR_BACKEND",
            Status::Internal => "PQ_ERR_INTERNAL",
            Status::BufferTooSmall => "PQ_ERR_BUFFER_TOO_SMALL",
            Status::Corrupt => "PQ_ERR_CORRUPT",
            Status::Incompatible => "PQ_ERR_INCOMPATIBLE",
            Status::Unknown(_) => "unknown pq_status",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Status::Unknown(code) => write!(f, "unknown pq_status {code}"),
            known => f.write_str(known.name()),
        }
    }
}

/// A failed call: the status and the library's message (`pq_last_error()`,
/// copied at once on the failing thread), which names the argument, the
/// value and what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub status: Status,
    pub message: String,
}

impl Error {
    pub fn new(status: Status, message: impl Into<String>) -> Error {
        Error {
            status,
            message: message.into(),
        }
    }

    /// An argument error found on the Rust side, before calling the C
    /// function `op`: `InvalidArgument` (the status the library gives a bad
    /// argument) and `"<op>: <what>"`, where `what` names the argument, its
    /// value and what was expected, as the library's own messages do
    /// (docs/bindings/errors.md): `"pq_fetch_kv: selection has 3 kv heads;
    /// expected 2 (num_kv_heads)"`.
    pub(crate) fn invalid(op: &str, what: impl fmt::Display) -> Error {
        Error::new(Status::InvalidArgument, format!("{op}: {what}"))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status, self.message)
    }
}

impl std::error::Error for Error {}

/// A library that cannot be loaded is `NotFound` (missing file or function)
/// or `Unsupported` (another ABI major); the message has the loader's text.
impl From<sys::dynamic::LoadError> for Error {
    fn from(e: sys::dynamic::LoadError) -> Error {
        let status = match e.kind {
            sys::dynamic::LoadErrorKind::AbiMismatch => Status::Unsupported,
            _ => Status::NotFound,
        };
        Error::new(status, e.to_string())
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
