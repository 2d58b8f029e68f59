package io.pqcache;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Random;
import java.util.TreeSet;
import org.junit.jupiter.api.Test;

/**
 * The index-only tier ({@link KvTier#CALLER}), paged keys and the multi-token select, as
 * tests/test_api_index_only.cpp checks them in C: an index-only context selects what a host-tier
 * context with the same keys selects.
 */
class IndexOnlyTest {
  private static final int Q = 4;
  private static final int KV = 2;
  private static final int DIM = 32;
  private static final int PROMPT = 1500;
  private static final long SEQ = 3;

  private static Config.Builder config(KvTier tier) {
    return Config.builder()
        .dtype(DType.F32)
        .layers(1)
        .queryHeads(Q)
        .kvHeads(KV)
        .headDim(DIM)
        .topkTokens(40)
        .localTokens(64)
        .kmeansIterations(8)
        .workerThreads(2)
        .kvTier(tier);
  }

  private static PqContext context(KvTier tier) {
    PqContext ctx = new PqContext(config(tier).build());
    ctx.addSequence(SEQ);
    return ctx;
  }

  private static float[] normal(int n, long seed, double scale) {
    Random random = new Random(seed);
    float[] out = new float[n];
    for (int i = 0; i < n; i++) {
      out[i] = (float) (random.nextGaussian() * scale);
    }
    return out;
  }

  /** [token][kv head][dim] keys with structure (a few directions per head plus noise). */
  private static float[] keys(int tokens, long seed) {
    float[] keys = normal(tokens * KV * DIM, seed, 0.3);
    float[] dirs = normal(8 * DIM, seed + 1, 1);
    for (int t = 0; t < tokens; t++) {
      for (int h = 0; h < KV; h++) {
        for (int d = 0; d < DIM; d++) {
          keys[(t * KV + h) * DIM + d] += dirs[((t * 7 + h) % 8) * DIM + d];
        }
      }
    }
    return keys;
  }

  private static float[] rows(float[] keys, int first, int count) {
    return Arrays.copyOfRange(keys, first * KV * DIM, (first + count) * KV * DIM);
  }

  /** Every kv head's selection for one query token. */
  private static List<List<Integer>> select(PqContext ctx, float[] query) {
    Selection selection = ctx.decodeSelect(SEQ, 0, query);
    List<List<Integer>> heads = new ArrayList<>();
    for (int h = 0; h < selection.kvHeads(); h++) {
      heads.add(list(selection.positions(h)));
    }
    return heads;
  }

  private static List<Integer> list(int[] positions) {
    return Arrays.stream(positions).boxed().toList();
  }

  /** The engine's pool: positions scattered over shuffled blocks, spare blocks filled with 99. */
  private static final class Pool {
    static final int BLOCK = 16;
    final int[] table;
    final long[] slots;
    final int tokens; // the pool's slots
    final ByteBuffer data;

    Pool(float[] keys, int positions, long seed) {
      int blocks = (positions + BLOCK - 1) / BLOCK;
      int poolBlocks = 2 * blocks + 3;
      List<Integer> order = new ArrayList<>();
      for (int b = 0; b < poolBlocks; b++) {
        order.add(b);
      }
      Collections.shuffle(order, new Random(seed));
      table = order.subList(0, blocks).stream().mapToInt(Integer::intValue).toArray();
      tokens = poolBlocks * BLOCK;
      float[] pool = new float[tokens * KV * DIM];
      Arrays.fill(pool, 99f);
      slots = new long[positions];
      for (int p = 0; p < positions; p++) {
        int slot = table[p / BLOCK] * BLOCK + p % BLOCK;
        slots[p] = slot;
        System.arraycopy(keys, p * KV * DIM, pool, slot * KV * DIM, KV * DIM);
      }
      data = ReferenceCycle.direct(pool);
    }

    PagedKeys byBlocks() {
      return PagedKeys.byBlocks(data, tokens, table, BLOCK);
    }

    PagedKeys bySlots() {
      return PagedKeys.bySlots(data, tokens, slots);
    }
  }

