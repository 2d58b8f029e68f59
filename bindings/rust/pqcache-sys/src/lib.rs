//! Raw declarations of libpqcache's C API (`include/pqcache.h`), written by
//! hand: every function, struct, enum constant and macro value of the header.
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
//! `tests/header.rs` checks every struct's size, every field's offset and C
//! type, every constant and the list of functions against the C compiler's
//! view of the header, so these declarations cannot drift silently.
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::marker::{PhantomData, PhantomPinned};

pub mod dynamic;

// ---------------------------------------------------------------------------
// Versions
// ---------------------------------------------------------------------------

pub const PQ_VERSION_MAJOR: c_int = 0;
pub const PQ_VERSION_MINOR: c_int = 14;
pub const PQ_VERSION_PATCH: c_int = 0;
pub const PQ_VERSION_NUMBER: c_int =
    PQ_VERSION_MAJOR * 10000 + PQ_VERSION_MINOR * 100 + PQ_VERSION_PATCH;
pub const PQ_VERSION_STRING: &CStr = c"0.14.0";

/// The soname the dynamic loader knows the library by (ABI major = PQ_VERSION_MAJOR).
pub const PQ_SONAME: &CStr = c"libpqcache.so.0";

// ---------------------------------------------------------------------------
// Enumerations (int32_t in the header)
// ---------------------------------------------------------------------------

/// `pq_status`: every function's return value. Kept an integer because the
/// library may return codes this declaration does not know.
pub type pq_status = c_int;
pub const PQ_OK: pq_status = 0;
pub const PQ_ERR_INVALID_ARGUMENT: pq_status = -1;
pub const PQ_ERR_OUT_OF_MEMORY: pq_status = -2;
pub const PQ_ERR_BAD_STATE: pq_status = -3;
pub const PQ_ERR_NOT_FOUND: pq_status = -4;
pub const PQ_ERR_UNSUPPORTED: pq_status = -5;
pub const PQ_ERR_BACKEND: pq_status = -6;
pub const PQ_ERR_INTERNAL: pq_status = -7;
/// Added in 0.4: an output buffer is too small; the needed size was written.
pub const PQ_ERR_BUFFER_TOO_SMALL: pq_status = -8;
/// Added in 0.5: saved sequence state that is not intact (truncated, a
/// checksum or magic number that does not match, an inconsistent field).
pub const PQ_ERR_CORRUPT: pq_status = -9;
/// Added in 0.5: saved sequence state that is intact but cannot be loaded
/// here (another format version, or another geometry than the context's).
pub const PQ_ERR_INCOMPATIBLE: pq_status = -10;

pub type pq_dtype = i32;
pub const PQ_DTYPE_F32: pq_dtype = 0;
pub const PQ_DTYPE_F16: pq_dtype = 1;
pub const PQ_DTYPE_BF16: pq_dtype = 2;
/// fp8 e4m3fn (bias 7, no Inf, 0x7F/0xFF NaN, max 448); added in 0.10.
pub const PQ_DTYPE_FP8_E4M3: pq_dtype = 3;
/// fp8 e5m2 (bias 15, Inf and NaN); added in 0.10.
pub const PQ_DTYPE_FP8_E5M2: pq_dtype = 4;

pub type pq_memory = i32;
pub const PQ_MEMORY_HOST: pq_memory = 0;
pub const PQ_MEMORY_DEVICE: pq_memory = 1;

pub type pq_selector = i32;
pub const PQ_SELECTOR_PQ: pq_selector = 0;
pub const PQ_SELECTOR_EXACT: pq_selector = 1;
pub const PQ_SELECTOR_WINDOW: pq_selector = 2;
pub const PQ_SELECTOR_SPARQ: pq_selector = 3;
pub const PQ_SELECTOR_INFLLM: pq_selector = 4;
pub const PQ_SELECTOR_QUEST: pq_selector = 5;
pub const PQ_SELECTOR_RANDOM: pq_selector = 6;
pub const PQ_SELECTOR_H2O: pq_selector = 7;
pub const PQ_SELECTOR_SCOPE: pq_selector = 8;
pub const PQ_SELECTOR_SNAPKV: pq_selector = 9;
pub const PQ_SELECTOR_PYRAMIDKV: pq_selector = 10;
pub const PQ_SELECTOR_SCISSORHANDS: pq_selector = 11;
pub const PQ_SELECTOR_KEYFORMER: pq_selector = 12;
pub const PQ_SELECTOR_CLUSTERKV: pq_selector = 13;
pub const PQ_SELECTOR_ADAKV: pq_selector = 14;
pub const PQ_SELECTOR_ZIGZAGKV: pq_selector = 15;
pub const PQ_SELECTOR_PYRAMIDINFER: pq_selector = 16;
pub const PQ_SELECTOR_FASTGEN: pq_selector = 17;
pub const PQ_SELECTOR_INFINIGEN: pq_selector = 18;
/// One past the last selector: the `pq_selector` values are 0 to
/// `PQ_SELECTOR_COUNT - 1` (a macro in the header, so `c_int`).
pub const PQ_SELECTOR_COUNT: c_int = 19;

