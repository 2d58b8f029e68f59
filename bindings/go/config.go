package pqcache

import (
	"math"

	"libpqcache.org/pqcache/internal/pqswig"
)

// DType is the element type of K, V and Q buffers (pq_dtype).
type DType int32

const (
	DTypeF32  DType = 0 // float32, passed as []float32
	DTypeF16  DType = 1 // IEEE binary16, raw bits in []uint16
	DTypeBF16 DType = 2 // bfloat16, raw bits in []uint16
	// fp8 K/V (0.10), codes in []uint8 (TensorFP8); queries of an fp8
	// context are DTypeF32, DTypeF16 or DTypeBF16. Scales: Config.KVScales.
	DTypeFP8E4M3 DType = 3 // e4m3fn: bias 7, no Inf, 0x7F/0xFF NaN, max 448
	DTypeFP8E5M2 DType = 4 // e5m2: bias 15, Inf and NaN
)

// Layout is the memory layout of a dense tensor (pq_layout).
type Layout int32

const (
	TokenMajor Layout = 0 // [tokens][heads][head_dim]
	HeadMajor  Layout = 1 // [heads][tokens][head_dim]
)

// Selector is how middle tokens are picked (pq_selector).
type Selector int32

const (
	SelectorPQ           Selector = 0
	SelectorExact        Selector = 1
	SelectorWindow       Selector = 2
	SelectorSparQ        Selector = 3
	SelectorInfLLM       Selector = 4
	SelectorQuest        Selector = 5
	SelectorRandom       Selector = 6
	SelectorH2O          Selector = 7
	SelectorSCOPE        Selector = 8
	SelectorSnapKV       Selector = 9
	SelectorPyramidKV    Selector = 10
	SelectorScissorhands Selector = 11
	SelectorKeyformer    Selector = 12
	SelectorClusterKV    Selector = 13
	SelectorAdaKV        Selector = 14
	SelectorZigZagKV     Selector = 15
	SelectorPyramidInfer Selector = 16
	SelectorFastGen      Selector = 17
	SelectorInfiniGen    Selector = 18
)

// SelectorCount is PQ_SELECTOR_COUNT, one past the last selector: the
// selectors are 0 to SelectorCount - 1. selector_test.go checks the
// constants above against the header's enum pq_selector and this count.
const SelectorCount = 19

// GQACombine is how the query heads of a group combine their scores
// (pq_gqa_combine).
type GQACombine int32

const (
	GQASumSoftmax GQACombine = 0
	GQAMax        GQACombine = 1
	GQAMean       GQACombine = 2
)

// KMeansInit is the K-Means initialisation (pq_kmeans_init).
type KMeansInit int32

const (
	KMeansInitRandom   KMeansInit = 0
	KMeansInitKMeansPP KMeansInit = 1
)

// Backend is the compute backend (pq_backend).
type Backend int32

const (
	BackendCPU  Backend = 0
	BackendCUDA Backend = 1
	BackendAuto Backend = 2
)

// CachePolicy is the eviction policy of the block cache (pq_cache_policy).
type CachePolicy int32

const (
	CacheLRU CachePolicy = 0
	CacheLFU CachePolicy = 1
)

// KeyRotary is how a head's rotary pairs are laid out (pq_key_rotary), so
// that each PQ subspace holds whole pairs.
type KeyRotary int32

const (
	RotaryNone        KeyRotary = 0
	RotaryHalf        KeyRotary = 1 // i with i + D/2: Hugging Face Llama, Qwen2, Gemma
	RotaryInterleaved KeyRotary = 2 // 2i with 2i + 1: GPT-J, GGUF
)

// Pooling is how SnapKV, PyramidKV and SCOPE pool window scores (pq_pooling).
type Pooling int32

const (
	PoolingMax Pooling = 0
	PoolingAvg Pooling = 1 // the official SnapKV code's
)

// TailEstimate is what Context.Attend adds for the middle tokens a
// selection leaves out (pq_tail_estimate; 0.12).
type TailEstimate int32

const (
	TailNone TailEstimate = 0 // the selected rows alone (the default)
	// TailCodeMeans: each left-out coded middle token with its lookup-table
	// score as logit and its first code's mean value; needs SelectorPQ.
	TailCodeMeans TailEstimate = 1
)

// KVTier is where each layer's K/V rows live (pq_kv_tier).
type KVTier int32

