package io.pqcache;

import io.pqcache.swig.pq_config;
import io.pqcache.swig.pq_layer_info;
import io.pqcache.swig.pq_layout;
import io.pqcache.swig.pq_selection;
import io.pqcache.swig.pq_stats;
import io.pqcache.swig.pq_tensor;
import io.pqcache.swig.pqcache;
import java.lang.ref.Cleaner;
import java.lang.ref.Reference;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Objects;
import java.util.concurrent.locks.Lock;
import java.util.concurrent.locks.ReentrantReadWriteLock;
import java.util.function.LongConsumer;
import java.util.function.LongFunction;

/**
 * A libpqcache context: the KV cache of any number of sequences (requests),
 * their PQ indexes and the worker threads that build them.
 *
 * <p><b>Threading.</b> A context is thread-safe: calls that name different
 * sequences, or the same sequence and different layers, run concurrently;
 * calls on the same (sequence, layer) are serialised by the library.
 * {@link #close()} waits for calls in progress, and later calls throw
 * {@link IllegalStateException}.
 *
 * <p><b>Memory.</b> K/V/Q tensors are passed as direct {@link ByteBuffer}s in
 * the platform byte order, read or written in place from their position (no
 * copy), dense token-major {@code [tokens][heads][headDim]}; the library
 * copies what it keeps, so buffers can be reused once a call returns. The
 * {@code float[]} overloads (F32 contexts only) copy through a temporary
 * direct buffer. Native memory is freed by {@link #close()}; a context that
 * is never closed is freed when it becomes unreachable, at the garbage
 * collector's pace.
 *
 * <p>Errors of the library throw {@link PqException} with its status and
 * message; Java-side preconditions (heap or too small buffers, float[] on a
 * non-F32 context) throw {@link IllegalArgumentException}.
 */
public final class PqContext implements AutoCloseable {
  private static final Cleaner CLEANER = Cleaner.create();
  private static final int TOKEN_MAJOR = pq_layout.PQ_LAYOUT_TOKEN_MAJOR;
  private static final int HEAD_MAJOR = pq_layout.PQ_LAYOUT_HEAD_MAJOR;

  /** The native handle; also the Cleaner's action, so it must not refer to the PqContext. */
  private static final class Handle implements Runnable {
    private long address;

    Handle(long address) {
      this.address = address;
    }

    @Override
    public void run() {
      long owned = address;
      address = 0;
      if (owned != 0) {
        pqcache.pq_destroy(owned);
      }
    }
  }

  // Calls hold the read lock, close() the write lock: pq_destroy must not
  // race with any other call on the context.
  private final ReentrantReadWriteLock lifecycle = new ReentrantReadWriteLock();
  private final Handle handle;
  private final Cleaner.Cleanable cleanable;

  private final int layers;
  private final int queryHeads;
  private final int kvHeads;
  private final int headDim;
  private final DType dtype;
  private final Backend backend;

  /**
   * Creates a context.
   *
   * @throws PqException INVALID_ARGUMENT naming a bad field, UNSUPPORTED
   *     (pqBits > 8), NOT_FOUND (CUDA backend without plug-in or device)
   */
  public PqContext(Config config) {
    Objects.requireNonNull(config, "config");
    long[] created = new long[1];
    pq_config requested = config.toNative();
    try {
      pqcache.pq_create(requested, created);
    } finally {
      requested.delete();
    }
    handle = new Handle(created[0]);
    cleanable = CLEANER.register(this, handle);

    // The effective configuration (defaults resolved) sizes the buffers.
    pq_config effective = new pq_config();
    int[] usedBackend = new int[1];
    try {
      pqcache.pq_get_config(created[0], effective);
      pqcache.pq_get_backend(created[0], usedBackend);
      layers = effective.getNum_layers();
      queryHeads = effective.getNum_q_heads();
      kvHeads = effective.getNum_kv_heads();
      headDim = effective.getHead_dim();
      dtype = DType.fromCode(effective.getDtype());
      backend = Backend.fromCode(usedBackend[0]);
    } catch (RuntimeException e) {
      cleanable.clean();
      throw e;
    } finally {
      effective.delete();
    }
  }

