package io.pqcache;

/** How SnapKV, PyramidKV and SCOPE pool window scores ({@code pq_pooling}); AVG is the official SnapKV code's. */
public enum Pooling {
  MAX(0),
  AVG(1);

  private final int code;

  Pooling(int code) {
    this.code = code;
  }

  /** The value the C API uses. */
  public int code() {
    return code;
  }

  /** The constant with this C value; IllegalArgumentException if there is none. */
  public static Pooling fromCode(int code) {
    for (Pooling value : values()) {
      if (value.code == code) {
        return value;
      }
    }
    throw new IllegalArgumentException("no Pooling with code " + code);
  }
}
