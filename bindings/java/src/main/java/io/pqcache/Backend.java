package io.pqcache;

/** The compute backend of a context ({@code pq_backend}). */
public enum Backend {
  CPU(0),
  CUDA(1),
  AUTO(2);

  private final int code;

  Backend(int code) {
    this.code = code;
  }

  /** The value the C API uses. */
  public int code() {
    return code;
  }

  /** The constant with this C value; IllegalArgumentException if there is none. */
  public static Backend fromCode(int code) {
    for (Backend value : values()) {
      if (value.code == code) {
        return value;
      }
    }
    throw new IllegalArgumentException("no Backend with code " + code);
  }
}
