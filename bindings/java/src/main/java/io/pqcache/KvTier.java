package io.pqcache;

/**
 * Where each layer's K/V rows live ({@code pq_kv_tier}): host memory, or a file in the
 * directory of {@link Config.Builder#kvDiskPath} (CPU backend only).
 */
public enum KvTier {
  HOST(0),
  DISK(1);

  private final int code;

  KvTier(int code) {
    this.code = code;
  }

  /** The value the C API uses. */
  public int code() {
    return code;
  }

  /** The constant with this C value; IllegalArgumentException if there is none. */
  public static KvTier fromCode(int code) {
    for (KvTier value : values()) {
      if (value.code == code) {
        return value;
      }
    }
    throw new IllegalArgumentException("no KvTier with code " + code);
  }
}
