package io.pqcache;

import java.util.Arrays;
import java.util.Objects;

/**
 * What {@link PqContext#decodeAttend} computed for one token's query over a
 * selection, in float whatever the stored dtype: per query head q, the output
 * {@code softmax(scale * q . K) V} over the selected tokens of its kv head
 * ({@code headDim} floats), and the log-sum-exp {@code ln sum exp(scale * q . K)},
 * which lets a caller merge this attention with one over tokens it keeps
 * itself. A kv head with no selected token gives zeros and negative
 * infinity. Immutable.
 */
public final class Attention {
  private final int headDim;
  private final float[] output;
  private final float[] lse;

  Attention(int headDim, float[] output, float[] lse) {
    this.headDim = headDim;
    this.output = output;
    this.lse = lse;
  }

  /** Number of query heads. */
  public int queryHeads() {
    return lse.length;
  }

  public int headDim() {
    return headDim;
  }

  /** The whole output, {@code [queryHeads][headDim]} flattened (a copy). */
  public float[] output() {
    return output.clone();
  }

  /** The output of one query head, {@code headDim} floats (a copy). */
  public float[] output(int queryHead) {
    Objects.checkIndex(queryHead, lse.length);
    return Arrays.copyOfRange(output, queryHead * headDim, (queryHead + 1) * headDim);
  }

  /** The log-sum-exp of every query head (a copy). */
  public float[] lse() {
    return lse.clone();
  }

  /** The log-sum-exp of one query head. */
  public float lse(int queryHead) {
    return lse[queryHead];
  }

  @Override
  public String toString() {
    return "Attention[" + queryHeads() + " query heads x " + headDim + ", lse="
        + Arrays.toString(lse) + "]";
  }
}
