package io.pqcache;

/** The library's result codes ({@code pq_status} in pqcache.h). */
public enum Status {
  OK(0),
  /** An argument is null, out of range or inconsistent with the configuration. */
  INVALID_ARGUMENT(-1),
  /** An allocation failed or the context's host memory limit would be exceeded; nothing changed. */
  OUT_OF_MEMORY(-2),
  /** The call is valid but not now, for example select before prefill. */
  BAD_STATE(-3),
  /** The sequence (or plug-in, or device) does not exist. */
  NOT_FOUND(-4),
  /** A valid request this build or backend does not implement. */
  UNSUPPORTED(-5),
  /** The compute backend (for example the CUDA plug-in) reported an error. */
  BACKEND(-6),
  /** A bug in libpqcache; please report it with the message. */
  INTERNAL(-7),
  /**
   * An output buffer is too small; the library wrote the size it needs (added in 0.4, which
   * returned {@link #INVALID_ARGUMENT} before). {@link PqContext#decodeSelect} sizes its own
   * buffers and grows them on this status, so callers see it only from their own buffers.
   */
  BUFFER_TOO_SMALL(-8),
  /**
   * Saved sequence state that is not intact: truncated, a checksum or magic number that does
   * not match, an inconsistent field (added in 0.5). Nothing was restored.
   */
  CORRUPT(-9),
  /**
   * Saved sequence state that is intact but cannot be restored here: a format version this
   * library does not read, or a geometry other than the context's (added in 0.5). Nothing was
   * restored.
   */
  INCOMPATIBLE(-10),
  /** A code this binding does not know (a newer library); see {@link PqException#code()}. */
  UNKNOWN(Integer.MIN_VALUE);

  private final int code;

  Status(int code) {
    this.code = code;
  }

  /** The numeric pq_status value. */
  public int code() {
    return code;
  }

  /** The status with this numeric value, or {@link #UNKNOWN}. */
  public static Status fromCode(int code) {
    for (Status status : values()) {
      if (status.code == code) {
        return status;
      }
    }
    return UNKNOWN;
  }
}
