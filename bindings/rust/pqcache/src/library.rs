use std::ffi::{CStr, CString, OsStr};
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::ptr::NonNull;
use std::sync::Arc;

use pqcache_sys as sys;

use crate::{Config, Context, Error, Result, Status};

/// A way to reach libpqcache: linked at build time ([`Library::linked`],
/// feature `link`) or loaded at run time ([`Library::load`]). Everything in
/// this crate works the same on either; contexts keep their `Library` (a
/// cheap clone), so a loaded library stays loaded while a context lives.
#[derive(Clone)]
pub struct Library {
    source: Source,
}

#[derive(Clone)]
enum Source {
    #[cfg(feature = "link")]
    Linked,
    Loaded(Arc<sys::dynamic::Library>),
}

impl Library {
    /// The library linked into this program.
    #[cfg(feature = "link")]
    pub fn linked() -> Library {
        Library {
            source: Source::Linked,
        }
    }

    /// Loads libpqcache with `dlopen`: a file path, or a soname such as
    /// [`SONAME`](crate::SONAME) that the dynamic loader searches for. A
    /// missing file or function is [`Status::NotFound`] with the loader's
    /// message; a library of another ABI major is [`Status::Unsupported`].
    ///
    /// Without the `link` feature there is no `Config::new` (nothing is
    /// linked to ask for the defaults): the loaded library gives them. The
    /// same lines are in README.md and docs/bindings/rust.md, which
    /// tests/docs.rs keeps equal to this example.
    ///
    /// ```
    /// use pqcache::{DType, Library};
    ///
    /// let lib = Library::load("libpqcache.so.0")?; // dlopen at run time: nothing linked
    /// let config = lib.default_config().geometry(1, 4, 2, 64).dtype(DType::F32);
    /// let ctx = lib.create(&config)?;
    /// ctx.add_sequence(7)?;
    /// # Ok::<(), pqcache::Error>(())
    /// ```
    pub fn load(path: impl AsRef<OsStr>) -> Result<Library> {
        let loaded = sys::dynamic::Library::open(path)?;
        Ok(Library {
            source: Source::Loaded(Arc::new(loaded)),
        })
    }

    /// The function table of this library.
    pub(crate) fn api(&self) -> &sys::Api {
        match &self.source {
            #[cfg(feature = "link")]
            Source::Linked => &sys::LINKED,
            Source::Loaded(library) => library.api(),
        }
    }

    /// The version of the library (`pq_version_number`), which may be newer
    /// than the header these bindings were written for.
    pub fn version(&self) -> Version {
        // SAFETY: no arguments; thread-safe.
        Version::from_number(unsafe { (self.api().pq_version_number)() })
    }

    /// The defaults of this library (`pq_config_default`); set the model
    /// geometry, then pass the config to [`Library::create`].
    pub fn default_config(&self) -> Config {
        let mut raw = std::mem::MaybeUninit::<sys::pq_config>::zeroed();
        // SAFETY: pq_config_default fills the whole struct; zeroed is a valid
        // pq_config anyway (integers, floats and a NULL pointer).
        unsafe {
            (self.api().pq_config_default)(raw.as_mut_ptr());
            Config::from_raw(raw.assume_init())
        }
    }

    /// Creates a context (`pq_create`).
    pub fn create(&self, config: &Config) -> Result<Context> {
        let mut raw = *config.as_raw();
        let plugin_path = lend_path("cuda_plugin_path", config.cuda_plugin_path_ref())?;
        let disk_path = lend_path("kv_disk_path", config.kv_disk_path_ref())?;
        // The library reads the paths during pq_create only.
        raw.cuda_plugin_path = plugin_path
            .as_ref()
            .map_or(std::ptr::null(), |p| p.as_ptr());
        raw.kv_disk_path = disk_path.as_ref().map_or(std::ptr::null(), |p| p.as_ptr());
        // Read (copied) during pq_create only; NULL when none were given.
        let scales = config.kv_scales_ref();
        raw.kv_scales = if scales.is_empty() {
            std::ptr::null()
        } else {
            scales.as_ptr()
        };
        let mut ctx = std::ptr::null_mut();
        // SAFETY: raw is a complete pq_config whose struct_size came from
        // pq_config_default; ctx is written only on success.
        self.check(unsafe { (self.api().pq_create)(&raw, &mut ctx) })?;
        let ctx = NonNull::new(ctx).ok_or_else(|| {
            Error::new(Status::Internal, "pq_create returned PQ_OK and no context")
        })?;
        // SAFETY: ctx is a fresh context that only this call knows.
        unsafe { Context::from_raw(self.clone(), ctx) }
    }

    /// The library's text for a status (`pq_status_string`), e.g.
    /// `"PQ_ERR_NOT_FOUND: what the call names does not exist (a sequence, file, Redis key, plug-in or device)"`.
    pub(crate) fn status_string(&self, status: sys::pq_status) -> String {
        // SAFETY: pq_status_string returns a static C string for any value.
        let text = unsafe { CStr::from_ptr((self.api().pq_status_string)(status)) };
        text.to_string_lossy().into_owned()
    }

    /// `Ok` for `PQ_OK`, else the error with this thread's `pq_last_error()`.
    pub(crate) fn check(&self, status: sys::pq_status) -> Result<()> {
        match Status::from_code(status) {
            None => Ok(()),
            Some(status) => {
                // SAFETY: pq_last_error returns a valid C string (thread-local,
                // valid until this thread's next failing call: copied now).
                let message = unsafe { CStr::from_ptr((self.api().pq_last_error)()) };
                Err(Error::new(status, message.to_string_lossy().into_owned()))
            }
        }
    }
}

/// A path setting of the config as the C string pq_create borrows; a NUL
/// byte (which C would read as a shorter path) is an `InvalidArgument` error
/// naming the field.
fn lend_path(field: &str, path: Option<&std::path::Path>) -> Result<Option<CString>> {
    path.map(|path| {
        CString::new(path.as_os_str().as_bytes()).map_err(|_| {
            Error::invalid(
                "pq_create",
                format_args!("config.{field} is {path:?}; expected a path without NUL bytes"),
            )
        })
    })
    .transpose()
}

impl fmt::Debug for Library {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match &self.source {
            #[cfg(feature = "link")]
            Source::Linked => "linked",
            Source::Loaded(_) => "loaded",
        };
        f.debug_struct("Library")
            .field("mode", &mode)
            .field("version", &self.version())
            .finish()
    }
}

/// A library version, `MAJOR.MINOR.PATCH`; the major is the ABI (soname) number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub major: i32,
    pub minor: i32,
    pub patch: i32,
}

impl Version {
    /// The version these bindings were written for (the header's).
    pub const HEADER: Version = Version::from_number(sys::PQ_VERSION_NUMBER);

    /// From `MAJOR * 10000 + MINOR * 100 + PATCH`.
    pub const fn from_number(number: i32) -> Version {
        Version {
            major: number / 10000,
            minor: number / 100 % 100,
            patch: number % 100,
        }
    }

    pub const fn number(self) -> i32 {
        self.major * 10000 + self.minor * 100 + self.patch
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}
