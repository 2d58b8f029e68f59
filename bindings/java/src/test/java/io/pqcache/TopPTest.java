package io.pqcache;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.Test;

/**
 * topP (0.15): budgets per kv head and step. A tiny share keeps the floor (one middle token with a
 * floor of 0) and 1 keeps all k; a selector without q.k estimates is a named error.
 */
class TopPTest {
  private static final int TOKENS = 300;

  /** Each kv head's count (sinks, middle, window) of one select. */
  private static int[] counts(float topP, float floor) {
    int n = TOKENS * ReferenceCycle.KV_HEADS * ReferenceCycle.HEAD_DIM;
    float[] keys = ReferenceCycle.generate(81, n);
    float[] values = ReferenceCycle.generate(82, n);
    float[] q = ReferenceCycle.generate(83, ReferenceCycle.Q_HEADS * ReferenceCycle.HEAD_DIM);
    Config config = ReferenceCycle.smallPq(Selector.PQ).topP(topP).topPFloor(floor).build();
    try (PqContext ctx = new PqContext(config)) {
      ctx.addSequence(1);
      ctx.prefillLayer(1, 0, TOKENS, keys, values);
      Selection s = ctx.decodeSelect(1, 0, q);
      int[] out = new int[ReferenceCycle.KV_HEADS];
      for (int h = 0; h < out.length; h++) out[h] = s.positions(h).length;
      return out;
    }
  }

  @Test
  void aTinyShareKeepsTheFloorAndOneKeepsEveryK() {
    // 4 sinks and a 16-token window around the middle's picks (k = 16).
    for (int count : counts(1e-6f, 0f)) assertEquals(4 + 1 + 16, count);
    for (int count : counts(1f, 0.02f)) assertEquals(4 + 16 + 16, count);
  }

  @Test
  void topPNeedsEstimatesOfQk() {
    PqException e = assertThrows(PqException.class,
        () -> new PqContext(ReferenceCycle.smallPq(Selector.H2O).topP(0.5f).build()));
    assertEquals(Status.INVALID_ARGUMENT, e.status());
    assertTrue(e.libraryMessage().contains("top_p"), e.libraryMessage());
    e = assertThrows(PqException.class,
        () -> new PqContext(ReferenceCycle.smallPq(Selector.PQ).topPFloor(2f).build()));
    assertTrue(e.libraryMessage().contains("top_p_floor"), e.libraryMessage());
  }
}
