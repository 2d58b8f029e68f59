package io.pqcache.example;

import io.pqcache.Config;
import io.pqcache.PqContext;
import io.pqcache.Selection;
import io.pqcache.Stats;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/**
 * The KV-cache tier of a toy inference service. One PqContext serves every
 * request; each request is a sequence, driven by its own thread (the context
 * is thread-safe, and requests never share a sequence). The model side hands
 * in K/V/Q as direct buffers and gets back the selected tokens' K/V.
 */
final class KvCacheService implements AutoCloseable {
  private final PqContext cache;

  KvCacheService(Config config) {
    cache = new PqContext(config);
  }

  PqContext cache() {
    return cache;
  }

  /** A request arrives: an empty sequence. */
  void admit(long requestId) {
    cache.addSequence(requestId);
  }

  /** The prompt's K/V of one layer; the PQ index builds in the background. */
  void prefill(long requestId, int layer, int tokens, ByteBuffer keys, ByteBuffer values) {
    cache.prefillLayer(requestId, layer, tokens, keys, values);
  }

  /** Output rows of one decode step, reused from step to step (the capacity only grows). */
  static final class FetchBuffers {
    private ByteBuffer keys = ByteBuffer.allocateDirect(0);
    private ByteBuffer values = ByteBuffer.allocateDirect(0);

    ByteBuffer keys() {
      return keys;
    }

    ByteBuffer values() {
      return values;
    }

    void ensure(int bytes) {
      if (keys.capacity() < bytes) {
        int grown = Math.max(bytes, keys.capacity() + keys.capacity() / 2);
        keys = ByteBuffer.allocateDirect(grown).order(ByteOrder.nativeOrder());
        values = ByteBuffer.allocateDirect(grown).order(ByteOrder.nativeOrder());
      }
    }
  }

  /**
   * One decode step of one layer: append the new token's K/V, select the
   * tokens that matter for the query, fetch their K/V into {@code out}
   * (head-major, {@code selection.capacity()} rows per kv head).
   */
  Selection decodeStep(long requestId, int layer, ByteBuffer key, ByteBuffer value,
      ByteBuffer query, FetchBuffers out) {
    cache.decodeAppend(requestId, layer, 1, key, value);
    Selection selection = cache.decodeSelect(requestId, layer, query);
    out.ensure(cache.kvHeads() * selection.capacity() * cache.headDim() * cache.dtype().bytes());
    cache.fetchKV(requestId, layer, selection, out.keys(), out.values());
    return selection;
  }

  /** The request is done: its memory goes back. */
  void release(long requestId) {
    cache.removeSequence(requestId);
  }

  Stats stats() {
    return cache.stats();
  }

  @Override
  public void close() {
    cache.close();
  }
}
