"""A sequence's saved state on a Redis server: libpqcache_redis.so for Python.

    import pqcache, pqcache.redis
    with pqcache.redis.Redis("127.0.0.1", 6379) as r:
        r.put(ctx_a, 7, "session:42")        # pq_sequence_save, in blocks
        r.get(ctx_b, 7, "session:42")        # pq_sequence_restore in ctx_b
        r.info("session:42")                 # {"state_bytes": ..., ...}
        with r.get_begin(ctx_c, 7, "session:42") as t:   # selectable now
            ctx_c.select(7, 0, query)
            t.finish()                       # or t.advance(16) until it says done
        r.delete("session:42")

What is stored under which key, the streaming get and how errors behave:
docs/redis.md. Every failing call raises pqcache.PQError with the status,
its name and pq_redis_last_error()'s message (the library's own errors, such
as PQ_ERR_CORRUPT from pq_sequence_restore, keep their status). A call on a
closed connection, transfer or context raises PQ_ERR_BAD_STATE "<function>:
the connection is closed" (context, transfer), as pqcache.Context does; a
transfer whose context or connection was closed first raises
PQ_ERR_BAD_STATE from the C library, naming which went. Every call that
reaches into a context (put, get, get_begin, and a transfer's advance,
finish, progress and close) counts as a call on it, so a Context.close() on
another thread waits for it to return (pqcache.Context.close).

The module calls libpqcache_redis.so.N (N: libpqcache's ABI major) through
ctypes, found in this order:
  1. $PQCACHE_REDIS_LIBRARY, a path (an error if it does not load);
  2. the pqcache package's own directory (the build tree stages a link to
     the built library there: PYTHONPATH=<build>/python);
  3. the dynamic loader's search by SONAME (Debian package libpqcache-redis0,
     RPM libpqcache_redis0, or LD_LIBRARY_PATH).
Without it, importing this module raises ImportError naming the package.
libpqcache_redis.so.N needs libpqcache.so.N, which the loader resolves to the
copy the pqcache module already loaded (same SONAME), so contexts made by
pqcache.Context are passed to it as they are.
"""

from __future__ import annotations

import ctypes
import os
import weakref
from typing import Dict, Optional

from . import Context, PQError, _Closing, _error, version
from . import pqcache_swig as _c

__all__ = ["Redis", "Transfer", "library_path", "MAX_BLOCK_BYTES", "DEFAULT_BLOCK_BYTES"]

# include/pqcache_redis.h: PQ_REDIS_MAX_BLOCK_BYTES.
MAX_BLOCK_BYTES = 512 * 1024 * 1024
# 4 MiB, docs/redis.md's example; any 1 .. MAX_BLOCK_BYTES works.
DEFAULT_BLOCK_BYTES = 4 << 20
_U64_MAX = (1 << 64) - 1

_ABI_MAJOR = version().split(".")[0]
_SONAME = f"libpqcache_redis.so.{_ABI_MAJOR}"


def _load():
    explicit = os.environ.get("PQCACHE_REDIS_LIBRARY")
    if explicit:
        try:
            return ctypes.CDLL(explicit), explicit
        except OSError as e:
            raise ImportError(f"pqcache.redis: $PQCACHE_REDIS_LIBRARY={explicit} does not load: {e} "
                              f"(name a built {_SONAME}, or unset it to use the one the package "
                              f"libpqcache-redis{_ABI_MAJOR} installs)") from e
    tried = []
    beside = os.path.join(os.path.dirname(os.path.abspath(__file__)), _SONAME)
    for candidate in (beside, _SONAME):
        if candidate == beside and not os.path.exists(beside):
            tried.append(f"{beside}: absent")
            continue
        try:
            return ctypes.CDLL(candidate), candidate
        except OSError as e:
            tried.append(str(e))
    raise ImportError(
        f"pqcache.redis needs {_SONAME} (the Redis tier, docs/redis.md): install the package "
        f"libpqcache-redis{_ABI_MAJOR} (Debian) or libpqcache_redis{_ABI_MAJOR} (RPM), or set "
        f"PQCACHE_REDIS_LIBRARY to its path. Tried: " + "; ".join(tried))


_lib, _loaded_from = _load()


def library_path() -> str:
    """The file this module loaded libpqcache_redis from (a path, or the
    SONAME when the dynamic loader found it)."""
    return _loaded_from


