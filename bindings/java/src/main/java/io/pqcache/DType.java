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
  BF16(2, 2);

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
