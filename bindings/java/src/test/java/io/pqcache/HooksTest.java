package io.pqcache;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.Collections;
import java.util.Comparator;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import org.junit.jupiter.api.Test;

/**
 * The hooks of pq_create_with_hooks from Java: log lines at the level asked, a listener per
 * finished build and one for its progress, a pool shared by contexts, exceptions kept out of the library, named errors,
 * and a build-done listener that calls its context while close() runs.
 */
class HooksTest {
  private static final long SEQ = 7;
  private static final int TOKENS = 300;
  // What a test waits for at most: a guard against a hang, not a timing.
  private static final long GUARD_SECONDS = 60;

  /** One finished build, as the listener saw it. */
  private record Build(long seqId, int layer, Status status, String thread, boolean daemon) {}

  /** One log message. */
  private record Line(LogLevel level, String message) {}

  private static Config config(int layers, int workerThreads) {
    return ReferenceCycle.smallPq(Selector.PQ).layers(layers).workerThreads(workerThreads)
        .build();
  }

  /** Adds sequence SEQ with TOKENS tokens in each of the given layers and waits for the builds. */
  private static void prefill(PqContext ctx, int... layers) {
    prefillWithoutWaiting(ctx, layers);
    ctx.waitBuilds();
  }

  private static void prefillWithoutWaiting(PqContext ctx, int... layers) {
    int kv = TOKENS * ReferenceCycle.KV_HEADS * ReferenceCycle.HEAD_DIM;
    ctx.addSequence(SEQ);
    for (int layer : layers) {
      ctx.prefillLayer(SEQ, layer, TOKENS, ReferenceCycle.generate(81 + 2 * layer, kv),
          ReferenceCycle.generate(82 + 2 * layer, kv));
    }
  }

