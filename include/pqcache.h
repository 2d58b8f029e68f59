/*
 * pqcache.h - the public C API of libpqcache.
 *
 * libpqcache keeps the KV cache of long prompts in host memory, builds a
 * product-quantization (PQ) index of the keys of every (layer, kv head), and
 * at each decode step selects the past tokens that matter for the current
 * query (PQCache, SIGMOD 2025). This is the only public header. It is plain
 * C99 and is meant to be consumed from C, C++, SWIG (Go, Java, Python), cgo
 * and Rust FFI.
 *
 * Conventions (the same for every function):
 *  - Every function returns a pq_status. PQ_OK (0) is success, errors are
 *    negative. On error, pq_last_error() returns a message for the calling
 *    thread that names the argument, the value and what was expected.
 *  - Output parameters are written only on success.
 *  - No C++ exception ever crosses this API.
 *  - Structs that may grow carry a struct_size field; fill them with the
 *    matching *_default / *_init function so that a caller compiled against
 *    an older header keeps working with a newer library.
 *  - Enum values travel as int32_t, in struct fields and in parameters, so
 *    that layouts do not depend on the compiler's enum size (Rust, cgo) and
 *    an out-of-range value from C is an error, not undefined behaviour in
 *    the C++ core.
 *  - Token positions are int32_t: one sequence holds at most INT32_MAX tokens.
 *
 * Threading contract (sqlite3.h style; each function repeats its own rule):
 *  - A pq_context is thread-safe. Calls that name different sequences may run
 *    concurrently from any threads.
 *  - Calls that name the same sequence and different layers may also run
 *    concurrently. Calls on the same (sequence, layer) are serialised by the
 *    library (they take that layer's lock), so they are safe but do not
 *    overlap.
 *  - pq_destroy must not race with any other call on the same context.
 *  - pq_sequence_remove may race with calls on that sequence: those calls
 *    either finish on the data they already hold or return PQ_ERR_NOT_FOUND.
 *  - The library keeps no global mutable state: two contexts share nothing
 *    unless the caller gives them one worker pool (pq_pool).
 *  - Device work (CUDA backend) outlives the call that enqueued it: a
 *    fetch queued on a sequence's stream reads that sequence's rows when
 *    the stream gets to it. While it is queued, every call may run on the
 *    sequence, pq_sequence_truncate, pq_sequence_remove and appends
 *    included: store blocks and device buffers they let go of are handed
 *    to another sequence only once the work enqueued before the release,
 *    on every stream, has run (events, queried without waiting), so the
 *    fetch returns the rows it was given. What the caller must order
 *    itself: its own writes to the fetch's outputs, and the replays of a
 *    CUDA graph that captured a step, which must finish before the
 *    sequence is truncated or removed (a capture records no release fence).
 *  - Callbacks (pq_hooks, pq_write_fn) may run on the library's worker
 *    threads and on the calling thread, concurrently: each says what it may
 *    call.
 *
 * Arguments: a call reads its inputs (descriptors, selections, queries,
 * probabilities, a batch's items) once, into the library's own memory,
 * before it writes any output, and checks and uses that copy. An output may
 * therefore lie over an input of the same call (it is overwritten after it
 * was read), and a caller thread that rewrites an input during the call
 * cannot make the call read out of bounds. Outputs must not overlap one
 * another (PQ_ERR_INVALID_ARGUMENT naming both): they would overwrite each
 * other.
 */
#ifndef PQCACHE_H
#define PQCACHE_H

#include <stddef.h>
#include <stdint.h>

/* PQ_API marks exported functions. SWIG cannot parse GNU attributes, so the
 * macro is empty when SWIG reads this header. */
#if defined(SWIG)
#define PQ_API
#elif defined(_WIN32)
#if defined(PQCACHE_BUILDING_LIBRARY)
#define PQ_API __declspec(dllexport)
#else
#define PQ_API __declspec(dllimport)
#endif
#elif defined(__GNUC__) || defined(__clang__)
#define PQ_API __attribute__((visibility("default")))
#else
#define PQ_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Versions                                                                 */
/* ------------------------------------------------------------------------ */

/* The ABI major is the SONAME (libpqcache.so.<PQ_VERSION_MAJOR>). A change
 * that breaks binary compatibility bumps it. */
#define PQ_VERSION_MAJOR 0
#define PQ_VERSION_MINOR 15
#define PQ_VERSION_PATCH 0
#define PQ_VERSION_NUMBER \
  (PQ_VERSION_MAJOR * 10000 + PQ_VERSION_MINOR * 100 + PQ_VERSION_PATCH)
#define PQ_VERSION_STRING "0.15.0"

/* The version of the library loaded at run time, as PQ_VERSION_NUMBER.
 * Thread-safe. */
PQ_API int pq_version_number(void);
/* The same as a static string, "MAJOR.MINOR.PATCH". Thread-safe. */
PQ_API const char* pq_version_string(void);
/* The CPU kernels this process uses, as a static string: "avx512" (AVX-512
 * F/BW/DQ/VL with AVX2, FMA and F16C; "avx512+bf16" where the CPU also has
 * AVX512_BF16), "avx2" (AVX2, FMA, F16C) or "portable". The highest level
 * the CPU has, lowered by the environment variable PQ_CPU_LEVEL
 * ("portable", "avx2", "avx512"), which is read once, at the first call of
 * a kernel or of this function; PQ_CPU_FEATURES=-avx512bf16 (added in
 * 0.14) switches AVX512_BF16 off, and the report then says "avx512".
 * Benchmarks print it with their figures. Thread-safe. (Added in 0.11.) */
PQ_API const char* pq_cpu_level(void);

/* ------------------------------------------------------------------------ */
/* Status codes and errors                                                  */
/* ------------------------------------------------------------------------ */

typedef enum pq_status {
  PQ_OK = 0,
  /* An argument is NULL, out of range or inconsistent with the
   * configuration. The message names it. */
  PQ_ERR_INVALID_ARGUMENT = -1,
  /* An allocation failed or the host memory limit of the context would be
   * exceeded. The call had no effect; the context and sequence stay usable. */
  PQ_ERR_OUT_OF_MEMORY = -2,
  /* The call is valid but not now: for example select before prefill. */
  PQ_ERR_BAD_STATE = -3,
  /* What the call names does not exist: a sequence, a file
   * (pq_sequence_restore_file), a key (the Redis tier, pqcache_redis.h), a
   * watch, the CUDA plug-in or a device. The message names it. */
  PQ_ERR_NOT_FOUND = -4,
  /* A valid request this build or backend does not implement. */
  PQ_ERR_UNSUPPORTED = -5,
  /* Something outside the library failed: the CUDA plug-in or device, the
   * file system (pq_sequence_save_file, _restore_file, the disk tier's K/V
   * file: a full disk, a read error), a caller's
   * callback (pq_write_fn, host_alloc), the Redis server (refused,
   * timed out, out of memory). The message says which and why. */
  PQ_ERR_BACKEND = -6,
  /* A bug in libpqcache. Please report it with the message. */
  PQ_ERR_INTERNAL = -7,
  /* An output buffer is too small; the call wrote the size it needs (see
   * the function) and nothing else. Added in 0.4: before, the same case
   * returned PQ_ERR_INVALID_ARGUMENT. */
  PQ_ERR_BUFFER_TOO_SMALL = -8,
  /* Saved sequence state that is not intact: truncated, a checksum that
   * does not match, a bad magic number or an inconsistent field. The
   * message names the check and the section. Nothing was loaded. (0.5) */
  PQ_ERR_CORRUPT = -9,
  /* Saved sequence state that is intact but cannot be loaded here: a
   * format version this library does not read, or a geometry (layers, kv
   * heads, head_dim, dtype, pq_subspaces, pq_bits, selector) that differs
   * from the context's. The message names the field and both values.
   * Nothing was loaded. (0.5) */
  PQ_ERR_INCOMPATIBLE = -10
} pq_status;

/* A static, human-readable name for a status ("PQ_ERR_INVALID_ARGUMENT: ...").
 * Unknown values give "unknown pq_status". Thread-safe. */
PQ_API const char* pq_status_string(int32_t status);

/* The message of the last failed call made by the calling thread, or "" if
 * none failed yet. Valid until the next failing call on the same thread.
 * Thread-safe (the message is thread-local). */
PQ_API const char* pq_last_error(void);

/* ------------------------------------------------------------------------ */
/* Enumerations                                                             */
/* ------------------------------------------------------------------------ */

/* Element type of the caller's K/V/Q buffers. K/V are stored in this type:
 * an f16 cache takes f16 memory on the host.
 *
 * fp8 (appended in 0.10): K/V stored as one byte per element, as serving
 * engines keep their fp8 KV cache; every key and value the library reads
 * as a number is the stored value times its scale (pq_config.kv_scales:
 * K-Means, the codes, every selector that reads keys, pq_decode_attend).
 * pq_fetch_kv copies the stored bytes (the caller applies its scales, as
 * it does for its own pool). Queries of an fp8 context come in their own
 * dtype, F32, F16 or BF16 (an fp8 query is PQ_ERR_INVALID_ARGUMENT).
 * Codes that are not finite (NaN; for e5m2 also Inf) are rejected at
 * ingest like NaN and Inf of the other dtypes. Every backend, tier and
 * call takes fp8 K/V, the CUDA device step included (its lookup table is
 * built from the query, whose dtype is a float one; rows move as bytes).
 * The saved state of an fp8 context holds its scales
 * (docs/state-format.md). */
typedef enum pq_dtype {
  PQ_DTYPE_F32 = 0,
  PQ_DTYPE_F16 = 1, /* IEEE 754 binary16 */
  PQ_DTYPE_BF16 = 2, /* bfloat16: the top 16 bits of a binary32 */
  /* OCP / NVIDIA e4m3fn (torch.float8_e4m3fn): sign, 4 exponent bits (bias
   * 7), 3 mantissa bits; no Inf, 0x7F and 0xFF are NaN, the largest value
   * is 448. (0.10) */
  PQ_DTYPE_FP8_E4M3 = 3,
  /* e5m2 (torch.float8_e5m2): sign, 5 exponent bits (bias 15), 2 mantissa
   * bits, IEEE-like: exponent 31 is Inf (mantissa 0) or NaN; the top byte
   * of a binary16. (0.10) */
  PQ_DTYPE_FP8_E5M2 = 4
} pq_dtype;

/* Where a tensor's data lives. */
typedef enum pq_memory {
  PQ_MEMORY_HOST = 0,
  PQ_MEMORY_DEVICE = 1 /* CUDA device memory; needs the CUDA backend */
} pq_memory;

