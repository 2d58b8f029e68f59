package io.pqcache.example;

import io.pqcache.Config;
import io.pqcache.LayerInfo;
import io.pqcache.PqContext;
import io.pqcache.PqException;
import io.pqcache.Selection;
import io.pqcache.Stats;
import java.nio.ByteBuffer;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

/**
 * Replays a real attention trace through the service, as concurrent
 * requests: each prefills every traced layer with the prompt (positions
 * before q_first), then runs one decode step per traced query: append the
 * token's K/V, select, fetch. It checks that every fetched row is the trace's
 * row of the selected position, that all requests select the same tokens,
 * and reports the share of the model's true attention (softmax over all
 * past tokens, from the trace's Q and K) that the selected tokens hold.
 *
 * <pre>
 * java -cp pqcache.jar:classes io.pqcache.example.TraceReplay TRACE
 *      [--requests N] [--steps N] [--min-mass M]
 * </pre>
 * Exit status 1 if a check fails or the mean attention mass is below M.
 */
public final class TraceReplay {
  private TraceReplay() {}

  /** What one request saw. */
  private record Outcome(long requestId, double prefillSeconds, double decodeSeconds,
      long selectedTokens, long selections, long positionsDigest, long mismatchedRows,
      double[] massPerLayer) {}

  public static void main(String[] args) throws Exception {
    Path tracePath = null;
    int requests = 2;
    int steps = Integer.MAX_VALUE;
    double minMass = 0;
    for (int i = 0; i < args.length; i++) {
      switch (args[i]) {
        case "--requests" -> requests = Integer.parseInt(args[++i]);
        case "--steps" -> steps = Integer.parseInt(args[++i]);
        case "--min-mass" -> minMass = Double.parseDouble(args[++i]);
        default -> tracePath = Path.of(args[i]);
      }
    }
    if (tracePath == null || requests < 1 || steps < 1) {
      System.err.println("usage: TraceReplay TRACE [--requests N] [--steps N] [--min-mass M]");
      System.exit(2);
    }

    PqTrace trace = PqTrace.open(tracePath);
    int decodeSteps = Math.min(steps, trace.tokens - trace.queryFirst);
    System.out.printf(Locale.ROOT, "libpqcache %s (Java binding)%n", PqContext.version());
    System.out.printf(Locale.ROOT,
        "trace %s: %s over %s, %s, %d tokens, layers %s of %d, %d q heads / %d kv heads x %d%n",
        tracePath.getFileName(), trace.model, trace.text, trace.dtype, trace.tokens,
        java.util.Arrays.toString(trace.layers), trace.modelLayers, trace.queryHeads,
        trace.kvHeads, trace.headDim);

    // The service's configuration: the model's geometry, the library's
    // defaults for everything else (PQ selector, 1/5 of the middle tokens).
    Config config = Config.builder()
        .layers(trace.modelLayers)
        .queryHeads(trace.queryHeads)
        .kvHeads(trace.kvHeads)
        .headDim(trace.headDim)
        .dtype(trace.dtype)
        .build();

    List<Outcome> outcomes = new ArrayList<>();
    try (KvCacheService service = new KvCacheService(config)) {
      System.out.printf(Locale.ROOT, "%d requests, each: prefill %d tokens x %d layers, then %d"
          + " decode steps (append + select + fetch per layer)%n", requests, trace.queryFirst,
          trace.layers.length, decodeSteps);
      ExecutorService workers = Executors.newFixedThreadPool(requests);
      try {
        List<Future<Outcome>> running = new ArrayList<>();
        for (int r = 0; r < requests; r++) {
          long requestId = 1000 + r;
          boolean measure = r == 0; // the attention reference is the same for all
          running.add(workers.submit(
              () -> serve(service, trace, requestId, decodeSteps, measure)));
        }
        for (Future<Outcome> outcome : running) {
          outcomes.add(outcome.get());
        }
      } finally {
        workers.shutdownNow();
      }
      report(service, trace, outcomes, minMass);
    } catch (PqException e) {
      System.err.println("libpqcache error: " + e.getMessage());
      System.exit(1);
    }
  }

  private static Outcome serve(KvCacheService service, PqTrace trace, long requestId,
      int decodeSteps, boolean measure) {
    int layers = trace.layers.length;
    int prompt = trace.queryFirst;
    long start = System.nanoTime();
    service.admit(requestId);
    for (int i = 0; i < layers; i++) {
      service.prefill(requestId, trace.layers[i], prompt, trace.keys(i, 0, prompt),
          trace.values(i, 0, prompt));
    }
    double prefillSeconds = (System.nanoTime() - start) * 1e-9;

    AttentionReference reference = measure ? new AttentionReference(trace) : null;
    double[] mass = new double[layers];
    KvCacheService.FetchBuffers[] out = new KvCacheService.FetchBuffers[layers];
    for (int i = 0; i < layers; i++) {
      out[i] = new KvCacheService.FetchBuffers();
    }
    long selected = 0;
    long selections = 0;
    long digest = 0xcbf29ce484222325L;
    long mismatched = 0;
    int rowBytes = trace.headDim * trace.dtype.bytes();
    double decodeSeconds = 0;
    for (int step = 0; step < decodeSteps; step++) {
      int position = prompt + step;
      for (int i = 0; i < layers; i++) {
        long t0 = System.nanoTime();
        Selection selection = service.decodeStep(requestId, trace.layers[i],
            trace.keys(i, position, 1), trace.values(i, position, 1), trace.query(i, position),
            out[i]);
        decodeSeconds += (System.nanoTime() - t0) * 1e-9;

        ByteBuffer allKeys = trace.keys(i, 0, position + 1);
        for (int h = 0; h < trace.kvHeads; h++) {
          int[] positions = selection.positions(h);
          selected += positions.length;
          selections++;
          for (int n = 0; n < positions.length; n++) {
            digest = (digest ^ positions[n]) * 0x100000001b3L;
            ByteBuffer fetched = out[i].keys()
                .slice((h * selection.capacity() + n) * rowBytes, rowBytes);
            ByteBuffer stored = allKeys
                .slice((positions[n] * trace.kvHeads + h) * rowBytes, rowBytes);
            if (!fetched.equals(stored)) {
              mismatched++;
            }
          }
        }
        if (reference != null) {
          mass[i] += reference.selectedMass(i, position, selection);
        }
      }
    }
    service.release(requestId);
    for (int i = 0; i < layers; i++) {
      mass[i] /= decodeSteps;
    }
    return new Outcome(requestId, prefillSeconds, decodeSeconds, selected, selections, digest,
        mismatched, measure ? mass : null);
  }

