package io.pqcache;

/**
 * What decodeAttend adds for the middle tokens a selection leaves out ({@code pq_tail_estimate}, 0.12):
 * NONE (the selected rows alone, the default) or CODE_MEANS (each left-out coded middle token with
 * its lookup-table score as logit and its first code's mean value; needs {@link Selector#PQ}).
 */
public enum TailEstimate {
  NONE(0),
  CODE_MEANS(1);

  private final int code;

  TailEstimate(int code) {
    this.code = code;
  }

  /** The value the C API uses. */
  public int code() {
    return code;
  }

  /** The constant with this C value; IllegalArgumentException if there is none. */
  public static TailEstimate fromCode(int code) {
    for (TailEstimate value : values()) {
      if (value.code == code) {
        return value;
      }
    }
    throw new IllegalArgumentException("no TailEstimate with code " + code);
  }
}
