package io.pqcache;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.IntBuffer;
import java.util.Arrays;

/**
 * The tokens {@link PqContext#decodeSelect} chose: per kv head, ascending
 * unique positions (sinks, top-k middle tokens, local window). Immutable;
 * pass it to {@link PqContext#fetchKV} to gather those tokens' K and V.
 * {@link PqContext#decodeSelectMulti}'s has a row per token and kv head,
 * per kv head or per request ({@link SelectRows}) where this class says kv
 * head, each padded with -1 up to the capacity ({@link #paddedPositions}).
 */
public final class Selection {
  private final int capacity;
  private final int[][] positions;
  // The native arrays pq_decode_select filled, kept so that fetchKV hands
  // the same memory back without rebuilding it. Never written after select.
  private final ByteBuffer nativePositions;
  private final ByteBuffer nativeCounts;

  private Selection(int capacity, int[][] positions, ByteBuffer nativePositions,
      ByteBuffer nativeCounts) {
    this.capacity = capacity;
    this.positions = positions;
    this.nativePositions = nativePositions;
    this.nativeCounts = nativeCounts;
  }

  /**
   * Empty native arrays for kvHeads x capacity positions, in the platform's byte order, for the
   * {@code out} of the C function {@code function}.
   */
  static ByteBuffer[] allocateNative(String function, int kvHeads, int capacity) {
    long positionBytes = 4L * kvHeads * capacity;
    if (positionBytes > Integer.MAX_VALUE) {
      throw PqContext.invalid(function, "out.capacity is " + capacity + "; expected at most "
          + Integer.MAX_VALUE / 4 / kvHeads + " (" + kvHeads + " kv heads x capacity positions"
          + " of 4 bytes must fit a Java buffer)");
    }
    return new ByteBuffer[] {
      ByteBuffer.allocateDirect((int) positionBytes).order(ByteOrder.nativeOrder()),
      ByteBuffer.allocateDirect(4 * kvHeads).order(ByteOrder.nativeOrder())
    };
  }

  /** Reads what pq_decode_select wrote into the native arrays. */
  static Selection fromNative(int kvHeads, int capacity, ByteBuffer nativePositions,
      ByteBuffer nativeCounts) {
    IntBuffer all = nativePositions.asIntBuffer();
    IntBuffer counts = nativeCounts.asIntBuffer();
    int[][] positions = new int[kvHeads][];
    for (int head = 0; head < kvHeads; head++) {
      positions[head] = new int[counts.get(head)];
      all.get(head * capacity, positions[head]);
    }
    return new Selection(capacity, positions, nativePositions.asReadOnlyBuffer(),
        nativeCounts.asReadOnlyBuffer());
  }

  /** Number of kv heads. */
  public int kvHeads() {
    return positions.length;
  }

  /** Entries reserved per kv head: the token rows fetchKV writes per head. */
  public int capacity() {
    return capacity;
  }

  /** Positions selected for this kv head. */
  public int count(int kvHead) {
    return positions[kvHead].length;
  }

  /** The selected positions of one kv head, ascending (a copy). */
  public int[] positions(int kvHead) {
    return positions[kvHead].clone();
  }

  /** Number of rows: {@link #kvHeads()}, or a multi-token selection's rows. */
  public int rows() {
    return positions.length;
  }

  /** The selected positions of one row, ascending (a copy): {@link #positions(int)}. */
  public int[] row(int row) {
    return positions(row);
  }

  /**
   * Every row's {@link #capacity()} entries as the library wrote them, row after row (a copy):
   * a multi-token selection pads each row with -1 past its count, the index list SGLang's sparse
   * attention takes.
   */
  public int[] paddedPositions() {
    int[] all = new int[positions.length * capacity];
    // The kept view is read-only, which resets a ByteBuffer's order to big-endian.
    nativePositions.duplicate().order(ByteOrder.nativeOrder()).asIntBuffer().get(0, all);
    return all;
  }

  /** The largest count over the kv heads. */
  public int maxCount() {
    int max = 0;
    for (int[] head : positions) {
      max = Math.max(max, head.length);
    }
    return max;
  }

  ByteBuffer nativePositions() {
    return nativePositions;
  }

  ByteBuffer nativeCounts() {
    return nativeCounts;
  }

  @Override
  public String toString() {
    StringBuilder text = new StringBuilder("Selection[capacity=").append(capacity);
    for (int head = 0; head < positions.length; head++) {
      text.append(", head ").append(head).append('=').append(Arrays.toString(positions[head]));
    }
    return text.append(']').toString();
  }
}
