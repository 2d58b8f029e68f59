package io.pqcache;

/**
 * The levels of the log hook ({@code pq_log_level}), most severe first: a
 * {@link Hooks} set to a level gets the messages of that level and the ones
 * above it (docs/hooks.md lists what each level logs).
 */
public enum LogLevel {
  /** A call failed: the message its {@link PqException} carries. */
  ERROR(0),
  /** An index build failed (the layer reports it at its next call); the default. */
  WARN(1),
  /** Context created, index build finished (its time, K-Means iterations). */
  INFO(2),
  /** Sequence added, removed, forked, truncated, saved, restored. */
  DEBUG(3);

  private final int code;

  LogLevel(int code) {
    this.code = code;
  }

  /** The value the C API uses. */
  public int code() {
    return code;
  }

  /**
   * The level with this C value (a level read from a configuration file, say); anything but 0
   * to 3 throws IllegalArgumentException naming the value.
   */
  public static LogLevel fromCode(int code) {
    for (LogLevel level : values()) {
      if (level.code == code) {
        return level;
      }
    }
    throw new IllegalArgumentException("log_level is " + code
        + "; expected 0 (ERROR), 1 (WARN), 2 (INFO) or 3 (DEBUG)");
  }
}
