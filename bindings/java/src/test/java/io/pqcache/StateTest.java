package io.pqcache;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pqcache.swig.pq_status;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Sequence state (0.5): truncate, fork, save and restore keep what a
 * sequence selects and fetches, and damaged states are refused.
 */
class StateTest {
  private static final int PROMPT = 600; // two full 256-token chunks and a partial one

  /** A sequence's selection for a query (its positions per kv head) and the rows it fetches. */
  private static final class Step {
    final int[][] positions;
    final float[] keys;
    final float[] values;

    Step(PqContext ctx, long seqId, float[] query) {
      Selection selection = ctx.decodeSelect(seqId, 0, query);
      positions = new int[selection.kvHeads()][];
      for (int h = 0; h < positions.length; h++) {
        positions[h] = selection.positions(h);
      }
      keys = new float[ctx.kvHeads() * selection.capacity() * ctx.headDim()];
      values = new float[keys.length];
      ctx.fetchKV(seqId, 0, selection, keys, values);
    }

    void assertSame(Step want, String what) {
      assertArrayEquals(want.positions, positions, what + ": selection");
      assertArrayEquals(want.keys, keys, what + ": keys");
      assertArrayEquals(want.values, values, what + ": values");
    }
  }

  private static PqException assertStatus(Status status, Runnable call) {
    PqException e = assertThrows(PqException.class, call::run);
    assertEquals(status, e.status(), e.getMessage());
    return e;
  }

  /** Adds seqId with a PROMPT-token prefill and 4 decode steps (the state tests' sequence). */
  private static void addPrefilled(PqContext ctx, long seqId) {
    int row = ctx.kvHeads() * ctx.headDim();
    ctx.addSequence(seqId);
    ctx.prefillLayer(seqId, 0, PROMPT, ReferenceCycle.generate(61, PROMPT * row),
        ReferenceCycle.generate(62, PROMPT * row));
    for (int step = 0; step < 4; step++) {
      ctx.decodeAppend(seqId, 0, 1, ReferenceCycle.generate(63 + 2 * step, row),
          ReferenceCycle.generate(64 + 2 * step, row));
    }
    assertEquals(PROMPT + 4, ctx.sequenceLength(seqId, 0));
  }

  @Test
  void truncateForkSaveAndRestoreKeepSelectionsAndRows(@TempDir Path dir) throws IOException {
    try (PqContext ctx = new PqContext(ReferenceCycle.config());
        PqContext other = new PqContext(ReferenceCycle.config())) {
      addPrefilled(ctx, 1);

      // Two rejected speculative tokens rolled back; more than the sequence
      // holds is refused.
      ctx.truncateSequence(1, PROMPT + 2);
      assertEquals(PROMPT + 2, ctx.sequenceLength(1, 0));
      assertStatus(Status.INVALID_ARGUMENT, () -> ctx.truncateSequence(1, PROMPT + 100));
      assertStatus(Status.NOT_FOUND, () -> ctx.truncateSequence(99, 1));

      float[] query = ReferenceCycle.generate(71, ctx.queryHeads() * ctx.headDim());
      Step want = new Step(ctx, 1, query);

      // A fork selects what its parent selects.
      ctx.forkSequence(1, 2);
      assertEquals(PROMPT + 2, ctx.sequenceLength(2, 0));
      assertArrayEquals(want.positions, new Step(ctx, 2, query).positions, "the fork's selection");
      assertStatus(Status.INVALID_ARGUMENT, () -> ctx.forkSequence(1, 2));

      // Save to bytes and to a file: the same bytes.
      byte[] state = ctx.saveSequence(1);
      assertEquals(state.length, ctx.sequenceStateSize(1));
      Path file = dir.resolve("state.bin");
      ctx.saveSequence(1, file);
      assertArrayEquals(state, Files.readAllBytes(file), "the file and saveSequence's bytes");
      assertStatus(Status.NOT_FOUND, () -> ctx.saveSequence(99));

      // Restored in this context (from bytes, a direct buffer at an offset,
      // the file) and in a second one: the same length, selections and rows.
      ctx.restoreSequence(3, state);
      ByteBuffer direct = ByteBuffer.allocateDirect(state.length + 5);
      direct.position(5);
      direct.put(state).position(5);
      ctx.restoreSequence(4, direct);
      assertEquals(5, direct.position(), "the buffer's position does not move");
      ctx.restoreSequence(5, file);
      other.restoreSequence(1, state);
      for (Object[] restored : new Object[][] {{ctx, 3L}, {ctx, 4L}, {ctx, 5L}, {other, 1L}}) {
        PqContext context = (PqContext) restored[0];
        long seqId = (Long) restored[1];
        assertEquals(PROMPT + 2, context.sequenceLength(seqId, 0));
        new Step(context, seqId, query).assertSame(want, "restored sequence " + seqId);
      }

      // Damaged states are refused and add nothing.
      long count = ctx.sequenceCount();
      byte[] flipped = state.clone();
      flipped[state.length / 2] ^= (byte) 0xff;
      PqException corrupt = assertStatus(Status.CORRUPT, () -> ctx.restoreSequence(6, flipped));
      assertTrue(corrupt.getMessage().startsWith("CORRUPT (-9): "), corrupt.getMessage());
      byte[] truncated = java.util.Arrays.copyOf(state, state.length / 2);
      PqException e = assertThrows(PqException.class, () -> ctx.restoreSequence(6, truncated));
      assertTrue(e.status() == Status.CORRUPT || e.status() == Status.INVALID_ARGUMENT,
          e.getMessage());
      assertEquals(count, ctx.sequenceCount());
      assertStatus(Status.INVALID_ARGUMENT, () -> ctx.restoreSequence(3, state));
      assertStatus(Status.NOT_FOUND, () -> ctx.restoreSequence(6, dir.resolve("missing.bin")));
    }
  }

