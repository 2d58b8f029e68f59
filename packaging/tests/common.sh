# Shared helpers of the packaging tests (sourced). The tests get their
# settings from CTest's environment (packaging/CMakeLists.txt).
set -euo pipefail

: "${PQ_SOURCE_DIR:?set by CTest}" "${PQ_BUILD_DIR:?}" "${PQ_VERSION:?}" "${PQ_ABI_MAJOR:?}"
: "${PQ_LIBDIR:?}" "${PQ_INCLUDEDIR:?}" "${PQ_JNIDIR:?}" "${PQ_C_COMPILER:?}" "${CMAKE_COMMAND:?}"
TESTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# has GREP-ARGS: grep for a pipeline's output that reads all of it (grep -q
# stops at the first match, and under pipefail the writer's SIGPIPE would
# then fail the test at random).
has() { grep "$@" >/dev/null; }

log() { echo "[$(basename "$0" .sh)] $*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
# The tests registered with SKIP_RETURN_CODE 77 say why they did not run.
skip() { echo "SKIPPED: $*"; exit 77; }

# A fresh private scratch folder: every test has its own, so ctest -j never
# shares a file between two tests.
fresh_dir() {
  rm -rf "$1"
  mkdir -p "$1"
}

# expect_files ROOT FILE...: each FILE (relative to ROOT) exists.
expect_files() {
  local root=$1; shift
  local f
  for f in "$@"; do
    [[ -e $root/$f || -L $root/$f ]] || fail "$root/$f is missing"
  done
}

# build_consumers PREFIX OUT PLUGIN(present|absent)
# Builds examples/decode_loop.c against the installed tree under PREFIX twice,
# through `pkg-config --cflags --libs pqcache` and through a CMake project
# using find_package(pqcache) / pqcache::pqcache, and runs both (--small). No
# path of the source or build tree is given to the compiler: only what the
# .pc and the CMake package say. Then checks that the library finds the CUDA
# plug-in in PREFIX/<libdir>/pqcache/ (or that it is absent).
build_consumers() {
  local prefix=$1 out=$2 plugin=$3
  local libdir=$prefix/$PQ_LIBDIR
  mkdir -p "$out"

  # pkg-config, with the search path limited to the installed tree. A
  # package's .pc names its real prefix (/usr): an unpacked one is reached
  # the standard way, through PKG_CONFIG_SYSROOT_DIR. A `cmake --install`
  # tree's .pc is relocatable (${pcfiledir}) and needs no sysroot.
  local flags sysroot=
  grep -q '^prefix=${pcfiledir}' "$libdir/pkgconfig/pqcache.pc" || sysroot=${prefix%/usr}
  flags=$(PKG_CONFIG_SYSROOT_DIR=$sysroot PKG_CONFIG_LIBDIR=$libdir/pkgconfig PKG_CONFIG_PATH= \
          pkg-config --cflags --libs pqcache) \
    || fail "pkg-config cannot resolve pqcache under $libdir/pkgconfig"
  log "pkg-config --cflags --libs pqcache${sysroot:+ (sysroot $sysroot)}: $flags"
  local version
  version=$(PKG_CONFIG_LIBDIR=$libdir/pkgconfig PKG_CONFIG_PATH= pkg-config --modversion pqcache)
  [[ $version == "$PQ_VERSION" ]] || fail "pkg-config says version $version, expected $PQ_VERSION"
  # shellcheck disable=SC2086 # $flags is a list of flags
  "$PQ_C_COMPILER" -std=c99 -pedantic -Wall -Wextra -Werror -o "$out/decode_loop_pc" \
    "$prefix/share/doc/$PQ_DEB_NAME_DEV/examples/decode_loop.c" $flags -lm \
    || fail "decode_loop.c does not compile with the pkg-config flags"
  # shellcheck disable=SC2086
  "$PQ_C_COMPILER" -std=c99 -Wall -Werror -o "$out/plugin_probe" "$TESTS_DIR/plugin_probe.c" $flags \
    || fail "plugin_probe.c does not compile with the pkg-config flags"

  # find_package(pqcache) from a downstream CMake project.
  "$CMAKE_COMMAND" -S "$TESTS_DIR/consumer" -B "$out/consumer" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
    -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF -DDECODE_LOOP_SOURCE="$prefix/share/doc/$PQ_DEB_NAME_DEV/examples/decode_loop.c" \
    >"$out/consumer-configure.log" 2>&1 \
    || { cat "$out/consumer-configure.log" >&2; fail "find_package(pqcache) failed"; }
  grep 'pqcache .* at ' "$out/consumer-configure.log" | sed "s/^/[$(basename "$0" .sh)] /"
  grep -q "at $libdir/libpqcache.so" "$out/consumer-configure.log" \
    || fail "pqcache::pqcache does not point into $libdir"
  "$CMAKE_COMMAND" --build "$out/consumer" >"$out/consumer-build.log" 2>&1 \
    || { cat "$out/consumer-build.log" >&2; fail "the find_package consumer does not build"; }

  # Run them against the installed library: LD_LIBRARY_PATH, since the tree
  # is not in the loader's path (the packages' library is, after dpkg -i).
  local bin
  for bin in "$out/decode_loop_pc" "$out/consumer/decode_loop"; do
    LD_LIBRARY_PATH=$libdir "$bin" --small --min-recall 0.5 >"$out/run.log" 2>&1 \
      || { cat "$out/run.log" >&2; fail "$bin --small failed"; }
    # The binary must have used the installed library, not the build tree's.
    LD_LIBRARY_PATH=$libdir ldd "$bin" | has "libpqcache.so.$PQ_ABI_MAJOR => $libdir/" \
      || fail "$bin does not load $libdir/libpqcache.so.$PQ_ABI_MAJOR"
    log "OK: $(basename "$(dirname "$bin")")/$(basename "$bin") --small: PQ recall (1/5, 1/10) $(awk '$1 == "PQ" && NF == 3 {print $2, $3; exit}' "$out/run.log")"
  done
  PQCACHE_CUDA_PLUGIN= LD_LIBRARY_PATH=$libdir "$out/plugin_probe" "$plugin" \
    || fail "the CUDA plug-in is not where libpqcache looks for it"
}

# has_packaged_component NAME: CPack packages the install component NAME
# (the bindings and the CUDA plug-in are optional).
has_packaged_component() {
  local config=$PQ_BUILD_DIR/CPackConfig.cmake
  [[ -f $config ]] || fail "$config is missing"
  [[ " $(sed -n 's/^set(CPACK_COMPONENTS_ALL "\(.*\)")$/\1/p' "$config" | tr ';' ' ') " == *" $1 "* ]]
}

# deb_file DIR NAME: the .deb of package NAME in DIR, for this machine's
# architecture or Architecture: all.
deb_file() {
  local f
  for f in "$1/${2}_${PQ_DEB_VERSION}_$(dpkg --print-architecture).deb" "$1/${2}_${PQ_DEB_VERSION}_all.deb"; do
    [[ -f $f ]] && { echo "$f"; return 0; }
  done
  fail "no .deb of $2 $PQ_DEB_VERSION in $1"
}

free_loopback_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# start_redis_server DIR: a redis-server without persistence on a free
# loopback port, its files in DIR; sets redis_port and redis_pid. Returns 1,
# having said SKIPPED with the reason, when redis-server is not installed
# (Debian: redis-server, which scripts/setup.sh installs).
start_redis_server() {
  local dir=$1 server tries i reply up
  mkdir -p "$dir"
  server=$(command -v redis-server || { [[ -x /usr/bin/redis-server ]] && echo /usr/bin/redis-server; } || true)
  if [[ -z $server ]]; then
    log "SKIPPED (the Redis round trips): redis-server is not installed (package redis-server; scripts/setup.sh installs it)"
    return 1
  fi
  for tries in 1 2 3 4 5; do  # another process may take the free port first
    redis_port=$(free_loopback_port)
    "$server" --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" >"$dir/redis-server.log" 2>&1 &
    redis_pid=$!
    up=0
    for i in $(seq 100); do
      kill -0 "$redis_pid" 2>/dev/null || break
      if exec 8<>"/dev/tcp/127.0.0.1/$redis_port" 2>/dev/null; then
        reply=
        printf 'PING\r\n' >&8 && IFS= read -r -t 2 reply <&8 || true
        exec 8>&-
        [[ $reply == "+PONG"* ]] && { up=1; break; }
      fi
      sleep 0.1
    done
    ((up)) && return 0
    stop_redis_server
  done
  fail "$server did not answer PING on a loopback port in 5 tries ($dir/redis-server.log)"
}

stop_redis_server() {
  if [[ -n ${redis_pid:-} ]]; then
    kill "$redis_pid" 2>/dev/null || true
    wait "$redis_pid" 2>/dev/null || true
    redis_pid=
  fi
}

# run_redis_consumer BIN DIR: runs packaging/tests/redis_consumer (built by
# the caller against the Redis tier's packages, run with the caller's
# LD_LIBRARY_PATH): a connect to a closed loopback port must fail with
# PQ_ERR_BACKEND, and a put/get/delete round trip against a redis-server of
# its own (start_redis_server, files in DIR) must give the state back byte
# for byte.
run_redis_consumer() {
  local bin=$1 dir=$2 out
  out=$("$bin" refused "$(free_loopback_port)" 2>&1) || { echo "$out" >&2; fail "$bin refused PORT"; }
  log "$out"
  start_redis_server "$dir" || return 0
  out=$("$bin" "$redis_port" 2>&1) || { stop_redis_server; echo "$out" >&2; fail "$bin $redis_port"; }
  stop_redis_server
  log "$out"
}
