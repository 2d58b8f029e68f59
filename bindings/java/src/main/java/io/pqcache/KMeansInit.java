package io.pqcache;

/** K-Means initialisation ({@code pq_kmeans_init}). */
public enum KMeansInit {
  RANDOM(0),
  KMEANS_PLUS_PLUS(1);

  private final int code;

  KMeansInit(int code) {
    this.code = code;
  }

  /** The value the C API uses. */
  public int code() {
    return code;
  }

  /** The constant with this C value; IllegalArgumentException if there is none. */
  public static KMeansInit fromCode(int code) {
    for (KMeansInit value : values()) {
      if (value.code == code) {
        return value;
      }
    }
    throw new IllegalArgumentException("no KMeansInit with code " + code);
  }
}