  /** Waits until done says so, at most GUARD_SECONDS (the assertions after it then fail). */
  private static void waitUntil(BooleanSupplier done) {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(GUARD_SECONDS);
    try {
      while (!done.getAsBoolean() && System.nanoTime() < deadline) {
        Thread.sleep(1);
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  /** What a listener's call to stats() answered: Stats or the exception. */
  private static Object statsOrException(PqContext ctx) {
    try {
      return ctx.stats();
    } catch (RuntimeException e) {
      return e;
    }
  }

  /** close() on a daemon thread, joined for at most GUARD_SECONDS: false if it hangs. */
  private static boolean closeReturns(Thread closer) throws InterruptedException {
    closer.setDaemon(true);
    closer.start();
    closer.join(TimeUnit.SECONDS.toMillis(GUARD_SECONDS));
    return !closer.isAlive();
  }

  private static Hooks.BuildDoneListener recordInto(List<Build> builds) {
    return (seqId, layer, status) -> builds.add(new Build(seqId, layer, status,
        Thread.currentThread().getName(), Thread.currentThread().isDaemon()));
  }

  private static boolean any(List<Line> lines, LogLevel level, String part) {
    return lines.stream().anyMatch(l -> l.level() == level && l.message().contains(part));
  }

  @Test
  void logMessagesArriveAtTheLevelAsked() {
    List<Line> debug = Collections.synchronizedList(new ArrayList<>());
    PqContext ctx = new PqContext(config(1, 1), Hooks.builder()
        .log((level, message) -> debug.add(new Line(level, message)))
        .logLevel(LogLevel.DEBUG)
        .build());
    prefill(ctx, 0);
    ctx.close(); // after the builds' log lines
    assertTrue(any(debug, LogLevel.INFO, "context created"), debug.toString());
    assertTrue(any(debug, LogLevel.DEBUG, "sequence added: seq_id 7"), debug.toString());
    assertTrue(any(debug, LogLevel.INFO, "index built: seq_id 7 layer 0"), debug.toString());

    // At ERROR, only a failed call logs: its message, as the exception carries it.
    List<Line> errors = Collections.synchronizedList(new ArrayList<>());
    PqException failure;
    try (PqContext quiet = new PqContext(config(1, 1), Hooks.builder()
        .log((level, message) -> errors.add(new Line(level, message)))
        .logLevel(LogLevel.ERROR)
        .build())) {
      prefill(quiet, 0);
      failure = assertThrows(PqException.class, () -> quiet.sequenceLength(99, 0));
    }
    assertEquals(List.of(new Line(LogLevel.ERROR, failure.libraryMessage())), errors);
  }

  @Test
  void buildDoneArrivesOncePerLayerWithOkOnADaemonWorkerThread() throws InterruptedException {
    List<Build> builds = Collections.synchronizedList(new ArrayList<>());
    Set<Thread> workers = Collections.synchronizedSet(new HashSet<>());
    Hooks.BuildDoneListener record = recordInto(builds);
    PqContext ctx = new PqContext(config(2, 1), Hooks.builder()
        .onBuildDone((seqId, layer, status) -> {
          workers.add(Thread.currentThread());
          record.buildDone(seqId, layer, status);
        }).build());
    prefill(ctx, 0, 1);
    ctx.close(); // returns after the builds' listeners
    List<Build> sorted = new ArrayList<>(builds);
    sorted.sort(Comparator.comparingInt(Build::layer));
    assertEquals(List.of(new Build(SEQ, 0, Status.OK, "pqcache-worker", true),
        new Build(SEQ, 1, Status.OK, "pqcache-worker", true)), sorted);
    // close() stopped the context's own worker: it was detached from the JVM as it ended.
    assertEquals(1, workers.size(), workers.toString());
    for (Thread worker : workers) {
      worker.join(TimeUnit.SECONDS.toMillis(GUARD_SECONDS));
      assertFalse(worker.isAlive(), worker + " is still attached");
    }
  }

  /** Build progress: every K-Means iteration, then the encode, rising to 1 before build-done. */
  @Test
  void buildProgressRisesThroughEachBuildBeforeItsBuildDone() {
    List<Object> events = Collections.synchronizedList(new ArrayList<>());
    Config config = ReferenceCycle.smallPq(Selector.PQ).layers(2).workerThreads(1)
        .kmeansIterations(3).kmeansTolerance(0f).build();
    PqContext ctx = new PqContext(config, Hooks.builder()
        .onBuildProgress(events::add)
        .onBuildDone((seqId, layer, status) -> events.add(new Build(seqId, layer, status, "", false)))
        .build());
    prefill(ctx, 0, 1);
    ctx.close();
    for (int layer = 0; layer < 2; layer++) {
      List<String> steps = new ArrayList<>();
      Object last = null;
      double fraction = 0;
      synchronized (events) {
        for (Object e : events) {
          if (e instanceof BuildProgress p && p.layer() == layer) {
            assertEquals(SEQ, p.seqId());
            assertTrue(p.fraction() >= fraction && p.fraction() <= 1, p.toString());
            fraction = p.fraction();
            steps.add(p.stage() + " " + p.done() + "/" + p.total());
            last = e;
          } else if (e instanceof Build b && b.layer() == layer) {
            last = e;
          }
        }
      }
      assertEquals(List.of("KMEANS 1/3", "KMEANS 2/3", "KMEANS 3/3", "ENCODE " + TOKENS + "/" + TOKENS),
          steps, "layer " + layer);
      assertEquals(1.0, fraction);
      assertEquals(new Build(SEQ, layer, Status.OK, "", false), last, "build-done comes last");
    }
    IllegalArgumentException unknown =
        assertThrows(IllegalArgumentException.class, () -> BuildProgress.Stage.fromCode(7));
    assertTrue(unknown.getMessage().contains("7"), unknown.getMessage());
  }

  /**
   * A failing build cannot be forced from Java (the library's builds fail only when out of
   * memory or on an internal error; the allocator hook that could fail one is C only): the
   * listener's side of the status, called as the JNI shim calls it, is checked instead.
   */
  @Test
  void aFailedBuildReachesTheListenerWithItsStatus() {
    List<Build> builds = new ArrayList<>();
    Hooks hooks = Hooks.builder().onBuildDone(recordInto(builds)).build();
    hooks.fromNativeBuildDone(-1L, 3, Status.OUT_OF_MEMORY.code());
    hooks.fromNativeBuildDone(5, 0, -99); // a status newer than this binding
    String thread = Thread.currentThread().getName();
    boolean daemon = Thread.currentThread().isDaemon();
    assertEquals(List.of(new Build(-1L, 3, Status.OUT_OF_MEMORY, thread, daemon),
        new Build(5, 0, Status.UNKNOWN, thread, daemon)), builds);
  }

  @Test
  void anExceptionInAHookGoesToTheUncaughtHandlerNotTheLibrary() {
    List<Throwable> seen = Collections.synchronizedList(new ArrayList<>());
    Thread.UncaughtExceptionHandler old = Thread.getDefaultUncaughtExceptionHandler();
    Thread.setDefaultUncaughtExceptionHandler((thread, thrown) -> seen.add(thrown));
    try {
      PqContext ctx = new PqContext(config(1, 1), Hooks.builder()
          .onBuildDone((seqId, layer, status) -> {
            throw new IllegalStateException("listener failed");
          }).build());
      prefill(ctx, 0);
      assertEquals(TOKENS, ctx.sequenceLength(SEQ, 0)); // the context goes on
      ctx.close();
    } finally {
      Thread.setDefaultUncaughtExceptionHandler(old);
    }
    assertEquals(1, seen.size(), seen.toString());
    assertEquals("listener failed", seen.get(0).getMessage());
  }

  @Test
  void twoContextsShareOnePool() {
    PqPool pool = new PqPool(1);
    assertEquals(1, pool.threads());
    // Each context would run 4 threads of its own without the pool: the
    // builds of the two would then run on two threads at least.
    Set<Long> threads = Collections.synchronizedSet(new HashSet<>());
    List<Status> statuses = Collections.synchronizedList(new ArrayList<>());
    Hooks hooks = Hooks.builder().pool(pool).onBuildDone((seqId, layer, status) -> {
      statuses.add(status);
      threads.add(Thread.currentThread().getId());
    }).build();
    PqContext first = new PqContext(config(1, 4), hooks);
    PqContext second = new PqContext(config(1, 4), hooks);
    pool.close(); // the contexts keep the pool
    assertTrue(pool.isClosed());
    for (PqContext ctx : List.of(first, second)) {
      prefill(ctx, 0);
      assertTrue(ctx.layerInfo(SEQ, 0).indexReady());
      ctx.close();
    }
    assertEquals(List.of(Status.OK, Status.OK), statuses);
    assertEquals(1, threads.size(), "threads the builds ran on: " + threads);
  }

  @Test
  void aClosedPoolIsANamedError() {
    PqPool pool = new PqPool(1);
    pool.close();
    pool.close(); // again: nothing
    PqException threads = assertThrows(PqException.class, pool::threads);
    assertEquals(Status.BAD_STATE, threads.status());
    assertEquals("pq_pool_threads: the pool is closed", threads.libraryMessage());
    Hooks hooks = Hooks.builder().pool(pool).build();
    PqException create = assertThrows(PqException.class, () -> new PqContext(config(1, 1), hooks));
    assertEquals(Status.BAD_STATE, create.status());
    assertEquals("pq_create_with_hooks: the pool is closed", create.libraryMessage());
    PqException size = assertThrows(PqException.class, () -> new PqPool(-1));
    assertEquals(Status.INVALID_ARGUMENT, size.status());
    assertTrue(size.libraryMessage().contains("threads"), size.libraryMessage());
  }

  @Test
  void anInvalidLogLevelIsANamedError() {
    IllegalArgumentException code =
        assertThrows(IllegalArgumentException.class, () -> LogLevel.fromCode(9));
    assertEquals("log_level is 9; expected 0 (ERROR), 1 (WARN), 2 (INFO) or 3 (DEBUG)",
        code.getMessage());
    assertEquals(LogLevel.DEBUG, LogLevel.fromCode(3));
    NullPointerException level = assertThrows(NullPointerException.class,
        () -> Hooks.builder().logLevel(null));
    assertTrue(level.getMessage().contains("hooks.logLevel is null"), level.getMessage());
    NullPointerException hooks = assertThrows(NullPointerException.class,
        () -> new PqContext(config(1, 1), null));
    assertEquals("pq_create_with_hooks: hooks is null; expected a Hooks", hooks.getMessage());
    assertEquals(LogLevel.WARN, Hooks.builder().build().logLevel()); // pq_hooks_default's
  }

  /**
   * The listener waits until close() has marked the context closed, then calls it: close()
   * must not hold what that call needs while pq_destroy waits for the listener. A deadlock
   * fails the test when the guard runs out (close() runs on a daemon thread).
   */
  @Test
  void aListenerCallingItsContextWhileCloseRunsDoesNotDeadlock() throws Exception {
    CompletableFuture<PqContext> context = new CompletableFuture<>();
    List<Object> answers = Collections.synchronizedList(new ArrayList<>());
    PqContext ctx = new PqContext(config(1, 1), Hooks.builder()
        .onBuildDone((seqId, layer, status) -> {
          PqContext self = context.join();
          waitUntil(self::isClosed);
          answers.add(statsOrException(self));
        }).build());
    context.complete(ctx);
    prefill(ctx, 0); // the index is ready; its listener may not have run yet
    assertTrue(closeReturns(new Thread(ctx::close, "closer")), "close() did not return: deadlock");
    assertEquals(1, answers.size(), answers.toString());
    PqClosedException closed = assertInstanceOf(PqClosedException.class, answers.get(0));
    assertEquals("pq_stats_get: the context is closed", closed.libraryMessage());
  }

  /**
   * One worker thread: layer 0's listener holds it while layer 1's build waits behind it, a
   * thread waits for that build in waitBuilds() (holding the context), and close() waits for
   * that thread. The listener's call must not queue behind close(): it would wait for close(),
   * which waits for waitBuilds(), which waits for the worker the listener holds. Each step is
   * waited for (no sleep decides it); a deadlock fails the test when the guard runs out.
   */
  @Test
  void aListenerCallIsNotQueuedBehindACloseThatWaitsForItsWorker() throws Exception {
    CompletableFuture<PqContext> context = new CompletableFuture<>();
    CompletableFuture<Thread> closing = new CompletableFuture<>();
    List<Object> answers = Collections.synchronizedList(new ArrayList<>());
    PqContext ctx = new PqContext(config(2, 1), Hooks.builder()
        .onBuildDone((seqId, layer, status) -> {
          if (layer != 0) {
            return;
          }
          PqContext self = context.join();
          Thread closer = closing.join();
          // Until waitBuilds holds the context and close() waits for it.
          waitUntil(() -> self.callsInProgress() == 1 && closer.getState() == Thread.State.WAITING);
          answers.add(self.callsInProgress() == 1 ? "waitBuilds in progress" : "not arranged");
          answers.add(statsOrException(self));
        }).build());
    context.complete(ctx);
    prefillWithoutWaiting(ctx, 0, 1);
    Thread waiter = new Thread(ctx::waitBuilds, "waiter");
    waiter.setDaemon(true);
    waiter.start();
    Thread closer = new Thread(() -> {
      waitUntil(() -> ctx.callsInProgress() == 1); // the waiter in waitBuilds first
      ctx.close();
    }, "closer");
    closing.complete(closer);
    assertTrue(closeReturns(closer), "close() did not return: deadlock");
    assertEquals(2, answers.size(), answers.toString());
    assertEquals("waitBuilds in progress", answers.get(0));
    assertInstanceOf(Stats.class, answers.get(1), answers.toString());
  }
}
