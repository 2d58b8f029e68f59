package io.pqcache;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pqcache.swig.pq_status;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import io.pqcache.swig.pqcache;
import org.junit.jupiter.api.Test;

/** Lifecycle, errors and the enums' agreement with the C header. */
class ContextTest {
  @Test
  void createReportsTheEffectiveGeometry() {
    try (PqContext ctx = new PqContext(ReferenceCycle.config())) {
      assertFalse(ctx.isClosed());
      assertEquals(1, ctx.layers());
      assertEquals(4, ctx.queryHeads());
      assertEquals(2, ctx.kvHeads());
      assertEquals(16, ctx.headDim());
      assertEquals(DType.F32, ctx.dtype());
      assertEquals(Backend.CPU, ctx.backend());
      assertEquals(0, ctx.sequenceCount());
    }
  }

  @Test
  void closeTwiceIsHarmlessAndUseAfterCloseThrows() {
    PqContext ctx = new PqContext(ReferenceCycle.config());
    ctx.addSequence(1);
    ctx.close();
    assertTrue(ctx.isClosed());
    assertDoesNotThrow(ctx::close);
    IllegalStateException e = assertThrows(IllegalStateException.class, () -> ctx.addSequence(2));
    assertTrue(e.getMessage().contains("closed"), e.getMessage());
    assertThrows(IllegalStateException.class, ctx::stats);
    assertThrows(IllegalStateException.class, () -> ctx.selectionCapacity(1, 0));
    // The status and text every binding gives a closed context (docs/bindings/errors.md).
    PqClosedException closed = assertThrows(PqClosedException.class, () -> ctx.addSequence(2));
    assertEquals(Status.BAD_STATE, closed.status());
    assertEquals(-3, closed.code());
    assertEquals("pq_sequence_add: the context is closed", closed.libraryMessage());
    assertEquals("BAD_STATE (-3): pq_sequence_add: the context is closed", closed.getMessage());
    closed = assertThrows(PqClosedException.class,
        () -> ctx.decodeSelect(1, 0, new float[ctx.queryHeads() * ctx.headDim()]));
    assertEquals("pq_decode_select: the context is closed", closed.libraryMessage());
    closed = assertThrows(PqClosedException.class, ctx::waitBuilds);
    assertEquals("pq_wait_builds: the context is closed", closed.libraryMessage());
  }

  /** A reference-config context whose sequence 1 holds 64 prefilled tokens. */
  private static PqContext prefilledContext() {
    PqContext ctx = new PqContext(ReferenceCycle.config());
    int rows = 64 * ctx.kvHeads() * ctx.headDim();
    ctx.addSequence(1);
    ctx.prefillLayer(1, 0, 64, ReferenceCycle.generate(1, rows), ReferenceCycle.generate(2, rows));
    return ctx;
  }

  /**
   * What a context handed out before close() (selections, a restore in pieces, batch inputs)
   * holds no native pointer into it: passed back after close() it meets the closed-context
   * check, PqClosedException naming the C function, and the library is not called
   * (docs/bindings/errors.md, issue 39's audit).
   */
  @Test
  void objectsMadeBeforeCloseMeetTheClosedContext() {
    PqContext ctx = prefilledContext();
    float[] q = ReferenceCycle.generate(3, ctx.queryHeads() * ctx.headDim());
    Selection selection = ctx.decodeSelect(1, 0, q);
    byte[] state = ctx.saveSequence(1);
    long described = ctx.restoreSequenceBegin(2, state);
    int outFloats = ctx.kvHeads() * selection.capacity() * ctx.headDim();
    ByteBuffer out = ByteBuffer.allocateDirect(outFloats * 4).order(ByteOrder.nativeOrder());
    ByteBuffer outV = ByteBuffer.allocateDirect(outFloats * 4).order(ByteOrder.nativeOrder());
    ctx.close();

    assertEquals("pq_fetch_kv: the context is closed", assertThrows(PqClosedException.class,
        () -> ctx.fetchKV(1, 0, selection, out, outV)).libraryMessage());
    assertEquals("pq_fetch_kv: the context is closed", assertThrows(PqClosedException.class,
        () -> ctx.fetchKV(1, 0, selection, new float[outFloats], new float[outFloats]))
        .libraryMessage());
    assertEquals("pq_decode_attend: the context is closed", assertThrows(
        PqClosedException.class, () -> ctx.decodeAttend(1, 0, q, selection)).libraryMessage());
    assertEquals("pq_observe_attention: the context is closed", assertThrows(
        PqClosedException.class,
        () -> ctx.observeAttention(1, 0, selection, new float[2 * selection.capacity()]))
        .libraryMessage());
    assertEquals("pq_fetch_kv_batch: the context is closed", assertThrows(
        PqClosedException.class, () -> ctx.fetchKVBatch(0, new long[] {1},
            new Selection[] {selection}, new ByteBuffer[] {out}, new ByteBuffer[] {outV}))
        .libraryMessage());
    assertEquals("pq_decode_select_batch: the context is closed", assertThrows(
        PqClosedException.class, () -> ctx.decodeSelectBatch(0, new long[] {1},
            new float[][] {q})).libraryMessage());
    assertEquals("pq_sequence_restore_kv: the context is closed", assertThrows(
        PqClosedException.class, () -> ctx.restoreSequenceKV(2, java.util.Arrays.copyOfRange(
            state, (int) described, state.length))).libraryMessage());
    assertEquals("pq_decode_speculate: the context is closed", assertThrows(
        PqClosedException.class, () -> ctx.decodeSpeculate(1, 0, q)).libraryMessage());
    // The selection itself is plain Java data and stays readable.
    assertEquals(selection.maxCount(), selection.positions(0).length);
  }

