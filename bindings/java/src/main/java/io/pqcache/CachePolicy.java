package io.pqcache;

/** Which block the block cache evicts when full ({@code pq_cache_policy}). */
public enum CachePolicy {
  LRU(0),
  LFU(1);

  private final int code;

  CachePolicy(int code) {
    this.code = code;
  }

  /** The value the C API uses. */
  public int code() {
    return code;
  }

  /** The constant with this C value; IllegalArgumentException if there is none. */
  public static CachePolicy fromCode(int code) {
    for (CachePolicy value : values()) {
      if (value.code == code) {
        return value;
      }
    }
    throw new IllegalArgumentException("no CachePolicy with code " + code);
  }
}
