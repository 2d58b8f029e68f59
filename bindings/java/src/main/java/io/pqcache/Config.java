package io.pqcache;

import io.pqcache.swig.pq_config;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Objects;
import java.util.function.Consumer;

/**
 * An immutable context configuration: the library's defaults
 * ({@code pq_config_default}) plus the settings made on a {@link Builder}.
 * The library validates it in {@link PqContext#PqContext(Config)}, which
 * throws a {@link PqException} naming the offending field.
 *
 * <pre>{@code
 * Config config = Config.builder()
 *     .layers(30).queryHeads(9).kvHeads(3).headDim(64).dtype(DType.F16)
 *     .topkTokens(64)
 *     .build();
 * }</pre>
 */
public final class Config {
  // The settings in call order, replayed onto a fresh pq_config_default()
  // struct: the defaults stay the library's, whatever version is loaded.
  private final List<Consumer<pq_config>> settings;

  private Config(List<Consumer<pq_config>> settings) {
    this.settings = List.copyOf(settings);
  }

  /** A builder starting from the library's defaults; the geometry must be set. */
  public static Builder builder() {
    return new Builder();
  }

  /** A native pq_config for pq_create; the caller deletes it. */
  pq_config toNative() {
    pq_config config = new pq_config(); // pq_config_default() in java.i
    settings.forEach(setting -> setting.accept(config));
    return config;
  }

  /** Collects settings; each method overrides the default of one pq_config field. */
  public static final class Builder {
    private final List<Consumer<pq_config>> settings = new ArrayList<>();

    private Builder() {}

    private Builder set(Consumer<pq_config> setting) {
      settings.add(setting);
      return this;
    }

    // --- Model geometry (no defaults) ---

    /** Number of model layers, >= 1. */
    public Builder layers(int layers) {
      return set(c -> c.setNum_layers(layers));
    }

    /** Query heads, a multiple of the kv heads (GQA). */
    public Builder queryHeads(int heads) {
      return set(c -> c.setNum_q_heads(heads));
    }

    /** Key/value heads. */
    public Builder kvHeads(int heads) {
      return set(c -> c.setNum_kv_heads(heads));
    }

    /** Elements per head, divisible by {@link #pqSubspaces}. */
    public Builder headDim(int headDim) {
      return set(c -> c.setHead_dim(headDim));
    }

    /** Element type of the K/V/Q buffers; default F16. */
    public Builder dtype(DType dtype) {
      Objects.requireNonNull(dtype, "dtype");
      return set(c -> c.setDtype(dtype.code()));
    }

    // --- Product quantization and K-Means ---

    /** m, PQ subspaces per head; default 0, chosen from the head dimension. */
    public Builder pqSubspaces(int subspaces) {
      return set(c -> c.setPq_subspaces(subspaces));
    }

    /** b, bits per code (2^b centroids), 1..8; default 0, which is 8. */
    public Builder pqBits(int bits) {
      return set(c -> c.setPq_bits(bits));
    }

    /** A fixed K-Means iteration count (> 0), for reproducibility; 0 = adaptive (default). */
    public Builder kmeansIterations(int iterations) {
      return set(c -> c.setKmeans_iterations(iterations));
    }

    /** The clip of the adaptive iteration budget; defaults 2 and 25. */
    public Builder kmeansIterationRange(int min, int max) {
      return set(c -> {
        c.setKmeans_min_iterations(min);
        c.setKmeans_max_iterations(max);
      });
    }

    /** Stop when one iteration improves the objective by less than this fraction; default 1e-4. */
    public Builder kmeansTolerance(float tolerance) {
      return set(c -> c.setKmeans_tolerance(tolerance));
    }

    /** K-Means initialisation; default k-means++. */
    public Builder kmeansInit(KMeansInit init) {
      Objects.requireNonNull(init, "init");
      return set(c -> c.setKmeans_init(init.code()));
    }

    /** Training points per centroid (a seeded sample); default 256. */
    public Builder kmeansMaxPointsPerCentroid(int points) {
      return set(c -> c.setKmeans_max_points_per_centroid(points));
    }