  /**
   * close() racing with calls on other threads: it waits for the calls in progress, and every
   * call either completes or throws PqClosedException; none reaches a freed context.
   */
  @Test
  void closeRacingWithCallsWaitsOrReportsClosed() throws Exception {
    PqContext ctx = prefilledContext();
    float[] q = ReferenceCycle.generate(3, ctx.queryHeads() * ctx.headDim());
    java.util.concurrent.CountDownLatch started = new java.util.concurrent.CountDownLatch(2);
    java.util.List<Thread> threads = new java.util.ArrayList<>();
    java.util.concurrent.atomic.AtomicReference<Throwable> unexpected =
        new java.util.concurrent.atomic.AtomicReference<>();
    int[] closedSeen = new int[2];
    for (int t = 0; t < 2; t++) {
      int id = t;
      Thread thread = new Thread(() -> {
        started.countDown();
        try {
          while (true) {
            Selection s = ctx.decodeSelect(1, 0, q);
            ctx.fetchKV(1, 0, s, new float[ctx.kvHeads() * s.capacity() * ctx.headDim()],
                new float[ctx.kvHeads() * s.capacity() * ctx.headDim()]);
          }
        } catch (PqClosedException e) {
          closedSeen[id] = 1;
        } catch (Throwable e) {
          unexpected.set(e);
        }
      });
      threads.add(thread);
      thread.start();
    }
    started.await();
    Thread.sleep(20);
    ctx.close();
    for (Thread thread : threads) {
      thread.join(30_000);
      assertFalse(thread.isAlive());
    }
    if (unexpected.get() != null) {
      throw new AssertionError("a call racing with close", unexpected.get());
    }
    assertArrayEquals(new int[] {1, 1}, closedSeen);
  }

  @Test
  void badConfigurationThrowsWithStatusAndLibraryMessage() {
    Config bad = Config.builder().layers(1).queryHeads(4).kvHeads(2).headDim(0).build();
    PqException e = assertThrows(PqException.class, () -> new PqContext(bad));
    assertEquals(Status.INVALID_ARGUMENT, e.status());
    assertEquals(-1, e.code());
    assertTrue(e.libraryMessage().contains("head_dim"),
        "the library's message names the field: " + e.libraryMessage());
    assertTrue(e.getMessage().startsWith("INVALID_ARGUMENT"), e.getMessage());
    assertTrue(e.getMessage().contains(e.libraryMessage()), e.getMessage());
  }

  @Test
  void unsupportedBitsThrowUnsupported() {
    Config tooWide = Config.builder().layers(1).queryHeads(4).kvHeads(2).headDim(16)
        .pqBits(9).build();
    PqException e = assertThrows(PqException.class, () -> new PqContext(tooWide));
    assertEquals(Status.UNSUPPORTED, e.status());
    assertFalse(e.libraryMessage().isEmpty());
  }

  @Test
  void sequenceErrorsCarryTheirStatus() {
    try (PqContext ctx = new PqContext(ReferenceCycle.config())) {
      ctx.addSequence(7);
      PqException duplicate = assertThrows(PqException.class, () -> ctx.addSequence(7));
      assertEquals(Status.INVALID_ARGUMENT, duplicate.status());

      PqException missing = assertThrows(PqException.class, () -> ctx.removeSequence(8));
      assertEquals(Status.NOT_FOUND, missing.status());
      assertFalse(missing.libraryMessage().isEmpty());

      float[] query = new float[ctx.queryHeads() * ctx.headDim()];
      PqException early = assertThrows(PqException.class, () -> ctx.decodeSelect(7, 0, query));
      assertEquals(Status.BAD_STATE, early.status());

      PqException badLayer = assertThrows(PqException.class, () -> ctx.sequenceLength(7, 5));
      assertEquals(Status.INVALID_ARGUMENT, badLayer.status());

      // Unsigned ids: the full 64-bit range is usable.
      ctx.addSequence(-1L); // 0xffffffffffffffff
      assertEquals(2, ctx.sequenceCount());
      ctx.removeSequence(-1L);
      ctx.removeSequence(7);
      assertEquals(0, ctx.sequenceCount());
    }
  }

