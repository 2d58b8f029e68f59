package io.pqcache;

import java.util.Arrays;

/**
 * Some items of a batched call ({@link PqContext#decodeSelectBatch},
 * {@link PqContext#fetchKVBatch}) failed; each item succeeds or fails on its
 * own. Thrown for the first failing item: {@link #status()} and
 * {@link #libraryMessage()} are that item's, and the message names it
 * ({@code "pq_decode_select_batch: items[3] (seq_id 42): ..."}). Every item's
 * status is in {@link #itemStatus(int)}; the items that succeeded have their
 * outputs: the caller's buffers for a fetch, {@link #selections()} for a
 * select.
 */
public final class PqBatchException extends PqException {
  private static final long serialVersionUID = 1L;

  private final int[] itemCodes;
  private final transient Selection[] selections;

  PqBatchException(int code, String libraryMessage, int[] itemCodes, Selection[] selections) {
    super(code, libraryMessage);
    this.itemCodes = itemCodes.clone();
    this.selections = selections == null ? null : selections.clone();
  }

  /** The number of items of the call. */
  public int items() {
    return itemCodes.length;
  }

  /** The status of item i: {@link Status#OK} where it succeeded. */
  public Status itemStatus(int i) {
    return Status.fromCode(itemCodes[i]);
  }

  /** The numeric pq_status of item i (0 where it succeeded). */
  public int itemCode(int i) {
    return itemCodes[i];
  }

  /**
   * For {@link PqContext#decodeSelectBatch}: every item's selection, null
   * where the item failed (a copy of the array). For a fetch: null.
   */
  public Selection[] selections() {
    return selections == null ? null : selections.clone();
  }

  @Override
  public String toString() {
    return super.toString() + " (item codes " + Arrays.toString(itemCodes) + ")";
  }
}
