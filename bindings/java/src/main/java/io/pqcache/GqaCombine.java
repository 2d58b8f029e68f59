package io.pqcache;

/** How a GQA group's query heads combine into one score per kv head ({@code pq_gqa_combine}). */
public enum GqaCombine {
  SUM_SOFTMAX(0),
  MAX(1),
  MEAN(2);

  private final int code;

  GqaCombine(int code) {
    this.code = code;
  }

  /** The value the C API uses. */
  public int code() {
    return code;
  }

  /** The constant with this C value; IllegalArgumentException if there is none. */
  public static GqaCombine fromCode(int code) {
    for (GqaCombine value : values()) {
      if (value.code == code) {
        return value;
      }
    }
    throw new IllegalArgumentException("no GqaCombine with code " + code);
  }
}
