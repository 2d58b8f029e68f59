package io.pqcache;

/**
 * Where each layer's K/V rows live ({@code pq_kv_tier}): host memory, a file in the
 * directory of {@link Config.Builder#kvDiskPath} (CPU backend only), or the caller's own pool.
 */
public enum KvTier {
  HOST(0),
  DISK(1),
  /**
   * Index only (0.10): the caller keeps K/V in its own (paged) pool and the library the PQ
   * index and the keys not coded yet. Values may be null in prefill and append; keys can come
   * from a paged pool ({@link PqContext#prefillLayerPaged}); fetchKV, decodeAttend and saving
   * throw UNSUPPORTED. Selectors PQ, WINDOW and RANDOM; CPU backend.
   */
  CALLER(2);

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
