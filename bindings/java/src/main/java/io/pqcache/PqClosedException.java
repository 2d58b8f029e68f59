package io.pqcache;

/**
 * A call on a {@link PqContext} after {@link PqContext#close()}. It reports
 * what every binding reports for a closed context (docs/bindings/errors.md):
 * status {@link Status#BAD_STATE} and the message
 * {@code "<C function>: the context is closed"}, for example
 * {@code "pq_sequence_add: the context is closed"}, with the accessors of
 * {@link PqException}. It stays an {@link IllegalStateException}, which a
 * closed context threw before, so that code catching that still does.
 */
public final class PqClosedException extends IllegalStateException {
  private static final long serialVersionUID = 1L;

  private final String libraryMessage;

  PqClosedException(String function) {
    super(Status.BAD_STATE + " (" + Status.BAD_STATE.code() + "): " + function
        + ": the context is closed");
    this.libraryMessage = function + ": the context is closed";
  }

  /** {@link Status#BAD_STATE}. */
  public Status status() {
    return Status.BAD_STATE;
  }

  /** The numeric pq_status value, -3. */
  public int code() {
    return Status.BAD_STATE.code();
  }

  /** The message without the status prefix: {@code "<C function>: the context is closed"}. */
  public String libraryMessage() {
    return libraryMessage;
  }
}