pub type pq_token_class = i32;
pub const PQ_TOKEN_PLAIN: pq_token_class = 0;
pub const PQ_TOKEN_SPECIAL: pq_token_class = 1;
pub const PQ_TOKEN_PUNCTUATION: pq_token_class = 2;

pub type pq_gqa_combine = i32;
pub const PQ_GQA_SUM_SOFTMAX: pq_gqa_combine = 0;
pub const PQ_GQA_MAX: pq_gqa_combine = 1;
pub const PQ_GQA_MEAN: pq_gqa_combine = 2;

pub type pq_kmeans_init = i32;
pub const PQ_KMEANS_INIT_RANDOM: pq_kmeans_init = 0;
pub const PQ_KMEANS_INIT_KMEANSPP: pq_kmeans_init = 1;

pub type pq_backend = i32;
pub const PQ_BACKEND_CPU: pq_backend = 0;
pub const PQ_BACKEND_CUDA: pq_backend = 1;
pub const PQ_BACKEND_AUTO: pq_backend = 2;

pub type pq_cache_policy = i32;
pub const PQ_CACHE_LRU: pq_cache_policy = 0;
pub const PQ_CACHE_LFU: pq_cache_policy = 1;

/// `pq_key_rotary` (added in 0.7): how a head's rotary pairs are laid out.
pub type pq_key_rotary = i32;
pub const PQ_ROTARY_NONE: pq_key_rotary = 0;
pub const PQ_ROTARY_HALF: pq_key_rotary = 1;
pub const PQ_ROTARY_INTERLEAVED: pq_key_rotary = 2;

/// `pq_pooling` (added in 0.7): SnapKV, PyramidKV and SCOPE's score pooling.
pub type pq_pooling = i32;
pub const PQ_POOLING_MAX: pq_pooling = 0;
pub const PQ_POOLING_AVG: pq_pooling = 1;

/// `pq_tail_estimate` (added in 0.12): what `pq_decode_attend` adds for the
/// middle tokens a selection leaves out.
pub type pq_tail_estimate = i32;
pub const PQ_TAIL_NONE: pq_tail_estimate = 0;
pub const PQ_TAIL_CODE_MEANS: pq_tail_estimate = 1;

/// `pq_kv_tier` (added in 0.9): where each layer's K/V rows live.
pub type pq_kv_tier = i32;
pub const PQ_KV_TIER_HOST: pq_kv_tier = 0;
/// A file in `pq_config.kv_disk_path` (CPU backend only).
pub const PQ_KV_TIER_DISK: pq_kv_tier = 1;
/// The caller's pool (added in 0.10): the library keeps the index only;
/// values may be NULL, and what needs them is `PQ_ERR_UNSUPPORTED`.
pub const PQ_KV_TIER_CALLER: pq_kv_tier = 2;

/// `pq_select_rows` (added in 0.10): the rows `pq_decode_select_multi` writes.
pub type pq_select_rows = i32;
/// Row `t * num_kv_heads + h`: token t's selection for kv head h.
pub const PQ_ROWS_PER_TOKEN: pq_select_rows = 0;
/// Row h: the union over the query tokens of kv head h's selections.
pub const PQ_ROWS_PER_HEAD: pq_select_rows = 1;
/// One row: the union over the query tokens and kv heads.
pub const PQ_ROWS_PER_REQUEST: pq_select_rows = 2;