  /** The loaded library's version, "MAJOR.MINOR.PATCH". */
  public static String version() {
    return pqcache.pq_version_string();
  }

  /** The loaded library's version as MAJOR * 10000 + MINOR * 100 + PATCH. */
  public static int versionNumber() {
    return pqcache.pq_version_number();
  }

  /**
   * Frees the context after the calls in progress return. Builds in flight
   * are cancelled. Closing again does nothing.
   */
  @Override
  public void close() {
    Lock lock = lifecycle.writeLock();
    lock.lock();
    try {
      cleanable.clean(); // runs Handle.run at most once
    } finally {
      lock.unlock();
    }
  }

  /** Whether {@link #close()} was called. */
  public boolean isClosed() {
    Lock lock = lifecycle.readLock();
    lock.lock();
    try {
      return handle.address == 0;
    } finally {
      lock.unlock();
    }
  }

  // --- geometry of the effective configuration ---

  public int layers() {
    return layers;
  }

  public int queryHeads() {
    return queryHeads;
  }

  public int kvHeads() {
    return kvHeads;
  }

  public int headDim() {
    return headDim;
  }

  public DType dtype() {
    return dtype;
  }

  /** The backend in use (AUTO resolved to CPU or CUDA). */
  public Backend backend() {
    return backend;
  }

  // --- sequences ---

  /** Adds an empty sequence; INVALID_ARGUMENT if the id exists. */
  public void addSequence(long seqId) {
    run(h -> pqcache.pq_sequence_add(h, seqId));
  }

  /** Removes a sequence and frees its memory; NOT_FOUND if absent. */
  public void removeSequence(long seqId) {
    run(h -> pqcache.pq_sequence_remove(h, seqId));
  }

  /** Tokens stored for (sequence, layer). */
  public long sequenceLength(long seqId, int layer) {
    long[] tokens = new long[1];
    run(h -> pqcache.pq_sequence_length(h, seqId, layer, tokens));
    return tokens[0];
  }

  /** Number of sequences. */
  public long sequenceCount() {
    long[] count = new long[1];
    run(h -> pqcache.pq_sequence_count(h, count));
    return count[0];
  }

  // --- prefill and decode ---

  /**
   * Appends a prompt's keys and values for one layer ({@code tokens x kvHeads
   * x headDim} each) and schedules the layer's index build.
   */
  public void prefillLayer(long seqId, int layer, int tokens, ByteBuffer keys, ByteBuffer values) {
    store(pqcache::pq_prefill_layer, seqId, layer, tokens, keys, values);
  }

  /** {@link #prefillLayer(long, int, int, ByteBuffer, ByteBuffer)} from arrays (F32; copies). */
  public void prefillLayer(long seqId, int layer, int tokens, float[] keys, float[] values) {
    prefillLayer(seqId, layer, tokens, copyIn(keys, "keys", tokens, kvHeads),
        copyIn(values, "values", tokens, kvHeads));
  }

  /** Appends decode tokens' keys and values (usually 1 token) to a prefilled layer. */
  public void decodeAppend(long seqId, int layer, int tokens, ByteBuffer keys, ByteBuffer values) {
    store(pqcache::pq_decode_append, seqId, layer, tokens, keys, values);
  }

  /** {@link #decodeAppend(long, int, int, ByteBuffer, ByteBuffer)} from arrays (F32; copies). */
  public void decodeAppend(long seqId, int layer, int tokens, float[] keys, float[] values) {
    decodeAppend(seqId, layer, tokens, copyIn(keys, "keys", tokens, kvHeads),
        copyIn(values, "values", tokens, kvHeads));
  }

  /**
   * The last prompt queries of a layer ({@code tokens x queryHeads x headDim}),
   * for SnapKV, PyramidKV and SCOPE; other selectors ignore them.
   */
  public void prefillQueries(long seqId, int layer, int tokens, ByteBuffer queries) {
    ByteBuffer q = input(queries, "queries", tokens, queryHeads);
    run(h -> {
      try (NativeTensor tq = tensor(q, TOKEN_MAJOR, tokens, queryHeads)) {
        pqcache.pq_prefill_queries(h, seqId, layer, tq.tensor);
      }
    });
  }

