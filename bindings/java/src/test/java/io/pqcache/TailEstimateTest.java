package io.pqcache;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Arrays;
import org.junit.jupiter.api.Test;

/**
 * TailEstimate.CODE_MEANS (0.12): decodeAttend adds an estimate of the middle tokens the selection
 * leaves out, so every query head's log-sum-exp grows past the selected rows' own and the output
 * moves; it needs Selector.PQ.
 */
class TailEstimateTest {
  private static final int TOKENS = 300;

  private static Config config(TailEstimate tail, Selector selector) {
    return ReferenceCycle.smallPq(selector).tailEstimate(tail).build();
  }

  @Test
  void attendAddsTheLeftOutTokens() {
    int n = TOKENS * ReferenceCycle.KV_HEADS * ReferenceCycle.HEAD_DIM;
    float[] keys = ReferenceCycle.generate(51, n);
    float[] values = ReferenceCycle.generate(52, n);
    float[] q = ReferenceCycle.generate(53, ReferenceCycle.Q_HEADS * ReferenceCycle.HEAD_DIM);
    Attention[] runs = new Attention[2];
    Selection selection = null;
    TailEstimate[] tails = {TailEstimate.NONE, TailEstimate.CODE_MEANS};
    for (int i = 0; i < 2; i++) {
      try (PqContext ctx = new PqContext(config(tails[i], Selector.PQ))) {
        ctx.addSequence(1);
        ctx.prefillLayer(1, 0, TOKENS, keys, values);
        if (selection == null) {
          selection = ctx.decodeSelect(1, 0, q);
        }
        runs[i] = ctx.decodeAttend(1, 0, q, selection);
      }
    }
    for (int h = 0; h < ReferenceCycle.Q_HEADS; h++) {
      assertTrue(runs[1].lse()[h] > runs[0].lse()[h], "query head " + h + "'s log-sum-exp");
    }
    assertFalse(Arrays.equals(runs[0].output(), runs[1].output()), "the output moved");
  }

  /** decodeTail merged with the caller's own attention over the rows is decodeAttend's result. */
  @Test
  void theTailAloneMergesIntoTheAttend() {
    int n = TOKENS * ReferenceCycle.KV_HEADS * ReferenceCycle.HEAD_DIM;
    float[] keys = ReferenceCycle.generate(61, n);
    float[] values = ReferenceCycle.generate(62, n);
    float[] q = ReferenceCycle.generate(63, ReferenceCycle.Q_HEADS * ReferenceCycle.HEAD_DIM);
    try (PqContext on = new PqContext(config(TailEstimate.CODE_MEANS, Selector.PQ));
        PqContext off = new PqContext(config(TailEstimate.NONE, Selector.PQ))) {
      for (PqContext ctx : new PqContext[] {on, off}) {
        ctx.addSequence(1);
        ctx.prefillLayer(1, 0, TOKENS, keys, values);
      }
      Selection selection = on.decodeSelect(1, 0, q);
      Attention whole = on.decodeAttend(1, 0, q, selection);
      Attention rows = off.decodeAttend(1, 0, q, selection);
      Attention tail = on.decodeTail(1, 0, q, selection, 0f);
      int dim = ReferenceCycle.HEAD_DIM;
      for (int h = 0; h < ReferenceCycle.Q_HEADS; h++) {
        double m = Math.max(rows.lse()[h], tail.lse()[h]);
        double wa = Math.exp(rows.lse()[h] - m);
        double wt = Math.exp(tail.lse()[h] - m);
        assertEquals(whole.lse()[h], m + Math.log(wa + wt), 1e-4, "lse of query head " + h);
        for (int d = 0; d < dim; d++) {
          int i = h * dim + d;
          double merged = (wa * rows.output()[i] + wt * tail.output()[i]) / (wa + wt);
          assertEquals(whole.output()[i], merged, 1e-4, "out[" + i + "]");
        }
      }
      PqException e = assertThrows(PqException.class, () -> off.decodeTail(1, 0, q, selection, 0f));
      assertEquals(Status.BAD_STATE, e.status());
      assertTrue(e.getMessage().contains("pq_decode_tail"), e.getMessage());
    }
  }

  @Test
  void theEstimateNeedsThePqSelector() {
    PqException e = assertThrows(PqException.class,
        () -> new PqContext(config(TailEstimate.CODE_MEANS, Selector.EXACT)));
    assertEquals(Status.INVALID_ARGUMENT, e.status());
    assertTrue(e.libraryMessage().contains("tail_estimate"), e.libraryMessage());
  }
}