/* How a selector picks middle tokens. */
typedef enum pq_selector {
  /* PQCache: approximate q.k through PQ codes and a lookup table. */
  PQ_SELECTOR_PQ = 0,
  /* Oracle: exact q.k over the full keys (reads every middle key). */
  PQ_SELECTOR_EXACT = 1,
  /* StreamingLLM: sinks plus the most recent tokens; the top-k budget
   * extends the local window instead of being chosen by score. */
  PQ_SELECTOR_WINDOW = 2,
  /* SparQ: approximate q.k from the sparq_dims query dimensions of largest
   * magnitude (reads those dimensions of every middle key). */
  PQ_SELECTOR_SPARQ = 3,
  /* InfLLM: blocks of block_tokens tokens, each scored by its
   * block_representatives representative keys; whole blocks are taken in
   * score order until k tokens are chosen. */
  PQ_SELECTOR_INFLLM = 4,
  /* Quest: blocks scored by an upper bound of q.k from the per-block
   * element-wise min and max keys; whole blocks in score order. */
  PQ_SELECTOR_QUEST = 5,
  /* k middle tokens drawn uniformly at random (seeded): a floor. */
  PQ_SELECTOR_RANDOM = 6,
  /* H2O: tokens by accumulated attention; needs pq_observe_attention. A
   * token once left out is dropped for good (drop semantics). */
  PQ_SELECTOR_H2O = 7,
  /* SCOPE: separate budgets for prompt tokens (scored at prefill from the
   * observation window, as SnapKV) and decode tokens (accumulated attention,
   * as H2O); needs pq_prefill_queries and pq_observe_attention. */
  PQ_SELECTOR_SCOPE = 8,
  /* SnapKV: prompt tokens scored once from the last observation_window
   * prompt queries (pooled); needs pq_prefill_queries. */
  PQ_SELECTOR_SNAPKV = 9,
  /* PyramidKV: SnapKV with budgets that shrink linearly with the layer
   * (pyramid_ratio = top-layer budget / bottom-layer budget), same total. */
  PQ_SELECTOR_PYRAMIDKV = 10,
  /* Scissorhands (added in 0.7): the persistence of importance. Each
   * pq_observe_attention call is a step; a token the step covers scores a
   * hit when it got at least uniform attention (probability summed over
   * the group >= group size / tokens observed). Tokens are kept by their
   * share of hits over the steps that observed them among the last
   * history_window steps; one left out is dropped for good. Needs
   * pq_observe_attention. */
  PQ_SELECTOR_SCISSORHANDS = 11,
  /* Keyformer (added in 0.7): tokens by accumulated Gumbel-softmax scores
   * softmax((logit + g) / tau), g Gumbel noise (seeded by config.seed), tau
   * = keyformer_tau + step * keyformer_tau_step. The prompt is a step
   * (pq_prefill_queries: its window rows), each pq_observe_attention call
   * one more (logits = log of the probabilities). A token once left out is
   * dropped for good. */
  PQ_SELECTOR_KEYFORMER = 12,
  /* ClusterKV (added in 0.7): recallable. Each kv head's middle is
   * clustered at the first select (cosine K-Means, cluster_count clusters;
   * tokens entering the middle later, 320 at a time into 8 more); a select
   * takes the clusters best ranked by q . centroid, whole, the last one cut
   * to fit k. Tokens not clustered yet are kept first. */
  PQ_SELECTOR_CLUSTERKV = 13,
  /* AdaKV (added in 0.7): SnapKV's scores with head-wise budgets: the kv
   * heads of a layer keep its top k * num_kv_heads middle tokens over all
   * heads, each head first its own top adakv_safeguard * k (kvpress's
   * AdaKVPress). Heads take different numbers of tokens: each head's count
   * is in pq_selection.counts, and the capacity allows the largest. Tokens
   * generated after the prompt have no score: every head keeps them first,
   * the latest k once there are more (as SNAPKV). Needs
   * pq_prefill_queries. */
  PQ_SELECTOR_ADAKV = 14,
  /* ZigZagKV (added in 0.7): SnapKV's scores with budgets shared across
   * layers: layer l keeps k_l = floor + (k - floor) * num_layers * u_l
   * middle tokens per kv head (floor = zigzag_floor * k, clipped to [1,
   * middle]), u_l its LMBA over the sum of all layers' LMBA. A layer's
   * LMBA is the mean over its kv heads of the fewest prompt tokens whose
   * scores reach zigzag_mass of the head's score mass. Needs
   * pq_prefill_queries on every layer before any select (PQ_ERR_BAD_STATE
   * names the layers missing); each layer's count is in
   * pq_selection.counts, and the capacity allows the largest share. */
  PQ_SELECTOR_ZIGZAGKV = 15,
  /* PyramidInfer (added in 0.7): layer l keeps a subset of what layer l - 1
   * kept, chosen by layer l - 1's prompt attention (the observation
   * window's rows, averaged over all heads, newer rows weighted up to 1.2),
   * with budgets k_l proportional to the share r_0 ... r_(l-1) of the
   * authors' cosine schedule r_j from 1 down to pyramidinfer_decay (mean k
   * over layers). Every kv head of a layer keeps the same tokens. Needs
   * pq_prefill_queries on layers 0 to l - 1 before layer l selects
   * (PQ_ERR_BAD_STATE names the layers missing). */
  PQ_SELECTOR_PYRAMIDINFER = 16,
  /* FastGen (added in 0.7): a policy per kv head, chosen at
   * pq_prefill_queries from the observation window's attention: the first
   * of special tokens, + punctuation, + heavy hitters, + a recent window,
   * full whose kept share of the window's attention (sinks and the local
   * window counted) reaches fastgen_recovery. The heavy hitters are
   * ceil(k / 2) middle tokens by mean attention since the token was
   * stored (the profile's share, then each pq_observe_attention, as
   * cold-compress ranks them; dropped for good once left out), the recent
   * window the newest k - ceil(k / 2) middle tokens.
   * Needs pq_sequence_token_classes (before pq_prefill_queries) and
   * pq_prefill_queries; heads take different numbers of tokens (in
   * pq_selection.counts; a full head keeps the whole middle, so the
   * capacity is the middle). */
  PQ_SELECTOR_FASTGEN = 17,
  /* InfiniGen (added in 0.7): recallable, made for pq_decode_speculate. At
   * pq_prefill_queries each kv head fixes a skew A (the right singular
   * vectors of its window queries) and the infinigen_partial_ratio *
   * head_dim columns of largest |q A| summed over those queries; every key
   * is kept as those columns of k A (its partial key). A select scores the
   * middle by the partial q.k / sqrt(head_dim), averaged over the GQA
   * group, and every kv head takes its top n, n the mean over kv heads of
   * the tokens within infinigen_alpha of the head's best score, at most k
   * (counts in pq_selection.counts). Needs pq_prefill_queries. */
  PQ_SELECTOR_INFINIGEN = 18
} pq_selector;
/* One past the last selector: the number of pq_selector values, 0 to
 * PQ_SELECTOR_COUNT - 1. Every binding checks its copy of the enum against
 * it and the values above. */
#define PQ_SELECTOR_COUNT 19

/* How the query heads of one GQA group combine into one score per kv head. */
typedef enum pq_gqa_combine {
  /* Softmax over the middle tokens per query head, then the sum over the
   * group's heads (what the official PQCache code does). */
  PQ_GQA_SUM_SOFTMAX = 0,
  /* The largest scaled logit q.k/sqrt(d) over the group's heads. */
  PQ_GQA_MAX = 1,
  /* The mean scaled logit over the group's heads. */
  PQ_GQA_MEAN = 2
} pq_gqa_combine;

/* K-Means initialisation. */
typedef enum pq_kmeans_init {
  /* k distinct training points drawn at random (seeded). */
  PQ_KMEANS_INIT_RANDOM = 0,
  /* k-means++ (D^2 sampling, seeded): better starts, one extra pass. */
  PQ_KMEANS_INIT_KMEANSPP = 1
} pq_kmeans_init;

/* Which compute backend a context uses. */
typedef enum pq_backend {
  /* Host threads. Always available. */
  PQ_BACKEND_CPU = 0,
  /* The CUDA plug-in (libpqcache_cuda.so), loaded at run time. pq_create
   * fails with PQ_ERR_NOT_FOUND if the plug-in or a device is missing. */
  PQ_BACKEND_CUDA = 1,
  /* CUDA if the plug-in loads and a device is present, else CPU. */
  PQ_BACKEND_AUTO = 2
} pq_backend;

/* Which block the GPU block cache (paper section 3.4) evicts when full. */
typedef enum pq_cache_policy {
  /* Least recently used: the block whose last top-k use is oldest. */
  PQ_CACHE_LRU = 0,
  /* Least frequently used: the block used at the fewest steps (ties: the
   * least recently used of them). */
  PQ_CACHE_LFU = 1
} pq_cache_policy;

/* How the model lays each rotary pair out in a head's dimensions (appended
 * in 0.7; config.key_rotary). RoPE turns each pair of dimensions by an
 * angle that grows with the position, so a product-quantization subspace
 * that holds both halves of its pairs sees the same rotation of every key,
 * and one that splits a pair sees its parts move apart. With a rotary
 * layout the library groups whole pairs into each subspace itself (keys and
 * queries alike; what the caller passes and gets back keeps its layout),
 * so pq_subspaces must leave an even number of dimensions per subspace. */
typedef enum pq_key_rotary {
  /* No pairing: subspace j holds dimensions [j*D/m, (j+1)*D/m). */
  PQ_ROTARY_NONE = 0,
  /* Dimension i turns with i + D/2 ("rotate half"): Hugging Face
   * transformers' Llama, Mistral, Qwen2, Gemma. */
  PQ_ROTARY_HALF = 1,
  /* Dimension 2i turns with 2i + 1: GPT-J, and llama.cpp's GGUF order. The
   * contiguous subspaces already hold whole pairs; this layout only asks for
   * an even width. */
  PQ_ROTARY_INTERLEAVED = 2
} pq_key_rotary;

/* How SnapKV, PyramidKV and SCOPE smooth the window's token scores over
 * pooling_kernel neighbours (appended in 0.7; config.pooling). */
typedef enum pq_pooling {
  /* The largest score in the window. */
  PQ_POOLING_MAX = 0,
  /* The mean over the window, counting the zero padding past either end
   * (torch's avg_pool1d): the official SnapKV code's default, as kvpress. */
  PQ_POOLING_AVG = 1
} pq_pooling;

/* What pq_decode_attend adds for the middle tokens a selection leaves out
 * (appended in 0.12; config.tail_estimate). */
typedef enum pq_tail_estimate {
  /* Nothing: the attention is over the selected rows alone (the default). */
  PQ_TAIL_NONE = 0,
  /* The tokens of the coded middle that the selection leaves out (the
   * tail) are estimated from the PQ index and merged with the selected
   * rows' exact attention by log-sum-exp: a tail token's logit is scale x
   * its lookup-table score (query . its centroids, as the select computes
   * it), its value the mean value of the middle tokens whose first subspace
   * has its code. The means are kept per kv head (2^pq_bits x head_dim
   * floats) and brought up to date as tokens are coded; after a truncate,
   * a fork, a restore or a rebuild they are summed again from the stored
   * values at the next attend (it reads the middle's values once). Needs
   * selector PQ_SELECTOR_PQ. See docs/quality.md for what it recovers. */
  PQ_TAIL_CODE_MEANS = 1
} pq_tail_estimate;

/* Memory layout presets for pq_tensor_init. */
typedef enum pq_layout {
  /* [tokens][heads][head_dim], as vLLM's paged blocks keep it. */
  PQ_LAYOUT_TOKEN_MAJOR = 0,
  /* [heads][tokens][head_dim], as Hugging Face's (batch, heads, seq, dim). */
  PQ_LAYOUT_HEAD_MAJOR = 1
} pq_layout;

/* ------------------------------------------------------------------------ */
/* Tensor descriptor                                                        */
/* ------------------------------------------------------------------------ */

/* A view of the caller's K, V or Q buffer; the library never takes
 * ownership. Element (t, h, d) is at
 *   data + (t * token_stride + h * head_stride + d) * element_size(dtype)
 * i.e. the head_dim elements of one (token, head) are contiguous. Rules,
 * each checked (PQ_ERR_INVALID_ARGUMENT naming the tensor):
 *  - strides are in elements and non-negative, and the span they address
 *    ((tokens - 1) * token_stride + (heads - 1) * head_stride + head_dim
 *    elements) fits in int64 bytes and, added to data, in the address space;
 *  - outputs (pq_fetch_kv) give every (token, head) row its own place:
 *    sorting the strides of the dimensions with more than one element, the
 *    smaller is >= head_dim and the larger >= the smaller * (its count - 1)
 *    + head_dim; out_keys and out_values do not overlap either (they may
 *    share a buffer when their rows interleave, same strides, shifted);
 *  - inputs may repeat rows: a zero stride broadcasts one row.
 * No alignment is required: data may start at any byte (elements are read
 * and written as bytes). */
typedef struct pq_tensor {
  void* data;           /* host or device pointer, see memory */
  int32_t dtype;        /* pq_dtype */
  int32_t memory;       /* pq_memory */
  int64_t tokens;       /* number of tokens (rows) */
  int32_t heads;        /* number of heads: kv heads for K/V, q heads for Q */
  int32_t head_dim;     /* elements per (token, head); must match the config */
  int64_t token_stride; /* elements between consecutive tokens */
  int64_t head_stride;  /* elements between consecutive heads */
} pq_tensor;

/* Fills *tensor for a dense buffer in one of the preset layouts, memory
 * PQ_MEMORY_HOST (set tensor->memory afterwards for device buffers).
 * Errors: PQ_ERR_INVALID_ARGUMENT for a NULL tensor, a bad dtype or layout,
 * or negative sizes. data may be NULL only when tokens == 0.
 * Thread-safe (touches only *tensor). */
PQ_API pq_status pq_tensor_init(pq_tensor* tensor, void* data,
                                int32_t dtype /* pq_dtype */,
                                int32_t layout /* pq_layout */, int64_t tokens,
                                int32_t heads, int32_t head_dim);

/* ------------------------------------------------------------------------ */
/* Configuration                                                            */
/* ------------------------------------------------------------------------ */

/* Context configuration. Always start from pq_config_default(), then set
 * the fields you need. Fields appended in later versions get their defaults
 * when an older caller passes a smaller struct_size. */
