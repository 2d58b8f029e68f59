package io.pqcache;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.TimeUnit;

/**
 * The cycle of tests/reference_cycle.c in Java: same generator, same
 * configuration, same output format, so the two texts compare equal.
 */
final class ReferenceCycle {
  static final int TOKENS = 256;
  static final int Q_HEADS = 4;
  static final int KV_HEADS = 2;
  static final int HEAD_DIM = 16;

  /**
   * One layer of the reference geometry in F32, 2 x 4-bit PQ, 4 sinks, a 16-token window and 16
   * selected tokens, with {@code selector}: the reference cycle's context, and the one the
   * feature tests add one field to.
   */
  static Config.Builder smallPq(Selector selector) {
    return Config.builder()
        .dtype(DType.F32)
        .layers(1)
        .queryHeads(Q_HEADS)
        .kvHeads(KV_HEADS)
        .headDim(HEAD_DIM)
        .pqSubspaces(2)
        .pqBits(4)
        .sinkTokens(4)
        .localTokens(16)
        .topkTokens(16)
        .seed(7)
        .workerThreads(1)
        .selector(selector);
  }

  private ReferenceCycle() {}

  static Config config() {
    return smallPq(Selector.PQ).kmeansIterations(8).build();
  }

  /** The generator of reference_cycle.c: 32-bit unsigned arithmetic, exact in f32. */
  static float value(int stream, int i) {
    int h = i * 0x9E3779B1 + stream * 97531; // 2654435761
    h ^= h >>> 15;
    h *= 0x85EBCA77; // 2246822519
    h ^= h >>> 13;
    return (float) (h >>> 8) / 16777216.0f - 0.5f;
  }

  static float[] generate(int stream, int n) {
    float[] values = new float[n];
    for (int i = 0; i < n; i++) {
      values[i] = value(stream, i);
    }
    return values;
  }

  static ByteBuffer direct(float[] values) {
    ByteBuffer buffer =
        ByteBuffer.allocateDirect(values.length * Float.BYTES).order(ByteOrder.nativeOrder());
    buffer.asFloatBuffer().put(values);
    return buffer;
  }

  static final long FNV_OFFSET = 0xcbf29ce484222325L;

  static long fnv1a(long hash, ByteBuffer bytes, int from, int count) {
    for (int i = from; i < from + count; i++) {
      hash ^= bytes.get(i) & 0xff;
      hash *= 0x100000001b3L;
    }
    return hash;
  }

  /**
   * Runs the cycle on sequence seqId of ctx (a context made from config())
   * and returns reference_cycle.c's output. viaArrays picks the float[]
   * overloads instead of direct buffers.
   */
  static String run(PqContext ctx, long seqId, boolean viaArrays) {
    float[] k = generate(1, TOKENS * KV_HEADS * HEAD_DIM);
    float[] v = generate(2, TOKENS * KV_HEADS * HEAD_DIM);
    float[] k1 = generate(3, KV_HEADS * HEAD_DIM);
    float[] v1 = generate(4, KV_HEADS * HEAD_DIM);
    float[] q = generate(5, Q_HEADS * HEAD_DIM);

    ctx.addSequence(seqId);
    Selection selection;
    ByteBuffer outK;
    ByteBuffer outV;
    int capacity;
    if (viaArrays) {
      ctx.prefillLayer(seqId, 0, TOKENS, k, v);
      ctx.decodeAppend(seqId, 0, 1, k1, v1);
      capacity = ctx.selectionCapacity(seqId, 0);
      selection = ctx.decodeSelect(seqId, 0, q);
      float[] keys = new float[KV_HEADS * capacity * HEAD_DIM];
      float[] values = new float[KV_HEADS * capacity * HEAD_DIM];
      ctx.fetchKV(seqId, 0, selection, keys, values);
      outK = direct(keys);
      outV = direct(values);
    } else {
      ctx.prefillLayer(seqId, 0, TOKENS, direct(k), direct(v));
      ctx.decodeAppend(seqId, 0, 1, direct(k1), direct(v1));
      capacity = ctx.selectionCapacity(seqId, 0);
      selection = ctx.decodeSelect(seqId, 0, direct(q));
      int bytes = KV_HEADS * capacity * HEAD_DIM * Float.BYTES;
      outK = ByteBuffer.allocateDirect(bytes).order(ByteOrder.nativeOrder());
      outV = ByteBuffer.allocateDirect(bytes).order(ByteOrder.nativeOrder());
      ctx.fetchKV(seqId, 0, selection, outK, outV);
    }
    assertEquals(capacity, selection.capacity());

    StringBuilder out = new StringBuilder();
    out.append("capacity ").append(capacity).append('\n');
    long hk = FNV_OFFSET;
    long hv = FNV_OFFSET;
    for (int h = 0; h < KV_HEADS; h++) {
      out.append("head ").append(h).append(" count ").append(selection.count(h))
          .append(" positions");
      for (int p : selection.positions(h)) {
        out.append(' ').append(p);
      }
      out.append('\n');
      int row0 = h * capacity * HEAD_DIM * Float.BYTES;
      int rowBytes = selection.count(h) * HEAD_DIM * Float.BYTES;
      hk = fnv1a(hk, outK, row0, rowBytes);
      hv = fnv1a(hv, outV, row0, rowBytes);
    }
    out.append(String.format("keys_fnv1a 0x%016x%nvalues_fnv1a 0x%016x%n", hk, hv));
    return out.toString();
  }

  /** The output of the C program named by $PQ_REFERENCE_CYCLE (CTest sets it). */
  static String expected() throws IOException, InterruptedException {
    String program = System.getenv("PQ_REFERENCE_CYCLE");
    assertNotNull(program, "PQ_REFERENCE_CYCLE must name the pq_reference_cycle program"
        + " (ctest sets it)");
    Process process = new ProcessBuilder(program).redirectErrorStream(true).start();
    String output = new String(process.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    process.waitFor(60, TimeUnit.SECONDS);
    assertEquals(0, process.exitValue(), "pq_reference_cycle failed:\n" + output);
    return output;
  }
}