  @Test
  void denseAndPagedKeysSelectWhatTheHostTierSelects() {
    final int decode = 24;
    float[] keys = keys(PROMPT + decode, 11);
    Pool pool = new Pool(keys, PROMPT + decode, 5);
    try (PqContext host = context(KvTier.HOST);
        PqContext dense = context(KvTier.CALLER);
        PqContext blocks = context(KvTier.CALLER);
        PqContext slots = context(KvTier.CALLER)) {
      assertEquals(KvTier.CALLER, dense.kvTier());
      float[] prompt = rows(keys, 0, PROMPT);
      host.prefillLayer(SEQ, 0, PROMPT, prompt, prompt);
      dense.prefillLayer(SEQ, 0, PROMPT, prompt, null); // no values: index only
      blocks.prefillLayerPaged(SEQ, 0, PROMPT, pool.byBlocks());
      slots.prefillLayerPaged(SEQ, 0, PROMPT, pool.bySlots());
      int selected = 0;
      for (int step = 0; step < decode; step++) {
        float[] query = normal(Q * DIM, 100 + step, 1);
        List<List<Integer>> want = select(host, query);
        assertEquals(want, select(dense, query), "dense keys, step " + step);
        assertEquals(want, select(blocks, query), "block table, step " + step);
        assertEquals(want, select(slots, query), "slot map, step " + step);
        selected += want.stream().mapToInt(List::size).sum();
        float[] one = rows(keys, PROMPT + step, 1);
        host.decodeAppend(SEQ, 0, 1, one, one);
        dense.decodeAppend(SEQ, 0, 1, one, null);
        blocks.decodeAppendPaged(SEQ, 0, 1, pool.byBlocks());
        slots.decodeAppendPaged(SEQ, 0, 1, pool.bySlots());
      }
      assertTrue(selected > 0);
      assertEquals(PROMPT + decode, blocks.sequenceLength(SEQ, 0));
    }
  }

  @Test
  void whatNeedsKvIsRefused() {
    float[] keys = keys(600, 16);
    Pool pool = new Pool(keys, 600, 3);
    try (PqContext ctx = context(KvTier.CALLER);
        PqContext host = context(KvTier.HOST);
        PqContext fresh = context(KvTier.CALLER)) {
      ctx.prefillLayer(SEQ, 0, 600, keys, null);
      float[] query = normal(Q * DIM, 1, 1);
      Selection selection = ctx.decodeSelect(SEQ, 0, query);
      float[] out = new float[KV * selection.capacity() * DIM];
      PqException fetch =
          assertThrows(PqException.class, () -> ctx.fetchKV(SEQ, 0, selection, out, out));
      assertEquals(Status.UNSUPPORTED, fetch.status());
      assertTrue(fetch.libraryMessage().contains("index-only"), fetch.libraryMessage());
      PqException attend =
          assertThrows(PqException.class, () -> ctx.decodeAttend(SEQ, 0, query, selection));
      assertEquals(Status.UNSUPPORTED, attend.status());

      // Paged keys need an index-only context: one that stores K/V needs the values.
      PqException paged = assertThrows(PqException.class,
          () -> host.prefillLayerPaged(SEQ, 0, 100, pool.byBlocks()));
      assertEquals(Status.UNSUPPORTED, paged.status());
      assertTrue(paged.libraryMessage().contains("values"), paged.libraryMessage());
      // Values left out of a context that stores them are refused by the library.
      PqException noValues = assertThrows(PqException.class,
          () -> host.prefillLayer(SEQ, 0, 600, keys, null));
      assertEquals(Status.INVALID_ARGUMENT, noValues.status());
      assertTrue(noValues.libraryMessage().contains("values"), noValues.libraryMessage());

      long[] bad = pool.slots.clone();
      bad[7] = -1;
      PqException slot = assertThrows(PqException.class,
          () -> fresh.prefillLayerPaged(SEQ, 0, 100, PagedKeys.bySlots(pool.data, pool.tokens, bad)));
      assertEquals(Status.INVALID_ARGUMENT, slot.status());
      assertTrue(slot.libraryMessage().contains("slots[7]"), slot.libraryMessage());
      PqException unmapped = assertThrows(PqException.class,
          () -> fresh.prefillLayerPaged(SEQ, 0, 601, pool.bySlots()));
      assertTrue(unmapped.libraryMessage().contains("not mapped"), unmapped.libraryMessage());
      assertEquals(0, fresh.sequenceLength(SEQ, 0), "a refused call stores nothing");
      // A pool shorter than its shape is caught in Java, before the library reads it.
      IllegalArgumentException shortPool = assertThrows(IllegalArgumentException.class,
          () -> fresh.prefillLayerPaged(SEQ, 0, 100, PagedKeys.dense(pool.data, pool.tokens + 1)));
      assertTrue(shortPool.getMessage().contains("keys.pool"), shortPool.getMessage());
    }
  }

