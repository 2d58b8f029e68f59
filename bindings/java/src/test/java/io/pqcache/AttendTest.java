package io.pqcache;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.ByteBuffer;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/** decodeAttend against an attention computed here over the rows fetchKV gathers. */
class AttendTest {
  private static final int TOKENS = 300;
  private PqContext ctx;
  private int qHeads;
  private int kvHeads;
  private int dim;

  @BeforeEach
  void createContext() {
    ctx = new PqContext(ReferenceCycle.config());
    qHeads = ctx.queryHeads();
    kvHeads = ctx.kvHeads();
    dim = ctx.headDim();
    ctx.addSequence(1);
  }

  @AfterEach
  void closeContext() {
    ctx.close();
  }

  private void prefill() {
    int n = TOKENS * kvHeads * dim;
    ctx.prefillLayer(1, 0, TOKENS, ReferenceCycle.generate(31, n),
        ReferenceCycle.generate(32, n));
  }

  /** Query values far from 0, so that the softmax weights are far from uniform. */
  private float[] query() {
    float[] q = ReferenceCycle.generate(33, qHeads * dim);
    for (int i = 0; i < q.length; i++) {
      q[i] *= 8;
    }
    return q;
  }

  private static void assertClose(double want, float got, String what) {
    if (Double.isInfinite(want)) {
      assertEquals(want, got, what);
      return;
    }
    assertEquals(want, got, 1e-5 + 1e-4 * Math.abs(want), what);
  }

  @Test
  void attendEqualsSoftmaxOverTheFetchedRows() {
    prefill();
    float[] q = query();
    Selection selection = ctx.decodeSelect(1, 0, q);
    int capacity = selection.capacity();
    float[] keys = new float[kvHeads * capacity * dim];
    float[] values = new float[keys.length];
    ctx.fetchKV(1, 0, selection, keys, values);

    int group = qHeads / kvHeads;
    // Scale 0 is 1 / sqrt(headDim); the direct-buffer overload gives the same.
    Attention[] runs = {
      ctx.decodeAttend(1, 0, q, selection),
      ctx.decodeAttend(1, 0, q, selection, 0.05f),
      ctx.decodeAttend(1, 0, ReferenceCycle.direct(q), selection, 0f),
    };
    double[] scales = {1 / Math.sqrt(dim), 0.05, 1 / Math.sqrt(dim)};
    for (int run = 0; run < runs.length; run++) {
      Attention attention = runs[run];
      assertEquals(qHeads, attention.queryHeads());
      assertEquals(dim, attention.headDim());
      assertEquals(qHeads * dim, attention.output().length);
      for (int qh = 0; qh < qHeads; qh++) {
        int h = qh / group; // GQA: the kv head of this query head
        int count = selection.count(h);
        assertTrue(count > 0);
        double[] logits = new double[count];
        double peak = Double.NEGATIVE_INFINITY;
        for (int i = 0; i < count; i++) {
          double dot = 0;
          for (int d = 0; d < dim; d++) {
            dot += (double) q[qh * dim + d] * keys[(h * capacity + i) * dim + d];
          }
          logits[i] = scales[run] * dot;
          peak = Math.max(peak, logits[i]);
        }
        double sum = 0;
        double[] want = new double[dim];
        for (int i = 0; i < count; i++) {
          double w = Math.exp(logits[i] - peak);
          sum += w;
          for (int d = 0; d < dim; d++) {
            want[d] += w * values[(h * capacity + i) * dim + d];
          }
        }
        float[] got = attention.output(qh);
        for (int d = 0; d < dim; d++) {
          assertClose(want[d] / sum, got[d], "run " + run + " q head " + qh + " dim " + d);
        }
        assertClose(peak + Math.log(sum), attention.lse(qh), "run " + run + " lse " + qh);
        assertEquals(attention.lse(qh), attention.lse()[qh]);
      }
    }
  }

  @Test
  void badArgumentsThrowWithTheLibrarysMessage() {
    float[] q = query();
    Selection empty = Selection.fromNative(kvHeads, 1,
        ReferenceCycle.direct(new float[kvHeads]), ReferenceCycle.direct(new float[kvHeads]));
    PqException early = assertThrows(PqException.class, () -> ctx.decodeAttend(1, 0, q, empty));
    assertEquals(Status.BAD_STATE, early.status());
    assertTrue(early.libraryMessage().startsWith("pq_decode_attend"), early.getMessage());

    prefill();
    Selection selection = ctx.decodeSelect(1, 0, q);
    PqException negative = assertThrows(PqException.class,
        () -> ctx.decodeAttend(1, 0, q, selection, -1f));
    assertEquals(Status.INVALID_ARGUMENT, negative.status());
    assertTrue(negative.libraryMessage().startsWith("pq_decode_attend"), negative.getMessage());
    assertTrue(negative.libraryMessage().contains("scale"), negative.getMessage());
    PqException nan = assertThrows(PqException.class,
        () -> ctx.decodeAttend(1, 0, q, selection, Float.NaN));
    assertEquals(Status.INVALID_ARGUMENT, nan.status());

    PqException missing = assertThrows(PqException.class,
        () -> ctx.decodeAttend(2, 0, q, selection));
    assertEquals(Status.NOT_FOUND, missing.status());
    assertTrue(missing.libraryMessage().startsWith("pq_decode_attend"), missing.getMessage());

    // A query with NaN is the library's check; a short one is refused in Java.
    float[] withNaN = q.clone();
    withNaN[5] = Float.NaN;
    PqException notFinite = assertThrows(PqException.class,
        () -> ctx.decodeAttend(1, 0, withNaN, selection));
    assertEquals(Status.INVALID_ARGUMENT, notFinite.status());
    assertTrue(notFinite.libraryMessage().contains("query"), notFinite.getMessage());
    ByteBuffer shortQuery = ReferenceCycle.direct(new float[kvHeads * dim]); // kv heads' worth
    IllegalArgumentException tooShort = assertThrows(IllegalArgumentException.class,
        () -> ctx.decodeAttend(1, 0, shortQuery, selection));
    assertTrue(tooShort.getMessage().contains("query"), tooShort.getMessage());
    assertThrows(NullPointerException.class, () -> ctx.decodeAttend(1, 0, q, null));
  }
}
