// Raw declarations of include/pqcache.h. Do not edit: bindings/rust/generate-sys.sh
// writes this file; rerun it after changing the header.
// Made by bindgen 0.60.1 from include/pqcache.h, enum aliases typed i32.

use crate::{pq_context, pq_pool}; // the opaque handles, declared by hand in lib.rs

pub const PQ_VERSION_MAJOR: i32 = 0;
pub const PQ_VERSION_MINOR: i32 = 15;
pub const PQ_VERSION_PATCH: i32 = 0;
pub const PQ_VERSION_NUMBER: i32 = 1500;
pub const PQ_VERSION_STRING: &[u8; 7usize] = b"0.15.0\0";
pub const PQ_SELECTOR_COUNT: i32 = 19;
pub const PQ_OK: pq_status = 0;
pub const PQ_ERR_INVALID_ARGUMENT: pq_status = -1;
pub const PQ_ERR_OUT_OF_MEMORY: pq_status = -2;
pub const PQ_ERR_BAD_STATE: pq_status = -3;
pub const PQ_ERR_NOT_FOUND: pq_status = -4;
pub const PQ_ERR_UNSUPPORTED: pq_status = -5;
pub const PQ_ERR_BACKEND: pq_status = -6;
pub const PQ_ERR_INTERNAL: pq_status = -7;
pub const PQ_ERR_BUFFER_TOO_SMALL: pq_status = -8;
pub const PQ_ERR_CORRUPT: pq_status = -9;
pub const PQ_ERR_INCOMPATIBLE: pq_status = -10;
pub type pq_status = i32;
pub const PQ_DTYPE_F32: pq_dtype = 0;
pub const PQ_DTYPE_F16: pq_dtype = 1;
pub const PQ_DTYPE_BF16: pq_dtype = 2;
pub const PQ_DTYPE_FP8_E4M3: pq_dtype = 3;
pub const PQ_DTYPE_FP8_E5M2: pq_dtype = 4;
pub type pq_dtype = i32;
pub const PQ_MEMORY_HOST: pq_memory = 0;
pub const PQ_MEMORY_DEVICE: pq_memory = 1;
pub type pq_memory = i32;
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
pub type pq_selector = i32;
pub const PQ_GQA_SUM_SOFTMAX: pq_gqa_combine = 0;
pub const PQ_GQA_MAX: pq_gqa_combine = 1;
pub const PQ_GQA_MEAN: pq_gqa_combine = 2;
pub type pq_gqa_combine = i32;
pub const PQ_KMEANS_INIT_RANDOM: pq_kmeans_init = 0;
pub const PQ_KMEANS_INIT_KMEANSPP: pq_kmeans_init = 1;
pub type pq_kmeans_init = i32;
pub const PQ_BACKEND_CPU: pq_backend = 0;
pub const PQ_BACKEND_CUDA: pq_backend = 1;
pub const PQ_BACKEND_AUTO: pq_backend = 2;
pub type pq_backend = i32;
pub const PQ_CACHE_LRU: pq_cache_policy = 0;
pub const PQ_CACHE_LFU: pq_cache_policy = 1;
pub type pq_cache_policy = i32;
pub const PQ_ROTARY_NONE: pq_key_rotary = 0;
pub const PQ_ROTARY_HALF: pq_key_rotary = 1;
pub const PQ_ROTARY_INTERLEAVED: pq_key_rotary = 2;
pub type pq_key_rotary = i32;
pub const PQ_POOLING_MAX: pq_pooling = 0;
pub const PQ_POOLING_AVG: pq_pooling = 1;
pub type pq_pooling = i32;
pub const PQ_TAIL_NONE: pq_tail_estimate = 0;
pub const PQ_TAIL_CODE_MEANS: pq_tail_estimate = 1;
pub type pq_tail_estimate = i32;
pub const PQ_LAYOUT_TOKEN_MAJOR: pq_layout = 0;
pub const PQ_LAYOUT_HEAD_MAJOR: pq_layout = 1;
pub type pq_layout = i32;
crate::c_struct! {
#[repr(C)]
pub struct pq_tensor {
    pub data: *mut ::std::os::raw::c_void,
    pub dtype: i32,
    pub memory: i32,
    pub tokens: i64,
    pub heads: i32,
    pub head_dim: i32,
    pub token_stride: i64,
    pub head_stride: i64,
}
}
crate::c_struct! {
#[repr(C)]
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
    pub cuda_plugin_path: *const ::std::os::raw::c_char,
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
    pub kv_tier: i32,
    pub kv_disk_path: *const ::std::os::raw::c_char,
    pub kv_head_offset: i32,
    pub kv_scale_count: i32,
    pub kv_scales: *const f32,
    pub tail_estimate: i32,
    pub pq_outliers: f32,
    pub top_p: f32,
    pub top_p_floor: f32,
}
}
pub const PQ_KV_TIER_HOST: pq_kv_tier = 0;
pub const PQ_KV_TIER_DISK: pq_kv_tier = 1;
pub const PQ_KV_TIER_CALLER: pq_kv_tier = 2;
pub type pq_kv_tier = i32;
pub type pq_destroy_fn =
    ::std::option::Option<unsafe extern "C" fn(user: *mut ::std::os::raw::c_void)>;
