package io.pqcache;

import io.pqcache.swig.pq_stats;

/**
 * Counters of a context or one sequence ({@code pq_stats}). The C counters are
 * unsigned 64-bit; Java longs hold the same bits (use
 * {@link Long#toUnsignedString(long)} past 2^63).
 *
 * @param sequences sequences counted
 * @param tokens tokens stored, summed over layers
 * @param kvBytes host bytes held by K/V stores
 * @param indexBytes host bytes held by PQ codes and centroids
 * @param buildsFinished index builds completed
 * @param buildsCancelled builds superseded or cancelled
 * @param kmeansIterations K-Means iterations, summed over builds
 * @param selectCalls decodeSelect calls
 * @param fetchCalls fetchKV calls
 * @param buildSeconds wall time in builds (worker threads)
 * @param selectSeconds wall time in decodeSelect
 * @param fetchSeconds wall time in fetchKV
 * @param bytesScored bytes read to score (codes, or keys)
 * @param bytesFetched K/V bytes copied by fetchKV
 * @param cacheHits selected middle tokens found in the block cache
 * @param cacheMisses selected middle tokens not found in it
 * @param hostBytes host bytes counted against the configured host memory limit
 * @param bytesStaged K/V bytes the CPU copied to stage rows for the device
 * @param hintTokens middle tokens selected after a hint ({@code decodeSpeculate})
 * @param hintCovered of those, the ones the hint held
 */
public record Stats(
    long sequences,
    long tokens,
    long kvBytes,
    long indexBytes,
    long buildsFinished,
    long buildsCancelled,
    long kmeansIterations,
    long selectCalls,
    long fetchCalls,
    double buildSeconds,
    double selectSeconds,
    double fetchSeconds,
    long bytesScored,
    long bytesFetched,
    long cacheHits,
    long cacheMisses,
    long hostBytes,
    long bytesStaged,
    long hintTokens,
    long hintCovered) {

  static Stats of(pq_stats s) {
    return new Stats(s.getSequences(), s.getTokens(), s.getKv_bytes(), s.getIndex_bytes(),
        s.getBuilds_finished(), s.getBuilds_cancelled(), s.getKmeans_iterations(),
        s.getSelect_calls(), s.getFetch_calls(), s.getBuild_seconds(), s.getSelect_seconds(),
        s.getFetch_seconds(), s.getBytes_scored(), s.getBytes_fetched(), s.getCache_hits(),
        s.getCache_misses(), s.getHost_bytes(), s.getBytes_staged(), s.getHint_tokens(),
        s.getHint_covered());
  }
}
