//! Raw declarations of libpqcache's C API (`include/pqcache.h`): every
//! function, struct, enum constant and macro value, generated from the header
//! by bindgen (`bindings/rust/generate-sys.sh` writes `src/generated.rs`,
//! which is committed: building the crate needs no bindgen and nothing from
//! crates.io). The generated items have no documentation of their own: the
//! header's comments on them are the reference (they are plain `/* */`
//! comments, which bindgen does not carry).
//!
//! Two ways to reach the library:
//! - feature `link` (default): the functions are linked at build time and
//!   [`LINKED`] is an [`Api`] table of them; `build.rs` finds the library.
//! - [`dynamic::Library::open`]: `dlopen` at run time, for servers that must
//!   start (and say why) when libpqcache is absent. Nothing is linked when
//!   the `link` feature is off.
//!
//! Both give the same [`Api`] (a struct of function pointers), so code
//! written against `&Api` works in either mode; the safe `pqcache` crate
//! does exactly that.
//!
//! Enumerations travel as `int32_t` in the header, so they are `i32` type
//! aliases with constants here, never Rust enums: an unknown value coming
//! back from C is then just a number, not undefined behaviour.
//!
//! Written by hand here: the opaque handles, [`PQ_VERSION_STRING`] as a
//! `&CStr`, [`PQ_SONAME`], the [`Api`] table and loader (`pq_functions!`,
//! which the generated file calls with bindgen's function declarations) and
//! the tables `tests/header.rs` checks against the C compiler's view of the
//! header (every struct's size, field offsets and C types, every constant
//! and the list of functions), so the generated declarations cannot drift
//! silently either.
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::marker::{PhantomData, PhantomPinned};

pub mod dynamic;

// The macros come before the module that calls them.