    /** K-Means seed (any 64-bit pattern); same seed, same index. */
    public Builder seed(long seed) {
      return set(c -> c.setSeed(seed));
    }

    /** The caller's compute time per layer, alpha + beta*s + gamma*s^2 seconds (paper eq. 2). */
    public Builder computeCost(double alpha, double beta, double gamma) {
      return set(c -> {
        c.setCompute_alpha(alpha);
        c.setCompute_beta(beta);
        c.setCompute_gamma(gamma);
      });
    }

    /** A fixed time budget per layer build, in seconds (> 0). */
    public Builder layerTimeBudget(double seconds) {
      return set(c -> c.setLayer_time_budget(seconds));
    }

    /** Index build threads; 0 (default) = hardware threads. */
    public Builder workerThreads(int threads) {
      return set(c -> c.setWorker_threads(threads));
    }

    // --- Selection ---

    /** The selector; default {@link Selector#PQ}. */
    public Builder selector(Selector selector) {
      Objects.requireNonNull(selector, "selector");
      return set(c -> c.setSelector(selector.code()));
    }

    /** Initial tokens always selected; default 4. */
    public Builder sinkTokens(int tokens) {
      return set(c -> c.setSink_tokens(tokens));
    }

    /** Most recent tokens always selected; default 128. */
    public Builder localTokens(int tokens) {
      return set(c -> c.setLocal_tokens(tokens));
    }

    /** Middle tokens selected per kv head (> 0), instead of {@link #topkFraction}. */
    public Builder topkTokens(int tokens) {
      return set(c -> c.setTopk_tokens(tokens));
    }

    /** Fraction of the middle tokens selected when topkTokens is 0; default 0.2. */
    public Builder topkFraction(float fraction) {
      return set(c -> c.setTopk_fraction(fraction));
    }

    /** How a GQA group's query heads combine; default {@link GqaCombine#SUM_SOFTMAX}. */
    public Builder gqaCombine(GqaCombine combine) {
      Objects.requireNonNull(combine, "combine");
      return set(c -> c.setGqa_combine(combine.code()));
    }

    // --- Resources ---

    /** Bytes of K/V the whole context may hold; 0 (default) = unlimited. */
    public Builder hostMemoryLimit(long bytes) {
      return set(c -> c.setHost_memory_limit(bytes));
    }

    /** The compute backend; default CPU. The CUDA plug-in is found as pqcache.h describes. */
    public Builder backend(Backend backend) {
      Objects.requireNonNull(backend, "backend");
      return set(c -> c.setBackend(backend.code()));
    }

    /** CUDA device ordinal; default 0. */
    public Builder deviceId(int device) {
      return set(c -> c.setDevice_id(device));
    }

    // --- Selector parameters ---

    /** SparQ: query dimensions used to score; 0 (default) = head_dim / 128 rounded up. */
    public Builder sparqDims(int dims) {
      return set(c -> c.setSparq_dims(dims));
    }

    /** InfLLM and Quest: tokens per block; default 128. */
    public Builder blockTokens(int tokens) {
      return set(c -> c.setBlock_tokens(tokens));
    }

    /** InfLLM: representative keys per block; default 1. */
    public Builder blockRepresentatives(int keys) {
      return set(c -> c.setBlock_representatives(keys));
    }

    /** SnapKV, PyramidKV, SCOPE: prompt queries in the observation window; default 32. */
    public Builder observationWindow(int tokens) {
      return set(c -> c.setObservation_window(tokens));
    }

    /** SnapKV, PyramidKV, SCOPE: max-pooling kernel (odd); default 7. */
    public Builder poolingKernel(int tokens) {
      return set(c -> c.setPooling_kernel(tokens));
    }

    /** PyramidKV: top-layer budget / bottom-layer budget, in (0, 1]; default 0.25. */
    public Builder pyramidRatio(float ratio) {
      return set(c -> c.setPyramid_ratio(ratio));
    }

