package io.pqcache;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pqcache.swig.pq_status;
import io.pqcache.swig.pqcache;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * One layer for a batch of sequences: the batched calls give what the
 * per-sequence calls give, items fail on their own and are named, and errors
 * name the call the caller made.
 */
class BatchTest {
  // Capacities 36, 9 and 30 (4 sinks + 16 top-k + 16 local, clipped to the length).
  private static final long[] IDS = {11, 7, 1000};
  private static final int[] LENGTHS = {300, 9, 30};

  private PqContext ctx;
  private float[][] queries;

  @BeforeEach
  void prefillThreeSequences() {
    ctx = new PqContext(ReferenceCycle.config());
    int row = ctx.kvHeads() * ctx.headDim();
    queries = new float[IDS.length][];
    for (int i = 0; i < IDS.length; i++) {
      ctx.addSequence(IDS[i]);
      ctx.prefillLayer(IDS[i], 0, LENGTHS[i], ReferenceCycle.generate(20 * i + 1, LENGTHS[i] * row),
          ReferenceCycle.generate(20 * i + 2, LENGTHS[i] * row));
      queries[i] = ReferenceCycle.generate(20 * i + 3, ctx.queryHeads() * ctx.headDim());
    }
    ctx.waitBuilds();
  }

  @AfterEach
  void closeContext() {
    ctx.close();
  }

  private Selection[] selectOneByOne(long[] ids) {
    Selection[] out = new Selection[ids.length];
    for (int i = 0; i < ids.length; i++) {
      out[i] = ctx.decodeSelect(ids[i], 0, queries[i]);
    }
    return out;
  }

  private static void assertSameRows(Selection want, Selection got, String what) {
    assertNotNull(got, what);
    assertEquals(want.kvHeads(), got.kvHeads(), what);
    for (int h = 0; h < want.kvHeads(); h++) {
      assertArrayEquals(want.positions(h), got.positions(h), what + " head " + h);
    }
  }

  private ByteBuffer[] outputs(Selection[] selections) {
    ByteBuffer[] out = new ByteBuffer[selections.length];
    for (int i = 0; i < selections.length; i++) {
      int bytes = ctx.kvHeads() * selections[i].capacity() * ctx.headDim() * Float.BYTES;
      out[i] = ByteBuffer.allocateDirect(bytes).order(ByteOrder.nativeOrder());
      for (int b = 0; b < bytes; b++) {
        out[i].put(b, (byte) 0x5a);
      }
    }
    return out;
  }

  @Test
  void batchedSelectEqualsPerSequenceSelects() {
    // Nothing selected yet: the batch starts from too small a capacity, so
    // every item is grown and selected once more on its own.
    Selection[] fresh = ctx.decodeSelectBatch(0, IDS, queries);
    Selection[] want = selectOneByOne(IDS);
    assertEquals(36, ctx.selectionCapacity(IDS[0], 0));
    assertEquals(9, ctx.selectionCapacity(IDS[1], 0));
    assertEquals(30, ctx.selectionCapacity(IDS[2], 0));
    Selection[] sized = ctx.decodeSelectBatch(0, IDS, queries);
    for (int i = 0; i < IDS.length; i++) {
      assertTrue(want[i].maxCount() > 0);
      assertSameRows(want[i], fresh[i], "fresh item " + i);
      assertSameRows(want[i], sized[i], "item " + i);
      assertTrue(sized[i].capacity() >= ctx.selectionCapacity(IDS[i], 0));
    }
    assertEquals(0, ctx.decodeSelectBatch(0, new long[0], new float[0][]).length);
  }

  /** Per-sequence fetches of selections: keys then values, one buffer per sequence. */
  private ByteBuffer[][] fetchOneByOne(Selection[] selections) {
    ByteBuffer[][] want = {outputs(selections), outputs(selections)};
    for (int i = 0; i < IDS.length; i++) {
      ctx.fetchKV(IDS[i], 0, selections[i], want[0][i], want[1][i]);
    }
    return want;
  }

  @Test
  void batchedFetchEqualsPerSequenceFetches() {
    Selection[] selections = selectOneByOne(IDS);
    ByteBuffer[][] want = fetchOneByOne(selections);
    ByteBuffer[] gotK = outputs(selections);
    ByteBuffer[] gotV = outputs(selections);
    long before = ctx.stats().fetchCalls();
    ctx.fetchKVBatch(0, IDS, selections, gotK, gotV);
    assertEquals(before + IDS.length, ctx.stats().fetchCalls());
    for (int i = 0; i < IDS.length; i++) {
      assertEquals(want[0][i], gotK[i], "keys of item " + i); // byte for byte
      assertEquals(want[1][i], gotV[i], "values of item " + i);
    }
  }

  @Test
  void aFailingSelectItemIsNamedAndTheOthersAreFilled() {
    long[] ids = {IDS[0], 999, IDS[2]};
    // First with nothing selected yet (items[0], too small, is what the
    // library names: the message for items[1] is built from its status),
    // then with selections large enough (the library names items[1]).
    for (String detail : new String[] {"PQ_ERR_NOT_FOUND", "is not a sequence"}) {
      PqBatchException e =
          assertThrows(PqBatchException.class, () -> ctx.decodeSelectBatch(0, ids, queries));
      assertEquals(Status.NOT_FOUND, e.status());
      assertTrue(e.libraryMessage().startsWith("pq_decode_select_batch: items[1] (seq_id 999): "),
          e.libraryMessage());
      assertTrue(e.libraryMessage().contains(detail), e.libraryMessage());
      assertEquals(3, e.items());
      assertEquals(Status.OK, e.itemStatus(0));
      assertEquals(Status.NOT_FOUND, e.itemStatus(1));
      assertEquals(Status.OK, e.itemStatus(2));
      Selection[] partial = e.selections();
      assertNull(partial[1]);
      Selection[] want = selectOneByOne(IDS);
      assertSameRows(want[0], partial[0], "item 0");
      assertSameRows(want[2], partial[2], "item 2");
    }
  }