const (
	KVTierHost KVTier = 0 // host memory (the default)
	KVTierDisk KVTier = 1 // a file in KVDiskPath's directory; CPU backend only
	// KVTierCaller (0.10): index only. The caller keeps K/V in its own
	// (paged) pool; the library keeps the PQ index and the keys not coded
	// yet. Values may be the zero Tensor; FetchKV, DecodeAttend and saving
	// are ErrUnsupported. Selectors PQ, Window and Random; CPU backend.
	KVTierCaller KVTier = 2
)

// Config mirrors pq_config; include/pqcache.h documents every field, and
// docs/bindings/go.md's table gives each one's meaning and default (a test
// checks the table against this struct and DefaultConfig). Start from
// DefaultConfig and set the geometry (NumLayers, NumQHeads, NumKVHeads,
// HeadDim), which has no default.
type Config struct {
	// The model's geometry (no defaults: set them). NumQHeads is a multiple
	// of NumKVHeads (GQA); HeadDim is divisible by PQSubspaces.
	NumLayers  int
	NumQHeads  int
	NumKVHeads int
	HeadDim    int
	DType      DType // K/V/Q element type; default DTypeF16

	PQSubspaces int // m; 0: chosen from HeadDim (HeadDim / 32 clipped to [1, 4])
	PQBits      int // b, 1..8: 2^b centroids per subspace; 0: 8

	KMeansIterations           int     // > 0: at most this many; 0: adaptive (the paper's budget)
	KMeansMinIterations        int     // clip of the adaptive budget; default 2
	KMeansMaxIterations        int     // default 25
	KMeansTolerance            float32 // stop below this relative gain; default 1e-4, 0: off
	KMeansInit                 KMeansInit
	KMeansMaxPointsPerCentroid int    // training sample per centroid; default 256 (as faiss)
	Seed                       uint64 // K-Means seed; default 0x5eed: same seed, same index

	// The caller's compute time per layer for s prompt tokens, seconds:
	// ComputeAlpha + ComputeBeta*s + ComputeGamma*s^2 (the paper's eq. 2);
	// any non-zero sets the adaptive K-Means budget from it. Else
	// LayerTimeBudget (> 0), a fixed time per layer build.
	ComputeAlpha    float64
	ComputeBeta     float64
	ComputeGamma    float64
	LayerTimeBudget float64

	WorkerThreads int // index-build threads; 0: the number of hardware threads

	Selector     Selector // default SelectorPQ
	SinkTokens   int      // first tokens always selected; default 4
	LocalTokens  int      // most recent tokens always selected; default 128
	TopKTokens   int      // middle tokens per kv head; > 0 overrides TopKFraction
	TopKFraction float32  // share of the middle per kv head; default 0.2
	GQACombine   GQACombine

	HostMemoryLimit uint64 // host bytes the sequences may hold (include/pqcache.h); 0: unlimited
	Backend         Backend
	DeviceID        int    // CUDA device ordinal
	CUDAPluginPath  string // "": the library's search order

	SparQDims            int     // SparQ: query dimensions scored; 0: HeadDim / 128 rounded up
	BlockTokens          int     // InfLLM, Quest: tokens per block; default 128
	BlockRepresentatives int     // InfLLM: representative keys per block; default 1
	ObservationWindow    int     // SnapKV, PyramidKV, SCOPE: prompt queries observed; default 32
	PoolingKernel        int     // SnapKV, PyramidKV, SCOPE: odd pooling width; default 7, 1: none
	PyramidRatio         float32 // PyramidKV: top layer's budget / bottom layer's; default 0.25
	ScopeDecodeShare     float32 // SCOPE: share of the budget for decode tokens; default 0.5

	CacheTokens       int64       // block cache per (sequence, layer), tokens; 0: off
	CacheBlockTokens  int         // tokens per cache block; default 128
	CachePolicy       CachePolicy // default CacheLRU
	CacheUpdateBlocks int         // the paper's k_cache; 0: all slots

	KeyRotary KeyRotary
	PQRerank  float32 // exact re-ranking of (1 + PQRerank) * k candidates; 0: off
	Pooling   Pooling
	// PQRebuildShare: rebuild the index in the background when the tokens
	// past its build pass this share of the sequence; 0: off.
	PQRebuildShare float32
	// HistoryWindow: Scissorhands' steps over which a token's hits count.
	HistoryWindow int
	// KeyformerTau, KeyformerTauStep: Keyformer's Gumbel-softmax temperature
	// at the prompt and what each later step adds.
	KeyformerTau     float32
	KeyformerTauStep float32
	// ClusterCount: ClusterKV's clusters of the middle at the first select.
	ClusterCount int
	// AdaKVSafeguard: the share of k each kv head keeps of its own top tokens.
	AdaKVSafeguard float32
	// ZigZagMass: the share of a kv head's attention mass its minimum budget covers.
	ZigZagMass float32
	// ZigZagFloor: each layer's floor, as a share of the mean budget.
	ZigZagFloor float32
	// PyramidInferDecay: the ratio of PyramidInfer's cosine schedule at the top layer.
	PyramidInferDecay float32
	// FastGenRecovery: the share of the window's attention a FastGen head's policy keeps.
	FastGenRecovery float32
	// InfiniGenPartialRatio: the share of head_dim InfiniGen keeps of each key.
	InfiniGenPartialRatio float32
	// InfiniGenAlpha: how far below a head's best score a token still counts for InfiniGen.
	InfiniGenAlpha float32

	// KVTier: where the K/V rows live; KVTierDisk needs KVDiskPath.
	KVTier KVTier
	// KVDiskPath: the directory of the disk tier's K/V file (an unnamed
	// file, gone with the process); read by NewContext only.
	KVDiskPath string

	// KVHeadOffset: the model's index of this context's kv head 0, for one
	// context per tensor-parallel rank holding a slice of the kv heads; the
	// ranks then select what one context with every kv head selects.
	KVHeadOffset int
	// KVScaleCount: fp8 scales per layer for K and for V: 0 (every scale
	// 1), 1 or NumKVHeads (one per kv head). KVScales: [NumLayers][2]
	// [KVScaleCount] (K then V), real = stored * scale; read by NewContext
	// only. Context.Config returns the context's copy. (0.10)
	KVScaleCount int
	KVScales     []float32

	// TailEstimate: what Context.Attend adds for the middle tokens the
	// selection leaves out; default TailNone. (0.12)
	TailEstimate TailEstimate

	// PQOutliers: the share of the middle whose keys the codebook
	// represents worst (largest quantization residuals), scored by their
	// exact q.k instead of their codes; in [0, 0.25], 0 (default) off. PQ
	// selector only, not with KVTierCaller. (0.13)
	PQOutliers float32

	// TopP: budgets per kv head and step; of the k best-scored middle
	// tokens a head keeps the fewest whose estimated attention mass reaches
	// this share of the middle's (k becomes the ceiling). In [0, 1], 0
	// (default) off. SelectorPQ, SelectorExact or SelectorSparQ with
	// GQASumSoftmax and no PQRerank. (0.15)
	TopP float32
	// TopPFloor: the fewest middle tokens a head keeps under TopP, as a
	// share of the middle; in [0, 1], default 0.02. (0.15)
	TopPFloor float32
}

