package io.pqcache;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/** One context shared by threads that each drive their own sequence. */
class ConcurrencyTest {
  private static final int ROUNDS = 20;

  @Test
  void twoSequencesOnTwoThreadsEachMatchTheReference() throws Exception {
    String expected = ReferenceCycle.expected();
    ExecutorService pool = Executors.newFixedThreadPool(2);
    try (PqContext ctx = new PqContext(ReferenceCycle.config())) {
      CyclicBarrier bothReady = new CyclicBarrier(2);
      List<Future<List<String>>> results = new ArrayList<>();
      for (int thread = 0; thread < 2; thread++) {
        long firstId = 1 + thread; // thread 0: odd ids, thread 1: even ids
        boolean viaArrays = thread == 1;
        results.add(pool.submit(() -> {
          List<String> outputs = new ArrayList<>();
          for (int round = 0; round < ROUNDS; round++) {
            long seqId = firstId + 2L * round;
            bothReady.await(30, TimeUnit.SECONDS); // start each round together
            outputs.add(ReferenceCycle.run(ctx, seqId, viaArrays));
            ctx.removeSequence(seqId);
          }
          return outputs;
        }));
      }
      for (Future<List<String>> result : results) {
        List<String> outputs = result.get(120, TimeUnit.SECONDS);
        assertEquals(ROUNDS, outputs.size());
        for (String output : outputs) {
          assertEquals(expected, output);
        }
      }
      Stats stats = ctx.stats();
      assertEquals(0, stats.sequences());
      assertEquals(2L * ROUNDS, stats.selectCalls());
      assertEquals(2L * ROUNDS, stats.fetchCalls());
    } finally {
      pool.shutdownNow();
    }
  }

  @Test
  void closeWaitsForCallsInProgressThenRefusesNewOnes() throws Exception {
    PqContext ctx = new PqContext(ReferenceCycle.config());
    ExecutorService pool = Executors.newSingleThreadExecutor();
    try {
      Future<String> running = pool.submit(() -> ReferenceCycle.run(ctx, 1, false));
      // Whichever wins, nothing crashes: the cycle either completes before
      // close or stops with PqClosedException (an IllegalStateException) at
      // its next call.
      ctx.close();
      try {
        String output = running.get(60, TimeUnit.SECONDS);
        assertTrue(output.startsWith("capacity "), output);
      } catch (java.util.concurrent.ExecutionException e) {
        assertEquals(PqClosedException.class, e.getCause().getClass(), e.toString());
      }
      assertThrows(IllegalStateException.class, () -> ctx.addSequence(2));
    } finally {
      pool.shutdownNow();
    }
  }
}
