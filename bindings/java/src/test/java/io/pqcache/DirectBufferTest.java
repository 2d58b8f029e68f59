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
    assertTrue(e.getMessage().contains("values") && e.getMessage().contains("needs"),
        e.getMessage());
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
      assertTrue(e.getMessage().contains("F16"), e.getMessage());
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
}
