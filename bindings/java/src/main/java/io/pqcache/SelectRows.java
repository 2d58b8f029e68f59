package io.pqcache;

/**
 * The rows {@link PqContext#decodeSelectMulti} writes ({@code pq_select_rows}), each ascending,
 * unique and padded with -1 up to the capacity.
 */
public enum SelectRows {
  /** Token t's selection for kv head h in row {@code t * kvHeads + h}. */
  PER_TOKEN(0),
  /** Row h: the union over the query tokens of kv head h's selections. */
  PER_HEAD(1),
  /** One row: the union over the query tokens and kv heads. */
  PER_REQUEST(2);

  private final int code;

  SelectRows(int code) {
    this.code = code;
  }

  /** The value the C API uses. */
  public int code() {
    return code;
  }
}
