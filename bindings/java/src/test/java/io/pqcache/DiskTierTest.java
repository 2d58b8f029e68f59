package io.pqcache;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Path;
import java.util.Arrays;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The disk tier: rows that went to the file come back as prefilled; its directory is checked. */
class DiskTierTest {
  // Past the sink (4), the local window (16) and one 256-token chunk: a chunk goes to the file.
  private static final int TOKENS = 600;
  private static final int KV = ReferenceCycle.KV_HEADS;
  private static final int DIM = ReferenceCycle.HEAD_DIM;

  /** The exact selector with k = every token, so that every row is compared. */
  private static Config.Builder diskTier() {
    return Config.builder()
        .dtype(DType.F32)
        .layers(1)
        .queryHeads(ReferenceCycle.Q_HEADS)
        .kvHeads(KV)
        .headDim(DIM)
        .selector(Selector.EXACT)
        .sinkTokens(4)
        .localTokens(16)
        .topkTokens(TOKENS)
        .workerThreads(1)
        .kvTier(KvTier.DISK);
  }

  @Test
  void rowsOnDiskComeBackAsPrefilled(@TempDir Path dir) {
    float[] keys = ReferenceCycle.generate(41, TOKENS * KV * DIM);
    float[] values = ReferenceCycle.generate(42, TOKENS * KV * DIM);
    try (PqContext ctx = new PqContext(diskTier().kvDiskPath(dir).build())) {
      ctx.addSequence(1);
      ctx.prefillLayer(1, 0, TOKENS, keys, values);
      Selection selection =
          ctx.decodeSelect(1, 0, ReferenceCycle.generate(43, ReferenceCycle.Q_HEADS * DIM));
      int capacity = selection.capacity();
      float[] outK = new float[KV * capacity * DIM];
      float[] outV = new float[KV * capacity * DIM];
      ctx.fetchKV(1, 0, selection, outK, outV);
      for (int h = 0; h < KV; h++) {
        int[] positions = selection.positions(h);
        assertEquals(TOKENS, positions.length, "kv head " + h + " selects every token");
        for (int i = 0; i < positions.length; i++) {
          int got = (h * capacity + i) * DIM;
          int want = (positions[i] * KV + h) * DIM;
          assertArrayEquals(Arrays.copyOfRange(keys, want, want + DIM),
              Arrays.copyOfRange(outK, got, got + DIM), "K of token " + positions[i]);
          assertArrayEquals(Arrays.copyOfRange(values, want, want + DIM),
              Arrays.copyOfRange(outV, got, got + DIM), "V of token " + positions[i]);
        }
      }
    }
  }

  @Test
  void theDiskTierNeedsADirectory() {
    PqException e = assertThrows(PqException.class, () -> new PqContext(diskTier().build()));
    assertEquals(Status.INVALID_ARGUMENT, e.status());
    assertTrue(e.libraryMessage().contains("kv_disk_path"), e.libraryMessage());
  }
}