_P = ctypes.c_void_p
_U64, _I32 = ctypes.c_uint64, ctypes.c_int32
_U64P, _I32P = ctypes.POINTER(_U64), ctypes.POINTER(_I32)
for _name, _args, _res in [
        ("pq_redis_connect", [ctypes.c_char_p, _I32, _I32, ctypes.POINTER(_P)], ctypes.c_int),
        ("pq_redis_connect_cluster", [ctypes.c_char_p, _I32, _I32, ctypes.POINTER(_P)],
         ctypes.c_int),
        ("pq_redis_close", [_P], None),
        ("pq_redis_put", [_P, _P, _U64, ctypes.c_char_p, _U64], ctypes.c_int),
        ("pq_redis_get", [_P, _P, _U64, ctypes.c_char_p], ctypes.c_int),
        ("pq_redis_get_begin", [_P, _P, _U64, ctypes.c_char_p, ctypes.POINTER(_P)], ctypes.c_int),
        ("pq_redis_get_continue", [_P, _U64, _I32P], ctypes.c_int),
        ("pq_redis_get_finish", [_P], ctypes.c_int),
        ("pq_redis_transfer_progress", [_P, _U64P, _U64P, _U64P, _I32P], ctypes.c_int),
        ("pq_redis_transfer_free", [_P], None),
        ("pq_redis_info", [_P, ctypes.c_char_p, _U64P, _U64P, _U64P], ctypes.c_int),
        ("pq_redis_delete", [_P, ctypes.c_char_p], ctypes.c_int),
        ("pq_redis_last_error", [], ctypes.c_char_p)]:
    _fn = getattr(_lib, _name)
    _fn.argtypes, _fn.restype = _args, _res


def _check(status: int) -> None:
    # Called right after the C call, on the same thread: the message is
    # thread-local and ctypes runs no other pq_redis_* call in between.
    if status != _c.PQ_OK:
        raw = _lib.pq_redis_last_error() or b""
        raise _error(status, raw.decode("utf-8", "replace"))


def _closed(op: str, what: str) -> PQError:
    return _error(_c.PQ_ERR_BAD_STATE, f"{op}: the {what} is closed")


def _u64(name: str, value) -> int:
    # ctypes would wrap a negative or too large int silently.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not 0 <= value <= _U64_MAX:
        raise OverflowError(f"{name} {value} is out of range for uint64_t")
    return value


def _key(key) -> bytes:
    if isinstance(key, str):
        key = key.encode("utf-8")
    elif not isinstance(key, bytes):
        raise TypeError(f"key must be str or bytes, not {type(key).__name__}")
    if b"\0" in key:
        raise ValueError("key contains a NUL character")
    return key


def _on_context(op: str, ctx, call) -> None:
    """call(handle), the pq_redis_* function `op` given ctx's pq_context* (an
    int), run as a call on ctx (Context._call): a ctx.close() on another
    thread waits for it, and a closed ctx raises PQ_ERR_BAD_STATE "<op>: the
    context is closed" without calling the library."""
    if not isinstance(ctx, Context):
        raise TypeError(f"ctx must be a pqcache.Context, not {type(ctx).__name__}")
    ctx._call(op, lambda handle: call(int(handle)))  # the pq_context* SWIG holds


class Transfer(_Closing):
    """A streaming get (Redis.get_begin): the sequence selects now, its K/V
    arrive with advance() or finish(). close() (or leaving a with block)
    frees it; one neither done nor failed is abandoned and its sequence
    removed (pq_redis_transfer_free). Closing its context or its Redis
    connection first leaves it invalid: advance, finish and progress then
    raise PQ_ERR_BAD_STATE naming which went (the C library learns it
    through pq_watch_destroy), and close only frees it. Its calls count as
    calls on the context: a Context.close() on another thread waits for one
    in flight, and one made while that close() runs waits for it to end
    (then answers as above)."""

    def __init__(self, handle: int, conn: "Redis", ctx: Context):
        self._handle = handle
        self._refs = (conn, ctx)  # kept alive: the C transfer uses both

    def _run(self, op: str, function, *args) -> None:
        """function(transfer, *args), checked, beside the context
        (Context._call_beside): counted as a call on it while it is open, so
        that a close() on another thread waits for it, and run only after
        pq_destroy when a close() has begun (the C transfer then answers
        PQ_ERR_BAD_STATE)."""
        handle, refs = self._handle, self._refs
        if handle is None or refs is None:
            raise _closed(op, "transfer")
        refs[1]._call_beside(lambda: _check(function(handle, *args)))

    def advance(self, max_blocks: int = 0) -> bool:
        """Fetches up to max_blocks more blocks (0: all that are left) and
        restores the K/V sections they complete. True once the whole state
        is restored."""
        done = _I32(0)
        self._run("pq_redis_get_continue", _lib.pq_redis_get_continue,
                  _u64("max_blocks", max_blocks), ctypes.byref(done))
        return bool(done.value)

    def finish(self) -> None:
        """Fetches every block left: the sequence is then complete."""
        self._run("pq_redis_get_finish", _lib.pq_redis_get_finish)

    def progress(self) -> Dict[str, int]:
        """fetched_bytes, description_bytes, state_bytes and layers_ready
        (layers 0 .. layers_ready - 1 have their K/V)."""
        fetched, description, state, layers = _U64(), _U64(), _U64(), _I32()
        self._run("pq_redis_transfer_progress", _lib.pq_redis_transfer_progress,
                  ctypes.byref(fetched), ctypes.byref(description), ctypes.byref(state),
                  ctypes.byref(layers))
        return {"fetched_bytes": fetched.value, "description_bytes": description.value,
                "state_bytes": state.value, "layers_ready": layers.value}

    def close(self) -> None:
        if self._handle is not None:
            handle, self._handle = self._handle, None
            # Abandoning removes the sequence from the context: beside it, as
            # the other calls (after pq_destroy if a close() has begun).
            self._refs[1]._call_beside(lambda: _lib.pq_redis_transfer_free(handle))
            self._refs = None


