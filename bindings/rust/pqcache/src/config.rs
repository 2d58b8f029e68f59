use std::path::{Path, PathBuf};

use pqcache_sys as sys;

/// Declares a `#[repr(i32)]` enum over the header's constants, with
/// `TryFrom<i32>` for values coming back from the library.
macro_rules! c_enum {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$vmeta:meta])* $variant:ident = $value:path,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(i32)]
        pub enum $name { $($(#[$vmeta])* $variant = $value,)* }

        impl $name {
            /// Every variant with its Rust name, in declaration order.
            pub const ALL: &'static [(&'static str, $name)] =
                &[$((stringify!($variant), $name::$variant),)*];
        }

        impl TryFrom<i32> for $name {
            type Error = i32;
            /// The variant of a C value, or the value back if unknown.
            fn try_from(value: i32) -> Result<Self, i32> {
                match value {
                    $($value => Ok($name::$variant),)*
                    other => Err(other),
                }
            }
        }
    };
}

c_enum! {
    /// Element type of K/V/Q buffers (the cache stores K/V in it).
    pub enum DType {
        F32 = sys::PQ_DTYPE_F32,
        /// IEEE 754 binary16, passed as `u16` bits.
        F16 = sys::PQ_DTYPE_F16,
        /// bfloat16 (the top 16 bits of an f32), passed as `u16` bits.
        Bf16 = sys::PQ_DTYPE_BF16,
        /// fp8 e4m3fn (0.10), passed as `u8` codes; K/V only (queries of an
        /// fp8 context are F32, F16 or Bf16). Scales: [`Config::kv_scales`].
        Fp8E4m3 = sys::PQ_DTYPE_FP8_E4M3,
        /// fp8 e5m2 (0.10), passed as `u8` codes; K/V only.
        Fp8E5m2 = sys::PQ_DTYPE_FP8_E5M2,
    }
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::Bf16 => 2,
            DType::Fp8E4m3 | DType::Fp8E5m2 => 1,
        }
    }
}

c_enum! {
    /// How the middle tokens are selected (see pqcache.h for each method).
    pub enum Selector {
        /// PQCache: PQ codes and a lookup table.
        Pq = sys::PQ_SELECTOR_PQ,
        /// Exact q.k over every middle key (the oracle).
        Exact = sys::PQ_SELECTOR_EXACT,
        /// StreamingLLM: sinks plus a longer local window.
        Window = sys::PQ_SELECTOR_WINDOW,
        SparQ = sys::PQ_SELECTOR_SPARQ,
        InfLlm = sys::PQ_SELECTOR_INFLLM,
        Quest = sys::PQ_SELECTOR_QUEST,
        Random = sys::PQ_SELECTOR_RANDOM,
        H2o = sys::PQ_SELECTOR_H2O,
        Scope = sys::PQ_SELECTOR_SCOPE,
        SnapKv = sys::PQ_SELECTOR_SNAPKV,
        PyramidKv = sys::PQ_SELECTOR_PYRAMIDKV,
        Scissorhands = sys::PQ_SELECTOR_SCISSORHANDS,
        Keyformer = sys::PQ_SELECTOR_KEYFORMER,
        ClusterKv = sys::PQ_SELECTOR_CLUSTERKV,
        AdaKv = sys::PQ_SELECTOR_ADAKV,
        ZigZagKv = sys::PQ_SELECTOR_ZIGZAGKV,
        PyramidInfer = sys::PQ_SELECTOR_PYRAMIDINFER,
        FastGen = sys::PQ_SELECTOR_FASTGEN,
        InfiniGen = sys::PQ_SELECTOR_INFINIGEN,
    }
}

/// `PQ_SELECTOR_COUNT`, one past the last selector: [`Selector::ALL`] has
/// this many variants, with the values 0 to `SELECTOR_COUNT - 1`
/// (tests/selectors.rs checks both against the header's `enum pq_selector`).
pub const SELECTOR_COUNT: usize = sys::PQ_SELECTOR_COUNT as usize;

c_enum! {
    /// How a GQA group's query heads combine into one score per kv head.
    pub enum GqaCombine {
        SumSoftmax = sys::PQ_GQA_SUM_SOFTMAX,
        Max = sys::PQ_GQA_MAX,
        Mean = sys::PQ_GQA_MEAN,
    }
}