    /** SCOPE: share of the top-k budget for decode tokens; default 0.5. */
    public Builder scopeDecodeShare(float share) {
      return set(c -> c.setScope_decode_share(share));
    }

    // --- Block cache ---

    /** Block cache capacity per (sequence, layer) in tokens; 0 (default) = off. */
    public Builder cacheTokens(long tokens) {
      return set(c -> c.setCache_tokens(tokens));
    }

    /** Tokens per cache block; default 128. */
    public Builder cacheBlockTokens(int tokens) {
      return set(c -> c.setCache_block_tokens(tokens));
    }

    /** Blocks ranked per cache update (the paper's k_cache); 0 (default) = all slots. */
    public Builder cacheUpdateBlocks(int blocks) {
      return set(c -> c.setCache_update_blocks(blocks));
    }

    /** Cache eviction policy; default LRU. */
    public Builder cachePolicy(CachePolicy policy) {
      Objects.requireNonNull(policy, "policy");
      return set(c -> c.setCache_policy(policy.code()));
    }

    // --- Index quality (0.7) ---

    /** The rotary layout of keys and queries; default NONE. */
    public Builder keyRotary(KeyRotary rotary) {
      Objects.requireNonNull(rotary, "rotary");
      return set(c -> c.setKey_rotary(rotary.code()));
    }

    /** Exact re-ranking of (1 + rerank) * k candidates per kv head; 0 (default) = off. */
    public Builder pqRerank(float rerank) {
      return set(c -> c.setPq_rerank(rerank));
    }

    /** SnapKV, PyramidKV and SCOPE's pooling of window scores; default MAX. */
    public Builder pooling(Pooling pooling) {
      Objects.requireNonNull(pooling, "pooling");
      return set(c -> c.setPooling(pooling.code()));
    }

    /**
     * Background index rebuild when the tokens past the index's build pass this share of the
     * sequence (long outputs); 0 (default) = off.
     */
    public Builder pqRebuildShare(float share) {
      return set(c -> c.setPq_rebuild_share(share));
    }

    /** Scissorhands: the steps over which a token's hits count, in [1, 4096]; default 400. */
    public Builder historyWindow(int steps) {
      return set(c -> c.setHistory_window(steps));
    }

    /** Keyformer: the Gumbel softmax's temperature at the prompt, in (0, 1e6]; default 1. */
    public Builder keyformerTau(float tau) {
      return set(c -> c.setKeyformer_tau(tau));
    }

    /** Keyformer: what each step adds to the temperature, in [0, 1e6]; default 1/128. */
    public Builder keyformerTauStep(float step) {
      return set(c -> c.setKeyformer_tau_step(step));
    }

    /** ClusterKV: clusters of the middle at the first select, in [1, 65536]; default 400. */
    public Builder clusterCount(int clusters) {
      return set(c -> c.setCluster_count(clusters));
    }

    /** AdaKV: the share of k each kv head keeps of its own top tokens, in [0, 1]; default 0.2. */
    public Builder adakvSafeguard(float share) {
      return set(c -> c.setAdakv_safeguard(share));
    }

    /** ZigZagKV: the share of a kv head's attention mass its minimum budget covers, in (0, 1]; default 0.9. */
    public Builder zigzagMass(float share) {
      return set(c -> c.setZigzag_mass(share));
    }

    /** ZigZagKV: each layer's floor, as a share of the mean budget, in [0, 1]; default 0.2. */
    public Builder zigzagFloor(float share) {
      return set(c -> c.setZigzag_floor(share));
    }

    /** PyramidInfer: the ratio of its cosine schedule at the top layer, in (0, 1]; default 0.9. */
    public Builder pyramidinferDecay(float ratio) {
      return set(c -> c.setPyramidinfer_decay(ratio));
    }

    /** FastGen: the share of the window's attention a head's policy keeps, in (0, 1]; default 0.9. */
    public Builder fastgenRecovery(float share) {
      return set(c -> c.setFastgen_recovery(share));
    }

