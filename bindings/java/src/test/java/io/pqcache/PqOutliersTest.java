package io.pqcache;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Arrays;
import org.junit.jupiter.api.Test;

/**
 * pqOutliers (0.13): the keys with the largest quantization residuals are scored by their exact
 * q.k, so the selection of the same tokens and query changes; it needs Selector.PQ and a share in
 * [0, 0.25].
 */
class PqOutliersTest {
  private static final int TOKENS = 300;

  private static Config config(float share, Selector selector) {
    return ReferenceCycle.smallPq(selector).pqOutliers(share).build();
  }

  @Test
  void outliersChangeTheSelection() {
    int n = TOKENS * ReferenceCycle.KV_HEADS * ReferenceCycle.HEAD_DIM;
    float[] keys = ReferenceCycle.generate(61, n);
    float[] values = ReferenceCycle.generate(62, n);
    float[] q = ReferenceCycle.generate(63, ReferenceCycle.Q_HEADS * ReferenceCycle.HEAD_DIM);
    int[][] rows = new int[2][];
    float[] shares = {0f, 0.05f};
    for (int i = 0; i < 2; i++) {
      try (PqContext ctx = new PqContext(config(shares[i], Selector.PQ))) {
        ctx.addSequence(1);
        ctx.prefillLayer(1, 0, TOKENS, keys, values);
        Selection s = ctx.decodeSelect(1, 0, q);
        int[] all = new int[0];
        for (int h = 0; h < ReferenceCycle.KV_HEADS; h++) {
          int[] head = s.positions(h);
          int[] joined = Arrays.copyOf(all, all.length + head.length + 1);
          System.arraycopy(head, 0, joined, all.length, head.length);
          joined[joined.length - 1] = -1;  // a head's end
          all = joined;
        }
        rows[i] = all;
      }
    }
    assertFalse(Arrays.equals(rows[0], rows[1]), "the outliers' exact scores changed nothing");
  }

  @Test
  void outliersNeedThePqSelectorAndAShareUpToAQuarter() {
    PqException e = assertThrows(PqException.class,
        () -> new PqContext(config(0.01f, Selector.EXACT)));
    assertEquals(Status.INVALID_ARGUMENT, e.status());
    assertTrue(e.libraryMessage().contains("pq_outliers"), e.libraryMessage());
    e = assertThrows(PqException.class, () -> new PqContext(config(0.5f, Selector.PQ)));
    assertEquals(Status.INVALID_ARGUMENT, e.status());
    assertTrue(e.libraryMessage().contains("pq_outliers"), e.libraryMessage());
  }
}