// DefaultConfig returns the library's defaults (pq_config_default); the
// geometry fields are 0 and must be set.
func DefaultConfig() Config {
	cc := pqswig.NewPq_config()
	defer pqswig.DeletePq_config(cc)
	pqswig.Pq_config_default(cc)
	return configFromC(cc)
}

func configFromC(cc pqswig.Pq_config) Config {
	return Config{
		NumLayers:  cc.GetNum_layers(),
		NumQHeads:  cc.GetNum_q_heads(),
		NumKVHeads: cc.GetNum_kv_heads(),
		HeadDim:    cc.GetHead_dim(),
		DType:      DType(cc.GetDtype()),

		PQSubspaces: cc.GetPq_subspaces(),
		PQBits:      cc.GetPq_bits(),

		KMeansIterations:           cc.GetKmeans_iterations(),
		KMeansMinIterations:        cc.GetKmeans_min_iterations(),
		KMeansMaxIterations:        cc.GetKmeans_max_iterations(),
		KMeansTolerance:            cc.GetKmeans_tolerance(),
		KMeansInit:                 KMeansInit(cc.GetKmeans_init()),
		KMeansMaxPointsPerCentroid: cc.GetKmeans_max_points_per_centroid(),
		Seed:                       cc.GetSeed(),

		ComputeAlpha:    cc.GetCompute_alpha(),
		ComputeBeta:     cc.GetCompute_beta(),
		ComputeGamma:    cc.GetCompute_gamma(),
		LayerTimeBudget: cc.GetLayer_time_budget(),

		WorkerThreads: cc.GetWorker_threads(),

		Selector:     Selector(cc.GetSelector()),
		SinkTokens:   cc.GetSink_tokens(),
		LocalTokens:  cc.GetLocal_tokens(),
		TopKTokens:   cc.GetTopk_tokens(),
		TopKFraction: cc.GetTopk_fraction(),
		GQACombine:   GQACombine(cc.GetGqa_combine()),

		HostMemoryLimit: cc.GetHost_memory_limit(),
		Backend:         Backend(cc.GetBackend()),
		DeviceID:        cc.GetDevice_id(),
		CUDAPluginPath:  cc.GetCuda_plugin_path(),

		SparQDims:            cc.GetSparq_dims(),
		BlockTokens:          cc.GetBlock_tokens(),
		BlockRepresentatives: cc.GetBlock_representatives(),
		ObservationWindow:    cc.GetObservation_window(),
		PoolingKernel:        cc.GetPooling_kernel(),
		PyramidRatio:         cc.GetPyramid_ratio(),
		ScopeDecodeShare:     cc.GetScope_decode_share(),

		CacheTokens:       cc.GetCache_tokens(),
		CacheBlockTokens:  cc.GetCache_block_tokens(),
		CachePolicy:       CachePolicy(cc.GetCache_policy()),
		CacheUpdateBlocks: cc.GetCache_update_blocks(),

		KeyRotary: KeyRotary(cc.GetKey_rotary()),
		PQRerank:  cc.GetPq_rerank(),
		Pooling:   Pooling(cc.GetPooling()),

		PQRebuildShare: cc.GetPq_rebuild_share(),
		HistoryWindow:  cc.GetHistory_window(),

		KeyformerTau:          cc.GetKeyformer_tau(),
		KeyformerTauStep:      cc.GetKeyformer_tau_step(),
		ClusterCount:          cc.GetCluster_count(),
		AdaKVSafeguard:        cc.GetAdakv_safeguard(),
		ZigZagMass:            cc.GetZigzag_mass(),
		ZigZagFloor:           cc.GetZigzag_floor(),
		PyramidInferDecay:     cc.GetPyramidinfer_decay(),
		FastGenRecovery:       cc.GetFastgen_recovery(),
		InfiniGenPartialRatio: cc.GetInfinigen_partial_ratio(),
		InfiniGenAlpha:        cc.GetInfinigen_alpha(),

		KVTier:     KVTier(cc.GetKv_tier()),
		KVDiskPath: cc.GetKv_disk_path(),

		KVHeadOffset: cc.GetKv_head_offset(),
		KVScaleCount: cc.GetKv_scale_count(),

		TailEstimate: TailEstimate(cc.GetTail_estimate()),
		PQOutliers:   cc.GetPq_outliers(),
		TopP:         cc.GetTop_p(),
		TopPFloor:    cc.GetTop_p_floor(),
	}
}