typedef struct pq_config {
  /* sizeof(pq_config) as the caller was compiled; set by pq_config_default. */
  uint32_t struct_size;

  /* --- Model geometry (no defaults: must be set) --------------------- */
  int32_t num_layers;   /* >= 1 */
  int32_t num_q_heads;  /* >= 1, a multiple of num_kv_heads (GQA) */
  int32_t num_kv_heads; /* >= 1 */
  int32_t head_dim;     /* >= 1, divisible by pq_subspaces */
  int32_t dtype;        /* pq_dtype of K/V/Q buffers; default PQ_DTYPE_F16 */

  /* --- Product quantization ----------------------------------------- */
  /* m, subspaces per head. 0 (the default since 0.7): chosen from head_dim,
   * the best setting per code byte measured (docs/quality.md, "The default
   * index"): head_dim / 32 clipped to [1, 4] (2 for head_dim 64, 4 for 128
   * and 256), lowered to the nearest value that divides head_dim into
   * subspaces of whole rotary pairs. The paper's LongBench setting is 2
   * (with pq_bits 6). pq_get_config reports the value chosen. */
  int32_t pq_subspaces;
  /* b, bits per code: 2^b centroids per subspace. 1..8; codes are stored
   * as one uint8 per subspace. b > 8 returns PQ_ERR_UNSUPPORTED: the
   * lookup table (2^b floats per subspace and query head) would leave L1
   * and the paper's largest setting is b = 8. 0 (the default since 0.7):
   * 8, the best measured per code byte; the paper's LongBench setting is 6. */
  int32_t pq_bits;

  /* --- K-Means -------------------------------------------------------- */
  /* > 0: run exactly this many iterations at most (stops earlier only at
   * convergence); overrides the adaptive budget, for reproducibility.
   * 0: adaptive (paper section 3.3, the default), see below. */
  int32_t kmeans_iterations;
  /* Clip of the adaptive budget T_max (paper: "neither too small nor too
   * large"). Defaults 2 and 25. */
  int32_t kmeans_min_iterations;
  int32_t kmeans_max_iterations;
  /* Stop when the objective improves by less than this fraction in one
   * iteration. Default 1e-4. 0 disables the test. */
  float kmeans_tolerance;
  int32_t kmeans_init; /* pq_kmeans_init; default k-means++ */
  /* Training uses at most this many points per centroid (a seeded random
   * sample); all tokens are still encoded. Default 256 (as faiss). */
  int32_t kmeans_max_points_per_centroid;
  uint64_t seed; /* K-Means seed; default 0x5eed. Same seed, same index. */

  /* The caller's compute time per layer (paper eq. 2), in seconds, for a
   * prompt of s tokens: alpha + beta*s + gamma*s^2. With any of the three
   * non-zero, the adaptive budget solves eq. 3 against the library's own
   * clustering-time fit (a short self-profile on first use). */
  double compute_alpha;
  double compute_beta;
  double compute_gamma;
  /* Alternatively, a fixed time budget per layer build in seconds (> 0);
   * used when the three coefficients are 0. With neither, the adaptive
   * budget is kmeans_max_iterations and convergence decides. */
  double layer_time_budget;

  /* Worker threads for index builds. 0 (default): the number of hardware
   * threads. The pool is shared by all sequences of the context; a context
   * made with pq_hooks.pool runs on that pool instead (0.6). */
  int32_t worker_threads;

  /* --- Selection ------------------------------------------------------ */
  int32_t selector;     /* pq_selector; default PQ_SELECTOR_PQ */
  /* Initial ("sink") tokens always selected. Default 4 (StreamingLLM's four
   * attention sinks; the paper leaves the number open). */
  int32_t sink_tokens;
  /* Most recent tokens always selected. Default 128 (PyramidKV's recent
   * window; the paper leaves it open). */
  int32_t local_tokens;
  /* Middle tokens selected per kv head: topk_tokens if > 0, else
   * ceil(topk_fraction * middle_tokens). Either is clipped to the number of
   * middle tokens. Default fraction 0.2 (the paper's 1/5). */
  int32_t topk_tokens;
  float topk_fraction;
  int32_t gqa_combine; /* pq_gqa_combine; default PQ_GQA_SUM_SOFTMAX */

  /* --- Resources ------------------------------------------------------ */
  /* Host bytes the sequences of the context may hold; 0 means unlimited
   * (default). It counts, as upper bounds:
   *  - per sequence, from pq_sequence_add until it is freed, the fixed state
   *    of its num_layers layers: the layer itself, the selector's state, the
   *    PQ centroids and their layout for the kernels (twice: a rebuild's new
   *    index while the old one serves)
   *    and the block cache's slots (cache_tokens / cache_block_tokens);
   *  - per layer, in whole chunks of 256 tokens (held from the call that
   *    opens a chunk), the K/V and what grows with the tokens: PQ codes,
   *    accumulated attention or prompt scores (H2O, SCOPE, SnapKV,
   *    PyramidKV), block summaries (InfLLM, Quest), block-cache maps. A
   *    1-token prefill takes a whole chunk; the next 255 tokens take none;
   *  - per layer, what a selector keeps of the caller's descriptions apart
   *    from the stored tokens, as held: FastGen's token classes (one byte
   *    per described position, which may run ahead of the K/V);
   *  - per layer, a speculation's rows (pq_decode_speculate), from the
   *    speculation to the layer's next select or truncate.
   * A truncate gives back what the tokens that go were counted for, state
   * included.
   * pq_stats.host_bytes reports what is held. A call that would pass the
   * limit returns PQ_ERR_OUT_OF_MEMORY and holds nothing, not even for a
   * moment another thread could observe. pq_create refuses (INVALID_ARGUMENT)
   * a limit smaller than one sequence's fixed state. Not counted: working
   * memory of one call or build (selection scores, the K-Means sample),
   * which is freed when it returns.
   * With the CPU backend's host tier (no host_alloc hook), K/V chunk blocks
   * of 128 KiB or more are carved from 2 MiB slabs on transparent huge
   * pages (environment PQ_HOST_HUGE_PAGES=0 at pq_create: operator new
   * instead); the limit then counts the slabs whole, the free part of a
   * partly used slab included, and a prefill needs room for one slab more
   * while it cuts one. Empty slabs are given back at once. */
  uint64_t host_memory_limit;
  int32_t backend;   /* pq_backend; default PQ_BACKEND_CPU */
  int32_t device_id; /* CUDA device ordinal; default 0 */
  /* Path of the CUDA plug-in file, or NULL (default) for the search order:
   * $PQCACHE_CUDA_PLUGIN, the directory of libpqcache.so, its pqcache/
   * subdirectory (where the packages install the plug-in), then the dynamic
   * loader's path. The string is read during pq_create only. */
  const char* cuda_plugin_path;

  /* --- Selector parameters (appended in 0.2; ignored by other selectors) */
  /* SparQ: query dimensions used to score, r. 0 (default): head_dim / 128
   * rounded up, the paper's 1/128 extra communication. */
  int32_t sparq_dims;
  /* InfLLM and Quest: tokens per block. Default 128 (InfLLM's block, and the
   * GPU cache block of paper section 3.4; Quest's paper uses 16). */
  int32_t block_tokens;
  /* InfLLM: representative keys per block. Default 1 (paper: 1 or 2 per
   * 128 tokens for 1/128 or 1/64 extra communication). */
  int32_t block_representatives;
  /* SnapKV, PyramidKV, SCOPE: prompt queries in the observation window, w.
   * Default 32 (SnapKV). */
  int32_t observation_window;
  /* SnapKV, PyramidKV, SCOPE: pooling kernel over token scores, odd (the
   * pooling itself: config.pooling). Default 7 (the SnapKV paper's; its code
   * defaults to 5). 1 disables pooling. */
  int32_t pooling_kernel;
  /* PyramidKV: budget of the top layer / budget of the bottom layer, in
   * (0, 1]. Default 0.25. */
  float pyramid_ratio;
  /* SCOPE: share of the top-k budget for decode tokens, in [0, 1]. Default
   * 0.5. */
  float scope_decode_share;

  /* --- Block cache (appended in 0.3; paper section 3.4) ---------------- */
  /* Capacity of the block cache of each (sequence, layer), in tokens; it
   * holds cache_tokens / cache_block_tokens whole blocks of all kv heads'
   * K and V. 0 (default) turns it off. With the CUDA backend the blocks
   * live in device memory and pq_fetch_kv copies hits device to device;
   * with the CPU backend the cache is bookkeeping only (the data comes
   * from host memory either way), so its hit rate can be measured. */
  int64_t cache_tokens;
  /* Tokens per cache block, >= 1. Default 128 (the paper's block). */
  int32_t cache_block_tokens;
  /* pq_cache_policy; default PQ_CACHE_LRU. */
  int32_t cache_policy;
  /* The paper's k_cache: blocks ranked at each update (those holding the
   * most fetched tokens are touched or admitted). 0 (default): the number
   * of slots, the paper's best setting, where every cached block the update
   * does not rank is replaced and the policy rarely matters; fewer blocks
   * keep some older blocks, chosen by the policy. */
  int32_t cache_update_blocks;

  /* --- Index quality (appended in 0.7; docs/quality.md) --------------- */
  /* pq_key_rotary: how the keys' and queries' rotary pairs are laid out, so
   * that each PQ subspace holds whole pairs. Default PQ_ROTARY_NONE (the
   * library cannot tell the layout from the numbers); set it from the model:
   * PQ_ROTARY_HALF for Hugging Face Llama-family models.
   * pq_decode_select_device serves every layout: its lookup table, built on
   * the device from the caller's query, reads the query in the same order
   * as the host's (bit-identical tables). */
  int32_t key_rotary;
  /* PQ: exact re-ranking. >= 0; 0 (default) turns it off. With r > 0 the
   * codes pick ceil((1 + r) * k) candidates per kv head, their exact scores
   * are computed from the full keys in host memory (the same GQA combine,
   * normalised over the candidates), and the best k of them are selected.
   * It reads (1 + r) * k key rows per kv head and step; with
   * pq_decode_select_device the device reads them from the host store
   * across PCIe (one more launch, no host wait; the same selection). */
  float pq_rerank;
  /* pq_pooling of SnapKV, PyramidKV and SCOPE's window scores. Default
   * PQ_POOLING_MAX (the library's behaviour before 0.7); the official SnapKV
   * code and kvpress use PQ_POOLING_AVG with pooling_kernel 5. */
  int32_t pooling;
  /* PQ: re-clustering for long outputs. Tokens appended during decode are
   * coded with the codebook of the tokens it was built over, whose rotary
   * angles it has never seen at later positions; when the tokens past that
   * build exceed this share of the sequence, the library rebuilds the index
   * over every stored token in the background and swaps it in at a later
   * select, which meanwhile goes on with the old one (no pause), so which
   * select first uses the new index depends on the build's time
   * (pq_wait_builds installs it at once). In [0, 1]; 0 (default) turns it
   * off. Measured (docs/quality.md, "Long outputs"): 2,048 tokens coded with
   * the codebook of a 6K prompt cost 0.16 of the middle mass on SmolLM2; 0.1
   * keeps a rebuild per 10% of growth, each the build time of the layer. A
   * restored index counts its coded tokens as built. */
  float pq_rebuild_share;
  /* Scissorhands: the steps (pq_observe_attention calls per kv head) over
   * which a token's hits are counted. In [1, 4096], default 400 (the value
   * cold-compress gives as the paper's); the state holds 2 bits per step
   * for each token and kv head. (Added in 0.7.) */
  int32_t history_window;
  /* Keyformer: the Gumbel softmax's temperature at the prompt, in (0, 1e6],
   * default 1 (the authors' tau_init), and what each later step adds, in
   * [0, 1e6], default 1/128 (tau_end 2 over the 128 new tokens of their
   * summarisation runs). (Added in 0.7.) */
  float keyformer_tau;
  float keyformer_tau_step;
  /* ClusterKV: clusters of the middle at the first select, per kv head, in
   * [1, 65536]; default 400 (the authors' accuracy setting). Clustering
   * costs 20 passes over those keys against every centroid. (Added in 0.7.) */
  int32_t cluster_count;
  /* AdaKV: the share of the mean budget k that each kv head keeps of its
   * own top tokens before the layer's budget is shared, in [0, 1]; default
   * 0.2 (kvpress's alpha_safeguard). 1 gives SnapKV. (Added in 0.7.) */
  float adakv_safeguard;
  /* ZigZagKV: the share of a kv head's prompt attention mass that its
   * minimum budget (MBA) must cover, in (0, 1]; default 0.9. (Added in
   * 0.7.) */
  float zigzag_mass;
  /* ZigZagKV: the budget every layer gets whatever its LMBA, as a share of
   * the mean budget k, in [0, 1]; default 0.2. 1 gives SnapKV. (Added in
   * 0.7.) */
  float zigzag_floor;
  /* PyramidInfer: the ratio r of its cosine schedule at the top layer (the
   * authors' prefill_decay_ratio), in (0, 1]; default 0.9. 1 keeps every
   * layer's budget k, still nested. (Added in 0.7.) */
  float pyramidinfer_decay;
  /* FastGen: the share of the observation window's attention a kv head's
   * policy must keep (the recovery ratio T), in (0, 1]; default 0.9
   * (cold-compress's default). 1 keeps the whole middle unless a policy
   * recovers all of it. (Added in 0.7.) */
  float fastgen_recovery;
  /* InfiniGen: the share of head_dim kept of each key (its partial key),
   * in (0, 1], default 0.2 (the authors' runtime setting): head_dim * ratio
   * columns truncated, as the authors' int() (12 at head_dim 64), at least
   * one. (Added in 0.7.) */
  float infinigen_partial_ratio;
  /* InfiniGen: a token is counted toward a select's n when its partial
   * score is within this of its head's best, in (0, 1e6], default 4 (the
   * authors' runtime alpha). (Added in 0.7.) */
  float infinigen_alpha;

  /* --- Storage tier (appended in 0.9; docs/tiers.md) ------------------ */
  /* pq_kv_tier: where each layer's K/V rows live. Default PQ_KV_TIER_HOST. */
  int32_t kv_tier;
  /* PQ_KV_TIER_DISK: the directory of the context's K/V file (an unnamed
   * file, gone with the process; its size is the disk tier's K/V). The
   * string is read during pq_create only; pq_create fails with
   * PQ_ERR_INVALID_ARGUMENT naming it when no file can be made there.
   * Ignored by the host tier; default NULL. */
  const char* kv_disk_path;

  /* --- Tensor parallel (appended in 0.10; docs/engines.md) ------------- */
  /* The model's index of this context's kv head 0, for a context that holds
   * a slice of a layer's kv heads (one context per tensor-parallel rank,
   * num_kv_heads the rank's count). Every seed the library derives per kv
   * head (K-Means, the random selector, Keyformer's noise) takes the
   * model's index, so the ranks together select exactly what one context
   * with all kv heads selects (selectors that share a budget across a
   * layer's kv heads, AdaKV, cannot: their heads see each other). In [0,
   * 65536]; default 0. */
  int32_t kv_head_offset;

  /* --- fp8 scales (appended in 0.10) ---------------------------------- */
  /* How the stored fp8 K/V map to real values, as engines keep them (vLLM:
   * real = stored * k_scale): 0 (default) every scale is 1; 1: one scale
   * per layer for K and one for V; num_kv_heads: one per kv head. Other
   * values, and a count other than 0 with an f32, f16 or bf16 dtype, are
   * PQ_ERR_INVALID_ARGUMENT ("kv_scales apply to fp8 dtypes only"). */
  int32_t kv_scale_count;
  /* [num_layers][2][kv_scale_count] floats, K then V, each finite and > 0
   * (PQ_ERR_INVALID_ARGUMENT naming the index, layer, K or V and kv head of
   * a bad one); NULL with kv_scale_count 0. Read during pq_create only (the
   * context keeps its own copy). pq_get_config returns a pointer to that
   * copy (valid until pq_destroy; NULL with kv_scale_count 0). A saved
   * fp8 state holds the scales, and a restore into a context whose scales
   * differ is PQ_ERR_INCOMPATIBLE naming the first that differs. */
  const float* kv_scales;

  /* --- Tail estimate (appended in 0.12; issue 44) ----------------------- */
  /* pq_tail_estimate: what pq_decode_attend adds for the middle tokens the
   * selection leaves out. Default PQ_TAIL_NONE. PQ_TAIL_CODE_MEANS with a
   * selector other than PQ_SELECTOR_PQ is PQ_ERR_INVALID_ARGUMENT (it reads
   * the PQ index), and so is it with PQ_KV_TIER_CALLER (it averages values,
   * which an index-only context does not keep). */
  int32_t tail_estimate;

  /* --- Outliers scored exactly (appended in 0.13; issue 44) ------------- */
  /* PQ: the share of the middle whose keys the codebook represents worst,
   * scored by their exact q.k instead of their codes. In [0, 0.25]; 0
   * (default) turns it off. A token's residual is |k - its centroids|^2
   * (the codebook's own error); a build (and a restore) sets each kv head's
   * threshold at the residual that this share of its coded tokens reaches,
   * and every token coded later whose residual reaches it joins that head's
   * outliers. At each select the outliers in the middle are read from the
   * host store and scored exactly: each one's combined score is its exact
   * logits' softmax against the code scores' normaliser of the middle (for
   * PQ_GQA_SUM_SOFTMAX; the exact logits themselves for the other
   * combines), then the top k is taken as before. Why: a key far from every
   * centroid (a needle's, measured in docs/quality.md) scores through its
   * codes like its centroids: on needle prompts, needle tokens the exact
   * top-k ranks first ranked 898 to 1,985 by their codes. Cost: the share
   * x middle key rows per kv head and select (1.02-1.14x select + attend
   * at 0.01, docs/perf.md), 4 bytes per outlier, and PQ's device selection
   * (pq_decode_select_device and the CUDA backend's host-call selection) is
   * not used:
   * the host selects (pq_decode_select_device is PQ_ERR_UNSUPPORTED). A
   * selector other than PQ_SELECTOR_PQ, or PQ_KV_TIER_CALLER (no keys to
   * score), with a share above 0 is PQ_ERR_INVALID_ARGUMENT. */
  float pq_outliers;

  /* --- Top-p budgets (appended in 0.15; issue 44) ---------------------- */
  /* Budgets that adapt per kv head and step (Twilight's top-p): of the k
   * best-scored middle tokens, a kv head keeps the fewest whose estimated
   * attention mass reaches this share of the middle's estimated mass; k
   * (topk_tokens or topk_fraction) becomes the ceiling, and the counts of
   * a selection's kv heads differ (pq_selection.counts). A token's
   * estimated mass is its share of the middle under PQ_GQA_SUM_SOFTMAX:
   * the softmax over the middle of the selector's scores (PQ's codes, the
   * exact keys, SparQ's approximation), averaged over the GQA group. In
   * [0, 1]; 0 (default) turns it off, 1 keeps all k. Why off by default
   * (docs/quality.md, "Top-p budgets"): at the average count of a 1/10
   * budget, top-p on PQ's scores held +0.014 of the middle's exact mass on
   * SmolLM2 and -0.018 on Gemma-3 against the fixed budget. Serves
   * PQ_SELECTOR_PQ, PQ_SELECTOR_EXACT and PQ_SELECTOR_SPARQ with
   * PQ_GQA_SUM_SOFTMAX and pq_rerank 0 (re-ranking normalises over its
   * candidates, not the middle); a share above 0 otherwise is
   * PQ_ERR_INVALID_ARGUMENT. The host selects: pq_decode_select_device is
   * PQ_ERR_UNSUPPORTED with it, and the CUDA backend's host-call
   * selection runs on the host. Cost at the same rows: 1.00-1.25x select +
   * attend at 32K and 128K (docs/perf.md). */
  float top_p;
  /* The fewest middle tokens a kv head keeps under top_p, as a share of the
   * middle: ceil(share x middle), at most k. In [0, 1]; default 0.02 (of
   * the floors measured, 0 and 0.02, the one that held more mass on both
   * models). Read only when top_p is above 0. */
  float top_p_floor;
} pq_config;

