package io.pqcache;

import io.pqcache.swig.pq_status;
import io.pqcache.swig.pqcache;
import java.lang.ref.Cleaner;
import java.util.function.LongFunction;

/**
 * Worker threads that several contexts share ({@code pq_pool}): a server
 * holding a context per model or per tenant runs one set of threads instead
 * of one per context. Give it to contexts through {@link Hooks.Builder#pool};
 * their index builds, K-Means rounds and batched calls queue on it in
 * arrival order, and their {@link Config.Builder#workerThreads} is ignored
 * (a context reports the pool's threads).
 *
 * <p>{@link #close()} releases this object's reference only: the threads stop
 * once no context uses the pool either (a context holds it until it is
 * closed). A pool never closed is released when it becomes unreachable.
 * Thread-safe.
 */
public final class PqPool implements AutoCloseable {
  /** The native pool; also the Cleaner's action, so it must not refer to the PqPool. */
  private static final class Handle implements Runnable {
    final long address;

    Handle(long address) {
      this.address = address;
    }

    @Override
    public void run() {
      pqcache.pq_pool_destroy(address);
    }
  }

  private final Handle handle;
  private final Cleaner.Cleanable cleanable;
  private boolean closed; // guarded by this

  /**
   * Starts a pool of {@code threads} worker threads (1 to 1024; 0: the hardware threads).
   *
   * @throws PqException INVALID_ARGUMENT naming {@code threads}, OUT_OF_MEMORY
   */
  public PqPool(int threads) {
    long[] created = new long[1];
    pqcache.pq_pool_create(threads, created);
    handle = new Handle(created[0]);
    cleanable = PqContext.CLEANER.register(this, handle);
  }

  /**
   * The number of worker threads.
   *
   * @throws PqException BAD_STATE "pq_pool_threads: the pool is closed"
   */
  public int threads() {
    return use("pq_pool_threads", pool -> {
      int[] threads = new int[1];
      pqcache.pq_pool_threads(pool, threads);
      return threads[0];
    });
  }

  /** Releases this object's reference to the pool; closing again does nothing. */
  @Override
  public synchronized void close() {
    closed = true;
    cleanable.clean(); // at most once
  }

  /** Whether {@link #close()} was called. */
  public synchronized boolean isClosed() {
    return closed;
  }

  /**
   * Runs op with the open pool's address; the pool cannot be released meanwhile (pqcache.h:
   * pq_pool_destroy must not race with a pq_create_with_hooks naming the pool). {@code function},
   * the C function op calls, names it in the BAD_STATE of a closed pool.
   */
  synchronized <T> T use(String function, LongFunction<T> op) {
    if (closed) {
      throw new PqException(pq_status.PQ_ERR_BAD_STATE, function + ": the pool is closed");
    }
    return op.apply(handle.address);
  }

  @Override
  public String toString() {
    return isClosed() ? "PqPool[closed]" : "PqPool[" + threads() + " threads]";
  }
}