  private static void report(KvCacheService service, PqTrace trace, List<Outcome> outcomes,
      double minMass) {
    boolean ok = true;
    Outcome first = outcomes.get(0);
    for (Outcome o : outcomes) {
      System.out.printf(Locale.ROOT,
          "request %d: prefill %.1f ms, decode %.1f ms (%.0f us per layer step),"
              + " %.1f tokens selected per kv head, fetched rows wrong: %d%n",
          o.requestId, o.prefillSeconds * 1e3, o.decodeSeconds * 1e3,
          o.decodeSeconds * 1e6 / Math.max(1, o.selections / trace.kvHeads),
          (double) o.selectedTokens / o.selections, o.mismatchedRows);
      if (o.mismatchedRows != 0) {
        System.out.println("  FAIL: fetched K rows differ from the trace");
        ok = false;
      }
      if (o.positionsDigest != first.positionsDigest) {
        System.out.println("  FAIL: selected other tokens than request " + first.requestId);
        ok = false;
      }
    }
    double meanMass = 0;
    for (int i = 0; i < trace.layers.length; i++) {
      System.out.printf(Locale.ROOT, "layer %2d: selected tokens hold %.3f of the attention%n",
          trace.layers[i], first.massPerLayer[i]);
      meanMass += first.massPerLayer[i] / trace.layers.length;
    }
    System.out.printf(Locale.ROOT, "mean attention mass held: %.3f (floor %.3f)%n", meanMass,
        minMass);
    if (meanMass < minMass) {
      System.out.println("FAIL: attention mass below the floor");
      ok = false;
    }
    Stats stats = service.stats();
    System.out.printf(Locale.ROOT,
        "context: %d index builds (%d K-Means iterations, %.2f s of worker time),"
            + " %d selects, %d fetches, %.1f MB fetched, %d live sequences%n",
        stats.buildsFinished(), stats.kmeansIterations(), stats.buildSeconds(),
        stats.selectCalls(), stats.fetchCalls(), stats.bytesFetched() / 1e6, stats.sequences());
    System.out.println(ok ? "OK" : "FAILED");
    if (!ok) {
      System.exit(1);
    }
  }

  /** The model's attention over all past tokens, recomputed from the trace's Q and K. */
  private static final class AttentionReference {
    private final PqTrace trace;
    private final float[][] keys; // per stored layer, [tokens][kvHeads][headDim]
    private final float[] logits;

    AttentionReference(PqTrace trace) {
      this.trace = trace;
      keys = new float[trace.layers.length][];
      int n = trace.tokens * trace.kvHeads * trace.headDim;
      for (int i = 0; i < keys.length; i++) {
        ByteBuffer stored = trace.keys(i, 0, trace.tokens);
        keys[i] = new float[n];
        for (int e = 0; e < n; e++) {
          keys[i][e] = PqTrace.element(stored, e, trace.dtype);
        }
      }
      logits = new float[trace.tokens];
    }

    /** Softmax mass on the selected tokens, averaged over the query heads. */
    double selectedMass(int layer, int position, Selection selection) {
      int d = trace.headDim;
      int group = trace.queryHeads / trace.kvHeads;
      double scale = 1.0 / Math.sqrt(d);
      ByteBuffer queries = trace.query(layer, position);
      float[] q = new float[d];
      double total = 0;
      for (int qh = 0; qh < trace.queryHeads; qh++) {
        int kvh = qh / group;
        for (int e = 0; e < d; e++) {
          q[e] = PqTrace.element(queries, qh * d + e, trace.dtype);
        }
        float max = Float.NEGATIVE_INFINITY;
        for (int t = 0; t <= position; t++) {
          int row = (t * trace.kvHeads + kvh) * d;
          float dot = 0;
          for (int e = 0; e < d; e++) {
            dot += q[e] * keys[layer][row + e];
          }
          logits[t] = (float) (dot * scale);
          max = Math.max(max, logits[t]);
        }
        double sum = 0;
        for (int t = 0; t <= position; t++) {
          sum += Math.exp(logits[t] - max);
        }
        double held = 0;
        for (int t : selection.positions(kvh)) {
          held += Math.exp(logits[t] - max);
        }
        total += held / sum;
      }
      return total / trace.queryHeads;
    }
  }
}