  @Test
  void multiTokenSelectRows() {
    final int n = 1800;
    final int tokens = 3;
    float[] keys = keys(n, 18);
    for (KvTier tier : new KvTier[] {KvTier.HOST, KvTier.CALLER}) {
      try (PqContext ctx = context(tier)) {
        ctx.prefillLayer(SEQ, 0, n, keys, tier == KvTier.HOST ? keys : null);
        float[] queries = normal(tokens * Q * DIM, 21, 1);
        List<List<List<Integer>>> single = new ArrayList<>(); // [token][kv head]
        for (int t = 0; t < tokens; t++) {
          single.add(select(ctx, Arrays.copyOfRange(queries, t * Q * DIM, (t + 1) * Q * DIM)));
        }
        for (SelectRows form : SelectRows.values()) {
          List<List<Integer>> want = new ArrayList<>();
          TreeSet<Integer> all = new TreeSet<>();
          for (int h = 0; h < KV; h++) {
            TreeSet<Integer> head = new TreeSet<>();
            for (List<List<Integer>> token : single) {
              head.addAll(token.get(h));
            }
            all.addAll(head);
            if (form == SelectRows.PER_HEAD) {
              want.add(new ArrayList<>(head));
            }
          }
          if (form == SelectRows.PER_TOKEN) {
            single.forEach(want::addAll);
          } else if (form == SelectRows.PER_REQUEST) {
            want.add(new ArrayList<>(all));
          }
          SelectionShape shape = ctx.selectionCapacityMulti(SEQ, 0, tokens, form);
          Selection got = ctx.decodeSelectMulti(SEQ, 0, tokens, queries, form, null);
          String what = tier + " " + form;
          assertEquals(want.size(), shape.rows(), what);
          assertEquals(shape.rows(), got.rows(), what);
          assertEquals(shape.capacity(), got.capacity(), what);
          int[] padded = got.paddedPositions();
          for (int r = 0; r < got.rows(); r++) {
            assertEquals(want.get(r), list(got.row(r)), what + " row " + r);
            int[] tail = Arrays.copyOfRange(padded, r * got.capacity() + got.count(r),
                (r + 1) * got.capacity());
            int[] minusOnes = new int[tail.length];
            Arrays.fill(minusOnes, -1);
            assertArrayEquals(minusOnes, tail, what + ": row " + r + " is padded with -1");
          }
        }
      }
    }
  }

  @Test
  void kvHeadOffsetRoundTrips() {
    try (PqContext ctx = new PqContext(config(KvTier.HOST).kvHeadOffset(6).build())) {
      assertEquals(6, ctx.kvHeadOffset());
      assertEquals(KvTier.HOST, ctx.kvTier());
    }
    try (PqContext ctx = new PqContext(config(KvTier.HOST).build())) {
      assertEquals(0, ctx.kvHeadOffset());
    }
    PqException e = assertThrows(PqException.class,
        () -> new PqContext(config(KvTier.HOST).kvHeadOffset(65535).build()));
    assertEquals(Status.INVALID_ARGUMENT, e.status());
    assertTrue(e.libraryMessage().contains("kv_head_offset"), e.libraryMessage());
  }
}
