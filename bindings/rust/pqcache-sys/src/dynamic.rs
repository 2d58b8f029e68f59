//! Loading libpqcache at run time with `dlopen`, for programs that must start
//! without it (an inference server with an optional PQCache path) and say
//! why when it is missing. Works with or without the `link` feature.
//!
//! ```no_run
//! let lib = pqcache_sys::dynamic::Library::open("libpqcache.so.0")?;
//! let version = unsafe { (lib.api().pq_version_number)() };
//! # Ok::<(), pqcache_sys::dynamic::LoadError>(())
//! ```

use std::ffi::{c_char, c_int, c_void, CStr, CString, OsStr};
use std::fmt;
use std::os::unix::ffi::OsStrExt;

use crate::{Api, PQ_VERSION_MAJOR};

// glibc 2.34+ has these in libc.so.6 itself, so no -ldl is needed.
extern "C" {
    fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn dlclose(handle: *mut c_void) -> c_int;
    fn dlerror() -> *mut c_char;
}
const RTLD_NOW: c_int = 2; // resolve everything now: a broken library fails here, not mid-run
const RTLD_LOCAL: c_int = 0;

/// Why the library could not be loaded: the file (or one of its
/// dependencies) is missing, a symbol is missing, or its ABI major differs.
/// `message` is the dynamic loader's own text (`dlerror()`) where it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    /// The path or soname that was given to `open`.
    pub library: String,
    pub kind: LoadErrorKind,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadErrorKind {
    /// dlopen failed: no such file, not a shared object, or a dependency is missing.
    Open,
    /// The library lacks this function (not libpqcache, or too old).
    MissingSymbol(String),
    /// The library's ABI major (its soname number) is not the one declared here.
    AbiMismatch,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            LoadErrorKind::Open => {
                write!(
                    f,
                    "cannot load libpqcache from '{}': {}",
                    self.library, self.message
                )
            }
            LoadErrorKind::MissingSymbol(symbol) => write!(
                f,
                "'{}' is not a usable libpqcache: no function {symbol}: {}",
                self.library, self.message
            ),
            LoadErrorKind::AbiMismatch => {
                write!(
                    f,
                    "'{}' is not a usable libpqcache: {}",
                    self.library, self.message
                )
            }
        }
    }
}

impl std::error::Error for LoadError {}

/// A loaded libpqcache: the `dlopen` handle and the [`Api`] filled by `dlsym`.
/// `dlclose` runs on drop, so the function pointers of [`Library::api`] must
/// not be used after the `Library` is gone (the safe crate keeps it in an
/// `Arc` next to every context).
pub struct Library {
    handle: *mut c_void,
    api: Api,
}

// SAFETY: a dlopen handle may be used and closed from any thread (the loader
// locks internally), and every function of the C API may be called from any
// thread (pqcache.h's threading contract); the handle is never mutated.
unsafe impl Send for Library {}
unsafe impl Sync for Library {}

impl Library {
    /// Loads `path` (a file path, or a soname such as `libpqcache.so.0` that
    /// the dynamic loader searches for) and looks up every function.
    pub fn open(path: impl AsRef<OsStr>) -> Result<Library, LoadError> {
        let path = path.as_ref();
        let library = path.to_string_lossy().into_owned();
        let error = |kind, message: String| LoadError {
            library: library.clone(),
            kind,
            message,
        };
        let c_path = CString::new(path.as_bytes()).map_err(|_| {
            error(
                LoadErrorKind::Open,
                "the path contains a NUL byte".to_owned(),
            )
        })?;

        // SAFETY: c_path is a valid C string; dlerror's text is copied at once.
        let handle = unsafe { dlopen(c_path.as_ptr(), RTLD_NOW | RTLD_LOCAL) };
        if handle.is_null() {
            return Err(error(LoadErrorKind::Open, last_dl_error()));
        }
        // SAFETY: every name is looked up in a library that exports it with
        // the C signature declared in lib.rs (checked by tests/header.rs).
        let api = unsafe {
            Api::load_with(|name| {
                let _ = dlerror(); // clear a stale error so that a NULL result is explained
                let address = dlsym(handle, name.as_ptr());
                if address.is_null() {
                    Err(error(
                        LoadErrorKind::MissingSymbol(name.to_string_lossy().into_owned()),
                        last_dl_error(),
                    ))
                } else {
                    Ok(address)
                }
            })
        };
        let api = match api {
            Ok(api) => api,
            Err(e) => {
                // SAFETY: the handle came from dlopen above and is not used again.
                unsafe { dlclose(handle) };
                return Err(e);
            }
        };
        // From here on Drop closes the handle.
        let loaded = Library { handle, api };
        // The soname carries the ABI major; a file given by path may not.
        let number = unsafe { (loaded.api.pq_version_number)() };
        if number / 10000 != PQ_VERSION_MAJOR {
            return Err(error(
                LoadErrorKind::AbiMismatch,
                format!(
                    "ABI major {} (version number {number}), these declarations are for {}",
                    number / 10000,
                    PQ_VERSION_MAJOR
                ),
            ));
        }
        Ok(loaded)
    }

    /// The library's functions. Valid while `self` lives.
    pub fn api(&self) -> &Api {
        &self.api
    }
}

impl Drop for Library {
    fn drop(&mut self) {
        // SAFETY: the handle came from a successful dlopen and is closed once.
        unsafe { dlclose(self.handle) };
    }
}

impl fmt::Debug for Library {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Library")
            .field("handle", &self.handle)
            .finish_non_exhaustive()
    }
}

/// The loader's message for the calling thread's last dl* failure.
fn last_dl_error() -> String {
    // SAFETY: dlerror returns NULL or a C string valid until the next dl* call.
    let text = unsafe { dlerror() };
    if text.is_null() {
        "unknown dynamic loader error".to_owned()
    } else {
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    }
}
