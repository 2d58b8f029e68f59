package io.pqcache;

/**
 * How far an index build of (seqId, layer) has come ({@code pq_build_progress}, docs/hooks.md):
 * {@code done} K-Means iterations of a budget of {@code total} (it may stop sooner), then
 * {@code done} of {@code total} tokens coded. {@code fraction}, in [0, 1] and non-decreasing over
 * one build, is the value to show; it is 1 at the build's last call.
 */
public record BuildProgress(long seqId, int layer, Stage stage, long done, long total,
    double fraction) {
  /** The stages of a build, in order ({@code pq_build_stage}). */
  public enum Stage {
    /** Training the codebook: Lloyd iterations. */
    KMEANS(0),
    /** Coding every token with the trained codebook. */
    ENCODE(1);

    private final int code;

    Stage(int code) {
      this.code = code;
    }

    /** The {@code pq_build_stage} value. */
    public int code() {
      return code;
    }

    /** The Stage of a {@code pq_build_stage} value; IllegalArgumentException naming it if none. */
    public static Stage fromCode(int code) {
      for (Stage s : values()) {
        if (s.code == code) {
          return s;
        }
      }
      throw new IllegalArgumentException("pq_build_stage " + code + " is not KMEANS (0) or ENCODE (1)");
    }
  }
}
