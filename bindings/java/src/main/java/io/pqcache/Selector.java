package io.pqcache;

/** How middle tokens are selected ({@code pq_selector}); see pqcache.h for each one. */
public enum Selector {
  PQ(0),
  EXACT(1),
  WINDOW(2),
  SPARQ(3),
  INFLLM(4),
  QUEST(5),
  RANDOM(6),
  H2O(7),
  SCOPE(8),
  SNAPKV(9),
  PYRAMIDKV(10),
  SCISSORHANDS(11),
  KEYFORMER(12),
  CLUSTERKV(13),
  ADAKV(14),
  ZIGZAGKV(15),
  PYRAMIDINFER(16),
  FASTGEN(17),
  INFINIGEN(18);

  /**
   * {@code PQ_SELECTOR_COUNT}, one past the last selector: the codes are 0 to {@code COUNT - 1}.
   * SelectorTest checks the constants above against the header's {@code enum pq_selector} and
   * this count.
   */
  public static final int COUNT = 19;

  private final int code;

  Selector(int code) {
    this.code = code;
  }

  /** The value the C API uses. */
  public int code() {
    return code;
  }

  /** The constant with this C value; IllegalArgumentException if there is none. */
  public static Selector fromCode(int code) {
    for (Selector value : values()) {
      if (value.code == code) {
        return value;
      }
    }
    throw new IllegalArgumentException("no Selector with code " + code);
  }
}
