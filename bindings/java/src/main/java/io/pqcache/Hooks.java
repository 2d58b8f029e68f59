package io.pqcache;

import io.pqcache.swig.pq_config;
import io.pqcache.swig.pqcache;
import java.nio.charset.StandardCharsets;
import java.util.Objects;

/**
 * What a context made with {@link PqContext#PqContext(Config, Hooks)} calls
 * ({@code pq_create_with_hooks}, docs/hooks.md): a log consumer, listeners
 * for index builds' progress and their end, and a {@link PqPool} shared with
 * other contexts.
 * Immutable; one Hooks may serve several contexts.
 *
 * <p><b>Threads.</b> The library calls the consumer and the listener on its
 * worker threads (a build's: attached to the JVM as daemon threads named
 * "pqcache-worker") or on the thread of a call, possibly from several threads
 * at once. They must not call into the context, except what
 * {@code pq_build_done_fn} in pqcache.h allows the listener: calls that do not
 * wait for builds ({@link PqContext#stats()}, calls on the layer it names),
 * not {@link PqContext#waitBuilds()} or {@link PqContext#close()}. A call
 * racing with {@code close()} throws {@link PqClosedException}, and
 * {@code close()} returns after the hooks of the builds it waited for.
 *
 * <p><b>Exceptions</b> thrown by the consumer or the listener go to the
 * thread's {@link Thread.UncaughtExceptionHandler} (by default, printed to
 * stderr) and no further: the library cannot take them, and the context goes
 * on.
 *
 * <p>The context holds its Hooks until it is freed: hooks that refer to their
 * context keep it reachable, so close it rather than leave it to the
 * garbage collector.
 */
public final class Hooks {
  /** Receives one log message, without a trailing newline. */
  @FunctionalInterface
  public interface LogConsumer {
    void log(LogLevel level, String message);
  }

  /**
   * An index build of (seqId, layer) ended: {@link Status#OK} when the layer's next call uses
   * the new index without waiting, else the error that call will report. Builds cancelled
   * before they finished (superseded, truncated, removed, closed) do not report.
   */
  @FunctionalInterface
  public interface BuildDoneListener {
    void buildDone(long seqId, int layer, Status status);
  }

  /**
   * An index build advanced ({@code pq_build_progress_fn}): after each K-Means iteration and
   * each 65,536 tokens coded, before the build's {@link BuildDoneListener}, on the build's
   * thread (the build waits for it: return quickly). It may call what that listener may.
   */
  @FunctionalInterface
  public interface BuildProgressListener {
    void buildProgress(BuildProgress progress);
  }

  // Set while this thread runs a hook: PqContext's calls from a hook do not
  // queue behind a waiting close() (PqContext.call says why).
  private static final ThreadLocal<Boolean> IN_HOOK = ThreadLocal.withInitial(() -> false);

  private final LogConsumer log;
  private final LogLevel logLevel;
  private final BuildDoneListener buildDone;
  private final BuildProgressListener buildProgress;
  private final PqPool pool;

  private Hooks(Builder builder) {
    log = builder.log;
    logLevel = builder.logLevel;
    buildDone = builder.buildDone;
    buildProgress = builder.buildProgress;
    pool = builder.pool;
  }

  /** No hooks, level {@link LogLevel#WARN}, the context's own pool (pq_hooks_default). */
  public static Builder builder() {
    return new Builder();
  }

  /** Sets the hooks one by one; unset ones are off. */
  public static final class Builder {
    private LogConsumer log;
    private LogLevel logLevel = LogLevel.WARN;
    private BuildDoneListener buildDone;
    private BuildProgressListener buildProgress;
    private PqPool pool;

    private Builder() {}

    /** Receives the messages at {@link #logLevel} and above; null: none. */
    public Builder log(LogConsumer consumer) {
      log = consumer;
      return this;
    }

    /** The least severe level logged; default {@link LogLevel#WARN}. */
    public Builder logLevel(LogLevel level) {
      logLevel = Objects.requireNonNull(level,
          "pq_create_with_hooks: hooks.logLevel is null; expected a LogLevel (ERROR to DEBUG)");
      return this;
    }

    /** Runs when an index build ends; null: nothing. */
    public Builder onBuildDone(BuildDoneListener listener) {
      buildDone = listener;
      return this;
    }

    /** Hears each index build advance; null: nothing. */
    public Builder onBuildProgress(BuildProgressListener listener) {
      buildProgress = listener;
      return this;
    }

    /** Runs the context's work on this shared pool; null: a pool of its own. */
    public Builder pool(PqPool shared) {
      pool = shared;
      return this;
    }

    public Hooks build() {
      return new Hooks(this);
    }
  }

  public LogLevel logLevel() {
    return logLevel;
  }

  /** The shared pool, or null. */
  public PqPool pool() {
    return pool;
  }

  /** Whether the current thread is running a hook. */
  static boolean runningOnThisThread() {
    return IN_HOOK.get();
  }

  /**
   * pq_create_with_hooks of {@code config} into {@code created}: returns the native hooks
   * (pqj_hooks*), which the caller frees with {@link #free} after pq_destroy; nothing is left
   * to free when it throws.
   */
  long create(pq_config config, long[] created) {
    if (pool == null) {
      return createOn(0, config, created);
    }
    return pool.use("pq_create_with_hooks", address -> createOn(address, config, created));
  }

  private long createOn(long poolAddress, pq_config config, long[] created) {
    long hooks = pqcache.pqj_hooks_new(this, logLevel.code(), log != null ? 1 : 0,
        buildDone != null ? 1 : 0, buildProgress != null ? 1 : 0, poolAddress);
    try {
      pqcache.pqj_create_with_hooks(config, hooks, created);
    } catch (RuntimeException e) {
      free(hooks);
      throw e;
    }
    return hooks;
  }

  /** Frees what {@link #create} returned, after the context's pq_destroy. */
  static void free(long hooks) {
    pqcache.pqj_hooks_delete(hooks);
  }

  // --- called from the JNI shim (bindings/swig/java_hooks.i) ---

  void fromNativeLog(int level, byte[] utf8) {
    run(() -> log.log(LogLevel.fromCode(level), new String(utf8, StandardCharsets.UTF_8)));
  }

  void fromNativeBuildDone(long seqId, int layer, int status) {
    run(() -> buildDone.buildDone(seqId, layer, Status.fromCode(status)));
  }

  void fromNativeBuildProgress(long seqId, int layer, int stage, long done, long total,
      double fraction) {
    run(() -> buildProgress.buildProgress(new BuildProgress(seqId, layer,
        BuildProgress.Stage.fromCode(stage), done, total, fraction)));
  }

  /** Runs a hook; what it throws goes to the thread's uncaught-exception handler, not to C. */
  private static void run(Runnable hook) {
    boolean nested = IN_HOOK.get();
    IN_HOOK.set(true);
    try {
      hook.run();
    } catch (Throwable thrown) {
      Thread thread = Thread.currentThread();
      thread.getUncaughtExceptionHandler().uncaughtException(thread, thrown);
    } finally {
      IN_HOOK.set(nested);
    }
  }
}