/* Where the K/V rows of every layer live (pq_config.kv_tier). */
typedef enum pq_kv_tier {
  /* Host memory (the default): every row in memory; the CUDA backend's
   * fetches read it in place (page-locked, device-mapped). */
  PQ_KV_TIER_HOST = 0,
  /* A file on local disk (pq_config.kv_disk_path): the sink chunk and the
   * chunks of the local window stay in memory, every other 256-token chunk
   * goes to the file as it leaves the window, and selected rows are read
   * back by pq_fetch_kv, pq_decode_attend and the selectors that read keys.
   * The index, its codes and the selector state stay in memory. The memory
   * limit counts the chunks in memory and the state of every chunk. A full
   * disk or a failed read is PQ_ERR_BACKEND naming the file's directory,
   * and the layer keeps every token it held. CPU backend only
   * (PQ_ERR_UNSUPPORTED with PQ_BACKEND_CUDA). (Added in 0.9.) */
  PQ_KV_TIER_DISK = 1,
  /* The caller's pool (index only; added in 0.10; docs/engines.md): a
   * serving engine keeps K/V in its own (paged) pool and the library keeps
   * the index only: each layer's centroids and every token's codes, plus
   * the keys of tokens not coded yet (see below). Keys come with
   * pq_prefill_layer and pq_decode_append (values may be NULL and are not
   * read) or, from a paged pool, with pq_prefill_layer_paged and
   * pq_decode_append_paged; a select returns positions that the caller
   * reads from its pool. pq_fetch_kv, pq_decode_attend, pq_sequence_save
   * and the device fetch are PQ_ERR_UNSUPPORTED (the library holds no
   * value); pq_rerank reads exact keys from the pool the select is given
   * (pq_decode_select_multi's keys).
   * Keys held, and why: until a layer's first select, every key (the index
   * is built over the prompt); the index is built at the first
   * pq_prefill_layer and rebuilt at a later prefill call only once the
   * layer's tokens have at least doubled since the last build started, so
   * a prompt prefilled in chunks is clustered at most log2(prompt / first
   * chunk) + 1 times, never once per chunk, and the last build covers at
   * least half of it. From the first select on, a key goes once its token
   * is coded (whole 256-token chunks): the index holds the codes, and only
   * the local window's keys and the partial last chunk stay; later prefill
   * calls and appends are coded with the index as it is (no rebuild). The
   * memory limit counts the codes and the selector's state of every chunk
   * and the keys while held.
   * Selectors: PQ, WINDOW and RANDOM (the others read keys or values the
   * library does not keep: PQ_ERR_INVALID_ARGUMENT at pq_create);
   * pq_rebuild_share and cache_tokens must be 0. Both backends (the CUDA
   * backend since 0.10; AUTO picks as for the host tier): on CUDA,
   * pq_decode_select_device(_batch) and pq_decode_select_multi_device select
   * on the device from the codes there, and nothing else goes to the
   * device (no window, no pinned store; keys appended from device memory
   * are copied to the host, where they are coded). There, config.pq_rerank
   * is PQ_ERR_UNSUPPORTED for the device selects (the exact keys are in the
   * caller's pool, which they are not given): pq_decode_select_multi with
   * keys re-ranks on the host. */
  PQ_KV_TIER_CALLER = 2
} pq_kv_tier;

/* Fills *config with the defaults above and struct_size = sizeof(pq_config).
 * Geometry fields are 0 and must be set. NULL is ignored. Thread-safe. */
PQ_API void pq_config_default(pq_config* config);

/* ------------------------------------------------------------------------ */
/* Context                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct pq_context pq_context;

/* Creates a context from *config (copied; the caller may free it).
 * Errors: PQ_ERR_INVALID_ARGUMENT (NULL, bad struct_size, bad geometry or
 * setting, naming the field), PQ_ERR_UNSUPPORTED (pq_bits > 8),
 * PQ_ERR_NOT_FOUND (backend CUDA without plug-in or device),
 * PQ_ERR_OUT_OF_MEMORY. *out is set only on success.
 * Thread-safe. */
PQ_API pq_status pq_create(const pq_config* config, pq_context** out);

/* Waits for the builds in flight (they are cancelled at their next
 * iteration), then frees everything. NULL is a no-op. Must not race with
 * any other call on ctx. */
PQ_API void pq_destroy(pq_context* ctx);

/* For libraries that keep a handle reaching into a context after the call
 * that made it returns (the Redis tier's streaming get, a binding's
 * objects): pq_destroy calls fn(user) once, on its own thread, before it
 * frees anything, so that the handle can mark itself invalid and answer
 * PQ_ERR_BAD_STATE from then on instead of touching freed memory. fn must
 * not call into ctx (it is being destroyed) or block on another thread
 * that does; pq_unwatch_destroy is the one exception (every watch has
 * ended by then: it answers PQ_ERR_NOT_FOUND, so a handle may free itself
 * from fn). Watches run newest first. *out_watch names the watch for
 * pq_unwatch_destroy. Errors: PQ_ERR_INVALID_ARGUMENT (ctx, fn or
 * out_watch NULL), PQ_ERR_OUT_OF_MEMORY. Thread-safe. (Added in 0.7.) */
typedef void (*pq_destroy_fn)(void* user);
PQ_API pq_status pq_watch_destroy(pq_context* ctx, pq_destroy_fn fn, void* user,
                                  uint64_t* out_watch);

/* Ends a watch of pq_watch_destroy (the handle is freed before its context);
 * fn is not called after this returns. Errors: PQ_ERR_INVALID_ARGUMENT
 * (NULL ctx), PQ_ERR_NOT_FOUND (no such watch: never made, or ended).
 * Thread-safe, but must not race with pq_destroy. (Added in 0.7.) */
PQ_API pq_status pq_unwatch_destroy(pq_context* ctx, uint64_t watch);

/* Copies the context's effective configuration (defaults resolved, e.g.
 * worker_threads) into *out, up to out->struct_size bytes; set
 * out->struct_size first (pq_config_default does). Thread-safe. */
PQ_API pq_status pq_get_config(const pq_context* ctx, pq_config* out);

/* The backend actually in use (pq_backend value). Thread-safe. */
PQ_API pq_status pq_get_backend(const pq_context* ctx, int32_t* out_backend);

/* ------------------------------------------------------------------------ */
/* Integration hooks (added in 0.6): logging, host allocation, build        */
/* notification and a worker pool shared between contexts                   */
/* ------------------------------------------------------------------------ */

/* Log levels, most severe first: a hook set to a level gets the messages of
 * that level and the levels above it. */
typedef enum pq_log_level {
  PQ_LOG_ERROR = 0, /* a call failed: the message pq_last_error returns, and the call */
  PQ_LOG_WARN = 1,  /* an index build failed (the layer reports it at its next call) */
  PQ_LOG_INFO = 2,  /* context created, index build finished (its time, iterations) */
  PQ_LOG_DEBUG = 3  /* sequence added, removed, forked, truncated, saved, restored */
} pq_log_level;

/* Receives one message, without a trailing newline, valid during the call.
 * Called on the thread of the call that logs (a worker thread for builds),
 * possibly from several threads at once. It must not call into the
 * context that logs. */
typedef void (*pq_log_fn)(void* user, int32_t level, const char* message);

/* Allocates `bytes` bytes aligned to `alignment` (a power of two, at most
 * 4096) for the host K/V store, or returns NULL (the call that needed them
 * then fails with PQ_ERR_OUT_OF_MEMORY, changing nothing; memory aligned
 * to less is given back to pq_free_fn and fails it with PQ_ERR_BACKEND).
 * Pinned or huge-page memory goes here. Called on the calling thread and on worker
 * threads, possibly concurrently; it must not call into the library. */
typedef void* (*pq_alloc_fn)(void* user, size_t bytes, size_t alignment);
/* Frees what pq_alloc_fn returned, with the same size. Must not fail or
 * call into the library. */
typedef void (*pq_free_fn)(void* user, void* ptr, size_t bytes);

/* An index build of (seq_id, layer) ended: status PQ_OK when its index is
 * ready (the next call on the layer uses it without waiting, unless a later
 * build of the layer superseded it), else the error the layer will report
 * at its next call. Not called for builds cancelled before they finished
 * (superseded, truncated, removed or destroyed). Called on the worker
 * thread after the build, so that a server can react to a finished index
 * instead of polling or blocking in pq_wait_builds. It should hand the
 * news to the server's own threads (a flag, an eventfd, a channel): it may
 * call pq_* functions that do not wait for builds (pq_stats_get, calls on
 * this layer), but not pq_wait_builds, pq_destroy or calls on layers whose
 * builds are still queued, which may wait for work queued behind it on
 * this very thread. pq_wait_builds returns once the indexes are ready,
 * possibly before their hooks (and log lines) ran; pq_destroy waits for
 * them. */
typedef void (*pq_build_done_fn)(void* user, uint64_t seq_id, int32_t layer,
                                 pq_status status);

/* The stages of an index build, in order (pq_build_progress.stage). */
typedef enum pq_build_stage {
  PQ_BUILD_STAGE_KMEANS = 0, /* training the codebook: Lloyd iterations */
  PQ_BUILD_STAGE_ENCODE = 1  /* coding every token with the trained codebook */
} pq_build_stage;

/* How far an index build of (seq_id, layer) has come (pq_build_progress_fn;
 * added in 0.14). `fraction` is the value to show: the share of the build's
 * work done, in [0, 1], non-decreasing over one build's calls, 1 at its
 * last. It weighs the two stages by the vectors they compare with every
 * centroid: iteration budget x training points for K-Means, tokens for the
 * encode; K-Means stopping before its budget (converged) moves it on to the
 * encode's share at once. */
typedef struct pq_build_progress {
  uint32_t struct_size; /* sizeof(pq_build_progress) as the library has it */
  uint64_t seq_id;
  int32_t layer;
  int32_t stage;        /* pq_build_stage */
  int64_t done;         /* KMEANS: iterations run; ENCODE: tokens coded */
  int64_t total;        /* KMEANS: the iteration budget (it may stop sooner); ENCODE: tokens */
  double fraction;
} pq_build_progress;

