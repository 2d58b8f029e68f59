package io.pqcache;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import org.junit.jupiter.api.Test;

/** fp8 K/V (0.10): scales reach the library, queries stay F32, fetches copy the stored codes. */
class Fp8Test {
  private static final int TOKENS = 300;
  private static final int KV = ReferenceCycle.KV_HEADS;
  private static final int DIM = ReferenceCycle.HEAD_DIM;

  private static Config.Builder fp8(float[] scales) {
    return Config.builder()
        .dtype(DType.FP8_E4M3)
        .layers(1)
        .queryHeads(ReferenceCycle.Q_HEADS)
        .kvHeads(KV)
        .headDim(DIM)
        .selector(Selector.EXACT)
        .workerThreads(1)
        .kvScales(1, scales);
  }

  private static ByteBuffer direct(int bytes) {
    return ByteBuffer.allocateDirect(bytes).order(ByteOrder.nativeOrder());
  }

  @Test
  void codesComeBackAsStored() {
    int n = TOKENS * KV * DIM;
    ByteBuffer keys = direct(n);
    ByteBuffer values = direct(n);
    for (int i = 0; i < n; i++) { // finite e4m3 codes (0x7F and 0xFF are NaN)
      keys.put(i, (byte) (i % 0x7F));
      values.put(i, (byte) (0x80 | ((i * 7) % 0x7F)));
    }
    try (PqContext ctx = new PqContext(fp8(new float[] {0.5f, 2f}).build())) {
      ctx.addSequence(1);
      ctx.prefillLayer(1, 0, TOKENS, keys, values);
      Selection selection =
          ctx.decodeSelect(1, 0, ReferenceCycle.generate(43, ReferenceCycle.Q_HEADS * DIM));
      int capacity = selection.capacity();
      ByteBuffer outK = direct(KV * capacity * DIM);
      ByteBuffer outV = direct(KV * capacity * DIM);
      ctx.fetchKV(1, 0, selection, outK, outV);
      for (int h = 0; h < KV; h++) {
        int[] positions = selection.positions(h);
        assertTrue(positions.length > 0);
        for (int i = 0; i < positions.length; i++) {
          for (int d = 0; d < DIM; d++) {
            int got = (h * capacity + i) * DIM + d;
            int want = (positions[i] * KV + h) * DIM + d;
            assertEquals(keys.get(want), outK.get(got), "K of token " + positions[i]);
            assertEquals(values.get(want), outV.get(got), "V of token " + positions[i]);
          }
        }
      }
      Attention a = ctx.decodeAttend(1, 0, new float[ReferenceCycle.Q_HEADS * DIM], selection);
      assertTrue(Float.isFinite(a.output()[0]));
    }
  }

  @Test
  void badScalesAreTheLibrarysErrors() {
    PqException e = assertThrows(PqException.class,
        () -> new PqContext(fp8(new float[] {0.5f, -1f}).build()));
    assertEquals(Status.INVALID_ARGUMENT, e.status());
    assertTrue(e.libraryMessage().contains("kv_scales[1]"), e.libraryMessage());
    e = assertThrows(PqException.class,
        () -> new PqContext(fp8(new float[] {1f, 1f}).dtype(DType.F16).build()));
    assertTrue(e.libraryMessage().contains("fp8 dtypes only"), e.libraryMessage());
  }
}