  /** One layer, 4 query and 2 kv heads of 16 dimensions, 4 sinks, 16 local, k 16. */
  private static Config.Builder smallConfig() {
    return Config.builder().dtype(DType.F32).layers(1).queryHeads(4).kvHeads(2).headDim(16)
        .sinkTokens(4).localTokens(16).topkTokens(16).workerThreads(1);
  }

  /**
   * Sequence 1 of {@code ctx} gets n generated tokens and 8 window queries;
   * returns the last of them, a query for a select.
   */
  private static float[] prefillWithWindow(PqContext ctx, int n) {
    float[] keys = new float[n * 2 * 16];
    for (int i = 0; i < keys.length; i++) keys[i] = ReferenceCycle.value(1, i);
    ctx.prefillLayer(1, 0, n, keys, keys);
    float[] queries = new float[8 * 4 * 16];
    for (int i = 0; i < queries.length; i++) queries[i] = ReferenceCycle.value(3, i);
    ByteBuffer window = ByteBuffer.allocateDirect(queries.length * Float.BYTES)
        .order(ByteOrder.nativeOrder());
    window.asFloatBuffer().put(queries);
    ctx.prefillQueries(1, 0, 8, window);
    return java.util.Arrays.copyOfRange(queries, 7 * 4 * 16, 8 * 4 * 16);
  }

  /**
   * FastGen reads the classes given through tokenClasses: at a recovery
   * ratio this low every kv head takes the special-token policy, so its
   * middle is exactly the special tokens; an unknown flag is refused.
   */
  @Test
  void fastgenKeepsTheSpecialTokensItIsToldOf() {
    Config config = smallConfig().selector(Selector.FASTGEN).fastgenRecovery(1e-6f).build();
    try (PqContext ctx = new PqContext(config)) {
      int n = 64;
      ctx.addSequence(1);
      byte[] classes = new byte[n];
      classes[10] = PqContext.TOKEN_SPECIAL;
      classes[30] = PqContext.TOKEN_SPECIAL | PqContext.TOKEN_PUNCTUATION;
      ctx.tokenClasses(1, 0, classes);
      float[] query = prefillWithWindow(ctx, n);
      Selection sel = ctx.decodeSelect(1, 0, query);
      int[] want = new int[4 + 2 + 16];
      for (int i = 0; i < 4; i++) want[i] = i;
      want[4] = 10;
      want[5] = 30;
      for (int i = 0; i < 16; i++) want[6 + i] = n - 16 + i;
      for (int h = 0; h < 2; h++) assertArrayEquals(want, sel.positions(h), "kv head " + h);
      PqException bad = assertThrows(PqException.class,
          () -> ctx.tokenClasses(1, 0, new byte[] {0, 3, 4}));
      assertEquals(Status.INVALID_ARGUMENT, bad.status());
      assertTrue(bad.libraryMessage().contains("classes[2] is 4"), bad.libraryMessage());
    }
  }

  /** A speculation for the query the select then uses is that selection. */
  @Test
  void speculateReturnsWhatTheSelectThenChooses() {
    try (PqContext ctx = new PqContext(smallConfig().selector(Selector.INFINIGEN).build())) {
      ctx.addSequence(1);
      float[] query = prefillWithWindow(ctx, 96);
      Selection hint = ctx.decodeSpeculate(1, 0, query);
      Selection chosen = ctx.decodeSelect(1, 0, query);
      for (int h = 0; h < 2; h++) {
        assertArrayEquals(chosen.positions(h), hint.positions(h), "kv head " + h);
      }
      Stats stats = ctx.stats();
      assertEquals(1, stats.selectCalls());
      // The hint held every middle token the select chose.
      assertTrue(stats.hintTokens() > 0, stats.toString());
      assertEquals(stats.hintTokens(), stats.hintCovered());
      assertEquals(0, stats.bytesStaged());  // the CPU backend stages nothing
    }
  }

