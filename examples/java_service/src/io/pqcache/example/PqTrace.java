package io.pqcache.example;

import io.pqcache.DType;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.Arrays;

/**
 * A reader of .pqtrace attention traces (docs/trace-format.md). The file is
 * memory-mapped: the K/V/Q views it hands out are direct buffers over the
 * mapping, so they go to libpqcache without a copy.
 */
final class PqTrace {
  final String model;
  final String text;
  final DType dtype;
  final int tokens;     // N: tokens with K and V
  final int queryFirst; // F: queries stored for positions F..N-1
  final int queryHeads;
  final int kvHeads;
  final int headDim;
  final int[] layers;   // the model's layer indices, in payload order
  final int modelLayers;

  private final MappedByteBuffer data;
  private final long[] queryOffset;
  private final long[] keyOffset;
  private final long[] valueOffset;

  private PqTrace(Header h, MappedByteBuffer data) {
    this.model = h.model;
    this.text = h.text;
    this.dtype = h.dtype;
    this.tokens = h.tokens;
    this.queryFirst = h.queryFirst;
    this.queryHeads = h.queryHeads;
    this.kvHeads = h.kvHeads;
    this.headDim = h.headDim;
    this.layers = h.layers;
    this.modelLayers = h.modelLayers > 0 ? h.modelLayers : Arrays.stream(h.layers).max().getAsInt() + 1;
    this.data = data;
    queryOffset = new long[layers.length];
    keyOffset = new long[layers.length];
    valueOffset = new long[layers.length];
    long queryBytes = (long) (tokens - queryFirst) * queryHeads * headDim * dtype.bytes();
    long kvBytes = (long) tokens * kvHeads * headDim * dtype.bytes();
    long at = align64(h.dataOffset + 4L * tokens); // after the token ids
    for (int i = 0; i < layers.length; i++) {
      queryOffset[i] = at;
      at = align64(at + queryBytes);
      keyOffset[i] = at;
      at = align64(at + kvBytes);
      valueOffset[i] = at;
      at = align64(at + kvBytes);
    }
    long end = valueOffset[layers.length - 1] + kvBytes;
    if (end > data.capacity()) {
      throw new IllegalArgumentException("truncated trace: " + data.capacity()
          + " bytes, the payload needs " + end);
    }
  }

  private static long align64(long offset) {
    return (offset + 63) & ~63L;
  }

  /** Maps and checks a trace file. */
  static PqTrace open(Path path) throws IOException {
    if (ByteOrder.nativeOrder() != ByteOrder.LITTLE_ENDIAN) {
      // The payload is little-endian and goes to the library as is.
      throw new IOException("traces are little-endian; this platform is not");
    }
    try (FileChannel channel = FileChannel.open(path, StandardOpenOption.READ)) {
      MappedByteBuffer data = channel.map(FileChannel.MapMode.READ_ONLY, 0, channel.size());
      data.order(ByteOrder.LITTLE_ENDIAN);
      return new PqTrace(Header.parse(path, data), data);
    }
  }

  /** The header's key/value lines, up to "end". */
  private static final class Header {
    String model = "?";
    String text = "?";
    DType dtype;
    int tokens;
    int queryFirst = -1;
    int queryHeads;
    int kvHeads;
    int headDim;
    int[] layers = new int[0];
    int modelLayers;
    long dataOffset;

    static Header parse(Path path, ByteBuffer data) throws IOException {
      Header h = new Header();
      boolean magic = false;
      boolean end = false;
      StringBuilder line = new StringBuilder();
      for (int i = 0; i < Math.min(data.capacity(), 1 << 16) && !end; i++) {
        char c = (char) (data.get(i) & 0xff);
        if (c != '\n') {
          line.append(c);
          continue;
        }
        String[] words = line.toString().trim().split("\\s+");
        line.setLength(0);
        switch (words[0]) {
          case "PQTRACE" -> magic = words.length > 1 && words[1].equals("1");
          case "model" -> h.model = words[words.length - 1];
          case "text" -> h.text = words[words.length - 1];
          case "dtype" -> h.dtype = switch (words[1]) {
            case "f16" -> DType.F16;
            case "f32" -> DType.F32;
            default -> throw new IOException(path + ": unknown dtype " + words[1]);
          };
          case "tokens" -> h.tokens = Integer.parseInt(words[1]);
          case "q_first" -> h.queryFirst = Integer.parseInt(words[1]);
          case "q_heads" -> h.queryHeads = Integer.parseInt(words[1]);
          case "kv_heads" -> h.kvHeads = Integer.parseInt(words[1]);
          case "head_dim" -> h.headDim = Integer.parseInt(words[1]);
          case "model_layers" -> h.modelLayers = Integer.parseInt(words[1]);
          case "data_offset" -> h.dataOffset = Long.parseLong(words[1]);
          case "layers" -> h.layers = Arrays.stream(words).skip(1).mapToInt(Integer::parseInt)
              .toArray();
          case "end" -> end = true;
          default -> { } // unknown keys are ignored, as the format asks
        }
      }
      if (!magic || !end || h.dtype == null || h.tokens <= 0 || h.queryHeads <= 0
          || h.kvHeads <= 0 || h.headDim <= 0 || h.layers.length == 0 || h.queryFirst < 0
          || h.queryFirst > h.tokens || h.dataOffset <= 0 || h.dataOffset % 64 != 0) {
        throw new IOException(path + " is not a valid PQTRACE 1 file (header)");
      }
      return h;
    }
  }

  private ByteBuffer view(long offset, long bytes) {
    return data.slice(Math.toIntExact(offset), Math.toIntExact(bytes))
        .order(ByteOrder.nativeOrder());
  }

  private int kvRowBytes() {
    return kvHeads * headDim * dtype.bytes();
  }

  /** Keys of tokens [first, first + count) of stored layer i: [count][kvHeads][headDim]. */
  ByteBuffer keys(int i, int first, int count) {
    return view(keyOffset[i] + (long) first * kvRowBytes(), (long) count * kvRowBytes());
  }

  /** Values, as {@link #keys}. */
  ByteBuffer values(int i, int first, int count) {
    return view(valueOffset[i] + (long) first * kvRowBytes(), (long) count * kvRowBytes());
  }

  /** The query at a position >= queryFirst: [1][queryHeads][headDim]. */
  ByteBuffer query(int i, int position) {
    long rowBytes = (long) queryHeads * headDim * dtype.bytes();
    return view(queryOffset[i] + (position - queryFirst) * rowBytes, rowBytes);
  }

  /** One stored element as a float (f16 or f32). */
  static float element(ByteBuffer buffer, int index, DType dtype) {
    return dtype == DType.F32 ? buffer.getFloat(index * 4)
        : halfToFloat(buffer.getShort(index * 2));
  }

  /** IEEE 754 binary16 to binary32 (Java 17 has no Float.float16ToFloat). */
  static float halfToFloat(short half) {
    int bits = half & 0xffff;
    int sign = (bits & 0x8000) << 16;
    int exponent = (bits >>> 10) & 0x1f;
    int mantissa = bits & 0x3ff;
    if (exponent == 0x1f) { // Inf or NaN
      return Float.intBitsToFloat(sign | 0x7f800000 | (mantissa << 13));
    }
    if (exponent == 0) { // zero or subnormal: mantissa * 2^-24
      float magnitude = mantissa * 0x1p-24f;
      return sign != 0 ? -magnitude : magnitude;
    }
    return Float.intBitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
  }
}