    /** InfiniGen: the share of head_dim kept of each key, in (0, 1]; default 0.2. */
    public Builder infinigenPartialRatio(float share) {
      return set(c -> c.setInfinigen_partial_ratio(share));
    }

    /** InfiniGen: how far below a head's best score a token still counts, in (0, 1e6]; default 4. */
    public Builder infinigenAlpha(float alpha) {
      return set(c -> c.setInfinigen_alpha(alpha));
    }

    // --- Storage tier (0.9) ---

    /** Where the K/V rows live; default HOST. DISK needs {@link #kvDiskPath}. */
    public Builder kvTier(KvTier tier) {
      Objects.requireNonNull(tier, "tier");
      return set(c -> c.setKv_tier(tier.code()));
    }

    /**
     * The directory of the disk tier's K/V file (an unnamed file, gone with the process); read
     * when the context is created only, ignored by the host tier.
     */
    public Builder kvDiskPath(Path directory) {
      String path = Objects.requireNonNull(directory, "directory").toString();
      return set(c -> c.setKv_disk_path(path));
    }

    // --- Tensor parallel (0.10) ---

    /**
     * The model's index of this context's kv head 0, for one context per tensor-parallel rank
     * that holds a slice of the kv heads: the ranks then select what one context with every kv
     * head selects. In [0, 65536]; default 0.
     */
    public Builder kvHeadOffset(int offset) {
      return set(c -> c.setKv_head_offset(offset));
    }

    // --- fp8 scales (0.10) ---

    /**
     * The scales of fp8 K/V (real = stored * scale): {@code count} 0 (every scale 1), 1 (one per
     * layer for K and for V) or the kv heads (one per kv head), and {@code scales} laid out
     * [layers][2][count], K then V. Copied; the library checks them when the context is created
     * (an error names the bad index).
     */
    public Builder kvScales(int count, float[] scales) {
      float[] copy = Objects.requireNonNull(scales, "scales").clone();
      return set(c -> {
        c.setKv_scale_count(count);
        ByteBuffer buffer = ByteBuffer.allocateDirect(Math.max(1, copy.length) * Float.BYTES)
            .order(ByteOrder.nativeOrder());
        buffer.asFloatBuffer().put(copy);
        c.set_kv_scales(copy.length == 0 ? null : buffer, copy.length);
      });
    }

    // --- Tail estimate (0.12) ---

    /**
     * What decodeAttend adds for the middle tokens the selection leaves out; default NONE. CODE_MEANS
     * needs {@link Selector#PQ}.
     */
    public Builder tailEstimate(TailEstimate estimate) {
      Objects.requireNonNull(estimate, "estimate");
      return set(c -> c.setTail_estimate(estimate.code()));
    }

    /**
     * PQ: the share of the middle whose keys the codebook represents worst
     * (largest quantization residuals), scored by their exact q.k instead of
     * their codes; in [0, 0.25], 0 (default) = off. Needs {@link Selector#PQ}
     * and a tier that keeps the keys.
     */
    public Builder pqOutliers(float share) {
      return set(c -> c.setPq_outliers(share));
    }

    /**
     * Budgets per kv head and step: of the k best-scored middle tokens a
     * head keeps the fewest whose estimated attention mass reaches this
     * share of the middle's (k becomes the ceiling); in [0, 1], 0 (default)
     * = off. Needs {@link Selector#PQ}, {@link Selector#EXACT} or
     * {@link Selector#SPARQ} with the sum-of-softmaxes combine and no
     * re-ranking.
     */
    public Builder topP(float share) {
      return set(c -> c.setTop_p(share));
    }

    /**
     * The fewest middle tokens a kv head keeps under {@link #topP}, as a
     * share of the middle; in [0, 1], default 0.02.
     */
    public Builder topPFloor(float share) {
      return set(c -> c.setTop_p_floor(share));
    }

    /** The configuration; the builder can be reused. */
    public Config build() {
      return new Config(settings);
    }
  }
}