/* An index build advanced: after each K-Means iteration and after each
 * slice of 65,536 tokens coded (so a few dozen calls per build, the last
 * with fraction 1, before the build's pq_build_done_fn). *progress is
 * valid during the call. Called on the worker thread running the build;
 * builds of different layers call it concurrently. A build cancelled
 * meanwhile stops calling it. It may call what pq_build_done_fn may, and
 * should return quickly: the build waits for it. */
typedef void (*pq_build_progress_fn)(void* user, const pq_build_progress* progress);

/* A worker pool that several contexts share, so that a server holding
 * many contexts runs one set of threads instead of one per context. */
typedef struct pq_pool pq_pool;

/* Creates a pool of `threads` worker threads (1..1024; 0: the hardware
 * threads). Errors: PQ_ERR_INVALID_ARGUMENT, PQ_ERR_OUT_OF_MEMORY.
 * Thread-safe. */
PQ_API pq_status pq_pool_create(int32_t threads, pq_pool** out);
/* The number of worker threads. Thread-safe. */
PQ_API pq_status pq_pool_threads(const pq_pool* pool, int32_t* out_threads);
/* Releases the caller's reference: the pool stops once no context uses
 * it either (a context keeps its pool until pq_destroy), finishing the
 * work queued. NULL is a no-op. Must not race with pq_create_with_hooks
 * naming this pool. */
PQ_API void pq_pool_destroy(pq_pool* pool);

/* Hooks a context calls (versioned like pq_config: set struct_size with
 * pq_hooks_default, then the fields wanted; NULL functions are off). */
/* pq_hooks.disk_read and disk_write (the disk tier's file). */
typedef int64_t (*pq_disk_read_fn)(void* user, int fd, void* buf, uint64_t bytes,
                                   uint64_t offset);
typedef int64_t (*pq_disk_write_fn)(void* user, int fd, const void* buf, uint64_t bytes,
                                    uint64_t offset);

typedef struct pq_hooks {
  uint32_t struct_size; /* sizeof(pq_hooks) */
  pq_log_fn log;
  void* log_user;
  int32_t log_level;    /* pq_log_level; default PQ_LOG_WARN */
  /* Both or neither: the host K/V store's allocations (its 256-token
   * chunks: 2 x 256 x kv heads x head_dim x element size bytes each). */
  pq_alloc_fn host_alloc;
  pq_free_fn host_free;
  void* alloc_user;
  pq_build_done_fn build_done;
  void* build_done_user;
  /* Run the context's work (index builds, K-Means, batched calls) on this
   * pool instead of a pool of its own; config.worker_threads is then
   * ignored, and pq_get_config reports the pool's threads. The context
   * holds the pool until pq_destroy. pq_destroy waits only for this
   * context's builds (they are cancelled; a queued one is dropped when a
   * worker reaches it). */
  pq_pool* pool;
  /* The disk tier's reads and writes of its K/V file (PQ_KV_TIER_DISK), each
   * NULL for pread / pwrite: `bytes` at `offset` of file descriptor fd,
   * returning the bytes moved or -errno. A transfer may move fewer bytes
   * (the library asks again for the rest); 0 or a negative value fails the
   * call with PQ_ERR_BACKEND. Called on any thread, concurrently. For
   * accounting, throttling, encryption, or to inject faults in tests.
   * (Added in 0.9.) */
  pq_disk_read_fn disk_read;
  pq_disk_write_fn disk_write;
  void* disk_user;
  /* Index builds' progress (pq_build_progress_fn; NULL: none). (Added in
   * 0.14.) */
  pq_build_progress_fn build_progress;
  void* build_progress_user;
} pq_hooks;

/* Fills *hooks with no hooks, log_level PQ_LOG_WARN and struct_size.
 * NULL is ignored. Thread-safe. */
PQ_API void pq_hooks_default(pq_hooks* hooks);

/* pq_create with hooks (NULL hooks: as pq_create). The function pointers
 * and user pointers are copied; what they point to must outlive the
 * context. Errors: as pq_create, and PQ_ERR_INVALID_ARGUMENT for a bad
 * hooks->struct_size, log_level, or only one of host_alloc and host_free.
 * Thread-safe. */
PQ_API pq_status pq_create_with_hooks(const pq_config* config, const pq_hooks* hooks,
                                      pq_context** out);

/* ------------------------------------------------------------------------ */
/* Sequences                                                                */
/* ------------------------------------------------------------------------ */

/* Sequences (requests) are named by the caller's 64-bit id.
 * Adds an empty sequence. Errors: PQ_ERR_INVALID_ARGUMENT if the id exists.
 * Thread-safe. */
PQ_API pq_status pq_sequence_add(pq_context* ctx, uint64_t seq_id);

/* Removes a sequence and frees its memory. Builds in flight for it are
 * cancelled; the call returns without waiting for them. Its memory leaves
 * config.host_memory_limit (pq_stats.host_bytes) when the call returns: a
 * queued build lets go of its K/V at once. A build that was running lets go
 * at its next K-Means iteration, and pq_wait_builds waits for that (so do
 * calls on seq_id racing with the remove, until they return). Errors:
 * PQ_ERR_NOT_FOUND. Thread-safe; calls on seq_id racing with it finish on
 * the data they hold or fail with PQ_ERR_NOT_FOUND. */
PQ_API pq_status pq_sequence_remove(pq_context* ctx, uint64_t seq_id);

/* Tokens stored for (seq_id, layer). Layers may differ during prefill.
 * Errors: PQ_ERR_NOT_FOUND, PQ_ERR_INVALID_ARGUMENT (layer). Thread-safe. */
PQ_API pq_status pq_sequence_length(const pq_context* ctx, uint64_t seq_id,
                                    int32_t layer, int64_t* out_tokens);

/* Number of sequences in the context. Thread-safe. */
PQ_API pq_status pq_sequence_count(const pq_context* ctx, int64_t* out_count);

/* Orders the device work of seq_id's calls on cuda_stream, a cudaStream_t
 * passed as an opaque pointer. NULL (the default) is CUDA's legacy default
 * stream, ordered with the caller's default-stream kernels. The library
 * never synchronises the device; a call waits on the stream only where its
 * result must reach the host (pq_decode_select's positions, and a device
 * query it must check on the host). Device inputs (a query, K/V to append)
 * are read in order on this stream, after the caller's work enqueued on it
 * before the call. Device outputs of pq_fetch_kv are complete once the
 * stream reaches the point of the call. Work already enqueued on a previous stream is not waited for:
 * synchronise it before switching. The stream must outlive its use: set
 * NULL before destroying it.
 * Errors: PQ_ERR_NOT_FOUND, PQ_ERR_UNSUPPORTED (a non-NULL stream on the
 * CPU backend). Threading: must not race with calls on seq_id. */
PQ_API pq_status pq_sequence_set_stream(pq_context* ctx, uint64_t seq_id,
                                        void* cuda_stream);

/* ------------------------------------------------------------------------ */
/* Sequence state: truncate, fork, save and restore (added in 0.5)          */
/* ------------------------------------------------------------------------ */

/* Keeps the first `tokens` tokens of every layer of seq_id and drops the
 * rest (a server rolling back rejected speculative tokens): the K/V, the
 * PQ codes, the selector's state and the block cache's bookkeeping follow:
 * nothing of the dropped tokens stays. For PQ, exact, window, SparQ,
 * InfLLM, Quest, SnapKV, PyramidKV, AdaKV, ZigZagKV, PyramidInfer and
 * InfiniGen the next decode step is as if they never came. Selectors that
 * learn at decode steps keep what the kept tokens learned while the
 * dropped ones were there: observed attention and drop marks (H2O, SCOPE,
 * FastGen, Keyformer), the steps counted (Scissorhands, Keyformer),
 * Random's stream, and ClusterKV's prompt clusters when the cut falls
 * inside the prompt. To go back exactly, fork before and remove after. A layer
 * with `tokens` or fewer tokens is left as it is. When the cut falls inside
 * a layer's prefill, its prefill becomes the first `tokens` tokens and its
 * index is rebuilt over them on the worker pool, as a prefill of those
 * tokens would build it; tokens = 0 empties the sequence (the next call
 * on a layer is pq_prefill_layer). The block cache of a truncated layer
 * starts empty.
 * Errors: PQ_ERR_NOT_FOUND, PQ_ERR_INVALID_ARGUMENT (tokens < 0 or more
 * than the longest layer holds), PQ_ERR_OUT_OF_MEMORY (the rebuild could
 * not be queued; nothing changed on that layer and those after it).
 * Threading: must not race with other calls on seq_id (it changes every
 * layer); calls on other sequences may run concurrently. */
PQ_API pq_status pq_sequence_truncate(pq_context* ctx, uint64_t seq_id,
                                      int64_t tokens);

/* Makes room for seq_id to grow to `tokens` tokens per layer without
 * allocating during its decode steps (added in 0.8): on the CUDA backend
 * the page-locked K/V blocks of the chunks still to come (cut from the pool
 * now: opening a chunk then pins nothing), and per layer the device codes,
 * the chunk tables and the working buffers of the sequence's stream for a
 * selection at that length. After it, a steady decode step on the device
 * (pq_decode_append of host K/V, pq_decode_select_device,
 * pq_fetch_kv_device) allocates nothing, frees nothing and waits for
 * nothing (tests/cuda_fake/test_cuda_fake_steady.cpp counts it). Nothing is
 * charged to config.host_memory_limit until tokens are stored; reserved
 * blocks stay in the pool for any sequence. Call it after
 * pq_sequence_set_stream (the buffers are the stream's). The CPU backend
 * has nothing to reserve (PQ_OK). Errors: PQ_ERR_NOT_FOUND,
 * PQ_ERR_INVALID_ARGUMENT (tokens < 0 or > INT32_MAX),
 * PQ_ERR_OUT_OF_MEMORY (device or pinned memory; what was reserved before
 * the failure stays). Threading: as pq_sequence_truncate. */
PQ_API pq_status pq_sequence_reserve(pq_context* ctx, uint64_t seq_id,
                                     int64_t tokens);

/* Adds child_id holding the same tokens as parent_id (many requests with
 * one system prompt, parallel samples). Full chunks of 256 tokens are
 * shared, copy-on-write, and the host memory limit counts them once; the
 * last, partial chunk of each layer is copied. The child shares the
 * parent's PQ index (the centroids, and the codes of the prefix: a prefix
 * of fewer than 4,096 coded tokens has its codes copied, at most 4,096 x
 * pq_subspaces bytes per kv head; no K-Means runs), gets a copy of its
 * selector state, an empty block cache and its own statistics; the parent
 * is unchanged. From then on each grows on its own chunks and codes.
 * Waits for the parent's index builds in flight.
 * Errors: PQ_ERR_NOT_FOUND (parent), PQ_ERR_INVALID_ARGUMENT (child_id
 * exists), PQ_ERR_OUT_OF_MEMORY (limit; no child was added), PQ_ERR_BAD_STATE
 * (a build of the parent failed), the parent's pending ingest error.
 * Threading: must not race with calls that change parent_id; other calls
 * may run concurrently. */
PQ_API pq_status pq_sequence_fork(pq_context* ctx, uint64_t parent_id,
                                  uint64_t child_id);

/* Receives the saved state in pieces, in order. Returns 0 to go on; any
 * other value stops the save, which then fails with PQ_ERR_BACKEND.
 * Called on the thread of pq_sequence_save (or pq_sequence_save_file,
 * pq_sequence_save_buffer), while the save holds the lock of the layer it
 * writes. It may call the library on other sequences, of this context or
 * another. Calls on the sequence being saved (pq_sequence_remove,
 * pq_sequence_state_size, pq_sequence_truncate, pq_decode_append, a fork of
 * it, any call naming its seq_id) and pq_wait_builds on its context return
 * PQ_ERR_BAD_STATE at once: they would wait for the save, which waits for
 * the callback. It must not call pq_destroy on the context. */
typedef int (*pq_write_fn)(void* user, const void* data, size_t size);

/* Writes seq_id's state (every layer's K/V, PQ index, window position and
 * selector state) to `write`, in the versioned format of
 * docs/state-format.md, with a CRC-32C per section. It waits for the
 * sequence's index builds in flight, so that a restore runs no K-Means.
 * The block cache and statistics are not saved. The size equals what
 * pq_sequence_state_size reported if nothing changed the sequence since.
 * Errors: PQ_ERR_NOT_FOUND, PQ_ERR_INVALID_ARGUMENT (write NULL),
 * PQ_ERR_BACKEND (write returned non-zero). Threading: must not race with
 * calls that change seq_id. */
PQ_API pq_status pq_sequence_save(pq_context* ctx, uint64_t seq_id,
                                  pq_write_fn write, void* user);

/* The bytes pq_sequence_save would write now, into *out_bytes. Waits for
 * the sequence's builds in flight. Threading: as pq_sequence_save. */
PQ_API pq_status pq_sequence_state_size(pq_context* ctx, uint64_t seq_id,
                                        uint64_t* out_bytes);

/* pq_sequence_save into a caller buffer of `capacity` bytes; *out_written
 * receives the bytes written. PQ_ERR_BUFFER_TOO_SMALL when it does not
 * fit: *out_written then receives the size needed. */
PQ_API pq_status pq_sequence_save_buffer(pq_context* ctx, uint64_t seq_id,
                                         void* buffer, uint64_t capacity,
                                         uint64_t* out_written);

/* pq_sequence_save into the file at `path`, atomically: the state goes to a
 * temporary file beside it, which is flushed to disk (fsync) and renamed
 * over `path`; on any failure `path` is left as it was and the temporary
 * file is removed. Errors: as pq_sequence_save, plus PQ_ERR_BACKEND for a
 * file system error (the message has the path and errno's text). */
