package io.pqcache;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** The reference cycle in Java gives exactly the C program's output. */
class ReferenceCycleTest {
  private static String expected;

  @BeforeAll
  static void runReferenceProgram() throws Exception {
    expected = ReferenceCycle.expected();
    assertTrue(expected.startsWith("capacity "), "unexpected reference output:\n" + expected);
  }

  @Test
  void directBuffersMatchTheCProgram() {
    try (PqContext ctx = new PqContext(ReferenceCycle.config())) {
      assertEquals(expected, ReferenceCycle.run(ctx, 1, false));
    }
  }

  @Test
  void floatArraysMatchTheCProgram() {
    try (PqContext ctx = new PqContext(ReferenceCycle.config())) {
      assertEquals(expected, ReferenceCycle.run(ctx, 1, true));
    }
  }

  @Test
  void statsAndLayerInfoCountTheCycle() {
    try (PqContext ctx = new PqContext(ReferenceCycle.config())) {
      ReferenceCycle.run(ctx, 1, false);
      ctx.waitBuilds();
      LayerInfo info = ctx.layerInfo(1, 0);
      assertEquals(ReferenceCycle.TOKENS + 1, info.tokens());
      assertEquals(ReferenceCycle.TOKENS, info.prefillTokens());
      assertTrue(info.indexReady());
      assertTrue(info.kmeansIterations() >= 1 && info.kmeansIterations() <= 8,
          "kmeansIterations(8) caps the build: " + info);
      assertEquals(ReferenceCycle.TOKENS + 1, ctx.sequenceLength(1, 0));
      assertEquals(1, ctx.sequenceCount());

      Stats stats = ctx.stats();
      assertEquals(1, stats.sequences());
      assertEquals(1, stats.selectCalls());
      assertEquals(1, stats.fetchCalls());
      assertEquals(1, stats.buildsFinished());
      long expectedKvBytes = 2L * (ReferenceCycle.TOKENS + 1) * ReferenceCycle.KV_HEADS
          * ReferenceCycle.HEAD_DIM * Float.BYTES;
      assertTrue(stats.kvBytes() >= expectedKvBytes, "K/V of 257 tokens: " + stats);
      assertEquals(stats.selectCalls(), ctx.sequenceStats(1).selectCalls());
    }
  }
}
