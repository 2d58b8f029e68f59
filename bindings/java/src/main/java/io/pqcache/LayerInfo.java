package io.pqcache;

import io.pqcache.swig.pq_layer_info;

/**
 * The state of one (sequence, layer) ({@code pq_layer_info}), read without
 * waiting for builds.
 *
 * @param tokens tokens stored
 * @param prefillTokens tokens that came through prefillLayer
 * @param middleTokens tokens between the sinks and the local window
 * @param codedTokens tokens that have PQ codes
 * @param buildPending true while a build is queued or running
 * @param kmeansIterations iterations the last finished build ran
 * @param kmeansBudget iteration budget it was given
 * @param indexReady true once a build has finished (only the PQ selector builds one)
 * @param buildSeconds wall time of the last finished build
 * @param lastSelectBytes bytes the selector read at the last decodeSelect (all kv heads)
 */
public record LayerInfo(
    long tokens,
    long prefillTokens,
    long middleTokens,
    long codedTokens,
    boolean buildPending,
    int kmeansIterations,
    int kmeansBudget,
    boolean indexReady,
    double buildSeconds,
    long lastSelectBytes) {

  static LayerInfo of(pq_layer_info i) {
    return new LayerInfo(i.getTokens(), i.getPrefill_tokens(), i.getMiddle_tokens(),
        i.getCoded_tokens(), i.getBuild_pending() != 0, i.getKmeans_iterations(),
        i.getKmeans_budget(), i.getIndex_ready() != 0, i.getBuild_seconds(),
        i.getLast_select_bytes());
  }
}