  @Test
  void aFailingFetchItemIsNamedAndTheOthersAreWritten() {
    Selection[] selections = selectOneByOne(IDS);
    ByteBuffer[][] want = fetchOneByOne(selections);
    ByteBuffer[] gotK = outputs(selections);
    ByteBuffer[] gotV = outputs(selections);
    PqBatchException e = assertThrows(PqBatchException.class,
        () -> ctx.fetchKVBatch(0, new long[] {IDS[0], 999, IDS[2]}, selections, gotK, gotV));
    assertEquals(Status.NOT_FOUND, e.status());
    assertTrue(e.libraryMessage().startsWith("pq_fetch_kv_batch: items[1] (seq_id 999): "),
        e.libraryMessage());
    assertEquals(Status.NOT_FOUND, e.itemStatus(1));
    assertNull(e.selections());
    for (int i : new int[] {0, 2}) {
      assertEquals(Status.OK, e.itemStatus(i));
      assertEquals(want[0][i], gotK[i], "keys of item " + i);
      assertEquals(want[1][i], gotV[i], "values of item " + i);
    }
    assertEquals(outputs(selections)[1], gotK[1], "nothing written for the failed item");
  }

  @Test
  void callLevelErrorsThrowPqExceptionAndRunNoItem() {
    PqException repeated = assertThrows(PqException.class,
        () -> ctx.decodeSelectBatch(0, new long[] {IDS[0], IDS[0]},
            new float[][] {queries[0], queries[1]}));
    assertFalse(repeated instanceof PqBatchException);
    assertEquals(Status.INVALID_ARGUMENT, repeated.status());
    assertTrue(repeated.libraryMessage().contains("seq_id"), repeated.libraryMessage());
    PqException layer =
        assertThrows(PqException.class, () -> ctx.decodeSelectBatch(3, IDS, queries));
    assertFalse(layer instanceof PqBatchException);
    assertTrue(layer.libraryMessage().contains("layer"), layer.libraryMessage());
    // Shapes are checked in Java, before the library runs.
    IllegalArgumentException lengths = assertThrows(IllegalArgumentException.class,
        () -> ctx.decodeSelectBatch(0, IDS, new float[][] {queries[0]}));
    assertEquals("pq_decode_select_batch: queries has 1 entries; expected 3, one per seqIds entry",
        lengths.getMessage());
    Selection[] selections = selectOneByOne(IDS);
    ByteBuffer[] out = outputs(selections);
    out[2] = ByteBuffer.allocateDirect(4).order(ByteOrder.nativeOrder());
    IllegalArgumentException small = assertThrows(IllegalArgumentException.class,
        () -> ctx.fetchKVBatch(0, IDS, selections, out, outputs(selections)));
    assertTrue(small.getMessage().startsWith(
        "pq_fetch_kv_batch: items[2].out_keys has 4 bytes from its position; expected at least "),
        small.getMessage());
  }

  @Test
  void selectErrorsNamePqDecodeSelect() {
    PqException e = assertThrows(PqException.class,
        () -> ctx.decodeSelect(12345, 0, queries[0]));
    assertEquals(Status.NOT_FOUND, e.status());
    assertTrue(e.libraryMessage().startsWith("pq_decode_select"), e.libraryMessage());
    assertFalse(e.libraryMessage().contains("pq_selection_capacity"), e.libraryMessage());
  }

  @Test
  void bufferTooSmallMapsToItsStatus() {
    assertEquals(pq_status.PQ_ERR_BUFFER_TOO_SMALL, Status.BUFFER_TOO_SMALL.code());
    assertEquals(Status.BUFFER_TOO_SMALL, Status.fromCode(-8));
    assertTrue(pqcache.pq_status_string(-8).startsWith("PQ_ERR_BUFFER_TOO_SMALL"));
    PqException e = new PqException(pq_status.PQ_ERR_BUFFER_TOO_SMALL, "out->capacity is 3");
    assertEquals(Status.BUFFER_TOO_SMALL, e.status());
    assertTrue(e.getMessage().startsWith("BUFFER_TOO_SMALL (-8): "), e.getMessage());
  }

  @Test
  void capacityForMatchesTheSequencesAndNeverShrinks() {
    for (int i = 0; i < IDS.length; i++) {
      assertEquals(ctx.selectionCapacity(IDS[i], 0), ctx.selectionCapacityFor(0, LENGTHS[i]));
    }
    int previous = 0;
    for (int tokens = 0; tokens < 100; tokens++) {
      int capacity = ctx.selectionCapacityFor(0, tokens);
      assertTrue(capacity >= previous, "tokens " + tokens);
      previous = capacity;
    }
    assertEquals(36, previous);
    PqException e = assertThrows(PqException.class, () -> ctx.selectionCapacityFor(0, -1));
    assertEquals(Status.INVALID_ARGUMENT, e.status());
  }
}