pub type pq_layout = i32;
pub const PQ_LAYOUT_TOKEN_MAJOR: pq_layout = 0;
pub const PQ_LAYOUT_HEAD_MAJOR: pq_layout = 1;

/// `pq_log_level` (added in 0.6), most severe first.
pub type pq_log_level = i32;
pub const PQ_LOG_ERROR: pq_log_level = 0;
pub const PQ_LOG_WARN: pq_log_level = 1;
pub const PQ_LOG_INFO: pq_log_level = 2;
pub const PQ_LOG_DEBUG: pq_log_level = 3;

/// `pq_build_stage` (added in 0.14): the stages of an index build.
pub type pq_build_stage = i32;
pub const PQ_BUILD_STAGE_KMEANS: pq_build_stage = 0;
pub const PQ_BUILD_STAGE_ENCODE: pq_build_stage = 1;

// ---------------------------------------------------------------------------
// Structs
// ---------------------------------------------------------------------------

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

/// Declares a `#[repr(C)]` struct and its `FIELDS` table (for the layout test).
macro_rules! c_struct {
    ($(#[$meta:meta])* pub struct $name:ident { $($(#[$fmeta:meta])* pub $field:ident: $ty:ty,)* }) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Debug, Clone, Copy)]
        pub struct $name { $($(#[$fmeta])* pub $field: $ty,)* }
        impl $name {
            /// Every field with its offset and C type, in declaration order.
            pub const FIELDS: &'static [FieldInfo] = &[
                $((stringify!($field), std::mem::offset_of!($name, $field), <$ty as CTypeName>::C_TYPE),)*
            ];
        }
    };
}

c_struct! {
    /// A view of the caller's K, V or Q buffer (element (t, h, d) at
    /// `data + (t * token_stride + h * head_stride + d) * element_size`).
    pub struct pq_tensor {
        pub data: *mut c_void,
        /// pq_dtype
        pub dtype: i32,
        /// pq_memory
        pub memory: i32,
        pub tokens: i64,
        pub heads: i32,
        pub head_dim: i32,
        pub token_stride: i64,
        pub head_stride: i64,
    }
}

c_struct! {
    /// Context configuration; start from `pq_config_default`.
    pub struct pq_config {
        pub struct_size: u32,
        pub num_layers: i32,
        pub num_q_heads: i32,
        pub num_kv_heads: i32,
        pub head_dim: i32,
        pub dtype: i32,
        pub pq_subspaces: i32,
        pub pq_bits: i32,
        pub kmeans_iterations: i32,
        pub kmeans_min_iterations: i32,
        pub kmeans_max_iterations: i32,
        pub kmeans_tolerance: f32,
        pub kmeans_init: i32,
        pub kmeans_max_points_per_centroid: i32,
        pub seed: u64,
        pub compute_alpha: f64,
        pub compute_beta: f64,
        pub compute_gamma: f64,
        pub layer_time_budget: f64,
        pub worker_threads: i32,
        pub selector: i32,
        pub sink_tokens: i32,
        pub local_tokens: i32,
        pub topk_tokens: i32,
        pub topk_fraction: f32,
        pub gqa_combine: i32,
        pub host_memory_limit: u64,
        pub backend: i32,
        pub device_id: i32,
        /// Read during pq_create only.
        pub cuda_plugin_path: *const c_char,
        pub sparq_dims: i32,
        pub block_tokens: i32,
        pub block_representatives: i32,
        pub observation_window: i32,
        pub pooling_kernel: i32,
        pub pyramid_ratio: f32,
        pub scope_decode_share: f32,
        pub cache_tokens: i64,
        pub cache_block_tokens: i32,
        pub cache_policy: i32,
        pub cache_update_blocks: i32,
        pub key_rotary: i32,
        pub pq_rerank: f32,
        pub pooling: i32,
        pub pq_rebuild_share: f32,
        pub history_window: i32,
        pub keyformer_tau: f32,
        pub keyformer_tau_step: f32,
        pub cluster_count: i32,
        pub adakv_safeguard: f32,
        pub zigzag_mass: f32,
        pub zigzag_floor: f32,
        pub pyramidinfer_decay: f32,
        pub fastgen_recovery: f32,
        pub infinigen_partial_ratio: f32,
        pub infinigen_alpha: f32,
        /// pq_kv_tier (added in 0.9)
        pub kv_tier: i32,
        /// The disk tier's directory; read during pq_create only (added in 0.9).
        pub kv_disk_path: *const c_char,
        /// The model's index of this context's kv head 0 (tensor parallel;
        /// added in 0.10).
        pub kv_head_offset: i32,
        /// fp8 scales per layer: 0, 1 or num_kv_heads (added in 0.10).
        pub kv_scale_count: i32,
        /// [num_layers][2][kv_scale_count] floats, K then V; read during
        /// pq_create only (added in 0.10).
        pub kv_scales: *const f32,
        /// pq_tail_estimate of pq_decode_attend (added in 0.12).
        pub tail_estimate: i32,
        /// PQ: the share of the middle with the largest quantization
        /// residuals, scored exactly (added in 0.13).
        pub pq_outliers: f32,
    }
}

c_struct! {
    /// Per kv head, ascending token positions; row h starts at
    /// `positions[h * capacity]` and holds `counts[h]` entries.
    pub struct pq_selection {
        pub positions: *mut i32,
        pub counts: *mut i32,
        pub capacity: i64,
    }
}

c_struct! {
    /// Where a sequence's keys are in the caller's paged pool (added in
    /// 0.10): position p's key is row `slots[p]`, or
    /// `block_table[p / block_size] * block_size + p % block_size`, or p
    /// (both NULL) of `pool`.
    pub struct pq_paged_keys {
        pub pool: pq_tensor,
        pub slots: *const i64,
        pub block_table: *const i32,
        pub block_size: i32,
        /// Entries of `slots` or `block_table`.
        pub map_length: i64,
        /// Tokens an append or prefill call adds (not read by a select).
        pub tokens: i64,
    }
}

c_struct! {
    /// Index state of one (sequence, layer); set `struct_size` first.
    pub struct pq_layer_info {
        pub struct_size: u32,
        pub tokens: i64,
        pub prefill_tokens: i64,
        pub middle_tokens: i64,
        pub coded_tokens: i64,
        pub build_pending: i32,
        pub kmeans_iterations: i32,
        pub kmeans_budget: i32,
        pub index_ready: i32,
        pub build_seconds: f64,
        pub last_select_bytes: u64,
    }
}

c_struct! {
    /// Context or sequence statistics; set `struct_size` first.
    pub struct pq_stats {
        pub struct_size: u32,
        pub sequences: i64,
        pub tokens: i64,
        pub kv_bytes: u64,
        pub index_bytes: u64,
        pub builds_finished: u64,
        pub builds_cancelled: u64,
        pub kmeans_iterations: u64,
        pub select_calls: u64,
        pub fetch_calls: u64,
        pub build_seconds: f64,
        pub select_seconds: f64,
        pub fetch_seconds: f64,
        pub bytes_scored: u64,
        pub bytes_fetched: u64,
        pub cache_hits: u64,
        pub cache_misses: u64,
        pub host_bytes: u64,
        pub bytes_staged: u64,
        pub hint_tokens: u64,
        pub hint_covered: u64,
    }
}

c_struct! {
    /// One sequence of `pq_decode_select_batch` (added in 0.4): the
    /// arguments of `pq_decode_select`, and the status the call writes.
    pub struct pq_select_item {
        pub seq_id: u64,
        pub query: pq_tensor,
        pub out: pq_selection,
        /// pq_status, written by the call
        pub status: i32,
    }
}

c_struct! {
    /// One sequence of `pq_fetch_kv_batch` (added in 0.4): the arguments of
    /// `pq_fetch_kv`, and the status the call writes.
    pub struct pq_fetch_item {
        pub seq_id: u64,
        pub selection: pq_selection,
        pub out_keys: pq_tensor,
        pub out_values: pq_tensor,
        /// pq_status, written by the call
        pub status: i32,
    }
}

/// Opaque worker pool handle shared between contexts (added in 0.6).
#[repr(C)]
pub struct pq_pool {
    _private: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

/// `pq_log_fn` (added in 0.6): one log message, valid during the call; may
/// be called from several threads at once; must not call into the context.
pub type pq_log_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, level: i32, message: *const c_char)>;
/// `pq_alloc_fn` (added in 0.6): host K/V store memory, or null.
pub type pq_alloc_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, bytes: usize, alignment: usize) -> *mut c_void>;
/// `pq_free_fn` (added in 0.6): frees what `pq_alloc_fn` returned.
pub type pq_free_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, ptr: *mut c_void, bytes: usize)>;
/// `pq_build_done_fn` (added in 0.6): an index build of (seq_id, layer) ended.
pub type pq_build_done_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, seq_id: u64, layer: i32, status: pq_status)>;
/// `pq_disk_read_fn` (added in 0.9): reads `bytes` at `offset` of the disk
/// tier's file `fd` into `buf`; returns the bytes read or -errno. Called on
/// any thread, concurrently; must not unwind into C.
pub type pq_disk_read_fn = Option<
    unsafe extern "C" fn(
        user: *mut c_void,
        fd: c_int,
        buf: *mut c_void,
        bytes: u64,
        offset: u64,
    ) -> i64,