pub const PQ_LOG_ERROR: pq_log_level = 0;
pub const PQ_LOG_WARN: pq_log_level = 1;
pub const PQ_LOG_INFO: pq_log_level = 2;
pub const PQ_LOG_DEBUG: pq_log_level = 3;
pub type pq_log_level = i32;
pub type pq_log_fn = ::std::option::Option<
    unsafe extern "C" fn(
        user: *mut ::std::os::raw::c_void,
        level: i32,
        message: *const ::std::os::raw::c_char,
    ),
>;
pub type pq_alloc_fn = ::std::option::Option<
    unsafe extern "C" fn(
        user: *mut ::std::os::raw::c_void,
        bytes: usize,
        alignment: usize,
    ) -> *mut ::std::os::raw::c_void,
>;
pub type pq_free_fn = ::std::option::Option<
    unsafe extern "C" fn(
        user: *mut ::std::os::raw::c_void,
        ptr: *mut ::std::os::raw::c_void,
        bytes: usize,
    ),
>;
pub type pq_build_done_fn = ::std::option::Option<
    unsafe extern "C" fn(
        user: *mut ::std::os::raw::c_void,
        seq_id: u64,
        layer: i32,
        status: pq_status,
    ),
>;
pub const PQ_BUILD_STAGE_KMEANS: pq_build_stage = 0;
pub const PQ_BUILD_STAGE_ENCODE: pq_build_stage = 1;
pub type pq_build_stage = i32;
crate::c_struct! {
#[repr(C)]
pub struct pq_build_progress {
    pub struct_size: u32,
    pub seq_id: u64,
    pub layer: i32,
    pub stage: i32,
    pub done: i64,
    pub total: i64,
    pub fraction: f64,
}
}
pub type pq_build_progress_fn = ::std::option::Option<
    unsafe extern "C" fn(user: *mut ::std::os::raw::c_void, progress: *const pq_build_progress),
>;
pub type pq_disk_read_fn = ::std::option::Option<
    unsafe extern "C" fn(
        user: *mut ::std::os::raw::c_void,
        fd: ::std::os::raw::c_int,
        buf: *mut ::std::os::raw::c_void,
        bytes: u64,
        offset: u64,
    ) -> i64,
>;
pub type pq_disk_write_fn = ::std::option::Option<
    unsafe extern "C" fn(
        user: *mut ::std::os::raw::c_void,
        fd: ::std::os::raw::c_int,
        buf: *const ::std::os::raw::c_void,
        bytes: u64,
        offset: u64,
    ) -> i64,
