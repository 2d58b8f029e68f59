package io.pqcache;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/** Tensors through direct buffers: in place from the position, and checked. */
class DirectBufferTest {
  private static final int TOKENS = 64;
  private PqContext ctx;
  private int rowFloats;

  @BeforeEach
  void createContext() {
    ctx = new PqContext(ReferenceCycle.config());
    ctx.addSequence(1);
    rowFloats = ctx.kvHeads() * ctx.headDim(); // one token of K or V
  }

  @AfterEach
  void closeContext() {
    ctx.close();
  }

  private static ByteBuffer nativeBuffer(int bytes) {
    return ByteBuffer.allocateDirect(bytes).order(ByteOrder.nativeOrder());
  }

  @Test
  void readsFromThePositionAndWritesInPlace() {
    float[] keys = ReferenceCycle.generate(11, TOKENS * rowFloats);
    float[] values = ReferenceCycle.generate(12, TOKENS * rowFloats);
    // 32 bytes of NaN before the data: read from position 32 on, or the
    // library would reject the NaN (it checks every input value).
    ByteBuffer k = nativeBuffer(32 + keys.length * 4);
    ByteBuffer v = nativeBuffer(32 + values.length * 4);
    for (int i = 0; i < 8; i++) {
      k.putFloat(Float.NaN);
      v.putFloat(Float.NaN);
    }
    k.asFloatBuffer().put(keys);
    v.asFloatBuffer().put(values);
    ctx.prefillLayer(1, 0, TOKENS, k, v);
    assertEquals(32, k.position(), "the caller's position is left alone");

    Selection selection =
        ctx.decodeSelect(1, 0, ReferenceCycle.generate(13, ctx.queryHeads() * ctx.headDim()));
    int capacity = selection.capacity();
    int outBytes = ctx.kvHeads() * capacity * ctx.headDim() * 4;
    // The output lands at the position of a larger buffer; a sentinel marks
    // every byte the fetch must not touch.
    ByteBuffer outK = nativeBuffer(64 + outBytes + 64);
    ByteBuffer outV = nativeBuffer(64 + outBytes + 64);
    for (int i = 0; i < outK.capacity(); i++) {
      outK.put(i, (byte) 0x5a);
      outV.put(i, (byte) 0x5a);
    }
    outK.position(64);
    outV.position(64);
    ctx.fetchKV(1, 0, selection, outK, outV);

    FloatBuffer gotK = outK.asFloatBuffer(); // starts at position 64
    FloatBuffer gotV = outV.asFloatBuffer();
    int headDim = ctx.headDim();
    for (int h = 0; h < ctx.kvHeads(); h++) {
      int[] positions = selection.positions(h);
      assertTrue(positions.length > 0);
      for (int i = 0; i < positions.length; i++) {
        float[] rowK = new float[headDim];
        float[] rowV = new float[headDim];
        gotK.get((h * capacity + i) * headDim, rowK);
        gotV.get((h * capacity + i) * headDim, rowV);
        int source = (positions[i] * ctx.kvHeads() + h) * headDim;
        for (int d = 0; d < headDim; d++) {
          assertEquals(keys[source + d], rowK[d], "key of token " + positions[i]);
          assertEquals(values[source + d], rowV[d], "value of token " + positions[i]);
        }
      }
    }
    for (int i = 0; i < 64; i++) {
      assertEquals((byte) 0x5a, outK.get(i), "byte " + i + " before the position");
      assertEquals((byte) 0x5a, outK.get(64 + outBytes + i), "byte after the tensor");
      assertEquals((byte) 0x5a, outV.get(64 + outBytes + i), "byte after the tensor");
    }
  }

  @Test
  void readOnlyDirectInputsAreAccepted() {
    ByteBuffer k = ReferenceCycle.direct(ReferenceCycle.generate(1, TOKENS * rowFloats));
    ByteBuffer v = ReferenceCycle.direct(ReferenceCycle.generate(2, TOKENS * rowFloats));
    ctx.prefillLayer(1, 0, TOKENS, k.asReadOnlyBuffer().order(ByteOrder.nativeOrder()),
        v.asReadOnlyBuffer().order(ByteOrder.nativeOrder()));
    assertEquals(TOKENS, ctx.sequenceLength(1, 0));
  }