// toC fills a C pq_config (freed by the caller with DeletePq_config) from
// c. It starts from pq_config_default, so struct_size is this header's. An
// int that does not fit the C field's int32 is an error here, named as the
// library names a field ("config.num_layers is ..."): the C cast would
// silently wrap it into a different, maybe valid, value.
// cuda_plugin_path and kv_disk_path are left NULL: NewContext sets them.
func (c *Config) toC() (pqswig.Pq_config, error) {
	var bad error
	i32 := func(field string, v int) int {
		if (v < math.MinInt32 || v > math.MaxInt32) && bad == nil {
			bad = invalid("pq_create", "config.%s is %d; expected %d..%d (int32_t)",
				field, v, math.MinInt32, math.MaxInt32)
		}
		return v
	}
	cc := pqswig.NewPq_config()
	pqswig.Pq_config_default(cc)

	cc.SetNum_layers(i32("num_layers", c.NumLayers))
	cc.SetNum_q_heads(i32("num_q_heads", c.NumQHeads))
	cc.SetNum_kv_heads(i32("num_kv_heads", c.NumKVHeads))
	cc.SetHead_dim(i32("head_dim", c.HeadDim))
	cc.SetDtype(int(c.DType))

	cc.SetPq_subspaces(i32("pq_subspaces", c.PQSubspaces))
	cc.SetPq_bits(i32("pq_bits", c.PQBits))

	cc.SetKmeans_iterations(i32("kmeans_iterations", c.KMeansIterations))
	cc.SetKmeans_min_iterations(i32("kmeans_min_iterations", c.KMeansMinIterations))
	cc.SetKmeans_max_iterations(i32("kmeans_max_iterations", c.KMeansMaxIterations))
	cc.SetKmeans_tolerance(c.KMeansTolerance)
	cc.SetKmeans_init(int(c.KMeansInit))
	cc.SetKmeans_max_points_per_centroid(i32("kmeans_max_points_per_centroid", c.KMeansMaxPointsPerCentroid))
	cc.SetSeed(c.Seed)

	cc.SetCompute_alpha(c.ComputeAlpha)
	cc.SetCompute_beta(c.ComputeBeta)
	cc.SetCompute_gamma(c.ComputeGamma)
	cc.SetLayer_time_budget(c.LayerTimeBudget)

	cc.SetWorker_threads(i32("worker_threads", c.WorkerThreads))

	cc.SetSelector(int(c.Selector))
	cc.SetSink_tokens(i32("sink_tokens", c.SinkTokens))
	cc.SetLocal_tokens(i32("local_tokens", c.LocalTokens))
	cc.SetTopk_tokens(i32("topk_tokens", c.TopKTokens))
	cc.SetTopk_fraction(c.TopKFraction)
	cc.SetGqa_combine(int(c.GQACombine))

	cc.SetHost_memory_limit(c.HostMemoryLimit)
	cc.SetBackend(int(c.Backend))
	cc.SetDevice_id(i32("device_id", c.DeviceID))

	cc.SetSparq_dims(i32("sparq_dims", c.SparQDims))
	cc.SetBlock_tokens(i32("block_tokens", c.BlockTokens))
	cc.SetBlock_representatives(i32("block_representatives", c.BlockRepresentatives))
	cc.SetObservation_window(i32("observation_window", c.ObservationWindow))
	cc.SetPooling_kernel(i32("pooling_kernel", c.PoolingKernel))
	cc.SetPyramid_ratio(c.PyramidRatio)
	cc.SetScope_decode_share(c.ScopeDecodeShare)

	cc.SetCache_tokens(c.CacheTokens)
	cc.SetCache_block_tokens(i32("cache_block_tokens", c.CacheBlockTokens))
	cc.SetCache_policy(int(c.CachePolicy))
	cc.SetCache_update_blocks(i32("cache_update_blocks", c.CacheUpdateBlocks))

	cc.SetKey_rotary(int(c.KeyRotary))
	cc.SetPq_rerank(c.PQRerank)
	cc.SetPooling(int(c.Pooling))
	cc.SetPq_rebuild_share(c.PQRebuildShare)
	cc.SetHistory_window(i32("history_window", c.HistoryWindow))
	cc.SetKeyformer_tau(c.KeyformerTau)
	cc.SetKeyformer_tau_step(c.KeyformerTauStep)
	cc.SetCluster_count(i32("cluster_count", c.ClusterCount))
	cc.SetAdakv_safeguard(c.AdaKVSafeguard)
	cc.SetZigzag_mass(c.ZigZagMass)
	cc.SetZigzag_floor(c.ZigZagFloor)
	cc.SetPyramidinfer_decay(c.PyramidInferDecay)
	cc.SetFastgen_recovery(c.FastGenRecovery)
	cc.SetInfinigen_partial_ratio(c.InfiniGenPartialRatio)
	cc.SetInfinigen_alpha(c.InfiniGenAlpha)
	cc.SetKv_tier(int(c.KVTier))
	cc.SetKv_head_offset(i32("kv_head_offset", c.KVHeadOffset))
	cc.SetKv_scale_count(i32("kv_scale_count", c.KVScaleCount))
	cc.SetTail_estimate(int(c.TailEstimate))
	cc.SetPq_outliers(c.PQOutliers)
	cc.SetTop_p(c.TopP)
	cc.SetTop_p_floor(c.TopPFloor)

	if bad != nil {
		pqswig.DeletePq_config(cc)
		return nil, bad
	}
	return cc, nil
}