PQ_API pq_status pq_sequence_save_file(pq_context* ctx, uint64_t seq_id,
                                       const char* path);

/* Adds seq_id from `size` bytes that pq_sequence_save wrote, in this or
 * another context (another process, another machine of the same byte
 * order) of the same geometry. Every section is checked before anything is
 * added: a restore either adds the whole sequence or nothing. The restored
 * sequence's selections and fetched bytes equal the saved one's; its PQ
 * index is loaded, not rebuilt (a layer saved without an index, after a
 * failed build, is rebuilt). Its block cache starts empty. Beyond the
 * checksums, every field is held to what a save can write (the reserved
 * header word 0, the end section's layer -1, the build facts of
 * pq_layer_info within their bounds, finite scores): a state with sound
 * checksums but impossible numbers is PQ_ERR_CORRUPT naming the field.
 * Errors: PQ_ERR_INVALID_ARGUMENT (NULL data, seq_id exists),
 * PQ_ERR_CORRUPT, PQ_ERR_INCOMPATIBLE, PQ_ERR_OUT_OF_MEMORY (limit).
 * Thread-safe. */
PQ_API pq_status pq_sequence_restore(pq_context* ctx, uint64_t seq_id,
                                     const void* data, uint64_t size);

/* pq_sequence_restore from the file at `path`. Errors: as
 * pq_sequence_restore, plus PQ_ERR_NOT_FOUND (no such file) and
 * PQ_ERR_BACKEND (a read error). */
PQ_API pq_status pq_sequence_restore_file(pq_context* ctx, uint64_t seq_id,
                                          const char* path);

/* A restore in two steps, for a state that arrives in pieces (a shared tier,
 * a network): a saved state holds every layer's description (layer, PQ
 * index and selector state sections, about 1% of the bytes) before any K/V,
 * so a server can select before the K/V have arrived.
 *
 * pq_sequence_restore_begin reads the state's beginning from `data` (it may
 * hold more; only the description is read; with size 0, data may be NULL
 * and the answer is PQ_ERR_BUFFER_TOO_SMALL with the header's 56 bytes in
 * *out_consumed), checks it as
 * pq_sequence_restore does, reserves the memory of the whole sequence in
 * config.host_memory_limit (PQ_ERR_OUT_OF_MEMORY now, not later) and adds
 * seq_id; each layer's K/V memory is allocated when its section arrives,
 * so a description never makes the library allocate more than the bytes
 * it was given. *out_consumed
 * receives the bytes read: the next call starts there. If `data` ends before
 * the description does, nothing is added and PQ_ERR_BUFFER_TOO_SMALL leaves
 * in *out_consumed how many bytes from the state's start are needed.
 *
 * Until a layer's K/V arrive, pq_decode_select works on it with the PQ
 * selector (the save coded every middle token; a context whose window is
 * smaller than the saver's would need codes of tokens not coded, and gets
 * PQ_ERR_BAD_STATE); every call that reads or changes the layer's K/V
 * (fetch, attend, append, prefill, pq_prefill_queries, pq_index_codes,
 * truncate, fork, save) and a select with another selector or with
 * config.pq_rerank (which reads the keys) return
 * PQ_ERR_BAD_STATE naming the layer. Selections equal those of the saved
 * sequence. Errors: as pq_sequence_restore. */
PQ_API pq_status pq_sequence_restore_begin(pq_context* ctx, uint64_t seq_id,
                                           const void* data, uint64_t size,
                                           uint64_t* out_consumed);

/* Reads the next section of a restore begun with pq_sequence_restore_begin:
 * `data` starts at the first byte not yet read (the sum of the
 * *out_consumed so far) and holds at least that section; exactly one
 * section is read and *out_consumed receives its size. The sections are
 * each layer's K/V in layer order, then the end section; after the end
 * section the sequence is complete and further calls are PQ_ERR_BAD_STATE.
 * A short `data` is PQ_ERR_BUFFER_TOO_SMALL with the bytes the section
 * needs in *out_consumed; a section that fails its checksum or comes out of
 * order is PQ_ERR_CORRUPT, and a failed allocation of the layer's K/V
 * memory (host_alloc) is PQ_ERR_OUT_OF_MEMORY: both change nothing (the
 * section may be given again); K/V that do not fit the layer, or hold a NaN or Inf, are
 * PQ_ERR_CORRUPT and end the restore: the sequence stays as it is, selects
 * as before, and must be removed. Threading: calls for one seq_id are
 * serialised; they may run concurrently with selections on seq_id. */
PQ_API pq_status pq_sequence_restore_kv(pq_context* ctx, uint64_t seq_id,
                                        const void* data, uint64_t size,
                                        uint64_t* out_consumed);

/* ------------------------------------------------------------------------ */
/* Prefill and decode                                                       */
/* ------------------------------------------------------------------------ */

/* Appends the prompt's keys and values for one layer (keys and values:
 * tokens x num_kv_heads x head_dim, same token count, config dtype) and
 * schedules that layer's PQ build on the worker pool over all its tokens.
 * Returns once the data is copied: the caller may reuse its buffers. Layers
 * may come in any order. Calling again for the same layer appends (chunked
 * prefill, a new turn) and rebuilds the index over all tokens; a build still
 * running for that layer is superseded. Only the PQ selector builds an
 * index; the others skip the build.
 * Non-finite values (NaN, Inf) are rejected with PQ_ERR_INVALID_ARGUMENT
 * naming the token and head; nothing is stored then.
 * Device K/V on the CUDA backend (both tensors PQ_MEMORY_DEVICE): the copy
 * to host memory is enqueued on the sequence's stream (see
 * pq_sequence_set_stream) and the call returns without waiting; work the
 * caller enqueues on that stream afterwards may overwrite the buffers. The
 * index build starts once the copy has landed. The checks that need the
 * data (non-finite values, the memory limit) then run at that point, and a
 * failure is returned, once, by the next call on this (sequence, layer),
 * with nothing stored. Calls on the layer wait for the copy first.
 * Errors: PQ_ERR_INVALID_ARGUMENT, PQ_ERR_NOT_FOUND (sequence),
 * PQ_ERR_OUT_OF_MEMORY (limit; nothing stored), PQ_ERR_UNSUPPORTED (device
 * memory on the CPU backend).
 * Threading: see the contract at the top; same-layer calls serialise. */
PQ_API pq_status pq_prefill_layer(pq_context* ctx, uint64_t seq_id,
                                  int32_t layer, const pq_tensor* keys,
                                  const pq_tensor* values);

/* Appends decode tokens' K/V (usually 1 token) to one layer without a
 * rebuild (paper Algorithm 2, lines 3-7): they join the local window, and
 * the tokens that leave it become middle tokens, coded with their nearest
 * centroids before the next selection. The layer must have been prefilled.
 * Errors: as pq_prefill_layer, plus PQ_ERR_BAD_STATE before any prefill of
 * this layer. Threading: as pq_prefill_layer. */
PQ_API pq_status pq_decode_append(pq_context* ctx, uint64_t seq_id,
                                  int32_t layer, const pq_tensor* keys,
                                  const pq_tensor* values);

/* --- Keys in the caller's paged pool (added in 0.10) ----------------------
 * Serving engines keep K/V in a pool of slots and a table per request that
 * maps its token positions to slots (vLLM's block table, SGLang's
 * req_to_token row). pq_paged_keys describes where a sequence's keys are:
 * the key of position p of the sequence is row slot(p) of `pool`, where
 *   slot(p) = slots[p]                                     (slots != NULL)
 *   slot(p) = block_table[p / block_size] * block_size + p % block_size
 *                                                    (block_table != NULL)
 *   slot(p) = p                                      (both NULL: dense)
 * for p < map_length (slots, or block_table entries * block_size). pool is
 * an ordinary pq_tensor whose tokens are the pool's slots, in host memory,
 * in the config dtype: vLLM's key cache [blocks * block_size][kv_heads]
 * [head_dim] is token-major with tokens = blocks * block_size. Every slot
 * is checked against pool.tokens and every block id against
 * pool.tokens / block_size. The library reads the pool during the call
 * only. */
typedef struct pq_paged_keys {
  pq_tensor pool;             /* the engine's key pool, host memory */
  const int64_t* slots;       /* slot of each position, or NULL */
  const int32_t* block_table; /* block of each block_size positions, or NULL */
  int32_t block_size;         /* tokens per block (block_table only), >= 1 */
  int64_t map_length;         /* entries of slots or block_table */
  int64_t tokens;             /* tokens this call appends (append calls) */
} pq_paged_keys;

/* pq_prefill_layer and pq_decode_append for an index-only context
 * (PQ_KV_TIER_CALLER) whose keys are in a paged pool: the keys of
 * positions [L, L + keys->tokens) are read from the pool through the map,
 * L the layer's length before the call (0 for a first prefill). Values
 * stay in the caller's pool. Otherwise as the dense calls (checks, all or
 * nothing, the build policy of PQ_KV_TIER_CALLER).
 * Errors: PQ_ERR_INVALID_ARGUMENT (keys NULL, map entries or slots out of
 * range, both slots and block_table set, NaN/Inf keys), PQ_ERR_UNSUPPORTED
 * (a context that stores K/V: it needs the values, pass them with
 * pq_prefill_layer; a pool in device memory), PQ_ERR_NOT_FOUND,
 * PQ_ERR_OUT_OF_MEMORY, PQ_ERR_BAD_STATE (an append before any prefill).
 * Threading: as pq_prefill_layer. */
PQ_API pq_status pq_prefill_layer_paged(pq_context* ctx, uint64_t seq_id,
                                        int32_t layer,
                                        const pq_paged_keys* keys);
PQ_API pq_status pq_decode_append_paged(pq_context* ctx, uint64_t seq_id,
                                        int32_t layer,
                                        const pq_paged_keys* keys);

/* ------------------------------------------------------------------------ */
/* Selection and fetch                                                      */
/* ------------------------------------------------------------------------ */

/* A selection: per kv head, ascending unique token positions. The caller
 * owns both arrays. Row h of positions starts at positions[h * capacity]
 * and holds counts[h] valid entries. The counts of a selection made by
 * pq_decode_select are equal for every kv head, except with AdaKV, whose
 * heads share a layer's budget unevenly (each <= capacity). */
typedef struct pq_selection {
  int32_t* positions; /* num_kv_heads * capacity entries */
  int32_t* counts;    /* num_kv_heads entries */
  int64_t capacity;   /* entries per kv head, >= pq_selection_capacity() */
} pq_selection;

/* The capacity per kv head that pq_decode_select needs for (seq_id, layer)
 * at its current length: min(length, sink + topk + local), where topk is
 * the most one kv head may take (for AdaKV, more than its mean budget).
 * Thread-safe. */
PQ_API pq_status pq_selection_capacity(const pq_context* ctx, uint64_t seq_id,
                                       int32_t layer, int64_t* out_capacity);

/* The capacity per kv head that pq_decode_select needs at `layer` for a
 * sequence of `tokens` tokens, without a sequence (added in 0.4). It never
 * decreases as tokens grow, so the capacity for the longest sequence a
 * server admits sizes every selection buffer once. Errors:
 * PQ_ERR_INVALID_ARGUMENT (layer, tokens < 0). Thread-safe. */
PQ_API pq_status pq_selection_capacity_for(const pq_context* ctx, int32_t layer,
                                           int64_t tokens,
                                           int64_t* out_capacity);

/* Selects, per kv head, the sink tokens, the top-k middle tokens for the
 * query (1 token x num_q_heads x head_dim, config dtype; an fp8 context
 * takes F32, F16 or BF16 queries, see pq_dtype) and the local
 * tokens, writing them ascending into *out. With the PQ selector it waits
 * for this layer's build if it is still running (other layers do not wait),
 * and codes any tokens that left the local window since the last call.
 * out->positions (num_kv_heads * capacity entries) and out->counts
 * (num_kv_heads entries) must not overlap; *out itself is read before
 * anything is written, so the positions may lie over it.
 * Errors: PQ_ERR_INVALID_ARGUMENT (query shape, NaN in the query,
 * positions and counts that overlap),
 * PQ_ERR_BUFFER_TOO_SMALL (out->capacity below the capacity needed, which
 * is written to every out->counts[h]; positions are not touched),
 * PQ_ERR_NOT_FOUND, PQ_ERR_BAD_STATE (layer never prefilled).
 * A too-small selection is PQ_ERR_BUFFER_TOO_SMALL, where a too-small
 * pq_fetch_kv output is PQ_ERR_INVALID_ARGUMENT: only the library knows the
 * capacity a selection needs, so it reports it for the caller to grow the
 * buffer and call again (0.4; PQ_ERR_INVALID_ARGUMENT before).
 * Threading: serialised with other calls on the same (sequence, layer). */
PQ_API pq_status pq_decode_select(pq_context* ctx, uint64_t seq_id,
                                  int32_t layer, const pq_tensor* query,
                                  pq_selection* out);

/* Gathers the K and V of a selection into the caller's buffers. Output
 * tensors describe num_kv_heads heads and at least max(counts) tokens, in
 * the config dtype; the selected token i of kv head h goes to row (i, h).
 * With PQ_LAYOUT_HEAD_MAJOR and tokens = capacity, each kv head's rows are
 * contiguous: [kv_head][capacity][head_dim], ready for attention. Bytes are
 * copied exactly as stored: for an fp8 dtype one byte per element, without
 * the scales (apply config.kv_scales as for the engine's own pool).
 * Positions are checked against the length.
 * The selection is read once, before any row is written: the outputs may
 * lie over it (it is overwritten after it was read, and the rows are those
 * of the positions as they were when the call began).
 * Errors: PQ_ERR_INVALID_ARGUMENT, PQ_ERR_NOT_FOUND, PQ_ERR_UNSUPPORTED
 * (device memory on the CPU backend). Output tensors with fewer than
 * max(counts) tokens are PQ_ERR_INVALID_ARGUMENT ("out_keys.tokens is 3;
 * expected at least 40"), not PQ_ERR_BUFFER_TOO_SMALL as a too-small
 * selection of pq_decode_select is: the size needed is max(counts) of the
 * caller's own selection, known before the call, so this is a wrong
 * argument, like a wrong head count, and nothing is written. It has been
 * PQ_ERR_INVALID_ARGUMENT since the first release and stays so for the
 * callers that test for it. Threading: as pq_decode_select. */