>;
crate::c_struct! {
#[repr(C)]
pub struct pq_hooks {
    pub struct_size: u32,
    pub log: pq_log_fn,
    pub log_user: *mut ::std::os::raw::c_void,
    pub log_level: i32,
    pub host_alloc: pq_alloc_fn,
    pub host_free: pq_free_fn,
    pub alloc_user: *mut ::std::os::raw::c_void,
    pub build_done: pq_build_done_fn,
    pub build_done_user: *mut ::std::os::raw::c_void,
    pub pool: *mut pq_pool,
    pub disk_read: pq_disk_read_fn,
    pub disk_write: pq_disk_write_fn,
    pub disk_user: *mut ::std::os::raw::c_void,
    pub build_progress: pq_build_progress_fn,
    pub build_progress_user: *mut ::std::os::raw::c_void,
}
}
pub type pq_write_fn = ::std::option::Option<
    unsafe extern "C" fn(
        user: *mut ::std::os::raw::c_void,
        data: *const ::std::os::raw::c_void,
        size: usize,
    ) -> ::std::os::raw::c_int,
>;
crate::c_struct! {
#[repr(C)]
pub struct pq_paged_keys {
    pub pool: pq_tensor,
    pub slots: *const i64,
    pub block_table: *const i32,
    pub block_size: i32,
    pub map_length: i64,
    pub tokens: i64,
}
}
crate::c_struct! {
#[repr(C)]
pub struct pq_selection {
    pub positions: *mut i32,
    pub counts: *mut i32,
    pub capacity: i64,
}
}
pub const PQ_ROWS_PER_TOKEN: pq_select_rows = 0;
pub const PQ_ROWS_PER_HEAD: pq_select_rows = 1;
pub const PQ_ROWS_PER_REQUEST: pq_select_rows = 2;
pub type pq_select_rows = i32;
crate::c_struct! {
#[repr(C)]
pub struct pq_select_item {
    pub seq_id: u64,
    pub query: pq_tensor,
    pub out: pq_selection,
    pub status: pq_status,
}
}
crate::c_struct! {
#[repr(C)]
pub struct pq_fetch_item {
    pub seq_id: u64,
    pub selection: pq_selection,
    pub out_keys: pq_tensor,
    pub out_values: pq_tensor,
    pub status: pq_status,
}
}
pub const PQ_TOKEN_PLAIN: pq_token_class = 0;
pub const PQ_TOKEN_SPECIAL: pq_token_class = 1;
pub const PQ_TOKEN_PUNCTUATION: pq_token_class = 2;
pub type pq_token_class = i32;
crate::c_struct! {
#[repr(C)]
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
crate::c_struct! {
#[repr(C)]
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

// Every function, as crate::pq_functions! takes them: it declares them (feature
// "link") and derives the Api table of function pointers from the same list.
crate::pq_functions! {
extern "C" {
    pub fn pq_version_number() -> ::std::os::raw::c_int;
}
extern "C" {
    pub fn pq_version_string() -> *const ::std::os::raw::c_char;
}
extern "C" {
    pub fn pq_cpu_level() -> *const ::std::os::raw::c_char;
}
extern "C" {
    pub fn pq_status_string(status: i32) -> *const ::std::os::raw::c_char;
}
extern "C" {
    pub fn pq_last_error() -> *const ::std::os::raw::c_char;
}
extern "C" {
    pub fn pq_tensor_init(
        tensor: *mut pq_tensor,
        data: *mut ::std::os::raw::c_void,
        dtype: i32,
        layout: i32,
        tokens: i64,
        heads: i32,
        head_dim: i32,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_config_default(config: *mut pq_config);
}
extern "C" {
    pub fn pq_create(config: *const pq_config, out: *mut *mut pq_context) -> pq_status;
}
extern "C" {
    pub fn pq_destroy(ctx: *mut pq_context);
}
extern "C" {
    pub fn pq_watch_destroy(
        ctx: *mut pq_context,
        fn_: pq_destroy_fn,
        user: *mut ::std::os::raw::c_void,
        out_watch: *mut u64,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_unwatch_destroy(ctx: *mut pq_context, watch: u64) -> pq_status;
}
extern "C" {
    pub fn pq_get_config(ctx: *const pq_context, out: *mut pq_config) -> pq_status;
}
extern "C" {
    pub fn pq_get_backend(ctx: *const pq_context, out_backend: *mut i32) -> pq_status;
}
extern "C" {
    pub fn pq_pool_create(threads: i32, out: *mut *mut pq_pool) -> pq_status;
}
extern "C" {
    pub fn pq_pool_threads(pool: *const pq_pool, out_threads: *mut i32) -> pq_status;
}
extern "C" {
    pub fn pq_pool_destroy(pool: *mut pq_pool);
}
extern "C" {
    pub fn pq_hooks_default(hooks: *mut pq_hooks);
}
extern "C" {
    pub fn pq_create_with_hooks(
        config: *const pq_config,
        hooks: *const pq_hooks,
        out: *mut *mut pq_context,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_sequence_add(ctx: *mut pq_context, seq_id: u64) -> pq_status;
}
extern "C" {
    pub fn pq_sequence_remove(ctx: *mut pq_context, seq_id: u64) -> pq_status;
}
extern "C" {
    pub fn pq_sequence_length(
        ctx: *const pq_context,
        seq_id: u64,
        layer: i32,
        out_tokens: *mut i64,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_sequence_count(ctx: *const pq_context, out_count: *mut i64) -> pq_status;
}
extern "C" {
    pub fn pq_sequence_set_stream(
        ctx: *mut pq_context,
        seq_id: u64,
        cuda_stream: *mut ::std::os::raw::c_void,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_sequence_truncate(ctx: *mut pq_context, seq_id: u64, tokens: i64) -> pq_status;
}
extern "C" {
    pub fn pq_sequence_reserve(ctx: *mut pq_context, seq_id: u64, tokens: i64) -> pq_status;
}
extern "C" {
    pub fn pq_sequence_fork(ctx: *mut pq_context, parent_id: u64, child_id: u64) -> pq_status;
}
extern "C" {
    pub fn pq_sequence_save(
        ctx: *mut pq_context,
        seq_id: u64,
        write: pq_write_fn,
        user: *mut ::std::os::raw::c_void,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_sequence_state_size(
        ctx: *mut pq_context,
        seq_id: u64,
        out_bytes: *mut u64,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_sequence_save_buffer(
        ctx: *mut pq_context,
        seq_id: u64,
        buffer: *mut ::std::os::raw::c_void,
        capacity: u64,
        out_written: *mut u64,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_sequence_save_file(
        ctx: *mut pq_context,
        seq_id: u64,
        path: *const ::std::os::raw::c_char,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_sequence_restore(
        ctx: *mut pq_context,
        seq_id: u64,
        data: *const ::std::os::raw::c_void,
        size: u64,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_sequence_restore_file(
        ctx: *mut pq_context,
        seq_id: u64,
        path: *const ::std::os::raw::c_char,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_sequence_restore_begin(
        ctx: *mut pq_context,
        seq_id: u64,
        data: *const ::std::os::raw::c_void,
        size: u64,
        out_consumed: *mut u64,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_sequence_restore_kv(
        ctx: *mut pq_context,
        seq_id: u64,
        data: *const ::std::os::raw::c_void,
        size: u64,
        out_consumed: *mut u64,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_prefill_layer(
        ctx: *mut pq_context,
        seq_id: u64,
        layer: i32,
        keys: *const pq_tensor,
        values: *const pq_tensor,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_decode_append(
        ctx: *mut pq_context,
        seq_id: u64,
        layer: i32,
        keys: *const pq_tensor,
        values: *const pq_tensor,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_prefill_layer_paged(
        ctx: *mut pq_context,
        seq_id: u64,
        layer: i32,
        keys: *const pq_paged_keys,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_decode_append_paged(
        ctx: *mut pq_context,
        seq_id: u64,
        layer: i32,
        keys: *const pq_paged_keys,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_selection_capacity(
        ctx: *const pq_context,
        seq_id: u64,
        layer: i32,
        out_capacity: *mut i64,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_selection_capacity_for(
        ctx: *const pq_context,
        layer: i32,
        tokens: i64,
        out_capacity: *mut i64,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_decode_select(
        ctx: *mut pq_context,
        seq_id: u64,
        layer: i32,
        query: *const pq_tensor,
        out: *mut pq_selection,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_fetch_kv(
        ctx: *mut pq_context,
        seq_id: u64,
        layer: i32,
        selection: *const pq_selection,
        out_keys: *const pq_tensor,
        out_values: *const pq_tensor,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_decode_attend(
        ctx: *mut pq_context,
        seq_id: u64,
        layer: i32,
        query: *const pq_tensor,
        selection: *const pq_selection,
        scale: f32,
        out: *mut f32,
        out_lse: *mut f32,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_decode_tail(
        ctx: *mut pq_context,
        seq_id: u64,
        layer: i32,
        query: *const pq_tensor,
        selection: *const pq_selection,
        scale: f32,
        out: *mut f32,
        out_lse: *mut f32,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_selection_capacity_multi(
        ctx: *const pq_context,
        seq_id: u64,
        layer: i32,
        query_tokens: i64,
        rows: i32,
        out_rows: *mut i64,
        out_capacity: *mut i64,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_decode_select_multi(
        ctx: *mut pq_context,
        seq_id: u64,
        layer: i32,
        queries: *const pq_tensor,
        rows: i32,
        keys: *const pq_paged_keys,
        out: *mut pq_selection,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_decode_select_batch(
        ctx: *mut pq_context,
        layer: i32,
        items: *mut pq_select_item,
        count: i64,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_fetch_kv_batch(
        ctx: *mut pq_context,
        layer: i32,
        items: *mut pq_fetch_item,
        count: i64,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_decode_select_device(
        ctx: *mut pq_context,
        seq_id: u64,
        layer: i32,
        query: *const pq_tensor,
        out: *mut pq_selection,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_decode_select_multi_device(
        ctx: *mut pq_context,
        seq_id: u64,
        layer: i32,
        queries: *const pq_tensor,
        rows: i32,
        out: *mut pq_selection,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_fetch_kv_device(
        ctx: *mut pq_context,
        seq_id: u64,
        layer: i32,
        selection: *const pq_selection,
        out_keys: *const pq_tensor,
        out_values: *const pq_tensor,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_decode_select_device_batch(
        ctx: *mut pq_context,
        layer: i32,
        items: *mut pq_select_item,
        count: i64,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_fetch_kv_device_batch(
        ctx: *mut pq_context,
        layer: i32,
        items: *mut pq_fetch_item,
        count: i64,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_prefill_queries(
        ctx: *mut pq_context,
        seq_id: u64,
        layer: i32,
        queries: *const pq_tensor,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_observe_attention(
        ctx: *mut pq_context,
        seq_id: u64,
        layer: i32,
        selection: *const pq_selection,
        probs: *const f32,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_sequence_token_classes(
        ctx: *mut pq_context,
        seq_id: u64,
        first: i64,
        count: i64,
        classes: *const u8,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_decode_speculate(
        ctx: *mut pq_context,
        seq_id: u64,
        layer: i32,
        query_estimate: *const pq_tensor,
        out: *mut pq_selection,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_layer_info_get(
        ctx: *const pq_context,
        seq_id: u64,
        layer: i32,
        out: *mut pq_layer_info,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_index_codes(
        ctx: *mut pq_context,
        seq_id: u64,
        layer: i32,
        kv_head: i32,
        first: i64,
        count: i64,
        out: *mut u8,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_index_centroids(
        ctx: *mut pq_context,
        seq_id: u64,
        layer: i32,
        kv_head: i32,
        out: *mut f32,
        out_floats: i64,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_stats_get(ctx: *const pq_context, out: *mut pq_stats) -> pq_status;
}
extern "C" {
    pub fn pq_sequence_stats_get(
        ctx: *const pq_context,
        seq_id: u64,
        out: *mut pq_stats,
    ) -> pq_status;
}
extern "C" {
    pub fn pq_wait_builds(ctx: *mut pq_context) -> pq_status;
}
}