c_enum! {
    /// K-Means initialisation.
    pub enum KmeansInit {
        Random = sys::PQ_KMEANS_INIT_RANDOM,
        KmeansPlusPlus = sys::PQ_KMEANS_INIT_KMEANSPP,
    }
}

c_enum! {
    /// Compute backend of a context.
    pub enum Backend {
        Cpu = sys::PQ_BACKEND_CPU,
        /// The CUDA plug-in; `create` fails with NotFound without it or a device.
        Cuda = sys::PQ_BACKEND_CUDA,
        /// CUDA when available, else CPU.
        Auto = sys::PQ_BACKEND_AUTO,
    }
}

c_enum! {
    /// Eviction policy of the block cache.
    pub enum CachePolicy {
        Lru = sys::PQ_CACHE_LRU,
        Lfu = sys::PQ_CACHE_LFU,
    }
}

c_enum! {
    /// How a head's rotary pairs are laid out (`pq_key_rotary`), so that
    /// each PQ subspace holds whole pairs.
    pub enum KeyRotary {
        None = sys::PQ_ROTARY_NONE,
        /// Dimension i with i + D/2: Hugging Face Llama, Qwen2, Gemma.
        Half = sys::PQ_ROTARY_HALF,
        /// Dimension 2i with 2i + 1: GPT-J, GGUF.
        Interleaved = sys::PQ_ROTARY_INTERLEAVED,
    }
}

c_enum! {
    /// SnapKV, PyramidKV and SCOPE's pooling of window scores (`pq_pooling`).
    pub enum Pooling {
        Max = sys::PQ_POOLING_MAX,
        /// The official SnapKV code's.
        Avg = sys::PQ_POOLING_AVG,
    }
}

c_enum! {
    /// What [`crate::Context::attend`] adds for the middle tokens a selection
    /// leaves out (`pq_tail_estimate`, added in 0.12).
    pub enum TailEstimate {
        /// Nothing: the selected rows alone (the default).
        None = sys::PQ_TAIL_NONE,
        /// Each left-out coded middle token with its lookup-table score as
        /// logit and its first code's mean value. Needs `Selector::Pq`.
        CodeMeans = sys::PQ_TAIL_CODE_MEANS,
    }
}

c_enum! {
    /// Where each layer's K/V rows live (`pq_kv_tier`).
    pub enum KvTier {
        /// Host memory (the default).
        Host = sys::PQ_KV_TIER_HOST,
        /// A file in [`Config::kv_disk_path`]'s directory: the sink and
        /// local-window chunks stay in memory, the rest is read back by
        /// selection. CPU backend only.
        Disk = sys::PQ_KV_TIER_DISK,
        /// The caller's own (paged) pool (added in 0.10): the library keeps
        /// the index only. Values may be `None` in [`crate::Context::prefill`]
        /// and [`crate::Context::append`], keys may come from a paged pool
        /// ([`crate::Context::prefill_paged`]); fetch, attend and save are
        /// `Unsupported`. Selectors Pq, Window and Random; CPU backend.
        Caller = sys::PQ_KV_TIER_CALLER,
    }
}

c_enum! {
    /// The rows [`crate::Context::select_multi`] writes (`pq_select_rows`),
    /// each ascending and padded with -1 up to the capacity.
    pub enum SelectRows {
        /// Row `t * num_kv_heads + h`: token t's selection for kv head h.
        PerToken = sys::PQ_ROWS_PER_TOKEN,
        /// Row h: the union over the query tokens of kv head h's selections.
        PerHead = sys::PQ_ROWS_PER_HEAD,
        /// One row: the union over the query tokens and kv heads.
        PerRequest = sys::PQ_ROWS_PER_REQUEST,
    }
}

/// A context configuration: the library's defaults (`pq_config_default`)
/// plus what the builder methods set. The model geometry (`num_layers`,
/// `num_q_heads`, `num_kv_heads`, `head_dim`) has no default and must be set.
///
/// Setters are named after the C fields; `pqcache.h` documents each one and
/// [`crate::Library::create`] validates them (an invalid one is an
/// `InvalidArgument` error naming the field). [`Config::as_raw_mut`] reaches
/// any field directly.
#[derive(Debug, Clone)]
pub struct Config {
    /// Always holds a NULL cuda_plugin_path, kv_disk_path and kv_scales:
    /// the paths live in `plugin_path` and `disk_path`, the scales in
    /// `scales`, and are lent to the library during pq_create only.
    raw: sys::pq_config,
    plugin_path: Option<PathBuf>,
    disk_path: Option<PathBuf>,
    scales: Vec<f32>,
}