  // --- selection and fetch ---

  /** Positions per kv head that a selection of (sequence, layer) needs now. */
  public int selectionCapacity(long seqId, int layer) {
    return call(h -> capacity(h, seqId, layer));
  }

  /**
   * Selects, per kv head, the sink tokens, the top-k middle tokens for the
   * query ({@code 1 x queryHeads x headDim}) and the local window. With the
   * PQ selector it waits for this layer's build if it is still running.
   */
  public Selection decodeSelect(long seqId, int layer, ByteBuffer query) {
    ByteBuffer q = input(query, "query", 1, queryHeads);
    return call(h -> {
      int capacity = capacity(h, seqId, layer);
      ByteBuffer[] arrays = Selection.allocateNative(kvHeads, capacity);
      pq_selection selection = new pq_selection();
      try (NativeTensor tq = tensor(q, TOKEN_MAJOR, 1, queryHeads)) {
        selection.attach(arrays[0], arrays[1], capacity);
        pqcache.pq_decode_select(h, seqId, layer, tq.tensor, selection);
      } finally {
        selection.delete();
      }
      return Selection.fromNative(kvHeads, capacity, arrays[0], arrays[1]);
    });
  }

  /** {@link #decodeSelect(long, int, ByteBuffer)} from an array (F32; copies). */
  public Selection decodeSelect(long seqId, int layer, float[] query) {
    return decodeSelect(seqId, layer, copyIn(query, "query", 1, queryHeads));
  }

  /**
   * Gathers the K and V of a selection into {@code outKeys} and
   * {@code outValues}, head-major {@code [kvHeads][selection.capacity()][headDim]}:
   * selected token i of kv head h lands in row {@code h * capacity + i}. Rows
   * past a head's count are left as they were. Bytes are copied as stored.
   */
  public void fetchKV(long seqId, int layer, Selection selection, ByteBuffer outKeys,
      ByteBuffer outValues) {
    Objects.requireNonNull(selection, "selection");
    if (selection.kvHeads() != kvHeads) {
      throw new IllegalArgumentException("selection has " + selection.kvHeads()
          + " kv heads, the context " + kvHeads);
    }
    int rows = selection.capacity();
    ByteBuffer k = output(outKeys, "outKeys", rows, kvHeads);
    ByteBuffer v = output(outValues, "outValues", rows, kvHeads);
    run(h -> {
      pq_selection chosen = attached(selection);
      try (NativeTensor tk = tensor(k, HEAD_MAJOR, rows, kvHeads);
          NativeTensor tv = tensor(v, HEAD_MAJOR, rows, kvHeads)) {
        pqcache.pq_fetch_kv(h, seqId, layer, chosen, tk.tensor, tv.tensor);
      } finally {
        chosen.delete();
        Reference.reachabilityFence(selection);
      }
    });
  }

  /**
   * {@link #fetchKV(long, int, Selection, ByteBuffer, ByteBuffer)} into arrays
   * of at least {@code kvHeads * selection.capacity() * headDim} floats (F32; copies).
   */
  public void fetchKV(long seqId, int layer, Selection selection, float[] outKeys,
      float[] outValues) {
    Objects.requireNonNull(selection, "selection");
    int rows = selection.capacity();
    ByteBuffer k = scratch(outKeys, "outKeys", rows, kvHeads);
    ByteBuffer v = scratch(outValues, "outValues", rows, kvHeads);
    // Start from the arrays' contents: rows past a head's count stay as they were.
    k.asFloatBuffer().put(outKeys, 0, k.capacity() / Float.BYTES);
    v.asFloatBuffer().put(outValues, 0, v.capacity() / Float.BYTES);
    fetchKV(seqId, layer, selection, k, v);
    k.asFloatBuffer().get(outKeys, 0, k.capacity() / Float.BYTES);
    v.asFloatBuffer().get(outValues, 0, v.capacity() / Float.BYTES);
  }

