package io.pqcache;

/**
 * Element type of K, V and Q ({@code pq_dtype}). Buffers hold elements in the
 * platform's byte order ({@link java.nio.ByteOrder#nativeOrder()}).
 */
public enum DType {
  /** IEEE 754 binary32; the only type the {@code float[]} overloads accept. */
  F32(0, 4),
  /** IEEE 754 binary16. */
  F16(1, 2),
  /** bfloat16: the top 16 bits of a binary32. */
  BF16(2, 2),
  /**
   * fp8 e4m3fn (0.10): K/V only, one byte per code; queries of an fp8 context are F32 here.
   * Scales: {@link Config.Builder#kvScales}.
   */
  FP8_E4M3(3, 1),
  /** fp8 e5m2 (0.10): K/V only, as {@link #FP8_E4M3}. */
  FP8_E5M2(4, 1);

  private final int code;
  private final int bytes;

  DType(int code, int bytes) {
    this.code = code;
    this.bytes = bytes;
  }

  /** The value the C API uses. */
  public int code() {
    return code;
  }

  /** Whether K/V of this type are fp8 codes (stored value times its scale). */
  public boolean isFp8() {
    return this == FP8_E4M3 || this == FP8_E5M2;
  }

  /** Bytes per element. */
  public int bytes() {
    return bytes;
  }

  /** The constant with this C value; IllegalArgumentException if there is none. */
  public static DType fromCode(int code) {
    for (DType value : values()) {
      if (value.code == code) {
        return value;
      }
    }
    throw new IllegalArgumentException("no DType with code " + code);
  }
}
