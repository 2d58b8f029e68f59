package example;

import io.pqcache.Config;
import io.pqcache.DType;
import io.pqcache.PqContext;
import io.pqcache.Selection;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Random;
import java.util.TreeSet;

/**
 * A Java program built outside the source tree against the installed
 * binding, resolved through its Maven coordinates (the packaging tests;
 * docs/bindings/java.md shows the same commands). It prefills one layer with
 * random K/V, waits for the PQ index, selects for a random query, fetches the
 * selected rows and checks each against what it prefilled, then prints the
 * JNI module and libpqcache files the JVM mapped (from /proc/self/maps), so
 * that the test sees which copies were loaded.
 *
 * <p>Usage: {@code java ... example.PqcacheConsumer EXPECTED_VERSION}
 */
public final class PqcacheConsumer {
  private PqcacheConsumer() {}

  public static void main(String[] args) throws IOException {
    if (args.length != 1) {
      System.err.println("usage: PqcacheConsumer EXPECTED_VERSION");
      System.exit(2);
    }
    if (!PqContext.version().equals(args[0])) {
      fail("the library says version " + PqContext.version() + ", expected " + args[0]);
    }
    final int qHeads = 4;
    final int kvHeads = 2;
    final int dim = 16;
    final int tokens = 512;
    final long seq = 7;
    Config config = Config.builder().layers(1).queryHeads(qHeads).kvHeads(kvHeads).headDim(dim)
        .dtype(DType.F32).build();
    Random rng = new Random(1);
    float[] keys = random(rng, tokens * kvHeads * dim);
    float[] values = random(rng, tokens * kvHeads * dim);
    int[] counts = new int[kvHeads];
    try (PqContext cache = new PqContext(config)) {
      cache.addSequence(seq);
      cache.prefillLayer(seq, 0, tokens, keys, values);
      cache.waitBuilds();
      Selection sel = cache.decodeSelect(seq, 0, random(rng, qHeads * dim));
      int capacity = sel.capacity();
      float[] k = new float[kvHeads * capacity * dim];
      float[] v = new float[k.length];
      cache.fetchKV(seq, 0, sel, k, v);
      for (int h = 0; h < kvHeads; h++) {
        int[] positions = sel.positions(h);
        counts[h] = positions.length;
        if (positions.length == 0 || positions.length >= tokens) {
          fail("kv head " + h + ": " + positions.length + " of " + tokens + " tokens selected");
        }
        for (int i = 0; i < positions.length; i++) {
          for (int d = 0; d < dim; d++) {
            int src = (positions[i] * kvHeads + h) * dim + d;
            int dst = (h * capacity + i) * dim + d;
            if (k[dst] != keys[src] || v[dst] != values[src]) {
              fail("kv head " + h + ", token " + positions[i]
                  + ": the fetched row differs from the prefilled one");
            }
          }
        }
      }
    }
    System.out.println("libpqcache " + PqContext.version() + ": selected " + counts[0] + " and "
        + counts[1] + " of " + tokens + " tokens; the fetched rows match");
    // The files behind the mappings, e.g. "jni: /usr/lib/jni/libpqcache_jni.so".
    TreeSet<String> jni = new TreeSet<>();
    TreeSet<String> library = new TreeSet<>();
    for (String line : Files.readAllLines(Path.of("/proc/self/maps"))) {
      int slash = line.indexOf('/');
      if (slash < 0) {
        continue;
      }
      String file = line.substring(slash);
      String name = Path.of(file).getFileName().toString();
      if (name.startsWith("libpqcache_jni")) {
        jni.add(file);
      } else if (name.startsWith("libpqcache.so")) {
        library.add(file);
      }
    }
    jni.forEach(f -> System.out.println("jni: " + f));
    library.forEach(f -> System.out.println("library: " + f));
  }

  private static float[] random(Random rng, int n) {
    float[] a = new float[n];
    for (int i = 0; i < n; i++) {
      a[i] = rng.nextFloat() * 2 - 1;
    }
    return a;
  }

  private static void fail(String message) {
    System.err.println("FAIL: " + message);
    System.exit(1);
  }
}
