package io.pqcache;

/**
 * A restore in pieces ({@link PqContext#restoreSequenceBegin},
 * {@link PqContext#restoreSequenceKV}) was given fewer bytes than the step
 * reads: nothing was read or added. {@link #status()} is
 * {@link Status#BUFFER_TOO_SMALL}; {@link #needed()} is how many bytes the
 * step needs, counted from the start of what it was given (the state's start
 * for the begin, the next section's start for a K/V step). Call again with
 * at least as many.
 */
public final class PqBufferTooSmallException extends PqException {
  private static final long serialVersionUID = 1L;

  private final long needed;

  PqBufferTooSmallException(int code, String libraryMessage, long needed) {
    super(code, libraryMessage);
    this.needed = needed;
  }

  /** The bytes the step needs from the start of what it was given. */
  public long needed() {
    return needed;
  }
}
