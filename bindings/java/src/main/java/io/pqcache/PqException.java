package io.pqcache;

/**
 * A libpqcache call failed. Carries the {@link Status} and the library's own
 * message (pq_last_error of the failing call), which names the argument, the
 * value and what was expected.
 */
public class PqException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  private final int code;
  private final String libraryMessage;

  /** Thrown from the JNI module (bindings/swig/java.i) with the failing call's status and message. */
  PqException(int code, String libraryMessage) {
    super(Status.fromCode(code) + " (" + code + "): " + libraryMessage);
    this.code = code;
    this.libraryMessage = libraryMessage;
  }

  /** The status, {@link Status#UNKNOWN} for a code newer than this binding. */
  public Status status() {
    return Status.fromCode(code);
  }

  /** The numeric pq_status value. */
  public int code() {
    return code;
  }

  /** The library's message, without the status prefix. */
  public String libraryMessage() {
    return libraryMessage;
  }
}