>;
/// `pq_disk_write_fn` (added in 0.9): writes `bytes` of `buf` at `offset` of
/// the disk tier's file `fd`; returns the bytes written or -errno.
pub type pq_disk_write_fn = Option<
    unsafe extern "C" fn(
        user: *mut c_void,
        fd: c_int,
        buf: *const c_void,
        bytes: u64,
        offset: u64,
    ) -> i64,
>;

c_struct! {
    /// How far an index build has come (`pq_build_progress_fn`, added in
    /// 0.14): `fraction` in [0, 1], non-decreasing, 1 at the last call.
    pub struct pq_build_progress {
        pub struct_size: u32,
        pub seq_id: u64,
        pub layer: i32,
        /// pq_build_stage
        pub stage: i32,
        pub done: i64,
        pub total: i64,
        pub fraction: f64,
    }
}

/// `pq_build_progress_fn` (added in 0.14): an index build advanced; called
/// on the build's worker thread; must not unwind into C.
pub type pq_build_progress_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, progress: *const pq_build_progress)>;

c_struct! {
    /// Hooks of `pq_create_with_hooks` (added in 0.6); start from
    /// [`pq_hooks::new`] (what `pq_hooks_default` gives).
    pub struct pq_hooks {
        pub struct_size: u32,
        pub log: pq_log_fn,
        pub log_user: *mut c_void,
        /// pq_log_level
        pub log_level: i32,
        pub host_alloc: pq_alloc_fn,
        pub host_free: pq_free_fn,
        pub alloc_user: *mut c_void,
        pub build_done: pq_build_done_fn,
        pub build_done_user: *mut c_void,
        pub pool: *mut pq_pool,
        /// The disk tier's file reads and writes, `None` for pread / pwrite
        /// (added in 0.9).
        pub disk_read: pq_disk_read_fn,
        pub disk_write: pq_disk_write_fn,
        pub disk_user: *mut c_void,
        /// Index builds' progress (added in 0.14).
        pub build_progress: pq_build_progress_fn,
        pub build_progress_user: *mut c_void,
    }
}

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