  @Test
  void heapBuffersAreRejected() {
    ByteBuffer heap = ByteBuffer.allocate(TOKENS * rowFloats * 4).order(ByteOrder.nativeOrder());
    ByteBuffer direct = nativeBuffer(TOKENS * rowFloats * 4);
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> ctx.prefillLayer(1, 0, TOKENS, heap, direct));
    assertTrue(e.getMessage().contains("keys") && e.getMessage().contains("direct"),
        e.getMessage());
  }

  @Test
  void tooSmallBuffersAreRejected() {
    ByteBuffer small = nativeBuffer(TOKENS * rowFloats * 4 - 1);
    ByteBuffer enough = nativeBuffer(TOKENS * rowFloats * 4);
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> ctx.prefillLayer(1, 0, TOKENS, enough, small));
    assertTrue(e.getMessage().startsWith("pq_prefill_layer: values has"), e.getMessage());
    // What counts is what remains after the position.
    enough.position(4);
    assertThrows(IllegalArgumentException.class,
        () -> ctx.prefillLayer(1, 0, TOKENS, enough, nativeBuffer(TOKENS * rowFloats * 4)));
    float[] shortArray = new float[TOKENS * rowFloats - 1];
    assertThrows(IllegalArgumentException.class,
        () -> ctx.prefillLayer(1, 0, TOKENS, shortArray, new float[TOKENS * rowFloats]));
    assertEquals(0, ctx.sequenceLength(1, 0), "nothing reached the library");
  }

  @Test
  void foreignByteOrderIsRejected() {
    ByteOrder foreign = ByteOrder.nativeOrder() == ByteOrder.LITTLE_ENDIAN
        ? ByteOrder.BIG_ENDIAN : ByteOrder.LITTLE_ENDIAN;
    ByteBuffer k = ByteBuffer.allocateDirect(TOKENS * rowFloats * 4).order(foreign);
    ByteBuffer v = nativeBuffer(TOKENS * rowFloats * 4);
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> ctx.prefillLayer(1, 0, TOKENS, k, v));
    assertTrue(e.getMessage().contains("nativeOrder"), e.getMessage());
  }

  @Test
  void readOnlyOutputsAreRejected() {
    ctx.prefillLayer(1, 0, TOKENS, ReferenceCycle.generate(1, TOKENS * rowFloats),
        ReferenceCycle.generate(2, TOKENS * rowFloats));
    Selection selection =
        ctx.decodeSelect(1, 0, ReferenceCycle.generate(5, ctx.queryHeads() * ctx.headDim()));
    int bytes = ctx.kvHeads() * selection.capacity() * ctx.headDim() * 4;
    ByteBuffer readOnly = nativeBuffer(bytes).asReadOnlyBuffer().order(ByteOrder.nativeOrder());
    assertThrows(IllegalArgumentException.class,
        () -> ctx.fetchKV(1, 0, selection, readOnly, nativeBuffer(bytes)));
  }

  @Test
  void floatArraysNeedAnF32Context() {
    Config f16 = Config.builder().layers(1).queryHeads(4).kvHeads(2).headDim(16)
        .dtype(DType.F16).build();
    try (PqContext half = new PqContext(f16)) {
      half.addSequence(1);
      IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
          () -> half.prefillLayer(1, 0, 1, new float[32], new float[32]));
      assertEquals("pq_prefill_layer: keys is a float[]; expected a direct ByteBuffer of f16"
          + " elements: the context stores f16, and float[] passes f32", e.getMessage());
      // The same data as F16 bytes goes through a direct buffer: 1.0 is 0x3c00.
      ByteBuffer ones = nativeBuffer(32 * 2);
      for (int i = 0; i < 32; i++) {
        ones.putShort(i * 2, (short) 0x3c00);
      }
      half.prefillLayer(1, 0, 1, ones, ones);
      assertEquals(1, half.sequenceLength(1, 0));
    }
  }

  @Test
  void floatArrayFetchKeepsRowsPastTheCount() {
    ctx.prefillLayer(1, 0, TOKENS, ReferenceCycle.generate(1, TOKENS * rowFloats),
        ReferenceCycle.generate(2, TOKENS * rowFloats));
    Selection selection =
        ctx.decodeSelect(1, 0, ReferenceCycle.generate(5, ctx.queryHeads() * ctx.headDim()));
    int n = ctx.kvHeads() * selection.capacity() * ctx.headDim();
    float[] outK = new float[n + 3];
    float[] outV = new float[n + 3];
    java.util.Arrays.fill(outK, 42f);
    java.util.Arrays.fill(outV, 42f);
    ctx.fetchKV(1, 0, selection, outK, outV);
    assertArrayEquals(new float[] {42f, 42f, 42f}, java.util.Arrays.copyOfRange(outK, n, n + 3));
    int filled = 0;
    for (int i = 0; i < n; i++) {
      if (outK[i] != 42f) {
        filled++;
      }
    }
    assertEquals(selection.count(0) * ctx.headDim() + selection.count(1) * ctx.headDim(), filled);
  }

  /**
   * Every check made in Java before the library is called names the C function and the
   * argument (as the C function calls it), its value and what was expected, as the library's
   * own messages do (docs/bindings/errors.md); nothing reaches the library.
   */
  @Test
  void preconditionMessagesSpeakTheSharedVocabulary() {
    int bytes = TOKENS * rowFloats * 4;
    ByteBuffer enough = nativeBuffer(bytes);
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> ctx.prefillLayer(1, 0, TOKENS, enough, nativeBuffer(bytes - 1)));
    assertEquals("pq_prefill_layer: values has 8191 bytes from its position; expected at least"
        + " 8192 (tokens 64 x heads 2 x head_dim 16 x 4 bytes of f32)", e.getMessage());
    e = assertThrows(IllegalArgumentException.class, () -> ctx.decodeAppend(1, 0, TOKENS,
        ByteBuffer.allocate(bytes).order(ByteOrder.nativeOrder()), enough));
    assertEquals("pq_decode_append: keys is a heap ByteBuffer; expected a direct one"
        + " (ByteBuffer.allocateDirect): a heap buffer has no fixed native address;"
        + " the float[] overloads pass arrays by copy", e.getMessage());
    ByteOrder foreign = ByteOrder.nativeOrder() == ByteOrder.LITTLE_ENDIAN
        ? ByteOrder.BIG_ENDIAN : ByteOrder.LITTLE_ENDIAN;
    e = assertThrows(IllegalArgumentException.class, () -> ctx.prefillQueries(1, 0, 1,
        ByteBuffer.allocateDirect(ctx.queryHeads() * ctx.headDim() * 4).order(foreign)));
    assertEquals("pq_prefill_queries: queries is " + foreign + "; expected the native order "
        + ByteOrder.nativeOrder() + ", in which the library reads elements"
        + " (buffer.order(ByteOrder.nativeOrder()))", e.getMessage());
    e = assertThrows(IllegalArgumentException.class,
        () -> ctx.decodeSpeculate(1, 0, new float[63]));
    assertEquals("pq_decode_speculate: query_estimate has 63 floats; expected at least 64"
        + " (tokens 1 x heads 4 x head_dim 16)", e.getMessage());
    NullPointerException missing = assertThrows(NullPointerException.class,
        () -> ctx.restoreSequence(2, (byte[]) null));
    assertEquals("pq_sequence_restore: data is null; expected a byte[] of the saved state",
        missing.getMessage());
    assertEquals(0, ctx.sequenceLength(1, 0), "nothing reached the library");

    ctx.prefillLayer(1, 0, TOKENS, ReferenceCycle.generate(1, TOKENS * rowFloats),
        ReferenceCycle.generate(2, TOKENS * rowFloats));
    float[] q = ReferenceCycle.generate(5, ctx.queryHeads() * ctx.headDim());
    Selection selection = ctx.decodeSelect(1, 0, q);
    int capacity = selection.capacity();
    int outBytes = ctx.kvHeads() * capacity * ctx.headDim() * 4;
    ByteBuffer readOnly = nativeBuffer(outBytes).asReadOnlyBuffer().order(ByteOrder.nativeOrder());
    e = assertThrows(IllegalArgumentException.class,
        () -> ctx.fetchKV(1, 0, selection, nativeBuffer(outBytes), readOnly));
    assertEquals("pq_fetch_kv: out_values is read-only; expected a writable buffer, which"
        + " receives the fetched rows", e.getMessage());
    e = assertThrows(IllegalArgumentException.class,
        () -> ctx.fetchKV(1, 0, selection, new float[7], new float[7]));
    assertEquals("pq_fetch_kv: out_keys has 7 floats; expected at least " + outBytes / 4
        + " (tokens " + capacity + " x heads 2 x head_dim 16)", e.getMessage());
    missing = assertThrows(NullPointerException.class,
        () -> ctx.decodeAttend(1, 0, q, null));
    assertEquals("pq_decode_attend: selection is null; expected a Selection",
        missing.getMessage());
    e = assertThrows(IllegalArgumentException.class,
        () -> ctx.observeAttention(1, 0, selection, new float[3]));
    assertEquals("pq_observe_attention: probs has 3 floats; expected at least " + 2 * capacity
        + " (2 kv heads x selection capacity " + capacity + ")", e.getMessage());

    // A selection of another head count, from a context of another geometry.
    Config wider = Config.builder().layers(1).queryHeads(4).kvHeads(4).headDim(16)
        .dtype(DType.F32).build();
    Selection other;
    try (PqContext four = new PqContext(wider)) {
      four.addSequence(1);
      int rows = TOKENS * 4 * 16;
      four.prefillLayer(1, 0, TOKENS, ReferenceCycle.generate(1, rows),
          ReferenceCycle.generate(2, rows));
      other = four.decodeSelect(1, 0, q);
    }
    e = assertThrows(IllegalArgumentException.class,
        () -> ctx.decodeAttend(1, 0, q, other));
    assertEquals("pq_decode_attend: selection has 4 kv heads; expected 2 (num_kv_heads)",
        e.getMessage());
    e = assertThrows(IllegalArgumentException.class, () -> ctx.fetchKVBatch(0,
        new long[] {1}, new Selection[] {other}, new ByteBuffer[] {nativeBuffer(outBytes)},
        new ByteBuffer[] {nativeBuffer(outBytes)}));
    assertEquals("pq_fetch_kv_batch: items[0].selection has 4 kv heads; expected 2"
        + " (num_kv_heads)", e.getMessage());
  }
}