PQ_API pq_status pq_fetch_kv(pq_context* ctx, uint64_t seq_id, int32_t layer,
                             const pq_selection* selection,
                             const pq_tensor* out_keys,
                             const pq_tensor* out_values);

/* The attention of one token's query over a selection (added in 0.4), read
 * straight from the host store: what a CPU inference engine needs from the
 * decode step, without the gathered copy of pq_fetch_kv. For query head q
 * of kv head h = q / (num_q_heads / num_kv_heads), over the selected
 * positions p_i of row h:
 *   out[q][d]  = sum_i softmax_i(scale * query_q . K[p_i]) * V[p_i][d]
 *   out_lse[q] = ln sum_i exp(scale * query_q . K[p_i])
 * in float (f32 accumulation, whatever the stored dtype; for bf16 K/V on a
 * CPU with AVX512_BF16, and fp8 K/V where it also has AVX512_VBMI, the
 * value sum multiplies by the softmax weights rounded to bf16, as PyTorch's
 * CPU attention does for bf16, which moves out[q][d] by at most 2^-8 x
 * sum_i softmax_i |V[p_i][d]| (the rows' own rounding: bf16 2^-8, e4m3
 * 2^-4); the logits and the log-sum-exp stay in float); the log-sum-exp
 * lets a caller merge attentions over disjoint token sets (for example this
 * one and one over tokens it keeps itself). query: 1 token x num_q_heads x
 * head_dim in the config dtype (an fp8 context: F32, F16 or BF16; K and V
 * are the stored values times their kv_scales) (host or device memory);
 * scale 0 means
 * 1 / sqrt(head_dim); out: num_q_heads * head_dim floats of host memory;
 * out_lse: num_q_heads floats, or NULL, not overlapping out. A kv head
 * with no selected token gives zeros and -inf. A repeated position counts
 * as often as it appears.
 * With config.tail_estimate PQ_TAIL_CODE_MEANS, the sums above also run
 * over the coded middle tokens of kv head h that the selection leaves out
 * (sinks and the local window are never estimated), each with logit scale x
 * its lookup-table score and the mean value of its first-subspace code
 * (pq_tail_estimate); out_lse then includes them. A selection that holds
 * every middle token gives the same result as without the estimate.
 * Works on every backend (the K/V are read on the host). Its time counts in
 * pq_stats.fetch_seconds, as the fetch it stands in for.
 * Errors: PQ_ERR_INVALID_ARGUMENT (shapes, scale < 0 or not finite, NaN in
 * the query, positions past the length), PQ_ERR_NOT_FOUND,
 * PQ_ERR_BAD_STATE (layer never prefilled). Threading: as pq_fetch_kv. */
PQ_API pq_status pq_decode_attend(pq_context* ctx, uint64_t seq_id, int32_t layer,
                                  const pq_tensor* query,
                                  const pq_selection* selection, float scale,
                                  float* out, float* out_lse);

/* The tail estimate alone (added in 0.12; config.tail_estimate
 * PQ_TAIL_CODE_MEANS), for a caller that attends over the selected rows
 * itself (after pq_fetch_kv or the device fetch): out[q][d] and out_lse[q]
 * are the attention output and log-sum-exp over the estimated tail alone,
 * the part pq_decode_attend adds (same query, selection and scale; see
 * pq_tail_estimate). Merge it with your attention (o_a, lse_a) over the
 * selected rows, per query head:
 *   m = max(lse_a, lse_t), w_a = exp(lse_a - m), w_t = exp(lse_t - m),
 *   o = (w_a o_a + w_t o_t) / (w_a + w_t),   lse = m + ln(w_a + w_t),
 * which equals pq_decode_attend's result up to float rounding. A kv head
 * with nothing left out gives zeros and -inf (w_t = 0). out_lse may not be
 * NULL. No K/V row is read; the value means are brought up to date as in
 * pq_decode_attend.
 * Errors: as pq_decode_attend; PQ_ERR_BAD_STATE when config.tail_estimate
 * is PQ_TAIL_NONE; PQ_ERR_UNSUPPORTED on an index-only context (it keeps no
 * value). Threading: as pq_decode_attend. */
PQ_API pq_status pq_decode_tail(pq_context* ctx, uint64_t seq_id, int32_t layer,
                                const pq_tensor* query,
                                const pq_selection* selection, float scale,
                                float* out, float* out_lse);

/* --- Several query tokens in one select (added in 0.10) ------------------
 * Speculative verification and chunked prefill over a cached context query
 * the cache with several tokens of one sequence at once. */

/* The rows a multi-token select writes. Each row is ascending and unique,
 * holds counts[row] positions and is padded with -1 up to the capacity
 * (the padded index list SGLang's sparse attention takes, with the counts
 * as its valid lengths). */
typedef enum pq_select_rows {
  /* Token t's selection for kv head h in row t * num_kv_heads + h: what
   * pq_decode_select would return for that token's query alone. */
  PQ_ROWS_PER_TOKEN = 0,
  /* Row h: the union over the query tokens of kv head h's selections. */
  PQ_ROWS_PER_HEAD = 1,
  /* One row for the request: the union over query tokens and kv heads. */
  PQ_ROWS_PER_REQUEST = 2
} pq_select_rows;

/* The rows and the capacity per row that pq_decode_select_multi needs at
 * (seq_id, layer)'s current length for query_tokens tokens (>= 1) and the
 * row form `rows`: rows = query_tokens * num_kv_heads, num_kv_heads or 1;
 * capacity = sinks + local window + min(middle, u * k), u the selections a
 * row unites (1, query_tokens, or query_tokens * num_kv_heads) and k the
 * most middle tokens one kv head may take. Either output may be NULL.
 * Errors: PQ_ERR_INVALID_ARGUMENT, PQ_ERR_NOT_FOUND. Thread-safe. */
PQ_API pq_status pq_selection_capacity_multi(const pq_context* ctx,
                                             uint64_t seq_id, int32_t layer,
                                             int64_t query_tokens,
                                             int32_t rows /* pq_select_rows */,
                                             int64_t* out_rows,
                                             int64_t* out_capacity);

/* pq_decode_select for the query tokens of one sequence (queries: tokens x
 * num_q_heads x head_dim, config dtype, host memory), in one call: every
 * token is scored against the layer's tokens as they are now (the caller's
 * attention masks what a token may not see; the local window holds the
 * newest tokens), one after another in token order, each as a
 * pq_decode_select of its query would (selectors that keep state update it
 * per token), and the rows are written as `rows` says. out->positions
 * holds rows * out->capacity entries, out->counts one per row (see
 * pq_selection_capacity_multi). keys (may be NULL): where exact keys are,
 * for config.pq_rerank > 0 in an index-only context (PQ_KV_TIER_CALLER),
 * which needs it; its map covers the layer's positions and its tokens
 * field is not read. In other contexts keys is not read.
 * Errors: as pq_decode_select (PQ_ERR_BUFFER_TOO_SMALL writes the needed
 * capacity to every out->counts entry), plus PQ_ERR_INVALID_ARGUMENT for a
 * bad `rows`, and PQ_ERR_BAD_STATE for re-ranking in an index-only
 * context without keys. Threading: as pq_decode_select. Queries and rows in
 * device memory: pq_decode_select_multi_device (the CUDA backend). */
PQ_API pq_status pq_decode_select_multi(pq_context* ctx, uint64_t seq_id,
                                        int32_t layer, const pq_tensor* queries,
                                        int32_t rows /* pq_select_rows */,
                                        const pq_paged_keys* keys,
                                        pq_selection* out);

/* --- One layer for a batch of sequences (added in 0.4) -------------------
 * A serving engine runs a layer for every request of its batch at once:
 * these calls take the whole batch, so a decode step costs O(layers) calls
 * rather than O(batch x layers), and the library spreads the items over
 * its worker pool (the calling thread works too).
 *
 * Each item is the argument list of the per-sequence call, and succeeds or
 * fails on its own: item.status receives PQ_OK or the status the
 * per-sequence call would have returned, and outputs are written exactly as
 * that call writes them. The call returns PQ_OK when every item succeeded;
 * else the status of the first failing item, with pq_last_error() naming it
 * ("items[3] (seq_id 42): ..."). A seq_id may appear once per batch.
 * The items array is read once, before any item runs: an item's outputs
 * may lie over another item's inputs (its selection, its query), which that
 * item reads as they were when the call began. Call-level errors (ctx or
 * items NULL with count > 0, count < 0, a bad layer, a repeated seq_id,
 * outputs of two items that overlap, an output over the items array, where
 * the statuses go) return PQ_ERR_INVALID_ARGUMENT before any item runs; no
 * item status is written.
 * Threading: as the per-sequence calls, item by item; items of one batch
 * run concurrently, so they must not share outputs. */

typedef struct pq_select_item {
  uint64_t seq_id;
  pq_tensor query;      /* as pq_decode_select's query */
  pq_selection out;     /* as pq_decode_select's out */
  pq_status status;     /* written by the call */
} pq_select_item;

/* pq_decode_select for every item, at one layer. */
PQ_API pq_status pq_decode_select_batch(pq_context* ctx, int32_t layer,
                                        pq_select_item* items, int64_t count);

typedef struct pq_fetch_item {
  uint64_t seq_id;
  pq_selection selection; /* as pq_fetch_kv's selection (not written) */
  pq_tensor out_keys;     /* as pq_fetch_kv's */
  pq_tensor out_values;
  pq_status status;       /* written by the call */
} pq_fetch_item;

/* pq_fetch_kv for every item, at one layer. */
PQ_API pq_status pq_fetch_kv_batch(pq_context* ctx, int32_t layer,
                                   pq_fetch_item* items, int64_t count);

/* --- A decode step that stays on the device (added in 0.7) ---------------
 * On the CUDA backend a selection can live in device memory: its
 * positions (num_kv_heads * capacity int32) and counts (num_kv_heads int32)
 * are device arrays of the context's device, with pq_selection's layout.
 * pq_decode_select_device writes one and pq_fetch_kv_device reads it, both
 * enqueued on the sequence's stream (pq_sequence_set_stream) without a host
 * wait, so that select and fetch overlap the caller's own work on that
 * stream; the host-positions calls above wait once for the positions. The
 * results are complete once the stream is. */

/* pq_decode_select with a query and a selection in device memory: the
 * lookup table is built on the device from the query (bit-identical to the
 * host's), the middle is scored and its top k chosen there, and the sinks,
 * the middle and the local window are written into out's device arrays,
 * all on the sequence's stream; the call returns without waiting. It
 * selects what pq_decode_select would, with every config.key_rotary (the
 * table reads the query in the codebook's order) and with config.pq_rerank
 * (since 0.9: the candidates' keys are read by the device from the host
 * store and re-ranked there, in the host's arithmetic). A NaN in the query
 * is not detected (that needs the host to read it). PQ selector only.
 * Errors: PQ_ERR_INVALID_ARGUMENT (query shape or dtype, out or its arrays
 * NULL), PQ_ERR_BUFFER_TOO_SMALL (out->capacity below
 * pq_selection_capacity; the message says what is needed; nothing is
 * written), PQ_ERR_UNSUPPORTED (the CPU backend, another selector, a query
 * or arrays the device does not know as its memory, config.pq_rerank > 0
 * with a K/V store in the caller's host_alloc memory, which the device
 * cannot read, or in an index-only context, whose keys are in the caller's
 * pool), PQ_ERR_NOT_FOUND, PQ_ERR_BAD_STATE (layer never prefilled).
 * Threading: as pq_decode_select. */
PQ_API pq_status pq_decode_select_device(pq_context* ctx, uint64_t seq_id,
                                         int32_t layer, const pq_tensor* query,
                                         pq_selection* out);

/* pq_decode_select_multi with queries and rows in device memory (added in
 * 0.10): queries tokens x num_q_heads x head_dim (config dtype) in device
 * memory; out->positions (rows x out->capacity int32) and out->counts (rows
 * int32) device arrays, rows and capacity from pq_selection_capacity_multi.
 * Each query token is selected on the device as pq_decode_select_device
 * would select it (the tokens of one call in one launch chain), into the
 * stream's scratch; then the rows are written there as `rows` says: a
 * token's row as it is, or the sorted unique union per kv head or per
 * request, every row padded with -1 up to the capacity. All of it is
 * enqueued on the sequence's stream and the call returns without a host
 * wait; the rows are complete once the stream is. It selects what
 * pq_decode_select_multi would (keys: with config.pq_rerank the device
 * re-ranks from the host store, as pq_decode_select_device does; in an
 * index-only context that is PQ_ERR_UNSUPPORTED, see PQ_KV_TIER_CALLER).
 * A NaN in the queries is not detected. PQ selector only.
 * Errors: PQ_ERR_INVALID_ARGUMENT (queries shape or dtype, a bad `rows`,
 * out or its arrays NULL or overlapping), PQ_ERR_BUFFER_TOO_SMALL
 * (out->capacity below pq_selection_capacity_multi; the message says what
 * is needed; nothing is written, the counts included), PQ_ERR_UNSUPPORTED
 * (as pq_decode_select_device), PQ_ERR_NOT_FOUND, PQ_ERR_BAD_STATE (layer
 * never prefilled). Threading: as pq_decode_select. */
