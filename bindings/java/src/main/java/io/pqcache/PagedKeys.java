package io.pqcache;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Objects;

/**
 * Where a sequence's keys are in the caller's paged pool ({@code pq_paged_keys}, added in 0.10),
 * for an index-only context ({@link KvTier#CALLER}): the key of position p is row slot(p) of the
 * pool, where slot(p) is {@code slots[p]} ({@link #bySlots}), {@code blockTable[p / blockSize] *
 * blockSize + p % blockSize} ({@link #byBlocks}, vLLM's block table), or p ({@link #dense}).
 *
 * <p>The pool is a direct buffer in the platform byte order, read in place from its position:
 * {@code poolTokens x kvHeads x headDim} elements of the context's dtype, token-major (vLLM's key
 * cache {@code [blocks * blockSize][kvHeads][headDim]} with poolTokens = blocks * blockSize). The
 * maps are copied when the object is made. The library checks every slot and block against the
 * pool and reads the pool during a call only.
 */
public final class PagedKeys {
  final ByteBuffer pool;
  final int poolTokens;
  // Native-order direct copies of the maps, or null.
  final ByteBuffer slots;
  final ByteBuffer blockTable;
  final int blockSize;
  final long mapLength;

  private PagedKeys(ByteBuffer pool, int poolTokens, ByteBuffer slots, ByteBuffer blockTable,
      int blockSize, long mapLength) {
    this.pool = Objects.requireNonNull(pool, "pool");
    this.poolTokens = poolTokens;
    this.slots = slots;
    this.blockTable = blockTable;
    this.blockSize = blockSize;
    this.mapLength = mapLength;
  }

  /** Position p's key is row {@code slots[p]} of the pool (SGLang's req_to_token row). */
  public static PagedKeys bySlots(ByteBuffer pool, int poolTokens, long[] slots) {
    Objects.requireNonNull(slots, "slots");
    ByteBuffer copy = direct(slots.length, Long.BYTES);
    copy.asLongBuffer().put(slots);
    return new PagedKeys(pool, poolTokens, copy, null, 0, slots.length);
  }

  /**
   * Position p's key is row {@code blockTable[p / blockSize] * blockSize + p % blockSize} of the
   * pool (vLLM's block table).
   */
  public static PagedKeys byBlocks(ByteBuffer pool, int poolTokens, int[] blockTable,
      int blockSize) {
    Objects.requireNonNull(blockTable, "blockTable");
    ByteBuffer copy = direct(blockTable.length, Integer.BYTES);
    copy.asIntBuffer().put(blockTable);
    return new PagedKeys(pool, poolTokens, null, copy, blockSize, blockTable.length);
  }

  /** Position p's key is row p of the pool. */
  public static PagedKeys dense(ByteBuffer pool, int poolTokens) {
    return new PagedKeys(pool, poolTokens, null, null, 0, 0);
  }

  /** The pool's tokens (slots). */
  public int poolTokens() {
    return poolTokens;
  }

  private static ByteBuffer direct(int entries, int bytes) {
    // At least one byte: a map of no entries is still a map (not NULL).
    return ByteBuffer.allocateDirect(Math.max(1, Math.multiplyExact(entries, bytes)))
        .order(ByteOrder.nativeOrder());
  }
}