  @Test
  void newStatusesMirrorTheHeader() {
    assertEquals(pq_status.PQ_ERR_CORRUPT, Status.CORRUPT.code());
    assertEquals(pq_status.PQ_ERR_INCOMPATIBLE, Status.INCOMPATIBLE.code());
    assertEquals(Status.CORRUPT, Status.fromCode(-9));
    assertEquals(Status.INCOMPATIBLE, Status.fromCode(-10));
  }

  @Test
  void restoreInPiecesSelectsBeforeTheKVArrive() {
    try (PqContext ctx = new PqContext(ReferenceCycle.config());
        PqContext other = new PqContext(ReferenceCycle.config())) {
      addPrefilled(ctx, 1);
      float[] query = ReferenceCycle.generate(71, ctx.queryHeads() * ctx.headDim());
      Step want = new Step(ctx, 1, query);
      byte[] state = ctx.saveSequence(1);

      // The description arrives first: grow the prefix until it is enough.
      int prefix = 0;
      long consumed;
      while (true) {
        try {
          consumed = other.restoreSequenceBegin(1, ByteBuffer.wrap(state, 0, prefix));
          break;
        } catch (PqBufferTooSmallException e) {
          assertEquals(Status.BUFFER_TOO_SMALL, e.status(), e.getMessage());
          assertTrue(e.needed() > prefix && e.needed() <= state.length,
              "a prefix of " + prefix + " needs " + e.needed());
          assertEquals(0, other.sequenceCount(), "a short begin adds nothing");
          prefix = (int) e.needed();
        }
      }
      final long begun = consumed;
      assertTrue(begun > 0 && begun <= prefix && begun < state.length / 2, "began with " + begun);
      assertEquals(PROMPT + 4, other.sequenceLength(1, 0));

      // It selects as the saved sequence does before any K/V; a fetch waits
      // for them.
      Selection selection = other.decodeSelect(1, 0, query);
      for (int h = 0; h < selection.kvHeads(); h++) {
        assertArrayEquals(want.positions[h], selection.positions(h), "head " + h + " before the K/V");
      }
      float[] rows = new float[other.kvHeads() * selection.capacity() * other.headDim()];
      assertStatus(Status.BAD_STATE, () -> other.fetchKV(1, 0, selection, rows, rows.clone()));

      // Then one section a call, each given all the rest (a direct buffer,
      // read in place); a short one reads nothing and says what it needs.
      ByteBuffer direct = ByteBuffer.allocateDirect(state.length).put(0, state);
      PqBufferTooSmallException shortSection = assertThrows(PqBufferTooSmallException.class,
          () -> other.restoreSequenceKV(1, ByteBuffer.wrap(state, (int) begun, 4)));
      assertTrue(shortSection.needed() > 4, "4 bytes of a K/V section need " + shortSection.needed());
      long at = begun;
      int sections = 0;
      while (at < state.length) {
        at += other.restoreSequenceKV(1, direct.position((int) at));
        sections++;
      }
      assertEquals(state.length, at);
      assertEquals(2, sections, "one layer's K/V, then the end section");
      assertStatus(Status.BAD_STATE, () -> other.restoreSequenceKV(1, ByteBuffer.wrap(state)));

      new Step(other, 1, query).assertSame(want, "after the K/V arrived");
    }
  }
}
