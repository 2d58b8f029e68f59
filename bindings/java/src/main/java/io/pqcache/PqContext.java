package io.pqcache;

import io.pqcache.swig.pq_config;
import io.pqcache.swig.pq_layer_info;
import io.pqcache.swig.pq_layout;
import io.pqcache.swig.pq_paged_keys;
import io.pqcache.swig.pq_selection;
import io.pqcache.swig.pq_stats;
import io.pqcache.swig.SWIGTYPE_p_pq_fetch_item;
import io.pqcache.swig.SWIGTYPE_p_pq_select_item;
import io.pqcache.swig.pq_status;
import io.pqcache.swig.pq_tensor;
import io.pqcache.swig.pqcache;
import java.lang.ref.Cleaner;
import java.lang.ref.Reference;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.Locale;
import java.util.Objects;
import java.util.concurrent.atomic.AtomicIntegerArray;
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
 * {@link PqClosedException}, an {@link IllegalStateException} with status
 * BAD_STATE and the message "&lt;C function&gt;: the context is closed".
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
 *
 * <p><b>Batches.</b> {@link #decodeSelectBatch} and {@link #fetchKVBatch} run
 * one layer for many sequences in one library call, spread over its worker
 * pool. Items succeed or fail on their own: a failing item throws
 * {@link PqBatchException}, which names the first failing item and carries
 * every item's status (and, for a select, the selections that succeeded).
 */
public final class PqContext implements AutoCloseable {
  // Frees contexts and pools (PqPool) that become unreachable unclosed.
  static final Cleaner CLEANER = Cleaner.create();
  private static final int TOKEN_MAJOR = pq_layout.PQ_LAYOUT_TOKEN_MAJOR;
  private static final int HEAD_MAJOR = pq_layout.PQ_LAYOUT_HEAD_MAJOR;
  // How many times saveSequence sizes its buffer again when the sequence grew
  // between pq_sequence_state_size and the save (only a call racing with the
  // save, which pqcache.h forbids, makes it grow).
  private static final int SAVE_ATTEMPTS = 3;
  // The largest Java array the JVMs in use allocate.
  private static final long MAX_ARRAY_BYTES = Integer.MAX_VALUE - 8;

  /**
   * The native handle; also the Cleaner's action (run at most once, by close() or the Cleaner),
   * so it must not refer to the PqContext.
   */
  private static final class Handle implements Runnable {
    final long address;
    private final long hooks; // the native hooks (Hooks.create), 0 for none

    Handle(long address, long hooks) {
      this.address = address;
      this.hooks = hooks;
    }

    @Override
    public void run() {
      if (address != 0) {
        pqcache.pq_destroy(address); // waits for the builds and their hooks
      }
      if (hooks != 0) {
        Hooks.free(hooks);
      }
    }
  }

  // Calls hold the read lock and check `closed`; close() sets it under the
  // write lock, so no call runs on the context from then on, and destroys
  // the context after letting go of the lock: pq_destroy waits for the
  // builds' hooks, which may call the context (they get PqClosedException).
  private final ReentrantReadWriteLock lifecycle = new ReentrantReadWriteLock();
  private volatile boolean closed;
  private final Handle handle;
  private final Cleaner.Cleanable cleanable;

  private final int layers;
  private final int queryHeads;
  private final int kvHeads;
  private final int headDim;
  private final DType dtype;
  // The dtype of query buffers: the context's, or F32 for fp8 K/V (whose
  // queries the library takes in F32, F16 or BF16; this binding passes F32).
  private final DType queryDtype;
  private final Backend backend;
  private final KvTier kvTier;
  private final int kvHeadOffset;
  // Per layer, the largest selection capacity the library asked for so far:
  // decodeSelect sizes its buffers with it and grows them when told to.
  private final AtomicIntegerArray capacityHints;

  /**
   * Creates a context.
   *
   * @throws PqException INVALID_ARGUMENT naming a bad field, UNSUPPORTED
   *     (pqBits > 8), NOT_FOUND (CUDA backend without plug-in or device)
   */
  public PqContext(Config config) {
    this(config, null, "pq_create");
  }

  /**
   * Creates a context that logs to, reports its finished builds to and runs on what
   * {@code hooks} names (pq_create_with_hooks, docs/hooks.md). {@link #close()} waits for
   * the hooks of the builds it waits for.
   *
   * @throws PqException as {@link #PqContext(Config)}, and BAD_STATE "pq_create_with_hooks:
   *     the pool is closed" for a closed {@link PqPool}
   */
  public PqContext(Config config, Hooks hooks) {
    this(config, nonNull(hooks, "pq_create_with_hooks", "hooks", "a Hooks"),
        "pq_create_with_hooks");
  }

  private PqContext(Config config, Hooks hooks, String function) {
    nonNull(config, function, "config", "a Config");
    long[] created = new long[1];
    long nativeHooks = 0;
    pq_config requested = config.toNative();
    try {
      if (hooks == null) {
        pqcache.pq_create(requested, created);
      } else {
        nativeHooks = hooks.create(requested, created);
      }
    } finally {
      requested.delete();
    }
    handle = new Handle(created[0], nativeHooks);
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
      queryDtype = dtype.isFp8() ? DType.F32 : dtype;
      backend = Backend.fromCode(usedBackend[0]);
      kvTier = KvTier.fromCode(effective.getKv_tier());
      kvHeadOffset = effective.getKv_head_offset();
      capacityHints = new AtomicIntegerArray(layers);
    } catch (RuntimeException e) {
      cleanable.clean();
      throw e;
    } finally {
      effective.forget_kv_scales(); // the context's own copy, not the struct's
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
   * are cancelled. Calls made from then on throw {@link PqClosedException},
   * also while the context is being freed. Closing again does nothing.
   */
  @Override
  public void close() {
    Lock lock = lifecycle.writeLock();
    lock.lock(); // after the calls in progress
    try {
      if (closed) {
        return;
      }
      closed = true;
    } finally {
      lock.unlock();
    }
    cleanable.clean(); // Handle.run: pq_destroy, outside the lock
  }

  /** Whether {@link #close()} was called. */
  public boolean isClosed() {
    return closed;
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

  /** Where the K/V rows live. */
  public KvTier kvTier() {
    return kvTier;
  }

  /** The model's index of this context's kv head 0 ({@link Config.Builder#kvHeadOffset}). */
  public int kvHeadOffset() {
    return kvHeadOffset;
  }

  // --- sequences ---

  /** Adds an empty sequence; INVALID_ARGUMENT if the id exists. */
  public void addSequence(long seqId) {
    run("pq_sequence_add", h -> pqcache.pq_sequence_add(h, seqId));
  }

  /** Removes a sequence and frees its memory; NOT_FOUND if absent. */
  public void removeSequence(long seqId) {
    run("pq_sequence_remove", h -> pqcache.pq_sequence_remove(h, seqId));
  }

  /** Tokens stored for (sequence, layer). */
  public long sequenceLength(long seqId, int layer) {
    long[] tokens = new long[1];
    run("pq_sequence_length", h -> pqcache.pq_sequence_length(h, seqId, layer, tokens));
    return tokens[0];
  }

  /** Number of sequences. */
  public long sequenceCount() {
    long[] count = new long[1];
    run("pq_sequence_count", h -> pqcache.pq_sequence_count(h, count));
    return count[0];
  }

  // --- sequence state (added in 0.5): truncate, fork, save and restore ---

  /**
   * Keeps the first {@code tokens} tokens of every layer of the sequence and
   * drops the rest (pq_sequence_truncate), as when rejected speculative tokens
   * are rolled back: the next decode step is as if the dropped tokens never
   * came. A layer with {@code tokens} or fewer tokens is left as it is; a cut
   * inside a layer's prefill rebuilds its index over the kept tokens; 0
   * empties the sequence (the next call on a layer is then prefillLayer). No
   * other call on the sequence may run concurrently.
   *
   * @throws PqException NOT_FOUND, INVALID_ARGUMENT (negative, or more tokens
   *     than the longest layer holds), OUT_OF_MEMORY
   */
  public void truncateSequence(long seqId, long tokens) {
    run("pq_sequence_truncate", h -> pqcache.pq_sequence_truncate(h, seqId, tokens));
  }

  /**
   * Adds {@code childId} holding the same tokens, PQ index and selector state
   * as {@code parentId} (pq_sequence_fork), for requests that share a prompt
   * or parallel samples. Full 256-token chunks are shared copy-on-write
   * (counted once against the host memory limit); from then on each sequence
   * grows on its own.
   *
   * @throws PqException NOT_FOUND (parent), INVALID_ARGUMENT (the child
   *     exists), OUT_OF_MEMORY, BAD_STATE (a build of the parent failed)
   */
  public void forkSequence(long parentId, long childId) {
    run("pq_sequence_fork", h -> pqcache.pq_sequence_fork(h, parentId, childId));
  }

  /**
   * The bytes {@link #saveSequence(long)} would return now
   * (pq_sequence_state_size); waits for the sequence's index builds.
   */
  public long sequenceStateSize(long seqId) {
    long[] bytes = new long[1];
    run("pq_sequence_state_size", h -> pqcache.pq_sequence_state_size(h, seqId, bytes));
    return bytes[0];
  }

  /**
   * The sequence's state (every layer's K/V, PQ index, window position and
   * selector state) in the versioned, checksummed format of
   * docs/state-format.md, for {@link #restoreSequence(long, byte[])} in this
   * or another context of the same geometry. Sized with
   * pq_sequence_state_size, written by pq_sequence_save_buffer into native
   * memory (sized again if the library asks for more) and copied into the
   * array. Waits for the sequence's index builds; no call that changes the
   * sequence may run concurrently. A state too large for a Java array
   * throws OUT_OF_MEMORY: save it to a file instead.
   */
  public byte[] saveSequence(long seqId) {
    return call("pq_sequence_save_buffer", h -> {
      long[] size = new long[1];
      pqcache.pq_sequence_state_size(h, seqId, size);
      for (int attempt = 1; ; attempt++) {
        if (size[0] > MAX_ARRAY_BYTES) {
          throw new PqException(pq_status.PQ_ERR_OUT_OF_MEMORY, "pq_sequence_save_buffer: a saved"
              + " state of " + size[0] + " bytes does not fit a Java array; save it to a file");
        }
        ByteBuffer buffer = ByteBuffer.allocateDirect((int) size[0]);
        long[] written = new long[1];
        try {
          pqcache.pq_sequence_save_buffer(h, seqId, buffer, buffer.capacity(), written);
        } catch (PqException e) {
          if (e.status() != Status.BUFFER_TOO_SMALL || attempt == SAVE_ATTEMPTS) {
            throw e;
          }
          // The needed size is not passed back with the exception: ask again.
          pqcache.pq_sequence_state_size(h, seqId, size);
          continue;
        } finally {
          Reference.reachabilityFence(buffer);
        }
        if (written[0] < 0 || written[0] > buffer.capacity()) {
          throw new PqException(pq_status.PQ_ERR_INTERNAL, "pq_sequence_save_buffer reported "
              + written[0] + " bytes written into " + buffer.capacity());
        }
        byte[] state = new byte[(int) written[0]];
        buffer.get(0, state);
        return state;
      }
    });
  }

  /**
   * Saves the sequence's state into the file at {@code path}, atomically
   * (pq_sequence_save_file: a temporary file beside it, fsync, rename; on
   * failure the file is left as it was). A file system error throws BACKEND,
   * with the path and the system's text.
   */
  public void saveSequence(long seqId, Path path) {
    String file = nonNull(path, "pq_sequence_save_file", "path", "a Path").toString();
    run("pq_sequence_save_file", h -> pqcache.pq_sequence_save_file(h, seqId, file));
  }

  /**
   * Adds {@code seqId} from a state {@link #saveSequence(long)} returned, in
   * this or another context of the same geometry (pq_sequence_restore). Every
   * section is checked first: the whole sequence is added or nothing. Its
   * selections and fetched rows equal the saved sequence's. The bytes are
   * copied into native memory for the call.
   *
   * @throws PqException INVALID_ARGUMENT (the id exists), CORRUPT (truncated
   *     or damaged bytes), INCOMPATIBLE (another format version or geometry),
   *     OUT_OF_MEMORY
   */
  public void restoreSequence(long seqId, byte[] state) {
    nonNull(state, "pq_sequence_restore", "data", "a byte[] of the saved state");
    ByteBuffer copy = ByteBuffer.allocateDirect(state.length);
    copy.put(0, state);
    restoreSequence(seqId, copy);
  }

  /**
   * {@link #restoreSequence(long, byte[])} from the bytes between the
   * buffer's position and limit (the position does not move): a direct
   * buffer is read in place, a heap buffer is copied first.
   */
  public void restoreSequence(long seqId, ByteBuffer state) {
    ByteBuffer data = directBytes(state, "pq_sequence_restore", "data");
    run("pq_sequence_restore", h -> {
      try {
        pqcache.pq_sequence_restore(h, seqId, data, data.remaining());
      } finally {
        Reference.reachabilityFence(data);
      }
    });
  }

  /**
   * {@link #restoreSequence(long, byte[])} from the file at {@code path}
   * (pq_sequence_restore_file); a missing file throws NOT_FOUND, a read
   * error BACKEND.
   */
  public void restoreSequence(long seqId, Path path) {
    String file = nonNull(path, "pq_sequence_restore_file", "path", "a Path").toString();
    run("pq_sequence_restore_file", h -> pqcache.pq_sequence_restore_file(h, seqId, file));
  }

  /**
   * Begins a restore in pieces, for a state that arrives in parts (a shared
   * tier, a network): reads the state's description from its start (header,
   * every layer's PQ index and selector state, about 1% of the bytes, saved
   * before any K/V; {@code state} may hold more) and adds {@code seqId}
   * (pq_sequence_restore_begin). The whole sequence's memory is reserved now.
   * Its PQ selections work at once and equal the saved sequence's; every call
   * that needs K/V (fetch, attend, append, prefill, truncate, fork, save) and
   * a select with another selector throws BAD_STATE until
   * {@link #restoreSequenceKV(long, ByteBuffer)} has brought that layer's.
   * The bytes are copied into native memory for the call.
   *
   * @return the bytes read: the first restoreSequenceKV starts there
   * @throws PqBufferTooSmallException the state ends before the description
   *     does: nothing was added; {@link PqBufferTooSmallException#needed()}
   *     is the bytes needed from the state's start
   * @throws PqException as {@link #restoreSequence(long, byte[])}
   */
  public long restoreSequenceBegin(long seqId, byte[] state) {
    return restoreSequenceBegin(seqId, ByteBuffer.wrap(
        nonNull(state, "pq_sequence_restore_begin", "data", "a byte[] of the saved state")));
  }

  /**
   * {@link #restoreSequenceBegin(long, byte[])} from the bytes between the
   * buffer's position and limit (the position does not move): a direct
   * buffer is read in place, a heap buffer is copied first.
   */
  public long restoreSequenceBegin(long seqId, ByteBuffer state) {
    return restoreStep("pq_sequence_restore_begin", state, "data",
        (h, data, consumed) -> pqcache.pq_sequence_restore_begin(h, seqId, data, data.remaining(),
            consumed));
  }

  /**
   * Reads exactly one next section of a restore begun with
   * {@link #restoreSequenceBegin(long, ByteBuffer)} (pq_sequence_restore_kv)
   * from the bytes between the buffer's position and limit (the position does
   * not move; a direct buffer is read in place, a heap buffer is copied
   * first): they start at the first byte not yet read (the sum of the bytes
   * consumed so far) and may hold more. The sections are each layer's K/V in
   * layer order, then the end section; after the end section the sequence is
   * complete and further calls throw BAD_STATE. Calls for one sequence must
   * not overlap; selections on it may run meanwhile.
   *
   * @return the section's size: the next call starts after it
   * @throws PqBufferTooSmallException the bytes end before the section does:
   *     nothing was read; {@link PqBufferTooSmallException#needed()} is the
   *     section's size
   * @throws PqException CORRUPT: a section that fails its checksum or comes
   *     out of order changes nothing (the right bytes may be given again);
   *     K/V that do not fit the layer, or hold a NaN or Inf, end the restore
   *     (the sequence must be removed). BAD_STATE: no restore in progress
   */
  public long restoreSequenceKV(long seqId, ByteBuffer data) {
    return restoreStep("pq_sequence_restore_kv", data, "data",
        (h, bytes, consumed) -> pqcache.pq_sequence_restore_kv(h, seqId, bytes, bytes.remaining(),
            consumed));
  }

  /** {@link #restoreSequenceKV(long, ByteBuffer)} from a whole array (copied). */
  public long restoreSequenceKV(long seqId, byte[] data) {
    return restoreSequenceKV(seqId, ByteBuffer.wrap(
        nonNull(data, "pq_sequence_restore_kv", "data", "a byte[] of the saved state")));
  }

  // --- prefill and decode ---

  /**
   * Appends a prompt's keys and values for one layer ({@code tokens x kvHeads
   * x headDim} each) and schedules the layer's index build. An index-only
   * context ({@link KvTier#CALLER}) keeps no values: {@code values} may be
   * null there (and only there).
   */
  public void prefillLayer(long seqId, int layer, int tokens, ByteBuffer keys, ByteBuffer values) {
    store("pq_prefill_layer", pqcache::pq_prefill_layer, seqId, layer, tokens, keys, values);
  }

  /** {@link #prefillLayer(long, int, int, ByteBuffer, ByteBuffer)} from arrays (F32; copies). */
  public void prefillLayer(long seqId, int layer, int tokens, float[] keys, float[] values) {
    prefillLayer(seqId, layer, tokens, copyIn(keys, "pq_prefill_layer", "keys", tokens, kvHeads),
        copyInOptional(values, "pq_prefill_layer", "values", tokens, kvHeads));
  }

  /**
   * Appends decode tokens' keys and values (usually 1 token) to a prefilled layer;
   * {@code values} may be null as for {@link #prefillLayer(long, int, int, ByteBuffer, ByteBuffer)}.
   */
  public void decodeAppend(long seqId, int layer, int tokens, ByteBuffer keys, ByteBuffer values) {
    store("pq_decode_append", pqcache::pq_decode_append, seqId, layer, tokens, keys, values);
  }

  /** {@link #decodeAppend(long, int, int, ByteBuffer, ByteBuffer)} from arrays (F32; copies). */
  public void decodeAppend(long seqId, int layer, int tokens, float[] keys, float[] values) {
    decodeAppend(seqId, layer, tokens, copyIn(keys, "pq_decode_append", "keys", tokens, kvHeads),
        copyInOptional(values, "pq_decode_append", "values", tokens, kvHeads));
  }

  /**
   * {@link #prefillLayer(long, int, int, ByteBuffer, ByteBuffer)} for an index-only context
   * ({@link KvTier#CALLER}) whose keys are in a paged pool (pq_prefill_layer_paged): the keys of
   * positions {@code [L, L + tokens)} are read through the map, L the layer's length before the
   * call (0 for a first prefill). The values stay in the caller's pool.
   *
   * @throws PqException INVALID_ARGUMENT (map entries or slots out of range, positions not
   *     mapped, NaN/Inf keys), UNSUPPORTED (a context that stores K/V: it needs the values),
   *     NOT_FOUND, OUT_OF_MEMORY
   */
  public void prefillLayerPaged(long seqId, int layer, int tokens, PagedKeys keys) {
    storePaged("pq_prefill_layer_paged", pqcache::pq_prefill_layer_paged, seqId, layer, tokens,
        keys);
  }

  /**
   * {@link #decodeAppend(long, int, int, ByteBuffer, ByteBuffer)} from a paged pool
   * (pq_decode_append_paged), as {@link #prefillLayerPaged}; before any prefill BAD_STATE.
   */
  public void decodeAppendPaged(long seqId, int layer, int tokens, PagedKeys keys) {
    storePaged("pq_decode_append_paged", pqcache::pq_decode_append_paged, seqId, layer, tokens,
        keys);
  }

  /**
   * The last prompt queries of a layer ({@code tokens x queryHeads x headDim}),
   * for SnapKV, PyramidKV and SCOPE; other selectors ignore them.
   */
  public void prefillQueries(long seqId, int layer, int tokens, ByteBuffer queries) {
    ByteBuffer q = queryInput(queries, "pq_prefill_queries", "queries", tokens);
    run("pq_prefill_queries", h -> {
      try (NativeTensor tq = queryTensor(q, tokens)) {
        pqcache.pq_prefill_queries(h, seqId, layer, tq.tensor);
      }
    });
  }

  // --- selection and fetch ---

  /** Positions per kv head that a selection of (sequence, layer) needs now. */
  public int selectionCapacity(long seqId, int layer) {
    return call("pq_selection_capacity", h -> capacity(h, seqId, layer));
  }

  /**
   * Positions per kv head a selection at {@code layer} needs for a sequence of
   * {@code tokens} tokens, without a sequence. It never decreases as tokens
   * grow: the capacity for the longest sequence admitted sizes every buffer.
   */
  public int selectionCapacityFor(int layer, long tokens) {
    long[] capacity = new long[1];
    run("pq_selection_capacity_for",
        h -> pqcache.pq_selection_capacity_for(h, layer, tokens, capacity));
    return Math.toIntExact(capacity[0]);
  }

  /**
   * The rows and the positions per row that {@link #decodeSelectMulti} needs for
   * {@code queryTokens} tokens at the layer's current length (pq_selection_capacity_multi).
   */
  public SelectionShape selectionCapacityMulti(long seqId, int layer, int queryTokens,
      SelectRows rows) {
    nonNull(rows, "pq_selection_capacity_multi", "rows", "a SelectRows");
    return call("pq_selection_capacity_multi",
        h -> capacityMulti(h, seqId, layer, queryTokens, rows));
  }

  /**
   * Selects for several query tokens of one sequence in one call (pq_decode_select_multi):
   * {@code queries} is {@code tokens x queryHeads x headDim}, each token scored as
   * {@link #decodeSelect} would score it alone, and the rows are written as {@code rows} says,
   * each ascending and padded with -1 ({@link Selection#paddedPositions()}). {@code keys} (may be
   * null) is where the exact keys are, for pqRerank &gt; 0 in an index-only context, which needs
   * it (BAD_STATE without); its map covers the layer's positions. The selection is sized with
   * {@link #selectionCapacityMulti} and grown once if the layer grew in between.
   *
   * @throws PqException as decodeSelect, and INVALID_ARGUMENT for a bad map
   */
  public Selection decodeSelectMulti(long seqId, int layer, int tokens, ByteBuffer queries,
      SelectRows rows, PagedKeys keys) {
    final String function = "pq_decode_select_multi";
    nonNull(rows, function, "rows", "a SelectRows");
    ByteBuffer q = input(queries, function, "queries", tokens, queryHeads);
    ByteBuffer pool = keys == null ? null
        : input(keys.pool, function, "keys.pool", keys.poolTokens, kvHeads);
    return call(function, h -> {
      try (NativeTensor tq = tensor(q, TOKEN_MAJOR, tokens, queryHeads);
          NativePaged k = keys == null ? null : paged(keys, pool, 0)) {
        pq_paged_keys rawKeys = k == null ? null : k.keys;
        SelectionShape shape = capacityMulti(h, seqId, layer, tokens, rows);
        int capacity = shape.capacity();
        ByteBuffer[] arrays = Selection.allocateNative(function, shape.rows(), capacity);
        try {
          selectMultiInto(h, seqId, layer, tq.tensor, rows, rawKeys, arrays, capacity);
        } catch (PqException e) {
          if (e.status() != Status.BUFFER_TOO_SMALL) {
            throw e;
          }
          capacity = arrays[1].getInt(0);
          arrays = Selection.allocateNative(function, shape.rows(), capacity);
          selectMultiInto(h, seqId, layer, tq.tensor, rows, rawKeys, arrays, capacity);
        }
        return Selection.fromNative(shape.rows(), capacity, arrays[0], arrays[1]);
      }
    });
  }

  /**
   * {@link #decodeSelectMulti(long, int, int, ByteBuffer, SelectRows, PagedKeys)} from an array
   * (F32; copies).
   */
  public Selection decodeSelectMulti(long seqId, int layer, int tokens, float[] queries,
      SelectRows rows, PagedKeys keys) {
    return decodeSelectMulti(seqId, layer, tokens,
        copyIn(queries, "pq_decode_select_multi", "queries", tokens, queryHeads), rows, keys);
  }

  /**
   * Selects, per kv head, the sink tokens, the top-k middle tokens for the
   * query ({@code 1 x queryHeads x headDim}) and the local window
   * (pq_decode_select). With the PQ selector it waits for this layer's build
   * if it is still running. The selection's buffers are sized from the
   * largest capacity this layer needed so far and grown once when the
   * library asks for more, so {@link Selection#capacity()} is at least
   * {@link #selectionCapacity}. Errors are pq_decode_select's.
   */
  public Selection decodeSelect(long seqId, int layer, ByteBuffer query) {
    return select(seqId, layer, query, false);
  }

  /**
   * A selection a step early, from an estimate of the query
   * (pq_decode_speculate): what {@link #decodeSelect} would return for it,
   * without changing the selector's state, so the caller can start fetching;
   * the next select of the layer at the same length counts how much of its
   * middle the hint held (stats: hint_tokens, hint_covered in the C API).
   */
  public Selection decodeSpeculate(long seqId, int layer, float[] queryEstimate) {
    return select(seqId, layer,
        queryCopyIn(queryEstimate, "pq_decode_speculate", "query_estimate"), true);
  }

  private Selection select(long seqId, int layer, ByteBuffer query, boolean speculate) {
    String function = speculate ? "pq_decode_speculate" : "pq_decode_select";
    ByteBuffer q = queryInput(query, function, speculate ? "query_estimate" : "query", 1);
    return call(function, h -> {
      try (NativeTensor tq = queryTensor(q, 1)) {
        int capacity = capacityHint(layer);
        ByteBuffer[] arrays = Selection.allocateNative(function, kvHeads, capacity);
        try {
          selectInto(h, seqId, layer, tq.tensor, arrays, capacity, speculate);
        } catch (PqException e) {
          if (e.status() != Status.BUFFER_TOO_SMALL) {
            throw e;
          }
          return selectGrown(function, h, seqId, layer, tq.tensor, arrays, speculate);
        }
        return Selection.fromNative(kvHeads, capacity, arrays[0], arrays[1]);
      }
    });
  }

  /** {@link #decodeSelect(long, int, ByteBuffer)} from an array (F32; copies). */
  public Selection decodeSelect(long seqId, int layer, float[] query) {
    return decodeSelect(seqId, layer, queryCopyIn(query, "pq_decode_select", "query"));
  }

  /**
   * {@link #decodeSelect(long, int, ByteBuffer)} for every sequence at one
   * layer, in one library call (pq_decode_select_batch): {@code queries[i]}
   * belongs to {@code seqIds[i]}, which may appear once. Returns the
   * selections in the same order; one still too small for its sequence is
   * grown and selected once more on its own, as decodeSelect does.
   *
   * @throws PqBatchException if items failed: the first failing item's
   *     status and message (naming the item and its seq_id), every item's
   *     status, and the selections of the items that succeeded
   * @throws PqException INVALID_ARGUMENT for the call as a whole (a bad
   *     layer, a repeated seq_id), before any item ran
   */
  public Selection[] decodeSelectBatch(int layer, long[] seqIds, ByteBuffer[] queries) {
    final String function = "pq_decode_select_batch";
    int n = batchSize(seqIds, queries, function, "queries");
    ByteBuffer[] q = new ByteBuffer[n];
    for (int i = 0; i < n; i++) {
      q[i] = queryInput(queries[i], function, "items[" + i + "].query", 1);
    }
    return call(function, h -> {
      int capacity = capacityHint(layer);
      NativeTensor[] tensors = new NativeTensor[n];
      ByteBuffer[][] arrays = new ByteBuffer[n][];
      SWIGTYPE_p_pq_select_item items = pqcache.pqj_select_items_new(n);
      if (items == null) {
        throw new OutOfMemoryError("pq_select_item[" + n + "]");
      }
      try {
        for (int i = 0; i < n; i++) {
          tensors[i] = tensor(q[i], TOKEN_MAJOR, 1, queryHeads);
          arrays[i] = Selection.allocateNative(function, kvHeads, capacity);
          pq_selection out = new pq_selection();
          try {
            out.attach(arrays[i][0], arrays[i][1], capacity);
            pqcache.pqj_select_items_set(items, i, seqIds[i], tensors[i].tensor, out);
          } finally {
            out.delete();
          }
        }
        PqException failure = null;
        try {
          pqcache.pq_decode_select_batch(h, layer, items, n);
        } catch (PqException e) {
          failure = e;
        }
        int[] codes = new int[n];
        for (int i = 0; i < n; i++) {
          codes[i] = pqcache.pqj_select_items_status(items, i);
        }
        Reference.reachabilityFence(arrays);
        return selectBatchResults(h, layer, seqIds, tensors, arrays, capacity, codes, failure);
      } finally {
        pqcache.pqj_select_items_delete(items);
        for (NativeTensor t : tensors) {
          if (t != null) {
            t.close();
          }
        }
      }
    });
  }

  /** {@link #decodeSelectBatch(int, long[], ByteBuffer[])} from arrays (F32; copies). */
  public Selection[] decodeSelectBatch(int layer, long[] seqIds, float[][] queries) {
    int n = batchSize(seqIds, queries, "pq_decode_select_batch", "queries");
    ByteBuffer[] q = new ByteBuffer[n];
    for (int i = 0; i < n; i++) {
      q[i] = queryCopyIn(queries[i], "pq_decode_select_batch", "items[" + i + "].query");
    }
    return decodeSelectBatch(layer, seqIds, q);
  }

  /**
   * {@link #fetchKV(long, int, Selection, ByteBuffer, ByteBuffer)} for every
   * sequence at one layer, in one library call (pq_fetch_kv_batch): item i
   * gathers {@code selections[i]} of {@code seqIds[i]} into {@code outKeys[i]}
   * and {@code outValues[i]}, head-major as fetchKV writes them. No two
   * outputs may overlap.
   *
   * @throws PqBatchException if items failed: the first failing item's
   *     status and message (naming the item and its seq_id) and every item's
   *     status; the outputs of the items that succeeded are written
   * @throws PqException INVALID_ARGUMENT for the call as a whole (a bad
   *     layer, a repeated seq_id, overlapping outputs), before any item ran
   */
  public void fetchKVBatch(int layer, long[] seqIds, Selection[] selections, ByteBuffer[] outKeys,
      ByteBuffer[] outValues) {
    final String function = "pq_fetch_kv_batch";
    int n = batchSize(seqIds, selections, function, "selections");
    batchSize(seqIds, outKeys, function, "outKeys");
    batchSize(seqIds, outValues, function, "outValues");
    ByteBuffer[] k = new ByteBuffer[n];
    ByteBuffer[] v = new ByteBuffer[n];
    for (int i = 0; i < n; i++) {
      String item = "items[" + i + "].";
      checkSelection(selections[i], function, item + "selection");
      int rows = selections[i].capacity();
      k[i] = output(outKeys[i], function, item + "out_keys", rows, kvHeads);
      v[i] = output(outValues[i], function, item + "out_values", rows, kvHeads);
    }
    run(function, h -> {
      NativeTensor[] tensors = new NativeTensor[2 * n];
      SWIGTYPE_p_pq_fetch_item items = pqcache.pqj_fetch_items_new(n);
      if (items == null) {
        throw new OutOfMemoryError("pq_fetch_item[" + n + "]");
      }
      try {
        for (int i = 0; i < n; i++) {
          int rows = selections[i].capacity();
          tensors[2 * i] = tensor(k[i], HEAD_MAJOR, rows, kvHeads);
          tensors[2 * i + 1] = tensor(v[i], HEAD_MAJOR, rows, kvHeads);
          pq_selection chosen = attached(selections[i]);
          try {
            pqcache.pqj_fetch_items_set(items, i, seqIds[i], chosen, tensors[2 * i].tensor,
                tensors[2 * i + 1].tensor);
          } finally {
            chosen.delete();
          }
        }
        try {
          pqcache.pq_fetch_kv_batch(h, layer, items, n);
        } catch (PqException e) {
          int[] codes = new int[n];
          for (int i = 0; i < n; i++) {
            codes[i] = pqcache.pqj_fetch_items_status(items, i);
          }
          if (Arrays.stream(codes).allMatch(c -> c == pq_status.PQ_OK)) {
            throw e; // the call as a whole failed: no item ran
          }
          throw new PqBatchException(e.code(), e.libraryMessage(), codes, null);
        }
      } finally {
        pqcache.pqj_fetch_items_delete(items);
        for (NativeTensor t : tensors) {
          if (t != null) {
            t.close();
          }
        }
        Reference.reachabilityFence(selections);
      }
    });
  }

  /**
   * Gathers the K and V of a selection into {@code outKeys} and
   * {@code outValues}, head-major {@code [kvHeads][selection.capacity()][headDim]}:
   * selected token i of kv head h lands in row {@code h * capacity + i}. Rows
   * past a head's count are left as they were. Bytes are copied as stored.
   */
  public void fetchKV(long seqId, int layer, Selection selection, ByteBuffer outKeys,
      ByteBuffer outValues) {
    checkSelection(selection, "pq_fetch_kv", "selection");
    int rows = selection.capacity();
    ByteBuffer k = output(outKeys, "pq_fetch_kv", "out_keys", rows, kvHeads);
    ByteBuffer v = output(outValues, "pq_fetch_kv", "out_values", rows, kvHeads);
    run("pq_fetch_kv", h -> {
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
    nonNull(selection, "pq_fetch_kv", "selection", "a Selection");
    int rows = selection.capacity();
    ByteBuffer k = scratch(outKeys, dtype, "pq_fetch_kv", "out_keys", rows, kvHeads);
    ByteBuffer v = scratch(outValues, dtype, "pq_fetch_kv", "out_values", rows, kvHeads);
    // Start from the arrays' contents: rows past a head's count stay as they were.
    k.asFloatBuffer().put(outKeys, 0, k.capacity() / Float.BYTES);
    v.asFloatBuffer().put(outValues, 0, v.capacity() / Float.BYTES);
    fetchKV(seqId, layer, selection, k, v);
    k.asFloatBuffer().get(outKeys, 0, k.capacity() / Float.BYTES);
    v.asFloatBuffer().get(outValues, 0, v.capacity() / Float.BYTES);
  }

  /**
   * The attention of one token's query ({@code 1 x queryHeads x headDim}, a
   * direct buffer like decodeSelect's) over the tokens of a selection, read
   * from the library's store without the gathered copy of fetchKV
   * (pq_decode_attend). Query head q attends over the selected tokens of kv
   * head {@code q / (queryHeads / kvHeads)} with logits {@code scale * q . K};
   * a scale of 0 means {@code 1 / sqrt(headDim)}.
   *
   * @throws PqException INVALID_ARGUMENT (query shape or dtype, a scale below
   *     0 or not finite, NaN in the query, positions past the length),
   *     NOT_FOUND, BAD_STATE (layer never prefilled); the message names
   *     pq_decode_attend
   * @throws IllegalArgumentException a heap, foreign-order or too small
   *     query buffer, or a selection of another kv head count
   */
  public Attention decodeAttend(long seqId, int layer, ByteBuffer query, Selection selection,
      float scale) {
    return attend("pq_decode_attend", seqId, layer, query, selection, scale);
  }

  /**
   * The tail estimate alone (pq_decode_tail, 0.12; a context built with {@code
   * .tailEstimate(TailEstimate.CODE_MEANS)}): the attention over the middle tokens the selection
   * leaves out, the part decodeAttend adds, for a caller that attends over the fetched rows
   * itself. Merge per query head with your own (oA, lseA): {@code m = max(lseA, lse), wA =
   * exp(lseA - m), wT = exp(lse - m), o = (wA oA + wT out) / (wA + wT)}. A kv head with nothing
   * left out gives zeros and -infinity.
   *
   * @throws PqException BAD_STATE without the estimate; otherwise decodeAttend's, naming
   *     pq_decode_tail
   */
  public Attention decodeTail(long seqId, int layer, ByteBuffer query, Selection selection,
      float scale) {
    return attend("pq_decode_tail", seqId, layer, query, selection, scale);
  }

  /** {@link #decodeTail(long, int, ByteBuffer, Selection, float)} from an array (F32; copies). */
  public Attention decodeTail(long seqId, int layer, float[] query, Selection selection,
      float scale) {
    return decodeTail(seqId, layer, queryCopyIn(query, "pq_decode_tail", "query"), selection,
        scale);
  }

  /** decodeAttend (op pq_decode_attend) and decodeTail (op pq_decode_tail). */
  private Attention attend(String op, long seqId, int layer, ByteBuffer query,
      Selection selection, float scale) {
    ByteBuffer q = queryInput(query, op, "query", 1);
    checkSelection(selection, op, "selection");
    ByteBuffer out = ByteBuffer.allocateDirect(queryHeads * headDim * Float.BYTES)
        .order(ByteOrder.nativeOrder());
    ByteBuffer lse = ByteBuffer.allocateDirect(queryHeads * Float.BYTES)
        .order(ByteOrder.nativeOrder());
    boolean tailOnly = op.equals("pq_decode_tail");
    run(op, h -> {
      pq_selection chosen = attached(selection);
      try (NativeTensor tq = queryTensor(q, 1)) {
        if (tailOnly) {
          pqcache.pq_decode_tail(h, seqId, layer, tq.tensor, chosen, scale, out, lse);
        } else {
          pqcache.pq_decode_attend(h, seqId, layer, tq.tensor, chosen, scale, out, lse);
        }
      } finally {
        chosen.delete();
        Reference.reachabilityFence(selection);
        Reference.reachabilityFence(out);
        Reference.reachabilityFence(lse);
      }
    });
    float[] output = new float[queryHeads * headDim];
    float[] logSumExp = new float[queryHeads];
    out.asFloatBuffer().get(output);
    lse.asFloatBuffer().get(logSumExp);
    return new Attention(headDim, output, logSumExp);
  }

  /** {@link #decodeAttend(long, int, ByteBuffer, Selection, float)} with the default scale. */
  public Attention decodeAttend(long seqId, int layer, ByteBuffer query, Selection selection) {
    return decodeAttend(seqId, layer, query, selection, 0f);
  }

  /** {@link #decodeAttend(long, int, ByteBuffer, Selection, float)} from an array (F32; copies). */
  public Attention decodeAttend(long seqId, int layer, float[] query, Selection selection,
      float scale) {
    return decodeAttend(seqId, layer, queryCopyIn(query, "pq_decode_attend", "query"),
        selection, scale);
  }

  /** {@link #decodeAttend(long, int, float[], Selection, float)} with the default scale. */
  public Attention decodeAttend(long seqId, int layer, float[] query, Selection selection) {
    return decodeAttend(seqId, layer, query, selection, 0f);
  }

  /**
   * Attention probabilities over a selection's tokens, summed over each
   * group's query heads: {@code probs[h * selection.capacity() + i]} belongs
   * to selected token i of kv head h. H2O and SCOPE accumulate them; other
   * selectors ignore them.
   */
  public void observeAttention(long seqId, int layer, Selection selection, float[] probs) {
    final String function = "pq_observe_attention";
    checkSelection(selection, function, "selection");
    nonNull(probs, function, "probs", "a float[]");
    int needed = selection.kvHeads() * selection.capacity();
    if (probs.length < needed) {
      throw invalid(function, "probs has " + probs.length + " floats; expected at least " + needed
          + " (" + selection.kvHeads() + " kv heads x selection capacity "
          + selection.capacity() + ")");
    }
    ByteBuffer p = ByteBuffer.allocateDirect(needed * Float.BYTES).order(ByteOrder.nativeOrder());
    p.asFloatBuffer().put(probs, 0, needed);
    run("pq_observe_attention", h -> {
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

  /** The class flags of pq_sequence_token_classes (FastGen reads them). */
  public static final byte TOKEN_PLAIN = 0, TOKEN_SPECIAL = 1, TOKEN_PUNCTUATION = 2;

  /**
   * The classes ({@link #TOKEN_SPECIAL} | {@link #TOKEN_PUNCTUATION} flags) of
   * the tokens at {@code first}, {@code first + 1}, ..., for every layer.
   * FastGen reads them: give the prompt's before {@code prefillQueries}.
   */
  public void tokenClasses(long seqId, long first, byte[] classes) {
    nonNull(classes, "pq_sequence_token_classes", "classes", "a byte[]");
    ByteBuffer c = ByteBuffer.allocateDirect(Math.max(classes.length, 1));
    c.put(classes);
    run("pq_sequence_token_classes", h -> {
      try {
        pqcache.pq_sequence_token_classes(h, seqId, first, classes.length, c);
      } finally {
        Reference.reachabilityFence(c);
      }
    });
  }

  // --- introspection ---

  /** Context-wide statistics (removed sequences' counters included, their tokens not). */
  public Stats stats() {
    pq_stats stats = new pq_stats();
    try {
      run("pq_stats_get", h -> pqcache.pq_stats_get(h, stats));
      return Stats.of(stats);
    } finally {
      stats.delete();
    }
  }

  /** Statistics of one sequence. */
  public Stats sequenceStats(long seqId) {
    pq_stats stats = new pq_stats();
    try {
      run("pq_sequence_stats_get", h -> pqcache.pq_sequence_stats_get(h, seqId, stats));
      return Stats.of(stats);
    } finally {
      stats.delete();
    }
  }

  /** The state of one (sequence, layer), without waiting for its build. */
  public LayerInfo layerInfo(long seqId, int layer) {
    pq_layer_info info = new pq_layer_info();
    try {
      run("pq_layer_info_get", h -> pqcache.pq_layer_info_get(h, seqId, layer, info));
      return LayerInfo.of(info);
    } finally {
      info.delete();
    }
  }

  /** Blocks until every index build queued so far has finished. */
  public void waitBuilds() {
    run("pq_wait_builds", pqcache::pq_wait_builds);
  }

  @Override
  public String toString() {
    return "PqContext[" + layers + " layers, " + queryHeads + " q heads, " + kvHeads
        + " kv heads, head_dim " + headDim + ", " + dtype + ", " + backend
        + (isClosed() ? ", closed]" : "]");
  }

  // --- internals ---

  /** Calls holding the context now (for tests: HooksTest). */
  int callsInProgress() {
    return lifecycle.getReadLockCount();
  }

  /**
   * Runs op with the live handle under the read lock; function, the C function op calls, names
   * it in the PqClosedException of a closed context.
   */
  private <T> T call(String function, LongFunction<T> op) {
    Lock lock = lifecycle.readLock();
    // A call from a hook (a build-done listener may make some) does not queue
    // behind a close() that is waiting for the calls in progress: one of them
    // may wait for a build queued behind this hook on its worker thread. It
    // takes the read lock at once unless close() holds the write lock, which
    // it does only to mark the context closed.
    if (!(Hooks.runningOnThisThread() && lock.tryLock())) {
      lock.lock();
    }
    try {
      if (closed) {
        throw new PqClosedException(function);
      }
      return op.apply(handle.address);
    } finally {
      lock.unlock();
      // The Cleaner must not free the context while a call runs on it.
      Reference.reachabilityFence(this);
    }
  }

  private void run(String function, LongConsumer op) {
    call(function, h -> {
      op.accept(h);
      return null;
    });
  }

  /**
   * The bytes between the buffer's position and limit as a direct buffer
   * whose address is the first of them: a slice of a direct one, else a
   * copy.
   */
  private static ByteBuffer directBytes(ByteBuffer buffer, String function, String name) {
    ByteBuffer bytes = nonNull(buffer, function, name, "a ByteBuffer").slice();
    if (bytes.isDirect()) {
      return bytes;
    }
    ByteBuffer copy = ByteBuffer.allocateDirect(bytes.remaining());
    copy.put(0, bytes, 0, bytes.remaining());
    return copy;
  }

  /** pq_sequence_restore_begin or _kv: data, and an 8-byte direct buffer for out_consumed. */
  @FunctionalInterface
  private interface RestoreCall {
    void apply(long context, ByteBuffer data, ByteBuffer consumed);
  }

  /**
   * One pq_sequence_restore_begin or _kv call: the bytes read, or
   * PqBufferTooSmallException with the bytes needed (the library writes
   * out_consumed on PQ_ERR_BUFFER_TOO_SMALL too).
   */
  private long restoreStep(String function, ByteBuffer buffer, String name, RestoreCall op) {
    ByteBuffer data = directBytes(buffer, function, name);
    ByteBuffer consumed = ByteBuffer.allocateDirect(Long.BYTES).order(ByteOrder.nativeOrder());
    return call(function, h -> {
      try {
        op.apply(h, data, consumed);
      } catch (PqException e) {
        if (e.status() == Status.BUFFER_TOO_SMALL) {
          throw new PqBufferTooSmallException(e.code(), e.libraryMessage(), consumed.getLong(0));
        }
        throw e;
      } finally {
        Reference.reachabilityFence(data);
        Reference.reachabilityFence(consumed);
      }
      return consumed.getLong(0);
    });
  }

  /** pq_prefill_layer or pq_decode_append: the same arguments, K and V token-major. */
  @FunctionalInterface
  private interface StoreCall {
    void apply(long context, long seqId, int layer, pq_tensor keys, pq_tensor values);
  }

  /** values null: NULL, for an index-only context (the library refuses it elsewhere). */
  private void store(String function, StoreCall call, long seqId, int layer, int tokens,
      ByteBuffer keys, ByteBuffer values) {
    ByteBuffer k = input(keys, function, "keys", tokens, kvHeads);
    ByteBuffer v = values == null ? null : input(values, function, "values", tokens, kvHeads);
    run(function, h -> {
      try (NativeTensor tk = tensor(k, TOKEN_MAJOR, tokens, kvHeads);
          NativeTensor tv = v == null ? null : tensor(v, TOKEN_MAJOR, tokens, kvHeads)) {
        call.apply(h, seqId, layer, tk.tensor, tv == null ? null : tv.tensor);
      }
    });
  }

  /** pq_prefill_layer_paged or pq_decode_append_paged: the same arguments. */
  @FunctionalInterface
  private interface PagedCall {
    void apply(long context, long seqId, int layer, pq_paged_keys keys);
  }

  private void storePaged(String function, PagedCall call, long seqId, int layer, int tokens,
      PagedKeys keys) {
    nonNull(keys, function, "keys", "PagedKeys");
    ByteBuffer pool = input(keys.pool, function, "keys.pool", keys.poolTokens, kvHeads);
    run(function, h -> {
      try (NativePaged k = paged(keys, pool, tokens)) {
        call.apply(h, seqId, layer, k.keys);
      }
    });
  }

  private static SelectionShape capacityMulti(long h, long seqId, int layer, int queryTokens,
      SelectRows rows) {
    long[] count = new long[1];
    long[] capacity = new long[1];
    pqcache.pq_selection_capacity_multi(h, seqId, layer, queryTokens, rows.code(), count,
        capacity);
    return new SelectionShape(Math.toIntExact(count[0]), Math.toIntExact(capacity[0]));
  }

  /** One pq_decode_select_multi into arrays (positions, counts) of the given capacity. */
  private static void selectMultiInto(long h, long seqId, int layer, pq_tensor queries,
      SelectRows rows, pq_paged_keys keys, ByteBuffer[] arrays, int capacity) {
    pq_selection selection = new pq_selection();
    try {
      selection.attach(arrays[0], arrays[1], capacity);
      pqcache.pq_decode_select_multi(h, seqId, layer, queries, rows.code(), keys, selection);
    } finally {
      selection.delete();
      Reference.reachabilityFence(arrays);
    }
  }

  private static int capacity(long h, long seqId, int layer) {
    long[] capacity = new long[1];
    pqcache.pq_selection_capacity(h, seqId, layer, capacity);
    return Math.toIntExact(capacity[0]);
  }

  /** The largest capacity the library asked for at this layer so far (0 out of range). */
  private int capacityHint(int layer) {
    return layer >= 0 && layer < layers ? capacityHints.get(layer) : 0;
  }

  /** One pq_decode_select into arrays (positions, counts) of the given capacity. */
  private static void selectInto(long h, long seqId, int layer, pq_tensor query,
      ByteBuffer[] arrays, int capacity, boolean speculate) {
    pq_selection selection = new pq_selection();
    try {
      selection.attach(arrays[0], arrays[1], capacity);
      if (speculate) {
        pqcache.pq_decode_speculate(h, seqId, layer, query, selection);
      } else {
        pqcache.pq_decode_select(h, seqId, layer, query, selection);
      }
    } finally {
      selection.delete();
      Reference.reachabilityFence(arrays);
    }
  }

  /**
   * After BUFFER_TOO_SMALL, which wrote the capacity needed into the counts of
   * {@code tooSmall}: selects once more into arrays of that size.
   */
  private Selection selectGrown(String function, long h, long seqId, int layer, pq_tensor query,
      ByteBuffer[] tooSmall, boolean speculate) {
    int needed = tooSmall[1].getInt(0);
    if (layer >= 0 && layer < layers) {
      capacityHints.accumulateAndGet(layer, needed, Math::max);
    }
    ByteBuffer[] arrays = Selection.allocateNative(function, kvHeads, needed);
    selectInto(h, seqId, layer, query, arrays, needed, speculate);
    return Selection.fromNative(kvHeads, needed, arrays[0], arrays[1]);
  }

  /**
   * The selections of a batch whose items wrote {@code codes}: items too
   * small for their sequence are grown and selected once more on their own;
   * then the first item still failing throws. The library's message names
   * the first item that failed in the batch; an item failing after it was
   * retried, or after such an item, gets a message built from its status.
   */
  private Selection[] selectBatchResults(long h, int layer, long[] seqIds, NativeTensor[] tensors,
      ByteBuffer[][] arrays, int capacity, int[] codes, PqException failure) {
    if (failure != null && Arrays.stream(codes).allMatch(c -> c == pq_status.PQ_OK)) {
      throw failure; // the call as a whole failed: no item ran
    }
    int named = 0; // the item the library's message is about
    while (named < codes.length && codes[named] == pq_status.PQ_OK) {
      named++;
    }
    Selection[] selections = new Selection[codes.length];
    int first = -1;
    String message = null;
    for (int i = 0; i < codes.length; i++) {
      String retryMessage = null;
      if (codes[i] == pq_status.PQ_ERR_BUFFER_TOO_SMALL) {
        try {
          selections[i] = selectGrown("pq_decode_select", h, seqIds[i], layer, tensors[i].tensor,
              arrays[i], false);
          codes[i] = pq_status.PQ_OK;
        } catch (PqException retry) {
          codes[i] = retry.code();
          retryMessage = retry.libraryMessage();
        }
      } else if (codes[i] == pq_status.PQ_OK) {
        selections[i] = Selection.fromNative(kvHeads, capacity, arrays[i][0], arrays[i][1]);
      }
      if (codes[i] != pq_status.PQ_OK && first < 0) {
        first = i;
        message = retryMessage == null && i == named ? failure.libraryMessage()
            : "pq_decode_select_batch: items[" + i + "] (seq_id " + Long.toUnsignedString(seqIds[i])
                + "): " + (retryMessage != null ? retryMessage : pqcache.pq_status_string(codes[i]));
      }
    }
    if (first >= 0) {
      throw new PqBatchException(codes[first], message, codes, selections);
    }
    return selections;
  }

  /**
   * The number of items of a batch of the C function {@code function}: one entry of
   * {@code items} (the Java parameter {@code name}, which C has not) per sequence id.
   */
  private static int batchSize(long[] seqIds, Object[] items, String function, String name) {
    nonNull(seqIds, function, "seqIds", "a long[]");
    nonNull(items, function, name, "an array");
    if (items.length != seqIds.length) {
      throw invalid(function, name + " has " + items.length + " entries; expected "
          + seqIds.length + ", one per seqIds entry");
    }
    return seqIds.length;
  }

  /** The library reads kvHeads counts and rows of a selection, argument {@code name}. */
  private void checkSelection(Selection selection, String function, String name) {
    nonNull(selection, function, name, "a Selection");
    if (selection.kvHeads() != kvHeads) {
      throw invalid(function, name + " has " + selection.kvHeads() + " kv heads; expected "
          + kvHeads + " (num_kv_heads)");
    }
  }

  /**
   * A precondition of the C function {@code function} checked in Java: the message reads as the
   * library's, the function first, then the argument, its value and what was expected
   * (docs/bindings/errors.md).
   */
  static IllegalArgumentException invalid(String function, String what) {
    return new IllegalArgumentException(function + ": " + what);
  }

  /**
   * {@code value}, or a NullPointerException (what Java throws for a null argument) whose
   * message reads as {@link #invalid}'s: "pq_fetch_kv: selection is null; expected a Selection".
   */
  private static <T> T nonNull(T value, String function, String name, String expected) {
    return Objects.requireNonNull(value,
        () -> function + ": " + name + " is null; expected " + expected);
  }

  /** The element type as the C API names it: f32, f16 or bf16. */
  private static String dtypeName(DType type) {
    return type.name().toLowerCase(Locale.ROOT);
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

  /** A pq_paged_keys over a pool and the maps of a PagedKeys; closing frees it. */
  private static final class NativePaged implements AutoCloseable {
    final pq_paged_keys keys = new pq_paged_keys();
    private final NativeTensor pool;
    private final PagedKeys source;

    NativePaged(NativeTensor pool, PagedKeys source) {
      this.pool = pool;
      this.source = source;
    }

    @Override
    public void close() {
      keys.delete();
      pool.close();
      Reference.reachabilityFence(source); // its maps are attached by address
    }
  }

  /** tokens: the tokens an append or prefill adds (not read by a select). */
  private NativePaged paged(PagedKeys keys, ByteBuffer pool, long tokens) {
    NativePaged k = new NativePaged(tensor(pool, TOKEN_MAJOR, keys.poolTokens, kvHeads), keys);
    k.keys.attach(k.pool.tensor, keys.slots, keys.blockTable, keys.blockSize, keys.mapLength,
        tokens);
    return k;
  }

  private NativeTensor tensor(ByteBuffer data, int layout, int tokens, int heads) {
    return tensor(data, dtype, layout, tokens, heads);
  }

  /** A query tensor (token-major, queryHeads heads, in {@link #queryDtype}). */
  private NativeTensor queryTensor(ByteBuffer data, int tokens) {
    return tensor(data, queryDtype, TOKEN_MAJOR, tokens, queryHeads);
  }

  private NativeTensor tensor(ByteBuffer data, DType type, int layout, int tokens, int heads) {
    NativeTensor t = new NativeTensor(data);
    try {
      pqcache.pq_tensor_init(t.tensor, data, type.code(), layout, tokens, heads, headDim);
    } catch (RuntimeException e) {
      t.close();
      throw e;
    }
    return t;
  }

  private long bytes(DType type, int tokens, int heads) {
    return Math.max(0L, tokens) * heads * headDim * type.bytes();
  }

  private ByteBuffer input(ByteBuffer buffer, String function, String name, int tokens,
      int heads) {
    return checked(buffer, dtype, function, name, tokens, heads, false);
  }

  private ByteBuffer queryInput(ByteBuffer buffer, String function, String name, int tokens) {
    return checked(buffer, queryDtype, function, name, tokens, queryHeads, false);
  }

  private ByteBuffer output(ByteBuffer buffer, String function, String name, int tokens,
      int heads) {
    return checked(buffer, dtype, function, name, tokens, heads, true);
  }

  /** The shape in words, for messages: "tokens 8 x heads 2 x head_dim 16". */
  private String shape(int tokens, int heads) {
    return "tokens " + tokens + " x heads " + heads + " x head_dim " + headDim;
  }

  /**
   * The buffer's bytes from its position, as a view the native code addresses from 0; a
   * failure names the C function and the argument as the library would.
   */
  private ByteBuffer checked(ByteBuffer buffer, DType type, String function, String name,
      int tokens, int heads, boolean written) {
    nonNull(buffer, function, name, "a direct ByteBuffer");
    if (!buffer.isDirect()) {
      throw invalid(function, name + " is a heap ByteBuffer; expected a direct one"
          + " (ByteBuffer.allocateDirect): a heap buffer has no fixed native address;"
          + " the float[] overloads pass arrays by copy");
    }
    if (buffer.order() != ByteOrder.nativeOrder()) {
      throw invalid(function, name + " is " + buffer.order() + "; expected the native order "
          + ByteOrder.nativeOrder() + ", in which the library reads elements"
          + " (buffer.order(ByteOrder.nativeOrder()))");
    }
    if (written && buffer.isReadOnly()) {
      throw invalid(function, name + " is read-only; expected a writable buffer, which"
          + " receives the fetched rows");
    }
    long needed = bytes(type, tokens, heads);
    if (buffer.remaining() < needed) {
      throw invalid(function, name + " has " + buffer.remaining() + " bytes from its position;"
          + " expected at least " + needed + " (" + shape(tokens, heads) + " x "
          + type.bytes() + " bytes of " + dtypeName(type) + ")");
    }
    return buffer.slice();
  }

  private void requireF32(DType type, String function, String name) {
    if (type != DType.F32) {
      throw invalid(function, name + " is a float[]; expected a direct ByteBuffer of "
          + dtypeName(type) + " elements: the context stores " + dtypeName(dtype)
          + ", and float[] passes f32");
    }
  }

  /** {@link #copyIn}, or null for a null array (values an index-only context does not keep). */
  private ByteBuffer copyInOptional(float[] array, String function, String name, int tokens,
      int heads) {
    return array == null ? null : copyIn(array, function, name, tokens, heads);
  }

  private ByteBuffer copyIn(float[] array, String function, String name, int tokens,
      int heads) {
    return copyIn(array, dtype, function, name, tokens, heads);
  }

  /** One token's query heads from an array (F32; an fp8 context's queries are F32 too). */
  private ByteBuffer queryCopyIn(float[] array, String function, String name) {
    return copyIn(array, queryDtype, function, name, 1, queryHeads);
  }

  private ByteBuffer copyIn(float[] array, DType type, String function, String name, int tokens,
      int heads) {
    ByteBuffer buffer = scratch(array, type, function, name, tokens, heads);
    buffer.asFloatBuffer().put(array, 0, buffer.capacity() / Float.BYTES);
    return buffer;
  }

  /** A direct buffer of the tensor's size after checking the array against it. */
  private ByteBuffer scratch(float[] array, DType type, String function, String name,
      int tokens, int heads) {
    nonNull(array, function, name, "a float[]");
    requireF32(type, function, name);
    long needed = bytes(type, tokens, heads);
    if (array.length * (long) Float.BYTES < needed) {
      throw invalid(function, name + " has " + array.length + " floats; expected at least "
          + needed / Float.BYTES + " (" + shape(tokens, heads) + ")");
    }
    if (needed > Integer.MAX_VALUE) {
      throw invalid(function, name + " needs " + needed + " bytes; expected at most "
          + Integer.MAX_VALUE + ", the most a Java buffer holds");
    }
    return ByteBuffer.allocateDirect((int) needed).order(ByteOrder.nativeOrder());
  }
}