  /**
   * Attention probabilities over a selection's tokens, summed over each
   * group's query heads: {@code probs[h * selection.capacity() + i]} belongs
   * to selected token i of kv head h. H2O and SCOPE accumulate them; other
   * selectors ignore them.
   */
  public void observeAttention(long seqId, int layer, Selection selection, float[] probs) {
    Objects.requireNonNull(selection, "selection");
    Objects.requireNonNull(probs, "probs");
    int needed = selection.kvHeads() * selection.capacity();
    if (probs.length < needed) {
      throw new IllegalArgumentException("probs has " + probs.length + " floats, needs "
          + needed + " (kvHeads x selection capacity)");
    }
    ByteBuffer p = ByteBuffer.allocateDirect(needed * Float.BYTES).order(ByteOrder.nativeOrder());
    p.asFloatBuffer().put(probs, 0, needed);
    run(h -> {
      pq_selection chosen = attached(selection);
      try {
        pqcache.pq_observe_attention(h, seqId, layer, chosen, p);
      } finally {
        chosen.delete();
        Reference.reachabilityFence(selection);
        Reference.reachabilityFence(p);
      }
    });
  }

  // --- introspection ---

  /** Context-wide statistics (removed sequences' counters included, their tokens not). */
  public Stats stats() {
    pq_stats stats = new pq_stats();
    try {
      run(h -> pqcache.pq_stats_get(h, stats));
      return Stats.of(stats);
    } finally {
      stats.delete();
    }
  }

  /** Statistics of one sequence. */
  public Stats sequenceStats(long seqId) {
    pq_stats stats = new pq_stats();
    try {
      run(h -> pqcache.pq_sequence_stats_get(h, seqId, stats));
      return Stats.of(stats);
    } finally {
      stats.delete();
    }
  }

  /** The state of one (sequence, layer), without waiting for its build. */
  public LayerInfo layerInfo(long seqId, int layer) {
    pq_layer_info info = new pq_layer_info();
    try {
      run(h -> pqcache.pq_layer_info_get(h, seqId, layer, info));
      return LayerInfo.of(info);
    } finally {
      info.delete();
    }
  }

  /** Blocks until every index build queued so far has finished. */
  public void waitBuilds() {
    run(pqcache::pq_wait_builds);
  }

  @Override
  public String toString() {
    return "PqContext[" + layers + " layers, " + queryHeads + " q heads, " + kvHeads
        + " kv heads, head_dim " + headDim + ", " + dtype + ", " + backend
        + (isClosed() ? ", closed]" : "]");
  }

  // --- internals ---

  /** Runs op with the live handle under the read lock. */
  private <T> T call(LongFunction<T> op) {
    Lock lock = lifecycle.readLock();
    lock.lock();
    try {
      long address = handle.address;
      if (address == 0) {
        throw new IllegalStateException("PqContext is closed");
      }
      return op.apply(address);
    } finally {
      lock.unlock();
      // The Cleaner must not free the context while a call runs on it.
      Reference.reachabilityFence(this);
    }
  }

  private void run(LongConsumer op) {
    call(h -> {
      op.accept(h);
      return null;
    });
  }

  /** pq_prefill_layer or pq_decode_append: the same arguments, K and V token-major. */
  @FunctionalInterface
  private interface StoreCall {
    void apply(long context, long seqId, int layer, pq_tensor keys, pq_tensor values);
  }

  private void store(StoreCall call, long seqId, int layer, int tokens, ByteBuffer keys,
      ByteBuffer values) {
    ByteBuffer k = input(keys, "keys", tokens, kvHeads);
    ByteBuffer v = input(values, "values", tokens, kvHeads);
    run(h -> {
      try (NativeTensor tk = tensor(k, TOKEN_MAJOR, tokens, kvHeads);
          NativeTensor tv = tensor(v, TOKEN_MAJOR, tokens, kvHeads)) {
        call.apply(h, seqId, layer, tk.tensor, tv.tensor);
      }
    });
  }

  private static int capacity(long h, long seqId, int layer) {
    long[] capacity = new long[1];
    pqcache.pq_selection_capacity(h, seqId, layer, capacity);
    return Math.toIntExact(capacity[0]);
  }