/// Declares a `#[repr(C)]` struct as bindgen wrote it, with `Debug`,
/// `Clone` and `Copy` (the header's structs are plain data) and its `FIELDS`
/// table (for the layout test). `generate-sys.sh` wraps every struct in it.
macro_rules! c_struct {
    ($(#[$meta:meta])* pub struct $name:ident { $($(#[$fmeta:meta])* pub $field:ident: $ty:ty,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy)]
        pub struct $name { $($(#[$fmeta])* pub $field: $ty,)* }
        impl $name {
            /// Every field with its offset and C type, in declaration order.
            pub const FIELDS: &'static [$crate::FieldInfo] = &[
                $((stringify!($field), ::std::mem::offset_of!($name, $field), <$ty as $crate::CTypeName>::C_TYPE),)*
            ];
        }
    };
}
pub(crate) use c_struct;

/// Takes bindgen's function declarations (`extern "C" { pub fn ...; }`
/// blocks, as `generate-sys.sh` writes them into `generated.rs`) and derives
/// from that one list: the `extern "C"` block (feature `link`), the [`Api`]
/// table of function pointers, [`LINKED`], and the loader that fills an
/// [`Api`] with `dlsym`.
macro_rules! pq_functions {
    ($(extern "C" { $($(#[$doc:meta])* pub fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;)* })*) => {
        #[cfg(feature = "link")]
        extern "C" {
            $($($(#[$doc])* pub fn $name($($arg: $ty),*) $(-> $ret)?;)*)*
        }

        /// Every function of the C API as a function pointer, filled either
        /// with the linked symbols ([`LINKED`]) or by `dlsym`
        /// ([`dynamic::Library`](crate::dynamic::Library)). Field names are
        /// the C names.
        #[derive(Clone, Copy)]
        pub struct Api {
            $($($(#[$doc])* pub $name: unsafe extern "C" fn($($ty),*) $(-> $ret)?,)*)*
        }

        /// The linked functions as an [`Api`] table.
        #[cfg(feature = "link")]
        pub static LINKED: Api = Api { $($($name,)*)* };

        impl Api {
            /// The C names of every function, in header order.
            pub const FUNCTION_NAMES: &'static [&'static str] = &[$($(stringify!($name),)*)*];

            /// Fills the table by looking up each name (NUL-terminated) with
            /// `lookup`; the first error stops the load.
            ///
            /// # Safety
            /// `lookup` must return the address of a function with exactly
            /// the declared signature for each name.
            pub(crate) unsafe fn load_with<E>(
                mut lookup: impl FnMut(&'static ::std::ffi::CStr) -> Result<*mut ::std::ffi::c_void, E>,
            ) -> Result<Api, E> {
                Ok(Api {
                    $($($name: {
                        let name = ::std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes())
                            .expect("a function name has no interior NUL");
                        let address = lookup(name)?;
                        ::std::mem::transmute::<*mut ::std::ffi::c_void, unsafe extern "C" fn($($ty),*) $(-> $ret)?>(address)
                    },)*)*
                })
            }
        }
    };
}
pub(crate) use pq_functions;

mod generated;
pub use generated::*;

/// `PQ_VERSION_STRING` as a C string (bindgen gives the header's string
/// literal as bytes; this name shadows them).
pub const PQ_VERSION_STRING: &CStr = match CStr::from_bytes_with_nul(generated::PQ_VERSION_STRING) {
    Ok(version) => version,
    Err(_) => panic!("PQ_VERSION_STRING is one NUL-terminated string"),
};

/// The soname the dynamic loader knows the library by (ABI major = PQ_VERSION_MAJOR).
pub const PQ_SONAME: &CStr = c"libpqcache.so.0";

/// Opaque context handle (the Rustonomicon's idiom: not constructible, not
/// Send/Sync/Unpin by itself).
#[repr(C)]
pub struct pq_context {
    _private: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

/// Opaque worker pool handle shared between contexts (added in 0.6).
#[repr(C)]
pub struct pq_pool {
    _private: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

/// The C type name of a struct field as the header spells it; the layout
/// test compares it with what the C compiler says (`_Generic`).
pub trait CTypeName {
    const C_TYPE: &'static str;
}
macro_rules! c_type_names {
    ($($rust:ty => $c:literal),* $(,)?) => { $(impl CTypeName for $rust { const C_TYPE: &'static str = $c; })* };
}
c_type_names! {
    i32 => "int32_t", u32 => "uint32_t", i64 => "int64_t", u64 => "uint64_t",
    f32 => "float", f64 => "double",
    *mut c_void => "void*", *const c_char => "const char*", *mut i32 => "int32_t*",
    *const i64 => "const int64_t*", *const i32 => "const int32_t*",
    *const f32 => "const float*",
    pq_tensor => "pq_tensor", pq_selection => "pq_selection",
    // The callback types, spelled out rather than by their aliases: when an
    // alias below changes, this impl no longer applies to it and
    // `CALLBACKS` stops compiling instead of keeping a stale C signature.
    Option<unsafe extern "C" fn(*mut c_void, *const c_void, usize) -> c_int>
        => "int (*)(void*, const void*, size_t)",
    Option<unsafe extern "C" fn(*mut c_void, i32, *const c_char)>
        => "void (*)(void*, int32_t, const char*)",
    Option<unsafe extern "C" fn(*mut c_void, usize, usize) -> *mut c_void>
        => "void* (*)(void*, size_t, size_t)",
    Option<unsafe extern "C" fn(*mut c_void, *mut c_void, usize)>
        => "void (*)(void*, void*, size_t)",
    Option<unsafe extern "C" fn(*mut c_void, u64, i32, i32)>
        => "void (*)(void*, uint64_t, int32_t, pq_status)",
    Option<unsafe extern "C" fn(*mut c_void)> => "void (*)(void*)",
    Option<unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, u64, u64) -> i64>
        => "int64_t (*)(void*, int, void*, uint64_t, uint64_t)",
    Option<unsafe extern "C" fn(*mut c_void, c_int, *const c_void, u64, u64) -> i64>
        => "int64_t (*)(void*, int, const void*, uint64_t, uint64_t)",
    Option<unsafe extern "C" fn(*mut c_void, *const pq_build_progress)>
        => "void (*)(void*, const pq_build_progress*)",
    *mut pq_pool => "pq_pool*",
}

/// One field of a C struct: name, byte offset, C type name.
pub type FieldInfo = (&'static str, usize, &'static str);

/// `(C name, size, fields)` of each struct: the name is the type's own, so
/// the table cannot pair a name with another struct's layout.
macro_rules! struct_table {
    ($($name:ident),* $(,)?) => {
        &[$((stringify!($name), std::mem::size_of::<$name>(), $name::FIELDS),)*]
    };
}

/// The structs whose layout `tests/header.rs` checks, by C name.
pub const STRUCTS: &[(&str, usize, &[FieldInfo])] = struct_table![
    pq_tensor,
    pq_config,
    pq_selection,
    pq_select_item,
    pq_fetch_item,
    pq_paged_keys,
    pq_layer_info,
    pq_stats,
    pq_hooks,
    pq_build_progress
];

/// `new()` and `Default` for the structs the library fills after reading
/// their `struct_size` (the caller's ABI version of the struct).
macro_rules! sized_output_structs {
    ($($name:ident),* $(,)?) => {$(
        impl $name {
            /// Zeroed, with `struct_size` set as the library expects.
            pub fn new() -> Self {
                // SAFETY: every field is an integer or a float, for which zero is valid.
                let mut out: Self = unsafe { std::mem::zeroed() };
                out.struct_size = std::mem::size_of::<Self>() as u32;
                out
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }
    )*};
}

sized_output_structs!(pq_layer_info, pq_stats);

impl pq_hooks {
    /// No hooks, `log_level` `PQ_LOG_WARN`, `struct_size` set: what
    /// `pq_hooks_default` fills.
    pub fn new() -> Self {
        // SAFETY: None, null and zero are valid for every field.
        let mut out: Self = unsafe { std::mem::zeroed() };
        out.struct_size = std::mem::size_of::<Self>() as u32;
        out.log_level = PQ_LOG_WARN;
        out
    }
}

impl Default for pq_hooks {
    fn default() -> Self {
        Self::new()
    }
}

/// `(C name, C type)` of each function-pointer typedef of the header, the
/// type as `tests/header.rs` has the C compiler confirm it (`_Generic`).
pub const CALLBACKS: &[(&str, &str)] = &[
    ("pq_write_fn", <pq_write_fn as CTypeName>::C_TYPE),
    ("pq_log_fn", <pq_log_fn as CTypeName>::C_TYPE),
    ("pq_alloc_fn", <pq_alloc_fn as CTypeName>::C_TYPE),
    ("pq_free_fn", <pq_free_fn as CTypeName>::C_TYPE),
    ("pq_build_done_fn", <pq_build_done_fn as CTypeName>::C_TYPE),
    ("pq_destroy_fn", <pq_destroy_fn as CTypeName>::C_TYPE),
    ("pq_disk_read_fn", <pq_disk_read_fn as CTypeName>::C_TYPE),
    ("pq_disk_write_fn", <pq_disk_write_fn as CTypeName>::C_TYPE),
    (
        "pq_build_progress_fn",
        <pq_build_progress_fn as CTypeName>::C_TYPE,
    ),
];

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("functions", &Self::FUNCTION_NAMES.len())
            .finish_non_exhaustive()
    }
}