class Redis(_Closing):
    """A connection to one Redis server (pq_redis_connect), or with
    cluster=True to a Redis Cluster through one of its nodes
    (pq_redis_connect_cluster: a state's keys are "{key}:...", in one hash
    slot; MOVED and ASK are followed; docs/redis.md, "Redis Cluster").
    timeout_ms bounds the connect and each network read or write (0: no
    limit). May be shared by threads (the library serialises its calls);
    ctypes releases the GIL during each call."""

    def __init__(self, host: str = "127.0.0.1", port: int = 6379, timeout_ms: int = 5000,
                 cluster: bool = False):
        self._conn: Optional[int] = None  # close() and __del__ work if connect fails
        self._transfers: "weakref.WeakSet[Transfer]" = weakref.WeakSet()  # freed by close()
        if not isinstance(host, str):
            raise TypeError(f"host must be str, not {type(host).__name__}")
        for name, value in (("port", port), ("timeout_ms", timeout_ms)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, not {type(value).__name__}")
            if not -2**31 <= value < 2**31:
                raise OverflowError(f"{name} {value} is out of range for int32_t")
        if not isinstance(cluster, bool):
            raise TypeError(f"cluster must be a bool, not {type(cluster).__name__}")
        connect = _lib.pq_redis_connect_cluster if cluster else _lib.pq_redis_connect
        conn = _P()
        _check(connect(_key(host), port, timeout_ms, ctypes.byref(conn)))
        self._conn = conn.value
        self.host, self.port, self.cluster = host, port, cluster

    def _open(self, op: str) -> int:
        if self._conn is None:
            raise _closed(op, "connection")
        return self._conn

    def put(self, ctx: Context, seq: int, key, block_bytes: int = DEFAULT_BLOCK_BYTES) -> None:
        """Saves sequence seq of ctx under key, in blocks of block_bytes."""
        conn = self._open("pq_redis_put")
        _on_context("pq_redis_put", ctx, lambda handle: _check(_lib.pq_redis_put(
            conn, handle, _u64("seq", seq), _key(key), _u64("block_bytes", block_bytes))))

    def get(self, ctx: Context, seq: int, key) -> None:
        """Restores the state under key as sequence seq of ctx (which must not
        exist). On any error no sequence was added."""
        conn = self._open("pq_redis_get")
        _on_context("pq_redis_get", ctx, lambda handle: _check(_lib.pq_redis_get(
            conn, handle, _u64("seq", seq), _key(key))))

    def get_begin(self, ctx: Context, seq: int, key) -> Transfer:
        """Adds seq to ctx from the state's first blocks (its description):
        it selects now; the returned Transfer brings the K/V."""
        handle, conn = _P(), self._open("pq_redis_get_begin")
        _on_context("pq_redis_get_begin", ctx, lambda context: _check(_lib.pq_redis_get_begin(
            conn, context, _u64("seq", seq), _key(key), ctypes.byref(handle))))
        transfer = Transfer(handle.value, self, ctx)
        self._transfers.add(transfer)
        return transfer

    def info(self, key) -> Dict[str, int]:
        """state_bytes, block_bytes and block_count of the state under key
        (reads the manifest only)."""
        state, block, count = _U64(), _U64(), _U64()
        _check(_lib.pq_redis_info(self._open("pq_redis_info"), _key(key), ctypes.byref(state),
                                  ctypes.byref(block), ctypes.byref(count)))
        return {"state_bytes": state.value, "block_bytes": block.value, "block_count": count.value}

    def delete(self, key) -> None:
        """Deletes the manifest under key, then its blocks."""
        _check(_lib.pq_redis_delete(self._open("pq_redis_delete"), _key(key)))

    def close(self) -> None:
        """Closes the connection (freeing its open transfers first); later
        calls raise PQ_ERR_BAD_STATE. Must not race with other calls on it."""
        if self._conn is not None:
            for transfer in list(self._transfers):
                transfer.close()
            conn, self._conn = self._conn, None
            _lib.pq_redis_close(conn)