  private static pq_selection attached(Selection selection) {
    pq_selection chosen = new pq_selection();
    chosen.attach(selection.nativePositions(), selection.nativeCounts(), selection.capacity());
    return chosen;
  }

  /** A pq_tensor over a direct buffer; closing frees it and keeps the buffer alive until then. */
  private static final class NativeTensor implements AutoCloseable {
    final pq_tensor tensor = new pq_tensor();
    private final ByteBuffer data;

    NativeTensor(ByteBuffer data) {
      this.data = data;
    }

    @Override
    public void close() {
      tensor.delete();
      Reference.reachabilityFence(data);
    }
  }

  private NativeTensor tensor(ByteBuffer data, int layout, int tokens, int heads) {
    NativeTensor t = new NativeTensor(data);
    try {
      pqcache.pq_tensor_init(t.tensor, data, dtype.code(), layout, tokens, heads, headDim);
    } catch (RuntimeException e) {
      t.close();
      throw e;
    }
    return t;
  }

  private long bytes(int tokens, int heads) {
    return Math.max(0L, tokens) * heads * headDim * dtype.bytes();
  }

  private ByteBuffer input(ByteBuffer buffer, String name, int tokens, int heads) {
    return checked(buffer, name, tokens, heads, false);
  }

  private ByteBuffer output(ByteBuffer buffer, String name, int tokens, int heads) {
    return checked(buffer, name, tokens, heads, true);
  }

  /** The buffer's bytes from its position, as a view the native code addresses from 0. */
  private ByteBuffer checked(ByteBuffer buffer, String name, int tokens, int heads,
      boolean written) {
    Objects.requireNonNull(buffer, name);
    if (!buffer.isDirect()) {
      throw new IllegalArgumentException(name + " must be a direct ByteBuffer"
          + " (ByteBuffer.allocateDirect): a heap buffer has no fixed native address;"
          + " use the float[] overloads to pass arrays by copy");
    }
    if (buffer.order() != ByteOrder.nativeOrder()) {
      throw new IllegalArgumentException(name + " is " + buffer.order() + " but the library"
          + " reads elements in the native order: call " + name
          + ".order(ByteOrder.nativeOrder())");
    }
    if (written && buffer.isReadOnly()) {
      throw new IllegalArgumentException(name + " is read-only but receives the fetched rows");
    }
    long needed = bytes(tokens, heads);
    if (buffer.remaining() < needed) {
      throw new IllegalArgumentException(name + " has " + buffer.remaining()
          + " bytes from its position, needs " + needed + " (" + tokens + " tokens x " + heads
          + " heads x " + headDim + " x " + dtype + ")");
    }
    return buffer.slice();
  }

  private void requireF32(String name) {
    if (dtype != DType.F32) {
      throw new IllegalArgumentException(name + ": float[] needs an F32 context, this one is "
          + dtype + "; pass a direct ByteBuffer of " + dtype + " elements");
    }
  }

  private ByteBuffer copyIn(float[] array, String name, int tokens, int heads) {
    ByteBuffer buffer = scratch(array, name, tokens, heads);
    buffer.asFloatBuffer().put(array, 0, buffer.capacity() / Float.BYTES);
    return buffer;
  }

  /** A direct buffer of the tensor's size after checking the array against it. */
  private ByteBuffer scratch(float[] array, String name, int tokens, int heads) {
    Objects.requireNonNull(array, name);
    requireF32(name);
    long needed = bytes(tokens, heads);
    if (array.length * (long) Float.BYTES < needed) {
      throw new IllegalArgumentException(name + " has " + array.length + " floats, needs "
          + needed / Float.BYTES + " (" + tokens + " tokens x " + heads + " heads x " + headDim
          + ")");
    }
    if (needed > Integer.MAX_VALUE) {
      throw new IllegalArgumentException(name + ": " + needed + " bytes exceed a Java buffer");
    }
    return ByteBuffer.allocateDirect((int) needed).order(ByteOrder.nativeOrder());
  }
}