PQ_API pq_status pq_decode_select_multi_device(pq_context* ctx, uint64_t seq_id,
                                               int32_t layer,
                                               const pq_tensor* queries,
                                               int32_t rows /* pq_select_rows */,
                                               pq_selection* out);

/* pq_fetch_kv of a selection in device memory, as pq_decode_select_device
 * writes it, into device tensors of at least selection->capacity tokens:
 * one gather on the device reads the selection there, the sink and local
 * rows from the device window and the others from the host store across
 * PCIe; the call returns without waiting. The block cache is neither read
 * nor updated (its bookkeeping needs the positions on the host) and its
 * counters do not move. Positions are read by the device: a count above
 * capacity is taken as capacity, and a position outside the sequence's
 * tokens is not read, its rows written as zeros.
 * Errors: PQ_ERR_INVALID_ARGUMENT (output shapes, dtype, overlap, NULL
 * arrays), PQ_ERR_UNSUPPORTED (the CPU backend, host outputs, arrays the
 * device does not know as its memory, a K/V store in the caller's
 * host_alloc memory, which the device cannot read, an index-only context,
 * which holds no K/V), PQ_ERR_NOT_FOUND, PQ_ERR_BAD_STATE (layer never
 * prefilled). Threading: as pq_fetch_kv. */
PQ_API pq_status pq_fetch_kv_device(pq_context* ctx, uint64_t seq_id,
                                    int32_t layer, const pq_selection* selection,
                                    const pq_tensor* out_keys,
                                    const pq_tensor* out_values);

/* pq_decode_select_device for every item, at one layer (added in 0.8):
 * items as pq_decode_select_batch's (query and out->positions/counts in
 * device memory), with that call's item-by-item statuses and call-level
 * errors. When the items' sequences share one stream, the whole batch is
 * one launch chain on it (the LUTs, one scan, one top-k and the fill of
 * every selection: four launches and one table upload, whatever the
 * count; a fifth, the re-ranking of every item, with config.pq_rerank),
 * enqueued without a host wait; otherwise the items run one by one. Each item selects what its pq_decode_select_device would.
 * Threading: as pq_decode_select_batch. */
PQ_API pq_status pq_decode_select_device_batch(pq_context* ctx, int32_t layer,
                                               pq_select_item* items,
                                               int64_t count);

/* pq_fetch_kv_device for every item, at one layer (added in 0.8): items
 * as pq_fetch_kv_batch's, with device selections and device outputs of at
 * least selection.capacity tokens. Items sharing one stream are gathered
 * in one launch, without a host wait. Threading: as pq_fetch_kv_batch. */
PQ_API pq_status pq_fetch_kv_device_batch(pq_context* ctx, int32_t layer,
                                          pq_fetch_item* items, int64_t count);

/* ------------------------------------------------------------------------ */
/* Inputs some selectors need                                               */
/* ------------------------------------------------------------------------ */

/* The last prompt queries of one layer (tokens x num_q_heads x head_dim,
 * after RoPE, config dtype; F32, F16 or BF16 for fp8), for selectors that
 * score the prompt from an
 * observation window (SnapKV, PyramidKV, SCOPE, AdaKV, ZigZagKV,
 * PyramidInfer; FastGen profiles its heads from them, InfiniGen takes its
 * skew from them; Keyformer takes the window rows as its first step). Call
 * after the layer's prefill; the last observation_window tokens of the
 * tensor are used, and the prompt tokens are scored against them at once. Other selectors ignore
 * the call (PQ_OK). Errors: as pq_prefill_layer, plus PQ_ERR_BAD_STATE
 * before any prefill of the layer. Threading: as pq_prefill_layer. */
PQ_API pq_status pq_prefill_queries(pq_context* ctx, uint64_t seq_id,
                                    int32_t layer, const pq_tensor* queries);

/* Attention probabilities the caller computed over the tokens of
 * `selection` (usually the one pq_decode_select returned at this step),
 * per kv head and summed over the group's query heads:
 * probs[h * selection->capacity + i] belongs to token
 * selection->positions[h * selection->capacity + i]. H2O and SCOPE add
 * them to each token's score, FastGen's heavy-hitter heads to its sum and
 * observation count (it ranks by their mean); a score stops at FLT_MAX,
 * so a saved state always restores. Scissorhands takes each call as one
 * step and records which tokens got at least uniform attention; Keyformer
 * takes each call as one step of its Gumbel softmax over log(probs);
 * others ignore the call (PQ_OK). To seed H2O with the prompt's attention,
 * pass a selection of all prompt tokens with their column sums.
 * Probabilities must be finite and >= 0 (any such value). Threading: as
 * pq_decode_select. */
PQ_API pq_status pq_observe_attention(pq_context* ctx, uint64_t seq_id,
                                      int32_t layer,
                                      const pq_selection* selection,
                                      const float* probs);

/* What a token is, for selectors that keep tokens by kind (FastGen): bit
 * flags, one byte per token. */
typedef enum pq_token_class {
  PQ_TOKEN_PLAIN = 0,
  /* A special token of the tokenizer (<s>, [INST], <start_of_turn>, ...). */
  PQ_TOKEN_SPECIAL = 1,
  /* A token made only of punctuation and white space (".", ":\n", ...). */
  PQ_TOKEN_PUNCTUATION = 2
} pq_token_class;

/* The classes (pq_token_class flags) of the sequence's tokens at positions
 * first .. first + count - 1, for every layer; a later call replaces what
 * an earlier one said of a position. A token never described is
 * PQ_TOKEN_PLAIN. first may be at most the tokens stored in the sequence's
 * fullest layer, so a token's class may come before its K/V (give the
 * prompt's before pq_prefill_queries: FastGen profiles its heads there).
 * Classes follow the tokens through pq_sequence_truncate, pq_sequence_fork
 * and the saved state. Selectors other than FastGen ignore them (PQ_OK,
 * after the same checks). FastGen keeps one byte per described position in
 * every layer, counted against config.host_memory_limit as held (a fork
 * and a restore count their copy; a truncate gives back what described
 * the tokens that go). Errors: PQ_ERR_INVALID_ARGUMENT (first or count
 * negative, first past the stored tokens, first + count past 2147483647,
 * classes NULL with count > 0, a value with a bit other than the flags
 * above, naming its index), PQ_ERR_NOT_FOUND (sequence),
 * PQ_ERR_OUT_OF_MEMORY (the limit, checked for every layer before any
 * changes). Threading: must not race with pq_sequence_truncate, fork,
 * restore or another pq_sequence_token_classes of seq_id; other calls on
 * it may run concurrently (each layer takes its lock in turn). */
PQ_API pq_status pq_sequence_token_classes(pq_context* ctx, uint64_t seq_id,
                                           int64_t first, int64_t count,
                                           const uint8_t* classes);

/* A selection a step early, from an estimate of the query (added in 0.7):
 * the layer's selector chooses for query_estimate (shaped as pq_decode_select's
 * query) as pq_decode_select would, without changing what it keeps (drop
 * marks, step counts), and writes the selection into *out, so that the
 * caller can start fetching those rows (pq_fetch_kv into its buffers, a
 * device upload) while it computes the layer below. The layer keeps it as
 * a hint: the next pq_decode_select of this (sequence, layer) at the same
 * length, or one token longer (the step's own token, appended after the
 * speculation, joins the local window), counts how many of the middle
 * tokens it chooses the hint held, in its middle or its local window
 * (pq_stats.hint_tokens, hint_covered); nothing else reads it. InfiniGen
 * is made for it (its authors estimate layer l's query from layer l-1's
 * attention input and layer l's query weights); any selector works. Errors:
 * as pq_decode_select. Threading: as pq_decode_select. */
PQ_API pq_status pq_decode_speculate(pq_context* ctx, uint64_t seq_id,
                                     int32_t layer,
                                     const pq_tensor* query_estimate,
                                     pq_selection* out);

/* ------------------------------------------------------------------------ */
/* Index introspection                                                      */
/* ------------------------------------------------------------------------ */

typedef struct pq_layer_info {
  uint32_t struct_size;     /* set by the caller: sizeof(pq_layer_info) */
  int64_t tokens;           /* tokens stored */
  int64_t prefill_tokens;   /* tokens that came through pq_prefill_layer */
  int64_t middle_tokens;    /* tokens between the sinks and the local window */
  int64_t coded_tokens;     /* tokens that have PQ codes */
  int32_t build_pending;    /* 1 while a build is queued or running */
  int32_t kmeans_iterations; /* iterations the last finished build ran */
  int32_t kmeans_budget;     /* iteration budget it was given */
  int32_t index_ready;      /* 1 once a build has finished (only the PQ
                               selector builds one) */
  double build_seconds;     /* wall time of the last finished build */
  /* Bytes the selector read to decide at the last pq_decode_select (all kv
   * heads): codes for PQ, key dimensions for SparQ, summaries for InfLLM and
   * Quest, full keys for EXACT. For budgets compared by communication. */
  uint64_t last_select_bytes;
} pq_layer_info;

/* Fills *out for (seq_id, layer) without waiting for builds. Thread-safe. */
PQ_API pq_status pq_layer_info_get(const pq_context* ctx, uint64_t seq_id,
                                   int32_t layer, pq_layer_info* out);

/* Copies the PQ codes of tokens [first, first+count) of one kv head into
 * out (count * pq_subspaces bytes, token-major). Waits for the layer's
 * build. A build codes every token it covers (the prefill's local window
 * too); tokens appended since are coded when they leave the local window.
 * A range reaching a token without codes yet is PQ_ERR_INVALID_ARGUMENT
 * (first and count are checked without first + count overflowing); a layer
 * without index (never prefilled, or a selector other than PQ) is
 * PQ_ERR_BAD_STATE.
 * Thread-safe. */
PQ_API pq_status pq_index_codes(pq_context* ctx, uint64_t seq_id,
                                int32_t layer, int32_t kv_head, int64_t first,
                                int64_t count, uint8_t* out);

/* Copies the centroids of one kv head into out: pq_subspaces x 2^pq_bits x
 * (head_dim / pq_subspaces) floats. Waits for the layer's build.
 * Thread-safe. */
PQ_API pq_status pq_index_centroids(pq_context* ctx, uint64_t seq_id,
                                    int32_t layer, int32_t kv_head,
                                    float* out, int64_t out_floats);

/* ------------------------------------------------------------------------ */
/* Statistics                                                               */
/* ------------------------------------------------------------------------ */

typedef struct pq_stats {
  uint32_t struct_size;      /* set by the caller: sizeof(pq_stats) */
  int64_t sequences;         /* sequences counted */
  int64_t tokens;            /* tokens stored, summed over layers */
  uint64_t kv_bytes;         /* host bytes held by K/V stores */
  uint64_t index_bytes;      /* host bytes held by codes and centroids (with
                              * the centroids' layout for the kernels, made
                              * at a layer's first select or coding) */
  /* (K/V chunks, codes and centroids a fork shares are in the kv_bytes
   * and index_bytes of every sequence that holds them; host_bytes counts
   * shared K/V once.) */
  uint64_t builds_finished;  /* index builds completed */
  uint64_t builds_cancelled; /* builds superseded or cancelled */
  uint64_t kmeans_iterations; /* iterations run, summed over builds */
  uint64_t select_calls;
  uint64_t fetch_calls;
  double build_seconds;      /* wall time in builds (worker threads) */
  double select_seconds;     /* wall time in pq_decode_select */
  double fetch_seconds;      /* wall time in pq_fetch_kv */
  uint64_t bytes_scored;     /* bytes read to score (codes, or keys) */
  uint64_t bytes_fetched;    /* K/V bytes copied by pq_fetch_kv */
  /* Block cache (appended in 0.3), in selected middle tokens per kv head
   * that pq_fetch_kv found in a cached block (hits) or not (misses). Sink
   * and local tokens are not counted. Hit rate: hits / (hits + misses). */
  uint64_t cache_hits;
  uint64_t cache_misses;
  /* Host bytes counted against config.host_memory_limit (appended in 0.4):
   * context-wide, everything held; per sequence, its own share. */
  uint64_t host_bytes;
  /* K/V bytes the CPU copied to stage rows for the device (appended in
   * 0.7): a fetch into device memory, and the device copies of the sink and
   * local window and of block-cache blocks. With the CUDA backend the K/V
   * store lives in its page-locked, device-mapped pool and the gather kernel
   * reads the rows itself: 0. A store in the caller's pq_hooks.host_alloc
   * memory is staged. Always 0 on the CPU backend. */
  uint64_t bytes_staged;
  /* Hints (pq_decode_speculate; appended in 0.7): the middle tokens chosen
   * by the pq_decode_select calls that followed a hint of the same layer
   * and length, and of those, the ones the hint held. Coverage:
   * hint_covered / hint_tokens. */
  uint64_t hint_tokens;
  uint64_t hint_covered;
} pq_stats;

/* Context-wide statistics, including removed sequences' counters but only
 * live sequences' tokens and bytes. Thread-safe. */
PQ_API pq_status pq_stats_get(const pq_context* ctx, pq_stats* out);

/* Statistics of one sequence. Thread-safe. */
PQ_API pq_status pq_sequence_stats_get(const pq_context* ctx, uint64_t seq_id,
                                       pq_stats* out);

/* Blocks until every build queued so far has finished, and until the
 * cancelled builds that were running (of removed or truncated sequences,
 * or superseded by a later prefill) have stopped: when it returns, a
 * removed sequence holds nothing against config.host_memory_limit.
 * Errors: the first failed build's status; PQ_ERR_BAD_STATE from inside a
 * pq_write_fn of this context (it would wait for that save). Thread-safe. */
PQ_API pq_status pq_wait_builds(pq_context* ctx);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PQCACHE_H */