/// Opaque context handle (the Rustonomicon's idiom: not constructible, not
/// Send/Sync/Unpin by itself).
#[repr(C)]
pub struct pq_context {
    _private: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

// ---------------------------------------------------------------------------
// Callback types
// ---------------------------------------------------------------------------

/// `pq_destroy_fn` (added in 0.7): `pq_destroy` of a watched context is
/// under way (`pq_watch_destroy`); must not call into the context.
pub type pq_destroy_fn = Option<unsafe extern "C" fn(user: *mut c_void)>;

/// `pq_write_fn` (added in 0.5): receives `pq_sequence_save`'s output in
/// pieces, in order; returns 0 to go on, anything else stops the save
/// (which then fails with `PQ_ERR_BACKEND`). `None` is C's NULL, which
/// `pq_sequence_save` rejects with `PQ_ERR_INVALID_ARGUMENT`. The callback
/// must not unwind into C (catch panics inside it).
pub type pq_write_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, data: *const c_void, size: usize) -> c_int>;

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
    ("pq_build_progress_fn", <pq_build_progress_fn as CTypeName>::C_TYPE),
];

// ---------------------------------------------------------------------------
// Functions
// ---------------------------------------------------------------------------

/// Declares every function once and derives from that one list: the
/// `extern "C"` block (feature `link`), the [`Api`] table of function
/// pointers, [`LINKED`], and the loader that fills an [`Api`] with `dlsym`.
macro_rules! pq_functions {
    ($($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;)*) => {
        #[cfg(feature = "link")]
        extern "C" {
            $($(#[$doc])* pub fn $name($($arg: $ty),*) $(-> $ret)?;)*
        }

        /// Every function of the C API as a function pointer, filled either
        /// with the linked symbols ([`LINKED`]) or by `dlsym`
        /// ([`dynamic::Library`]). Field names are the C names.
        #[derive(Clone, Copy)]
        pub struct Api {
            $($(#[$doc])* pub $name: unsafe extern "C" fn($($ty),*) $(-> $ret)?,)*
        }

        /// The linked functions as an [`Api`] table.
        #[cfg(feature = "link")]
        pub static LINKED: Api = Api { $($name,)* };

        impl Api {
            /// The C names of every function, in header order.
            pub const FUNCTION_NAMES: &'static [&'static str] = &[$(stringify!($name),)*];

            /// Fills the table by looking up each name (NUL-terminated) with
            /// `lookup`; the first error stops the load.
            ///
            /// # Safety
            /// `lookup` must return the address of a function with exactly
            /// the declared signature for each name.
            pub(crate) unsafe fn load_with<E>(
                mut lookup: impl FnMut(&'static CStr) -> Result<*mut c_void, E>,
            ) -> Result<Api, E> {
                Ok(Api {
                    $($name: {
                        let name = CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes())
                            .expect("a function name has no interior NUL");
                        let address = lookup(name)?;
                        std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($ty),*) $(-> $ret)?>(address)
                    },)*
                })
            }
        }
    };
}

pq_functions! {
    fn pq_version_number() -> c_int;
    fn pq_version_string() -> *const c_char;
    /// Added in 0.11.
    fn pq_cpu_level() -> *const c_char;
    fn pq_status_string(status: i32) -> *const c_char;
    fn pq_last_error() -> *const c_char;
    fn pq_tensor_init(tensor: *mut pq_tensor, data: *mut c_void, dtype: i32, layout: i32,
                      tokens: i64, heads: i32, head_dim: i32) -> pq_status;
    fn pq_config_default(config: *mut pq_config);
    fn pq_create(config: *const pq_config, out: *mut *mut pq_context) -> pq_status;
    fn pq_destroy(ctx: *mut pq_context);
    /// Added in 0.7.
    fn pq_watch_destroy(ctx: *mut pq_context, func: pq_destroy_fn, user: *mut c_void,
                        out_watch: *mut u64) -> pq_status;
    /// Added in 0.7.
    fn pq_unwatch_destroy(ctx: *mut pq_context, watch: u64) -> pq_status;
    fn pq_get_config(ctx: *const pq_context, out: *mut pq_config) -> pq_status;
    fn pq_get_backend(ctx: *const pq_context, out_backend: *mut i32) -> pq_status;
    /// Added in 0.6.
    fn pq_pool_create(threads: i32, out: *mut *mut pq_pool) -> pq_status;
    /// Added in 0.6.
    fn pq_pool_threads(pool: *const pq_pool, out_threads: *mut i32) -> pq_status;
    /// Added in 0.6.
    fn pq_pool_destroy(pool: *mut pq_pool);
    /// Added in 0.6.
    fn pq_hooks_default(hooks: *mut pq_hooks);
    /// Added in 0.6.
    fn pq_create_with_hooks(config: *const pq_config, hooks: *const pq_hooks,
                            out: *mut *mut pq_context) -> pq_status;
    fn pq_sequence_add(ctx: *mut pq_context, seq_id: u64) -> pq_status;
    fn pq_sequence_remove(ctx: *mut pq_context, seq_id: u64) -> pq_status;
    fn pq_sequence_length(ctx: *const pq_context, seq_id: u64, layer: i32,
                          out_tokens: *mut i64) -> pq_status;
    fn pq_sequence_count(ctx: *const pq_context, out_count: *mut i64) -> pq_status;
    fn pq_sequence_set_stream(ctx: *mut pq_context, seq_id: u64, cuda_stream: *mut c_void) -> pq_status;
    /// Added in 0.5.
    fn pq_sequence_truncate(ctx: *mut pq_context, seq_id: u64, tokens: i64) -> pq_status;
    /// Added in 0.8: room for `tokens` tokens, so that steady decode steps
    /// on the device allocate nothing.
    fn pq_sequence_reserve(ctx: *mut pq_context, seq_id: u64, tokens: i64) -> pq_status;
    /// Added in 0.5.
    fn pq_sequence_fork(ctx: *mut pq_context, parent_id: u64, child_id: u64) -> pq_status;
    /// Added in 0.5.
    fn pq_sequence_save(ctx: *mut pq_context, seq_id: u64, write: pq_write_fn,
                        user: *mut c_void) -> pq_status;
    /// Added in 0.5.
    fn pq_sequence_state_size(ctx: *mut pq_context, seq_id: u64, out_bytes: *mut u64) -> pq_status;
    /// Added in 0.5.
    fn pq_sequence_save_buffer(ctx: *mut pq_context, seq_id: u64, buffer: *mut c_void,
                               capacity: u64, out_written: *mut u64) -> pq_status;
    /// Added in 0.5.
    fn pq_sequence_save_file(ctx: *mut pq_context, seq_id: u64, path: *const c_char) -> pq_status;
    /// Added in 0.5.
    fn pq_sequence_restore(ctx: *mut pq_context, seq_id: u64, data: *const c_void,
                           size: u64) -> pq_status;
    /// Added in 0.5.
    fn pq_sequence_restore_file(ctx: *mut pq_context, seq_id: u64,
                                path: *const c_char) -> pq_status;
    /// Added in 0.5: reads a state's description (header, every layer's
    /// index and selector sections) and adds the sequence; it selects at
    /// once, its K/V arrive through `pq_sequence_restore_kv`. A short `data`
    /// is `PQ_ERR_BUFFER_TOO_SMALL` with the bytes needed in `*out_consumed`.
    fn pq_sequence_restore_begin(ctx: *mut pq_context, seq_id: u64, data: *const c_void,
                                 size: u64, out_consumed: *mut u64) -> pq_status;
    /// Added in 0.5: reads exactly one next section (a layer's K/V, then the
    /// end section) of a restore begun with `pq_sequence_restore_begin`.
    fn pq_sequence_restore_kv(ctx: *mut pq_context, seq_id: u64, data: *const c_void,
                              size: u64, out_consumed: *mut u64) -> pq_status;
    fn pq_prefill_layer(ctx: *mut pq_context, seq_id: u64, layer: i32, keys: *const pq_tensor,
                        values: *const pq_tensor) -> pq_status;
    fn pq_decode_append(ctx: *mut pq_context, seq_id: u64, layer: i32, keys: *const pq_tensor,
                        values: *const pq_tensor) -> pq_status;
    /// Added in 0.10: keys from the caller's paged pool (index-only contexts).
    fn pq_prefill_layer_paged(ctx: *mut pq_context, seq_id: u64, layer: i32,
                              keys: *const pq_paged_keys) -> pq_status;
    /// Added in 0.10.
    fn pq_decode_append_paged(ctx: *mut pq_context, seq_id: u64, layer: i32,
                              keys: *const pq_paged_keys) -> pq_status;
    fn pq_selection_capacity(ctx: *const pq_context, seq_id: u64, layer: i32,
                             out_capacity: *mut i64) -> pq_status;
    fn pq_selection_capacity_for(ctx: *const pq_context, layer: i32, tokens: i64,
                                 out_capacity: *mut i64) -> pq_status;
    fn pq_decode_select(ctx: *mut pq_context, seq_id: u64, layer: i32, query: *const pq_tensor,
                        out: *mut pq_selection) -> pq_status;
    fn pq_fetch_kv(ctx: *mut pq_context, seq_id: u64, layer: i32, selection: *const pq_selection,
                   out_keys: *const pq_tensor, out_values: *const pq_tensor) -> pq_status;
    fn pq_decode_attend(ctx: *mut pq_context, seq_id: u64, layer: i32, query: *const pq_tensor,
                        selection: *const pq_selection, scale: f32, out: *mut f32,
                        out_lse: *mut f32) -> pq_status;
    /// Added in 0.12: the tail estimate alone.
    fn pq_decode_tail(ctx: *mut pq_context, seq_id: u64, layer: i32, query: *const pq_tensor,
                      selection: *const pq_selection, scale: f32, out: *mut f32,
                      out_lse: *mut f32) -> pq_status;
    /// Added in 0.10: the rows and capacity per row of a multi-token select.
    fn pq_selection_capacity_multi(ctx: *const pq_context, seq_id: u64, layer: i32,
                                   query_tokens: i64, rows: i32, out_rows: *mut i64,
                                   out_capacity: *mut i64) -> pq_status;
    /// Added in 0.10: several query tokens in one select; rows padded with -1.
    fn pq_decode_select_multi(ctx: *mut pq_context, seq_id: u64, layer: i32,
                              queries: *const pq_tensor, rows: i32,
                              keys: *const pq_paged_keys, out: *mut pq_selection) -> pq_status;
    fn pq_decode_select_batch(ctx: *mut pq_context, layer: i32, items: *mut pq_select_item,
                              count: i64) -> pq_status;
    fn pq_fetch_kv_batch(ctx: *mut pq_context, layer: i32, items: *mut pq_fetch_item,
                         count: i64) -> pq_status;
    /// Added in 0.7 (CUDA backend): the selection written into device
    /// arrays on the sequence's stream, no host wait.
    fn pq_decode_select_device(ctx: *mut pq_context, seq_id: u64, layer: i32,
                               query: *const pq_tensor, out: *mut pq_selection) -> pq_status;
    /// Added in 0.7: a device selection gathered on the device.
    fn pq_fetch_kv_device(ctx: *mut pq_context, seq_id: u64, layer: i32,
                          selection: *const pq_selection, out_keys: *const pq_tensor,
                          out_values: *const pq_tensor) -> pq_status;
    /// Added in 0.10 (CUDA backend): `pq_decode_select_multi` with queries
    /// and the rows in device memory, on the sequence's stream.
    fn pq_decode_select_multi_device(ctx: *mut pq_context, seq_id: u64, layer: i32,
                                     queries: *const pq_tensor, rows: i32,
                                     out: *mut pq_selection) -> pq_status;
    /// Added in 0.8 (CUDA backend): `pq_decode_select_device` for a batch
    /// at one layer, one launch chain when the sequences share a stream.
    fn pq_decode_select_device_batch(ctx: *mut pq_context, layer: i32,
                                     items: *mut pq_select_item, count: i64) -> pq_status;
    /// Added in 0.8: `pq_fetch_kv_device` for a batch, one gather.
    fn pq_fetch_kv_device_batch(ctx: *mut pq_context, layer: i32, items: *mut pq_fetch_item,
                                count: i64) -> pq_status;
    fn pq_prefill_queries(ctx: *mut pq_context, seq_id: u64, layer: i32,
                          queries: *const pq_tensor) -> pq_status;
    fn pq_observe_attention(ctx: *mut pq_context, seq_id: u64, layer: i32,
                            selection: *const pq_selection, probs: *const f32) -> pq_status;
    fn pq_decode_speculate(ctx: *mut pq_context, seq_id: u64, layer: i32,
                           query_estimate: *const pq_tensor, out: *mut pq_selection) -> pq_status;
    fn pq_sequence_token_classes(ctx: *mut pq_context, seq_id: u64, first: i64, count: i64,
                                 classes: *const u8) -> pq_status;
    fn pq_layer_info_get(ctx: *const pq_context, seq_id: u64, layer: i32,
                         out: *mut pq_layer_info) -> pq_status;
    fn pq_index_codes(ctx: *mut pq_context, seq_id: u64, layer: i32, kv_head: i32, first: i64,
                      count: i64, out: *mut u8) -> pq_status;
    fn pq_index_centroids(ctx: *mut pq_context, seq_id: u64, layer: i32, kv_head: i32,
                          out: *mut f32, out_floats: i64) -> pq_status;
    fn pq_stats_get(ctx: *const pq_context, out: *mut pq_stats) -> pq_status;
    fn pq_sequence_stats_get(ctx: *const pq_context, seq_id: u64, out: *mut pq_stats) -> pq_status;
    fn pq_wait_builds(ctx: *mut pq_context) -> pq_status;
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("functions", &Self::FUNCTION_NAMES.len())
            .finish_non_exhaustive()
    }
}
