package io.pqcache;

/**
 * How a head's rotary pairs are laid out ({@code pq_key_rotary}), so that each PQ subspace holds
 * whole pairs: HALF pairs dimension i with i + D/2 (Hugging Face Llama, Qwen2, Gemma), INTERLEAVED
 * pairs 2i with 2i + 1 (GPT-J, GGUF).
 */
public enum KeyRotary {
  NONE(0),
  HALF(1),
  INTERLEAVED(2);

  private final int code;

  KeyRotary(int code) {
    this.code = code;
  }

  /** The value the C API uses. */
  public int code() {
    return code;
  }

  /** The constant with this C value; IllegalArgumentException if there is none. */
  public static KeyRotary fromCode(int code) {
    for (KeyRotary value : values()) {
      if (value.code == code) {
        return value;
      }
    }
    throw new IllegalArgumentException("no KeyRotary with code " + code);
  }
}