// SAFETY: the only pointers in the raw struct, cuda_plugin_path,
// kv_disk_path and kv_scales, are kept NULL (see the field's comment); everything else is
// plain data.
unsafe impl Send for Config {}
unsafe impl Sync for Config {}

macro_rules! setters {
    ($($(#[$doc:meta])* $field:ident: $ty:ty $(=> $conv:expr)?;)*) => {
        $(
            $(#[$doc])*
            pub fn $field(mut self, value: $ty) -> Self {
                self.raw.$field = setters!(@convert value $(, $conv)?);
                self
            }
        )*
    };
    (@convert $value:ident) => { $value };
    (@convert $value:ident, $conv:expr) => { ($conv)($value) };
}

impl Config {
    /// The linked library's defaults.
    #[cfg(feature = "link")]
    pub fn new() -> Config {
        crate::Library::linked().default_config()
    }

    pub(crate) fn from_raw(mut raw: sys::pq_config) -> Config {
        raw.cuda_plugin_path = std::ptr::null();
        raw.kv_disk_path = std::ptr::null();
        raw.kv_scales = std::ptr::null();
        Config {
            raw,
            plugin_path: None,
            disk_path: None,
            scales: Vec::new(),
        }
    }

    /// The C struct (cuda_plugin_path and kv_disk_path are NULL here; see
    /// [`Config::cuda_plugin_path`] and [`Config::kv_disk_path`]).
    pub fn as_raw(&self) -> &sys::pq_config {
        &self.raw
    }

    /// Any field, for settings without a builder method. A pointer written
    /// into `cuda_plugin_path` or `kv_disk_path` here is ignored: use
    /// [`Config::cuda_plugin_path`] and [`Config::kv_disk_path`].
    pub fn as_raw_mut(&mut self) -> &mut sys::pq_config {
        &mut self.raw
    }

    pub(crate) fn cuda_plugin_path_ref(&self) -> Option<&Path> {
        self.plugin_path.as_deref()
    }

    pub(crate) fn kv_disk_path_ref(&self) -> Option<&Path> {
        self.disk_path.as_deref()
    }

    pub(crate) fn kv_scales_ref(&self) -> &[f32] {
        &self.scales
    }

    /// fp8 scales (0.10; real = stored * scale): `count` 0 (every scale 1),
    /// 1 (per layer) or num_kv_heads (per kv head), and `scales` laid out
    /// [num_layers][2][count], K then V. Copied here; the library checks
    /// them at create (an error names the bad index) and keeps its own copy.
    pub fn kv_scales(mut self, count: i32, scales: &[f32]) -> Self {
        self.raw.kv_scale_count = count;
        self.scales = scales.to_vec();
        self
    }

    /// The four geometry fields at once: layers, query heads, kv heads, head_dim.
    pub fn geometry(
        self,
        num_layers: i32,
        num_q_heads: i32,
        num_kv_heads: i32,
        head_dim: i32,
    ) -> Self {
        self.num_layers(num_layers)
            .num_q_heads(num_q_heads)
            .num_kv_heads(num_kv_heads)
            .head_dim(head_dim)
    }

    /// The CUDA plug-in file (default: the library's search order).
    pub fn cuda_plugin_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.plugin_path = Some(path.into());
        self
    }

    /// The directory of the disk tier's K/V file ([`KvTier::Disk`]; an
    /// unnamed file, gone with the process). Read during create only;
    /// ignored by the host tier.
    pub fn kv_disk_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.disk_path = Some(path.into());
        self
    }

    setters! {
        num_layers: i32;
        num_q_heads: i32;
        num_kv_heads: i32;
        head_dim: i32;
        /// Element type of K/V/Q (default F16).
        dtype: DType => |d: DType| d as i32;
        /// m, subspaces per head (default 0: chosen from head_dim).
        pq_subspaces: i32;
        /// b, bits per code, 1..=8 (default 0: 8).
        pq_bits: i32;
        /// A fixed K-Means iteration count (0: adaptive, the default).
        kmeans_iterations: i32;
        kmeans_min_iterations: i32;
        kmeans_max_iterations: i32;
        kmeans_tolerance: f32;
        kmeans_init: KmeansInit => |k: KmeansInit| k as i32;
        kmeans_max_points_per_centroid: i32;
        /// K-Means seed: the same seed gives the same index.
        seed: u64;
        compute_alpha: f64;
        compute_beta: f64;
        compute_gamma: f64;
        layer_time_budget: f64;
        /// Index build threads (0: one per hardware thread).
        worker_threads: i32;
        selector: Selector => |s: Selector| s as i32;
        sink_tokens: i32;
        local_tokens: i32;
        /// Middle tokens per kv head (> 0 overrides topk_fraction).
        topk_tokens: i32;
        topk_fraction: f32;
        gqa_combine: GqaCombine => |g: GqaCombine| g as i32;
        /// Bytes of K/V the context may hold (0: unlimited).
        host_memory_limit: u64;
        backend: Backend => |b: Backend| b as i32;
        device_id: i32;
        sparq_dims: i32;
        block_tokens: i32;
        block_representatives: i32;
        observation_window: i32;
        pooling_kernel: i32;
        pyramid_ratio: f32;
        scope_decode_share: f32;
        /// Block cache capacity in tokens (0: off).
        cache_tokens: i64;
        cache_block_tokens: i32;
        cache_policy: CachePolicy => |p: CachePolicy| p as i32;
        /// Blocks ranked per cache update (the paper's k_cache; 0: all slots).
        cache_update_blocks: i32;
        /// The rotary layout of keys and queries (default None).
        key_rotary: KeyRotary => |r: KeyRotary| r as i32;
        /// Exact re-ranking of (1 + r) * k candidates (0: off, the default).
        pq_rerank: f32;
        pooling: Pooling => |p: Pooling| p as i32;
        /// Background index rebuild when the tokens past the build pass this
        /// share of the sequence (0: off, the default).
        pq_rebuild_share: f32;
        /// Scissorhands: the steps over which a token's hits count (default 400).
        history_window: i32;
        /// Keyformer: the Gumbel softmax's temperature at the prompt (default 1).
        keyformer_tau: f32;
        /// Keyformer: what each later step adds to it (default 1/128).
        keyformer_tau_step: f32;
        /// ClusterKV: clusters of the middle at the first select (default 400).
        cluster_count: i32;
        /// AdaKV: the share of k each kv head keeps of its own top tokens (default 0.2).
        adakv_safeguard: f32;
        /// ZigZagKV: the share of a head's attention mass its minimum budget covers (default 0.9).
        zigzag_mass: f32;
        /// ZigZagKV: each layer's floor, as a share of the mean budget (default 0.2).
        zigzag_floor: f32;
        /// PyramidInfer: the ratio of its cosine schedule at the top layer (default 0.9).
        pyramidinfer_decay: f32;
        /// FastGen: the share of the window's attention a head's policy keeps (default 0.9).
        fastgen_recovery: f32;
        /// InfiniGen: the share of head_dim kept of each key (default 0.2).
        infinigen_partial_ratio: f32;
        /// InfiniGen: how far below a head's best score a token still counts (default 4).
        infinigen_alpha: f32;
        /// Where the K/V rows live (default Host); Disk needs [`Config::kv_disk_path`].
        kv_tier: KvTier => |t: KvTier| t as i32;
        /// The model's index of this context's kv head 0, for one context
        /// per tensor-parallel rank holding a slice of the kv heads: the
        /// ranks then select what one context with every kv head selects
        /// (default 0).
        kv_head_offset: i32;
        /// What attend adds for the middle tokens the selection leaves out
        /// (default None; added in 0.12).
        tail_estimate: TailEstimate => |t: TailEstimate| t as i32;
        /// PQ: the share of the middle with the largest quantization
        /// residuals, scored by their exact q.k (0: off, the default; at
        /// most 0.25; added in 0.13).
        pq_outliers: f32;
        /// Budgets per kv head and step: of the k best-scored middle
        /// tokens, the fewest whose estimated attention mass reaches this
        /// share of the middle's (0: off, the default; at most 1; added in
        /// 0.15). PQ, Exact or SparQ with the sum-of-softmaxes combine and
        /// no re-ranking.
        top_p: f32;
        /// The fewest middle tokens a kv head keeps under top_p, as a
        /// share of the middle (default 0.02; added in 0.15).
        top_p_floor: f32;
    }
}

#[cfg(feature = "link")]
impl Default for Config {
    fn default() -> Config {
        Config::new()
    }
}