  @Test
  void nonFiniteKeysAreRejectedByTheLibrary() {
    try (PqContext ctx = new PqContext(ReferenceCycle.config())) {
      ctx.addSequence(1);
      float[] keys = new float[ctx.kvHeads() * ctx.headDim()];
      float[] values = new float[keys.length];
      keys[3] = Float.NaN;
      PqException e = assertThrows(PqException.class,
          () -> ctx.prefillLayer(1, 0, 1, keys, values));
      assertEquals(Status.INVALID_ARGUMENT, e.status());
      assertEquals(0, ctx.sequenceLength(1, 0), "nothing is stored on error");
    }
  }

  @Test
  void versionIsTheLoadedLibrarys() {
    String version = PqContext.version();
    assertTrue(version.matches("\\d+\\.\\d+\\.\\d+"), version);
    String[] parts = version.split("\\.");
    int number = Integer.parseInt(parts[0]) * 10000 + Integer.parseInt(parts[1]) * 100
        + Integer.parseInt(parts[2]);
    assertEquals(number, PqContext.versionNumber());
  }

  @Test
  void enumsMirrorTheHeader() {
    assertEquals(pq_status.PQ_OK, Status.OK.code());
    assertEquals(pq_status.PQ_ERR_INVALID_ARGUMENT, Status.INVALID_ARGUMENT.code());
    assertEquals(pq_status.PQ_ERR_OUT_OF_MEMORY, Status.OUT_OF_MEMORY.code());
    assertEquals(pq_status.PQ_ERR_BAD_STATE, Status.BAD_STATE.code());
    assertEquals(pq_status.PQ_ERR_NOT_FOUND, Status.NOT_FOUND.code());
    assertEquals(pq_status.PQ_ERR_UNSUPPORTED, Status.UNSUPPORTED.code());
    assertEquals(pq_status.PQ_ERR_BACKEND, Status.BACKEND.code());
    assertEquals(pq_status.PQ_ERR_INTERNAL, Status.INTERNAL.code());
    // The library's own names agree with the Java constants.
    for (Status status : Status.values()) {
      if (status != Status.UNKNOWN && status != Status.OK) {
        String name = pqcache.pq_status_string(status.code());
        assertTrue(name.startsWith("PQ_ERR_" + status.name()), status + " vs " + name);
      }
    }
    assertEquals(Status.UNKNOWN, Status.fromCode(-1000));

    assertEquals(io.pqcache.swig.pq_dtype.PQ_DTYPE_BF16, DType.BF16.code());
    // Selector: every constant, against the header itself (SelectorTest).
    assertEquals(io.pqcache.swig.pq_gqa_combine.PQ_GQA_MEAN, GqaCombine.MEAN.code());
    assertEquals(io.pqcache.swig.pq_kmeans_init.PQ_KMEANS_INIT_KMEANSPP,
        KMeansInit.KMEANS_PLUS_PLUS.code());
    assertEquals(io.pqcache.swig.pq_backend.PQ_BACKEND_AUTO, Backend.AUTO.code());
    assertEquals(io.pqcache.swig.pq_cache_policy.PQ_CACHE_LFU, CachePolicy.LFU.code());
    assertEquals(io.pqcache.swig.pq_key_rotary.PQ_ROTARY_HALF, KeyRotary.HALF.code());
    assertEquals(io.pqcache.swig.pq_key_rotary.PQ_ROTARY_INTERLEAVED, KeyRotary.INTERLEAVED.code());
    assertEquals(io.pqcache.swig.pq_pooling.PQ_POOLING_AVG, Pooling.AVG.code());
    assertEquals(io.pqcache.swig.pq_tail_estimate.PQ_TAIL_CODE_MEANS, TailEstimate.CODE_MEANS.code());
    assertEquals(io.pqcache.swig.pq_kv_tier.PQ_KV_TIER_HOST, KvTier.HOST.code());
    assertEquals(io.pqcache.swig.pq_kv_tier.PQ_KV_TIER_DISK, KvTier.DISK.code());
    assertEquals(io.pqcache.swig.pq_kv_tier.PQ_KV_TIER_CALLER, KvTier.CALLER.code());
    assertEquals(io.pqcache.swig.pq_select_rows.PQ_ROWS_PER_TOKEN, SelectRows.PER_TOKEN.code());
    assertEquals(io.pqcache.swig.pq_select_rows.PQ_ROWS_PER_HEAD, SelectRows.PER_HEAD.code());
    assertEquals(io.pqcache.swig.pq_select_rows.PQ_ROWS_PER_REQUEST,
        SelectRows.PER_REQUEST.code());
    assertEquals(KeyRotary.values().length, 3);
    assertEquals(Pooling.values().length, 2);
    assertEquals(TailEstimate.values().length, 2);
    assertEquals(KvTier.values().length, 3);
    assertEquals(SelectRows.values().length, 3);
  }
}
