#!/usr/bin/env bash
# CTest packaging_deb_system: the .debs of packaging_deb_rpm installed into
# the real system with dpkg -i (runtime, dev, CUDA plug-in, Go module, Java
# binding and, when the system's python3 is the one it was built for,
# python3-pqcache), then
#   - ldconfig knows libpqcache.so.N (the package's ldconfig trigger ran);
#   - decode_loop.c builds with the system's `pkg-config --cflags --libs
#     pqcache` and with find_package(pqcache) without any search path, and
#     runs without LD_LIBRARY_PATH;
#   - libpqcache finds the plug-in in /usr/<libdir>/pqcache/;
#   - the Go program builds against /usr/share/gocode (module mode with
#     go.work, and GOPATH mode) and the Java program through the Maven
#     coordinates in /usr/share/maven-repo, with no search path given; the JVM
#     finds the JNI module on its default java.library.path
#     (bindings_consumers.sh);
#   - python3-pqcache's postinst byte-compiled it (py3compile) and Debian's
#     python3 imports it;
#   - README's Rust dlopen example, built offline from the crates
#     librust-pqcache-sys-dev and librust-pqcache-dev installed in
#     /usr/share/cargo/registry (cargo's directory source replacement), loads
#     the system's library, and with the "link" feature links it
#     (check_rust_consumer.sh);
#   - the Redis tier (libpqcache-redis0, libpqcache-redis-dev): ldconfig knows
#     it, a C program builds with `pkg-config --cflags --libs pqcache-redis`
#     and with find_package(pqcache-redis) and round-trips a state through a
#     redis-server of its own, and Debian's python3 does the same through
#     pqcache.redis, which loads the system's libpqcache_redis.so.N;
# and the packages are purged again (dpkg -P) whatever happens, after which
# no file of any of them, no directory only they used and no ldconfig entry
# may remain.
# Exits 77 (CTest: skipped) with the reason where the machine does not allow
# it: not root, no dpkg, PQ_PACKAGING_NO_SYSTEM_INSTALL=1, or a libpqcache
# already installed that this test must not replace.
#
#   check_system_install.sh PACKAGES_SCRATCH_DIR   (packaging_deb_rpm's folder)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
source "$TESTS_DIR/bindings_consumers.sh"  # go_consumer, java_consumer

pkgdir=${1:?usage: check_system_install.sh PACKAGES_SCRATCH_DIR}

[[ ${PQ_PACKAGING_NO_SYSTEM_INSTALL:-0} == 1 ]] && skip "PQ_PACKAGING_NO_SYSTEM_INSTALL=1"
command -v dpkg >/dev/null || skip "no dpkg on this machine (not Debian-based)"
(($(id -u) == 0)) || skip "dpkg -i needs root (running as $(id -un)); the unpacked-package checks of packaging_deb_rpm still ran"
[[ -w /var/lib/dpkg ]] || skip "/var/lib/dpkg is not writable (read-only system)"

names=("$PQ_DEB_NAME_RUNTIME" "$PQ_DEB_NAME_DEV")
((PQ_WITH_CUDA_PLUGIN)) && names+=("$PQ_DEB_NAME_CUDA")
has_packaged_component go && names+=("$PQ_DEB_NAME_GO")
has_packaged_component java && names+=("$PQ_DEB_NAME_JAVA")
with_redis=0
if has_packaged_component redis; then
  names+=("${PQ_DEB_NAME_REDIS:?}" "${PQ_DEB_NAME_REDIS_DEV:?}")
  with_redis=1
fi
if has_packaged_component rust_sys; then
  names+=("${PQ_DEB_NAME_RUST_SYS:?}" "${PQ_DEB_NAME_RUST:?}")
fi
# python3-pqcache depends on the one python3 minor version its module was
# built for, and on python3-numpy: installed only where both are satisfied.
with_python=0
python_deb=$pkgdir/out/${PQ_DEB_NAME_PYTHON:?}_${PQ_DEB_VERSION}_$(dpkg --print-architecture).deb
if [[ -f $python_deb ]]; then
  wanted=$(dpkg-deb -f "$python_deb" Depends | sed -n 's/.*python3 (>= \([0-9.]*\)).*/\1/p')
  system=$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true)
  py_package=/$(dpkg-deb -c "$python_deb" | awk '{print $6}' | sed -n 's|^\./||; s|/__init__\.py$||p' | head -n 1)
  if [[ $wanted != "$system" ]]; then
    log "SKIPPED ($PQ_DEB_NAME_PYTHON only): built for Python $wanted; /usr/bin/python3 is ${system:-missing}"
  elif ! dpkg-query -W -f '${db:Status-Status}' python3-numpy 2>/dev/null | has -x installed; then
    log "SKIPPED ($PQ_DEB_NAME_PYTHON only): python3-numpy, its dependency, is not installed (scripts/setup.sh installs it)"
  elif [[ -e $py_package ]]; then
    log "SKIPPED ($PQ_DEB_NAME_PYTHON only): $py_package exists outside the packages; this test will not overwrite it"
  else
    names+=("$PQ_DEB_NAME_PYTHON")
    with_python=1
  fi
fi
debs=()
for n in "${names[@]}"; do
  debs+=("$(deb_file "$pkgdir/out" "$n")")  # packaging_deb_rpm makes them
done

# One system install at a time, also across build trees (every engineer's
# ctest runs this test); dpkg's own lock covers only dpkg itself.
exec 9>/var/lock/pqcache-packaging-system-test.lock
flock -w 300 9 || skip "another packaging_deb_system run held the lock for 5 minutes"

for n in "${names[@]}"; do
  if dpkg-query -W -f '${db:Status-Status}' "$n" 2>/dev/null | has -v '^not-installed$'; then
    skip "package $n is already installed on this machine; this test will not replace it"
  fi
done
libdir=/usr/$PQ_LIBDIR
jni=/usr/$PQ_JNIDIR/libpqcache_jni.so
gomodule=/usr/share/gocode/src/$PQ_GO_MODULE_PATH
for f in "$libdir/libpqcache.so.$PQ_ABI_MAJOR" "/usr/$PQ_INCLUDEDIR/pqcache.h" "$libdir/pkgconfig/pqcache.pc" \
         "$jni" "/usr/share/java/$PQ_JAVA_JAR_NAME.jar" "$gomodule" \
         "$libdir/libpqcache_redis.so.$PQ_ABI_MAJOR" "/usr/$PQ_INCLUDEDIR/pqcache_redis.h" \
         "/usr/share/cargo/registry/pqcache-sys-$PQ_VERSION" "/usr/share/cargo/registry/pqcache-$PQ_VERSION"; do
  [[ -e $f ]] && skip "$f exists outside the packages; this test will not overwrite it"
done

work=$pkgdir/system
fresh_dir "$work"
purge() {
  # Reverse dependency order; -P removes the conffiles and the dpkg records.
  local n
  for ((i = ${#names[@]} - 1; i >= 0; i--)); do
    n=${names[i]}
    dpkg-query -W "$n" >/dev/null 2>&1 && dpkg -P "$n" >>"$work/dpkg.log" 2>&1
  done
  return 0
}
trap purge EXIT

log "dpkg -i ${names[*]}"
dpkg -i "${debs[@]}" >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log" >&2; fail "dpkg -i"; }
for n in "${names[@]}"; do
  [[ $(dpkg-query -W -f '${db:Status-Status}' "$n") == installed ]] || fail "$n is not fully installed"
done
# ldconfig may name it through another path on a merged-/usr system
# (/lib/libpqcache.so.0 for /usr/lib/libpqcache.so.0): compare real paths.
# (awk reads all of ldconfig's output: exiting at the first match would let
# ldconfig die of SIGPIPE, which pipefail and set -e turn into a silent exit.)
cached=$(ldconfig -p | awk -v so="libpqcache.so.$PQ_ABI_MAJOR" '$1 == so && !found { print $NF; found = 1 }')
[[ -n $cached && $(realpath "$cached") == $(realpath "$libdir/libpqcache.so.$PQ_ABI_MAJOR") ]] \
  || fail "ldconfig does not know $libdir/libpqcache.so.$PQ_ABI_MAJOR after dpkg -i (trigger missing?): '$cached'"
log "OK: ldconfig -p lists $cached"

# Build with the system's search paths only.
flags=$(env -u PKG_CONFIG_PATH -u PKG_CONFIG_LIBDIR pkg-config --cflags --libs pqcache) \
  || fail "pkg-config does not find pqcache after dpkg -i"
log "pkg-config --cflags --libs pqcache: $flags"
# shellcheck disable=SC2086
"$PQ_C_COMPILER" -std=c99 -pedantic -Wall -Wextra -Werror -o "$work/decode_loop_pc" \
  "/usr/share/doc/$PQ_DEB_NAME_DEV/examples/decode_loop.c" $flags -lm || fail "decode_loop.c with the system pkg-config"
# shellcheck disable=SC2086
"$PQ_C_COMPILER" -std=c99 -Wall -Werror -o "$work/plugin_probe" "$TESTS_DIR/plugin_probe.c" $flags \
  || fail "plugin_probe.c with the system pkg-config"
"$CMAKE_COMMAND" -S "$TESTS_DIR/consumer" -B "$work/consumer" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DDECODE_LOOP_SOURCE="/usr/share/doc/$PQ_DEB_NAME_DEV/examples/decode_loop.c" \
  >"$work/consumer.log" 2>&1 && "$CMAKE_COMMAND" --build "$work/consumer" >>"$work/consumer.log" 2>&1 \
  || { cat "$work/consumer.log" >&2; fail "find_package(pqcache) from /usr"; }
for bin in "$work/decode_loop_pc" "$work/consumer/decode_loop"; do
  env -u LD_LIBRARY_PATH "$bin" --small --min-recall 0.5 >"$work/run.log" 2>&1 \
    || { cat "$work/run.log" >&2; fail "$bin --small against the installed packages"; }
  used=$(env -u LD_LIBRARY_PATH ldd "$bin" | awk -v so="libpqcache.so.$PQ_ABI_MAJOR" '$1 == so { print $3 }')
  [[ -n $used && $(realpath "$used") == $(realpath "$libdir/libpqcache.so.$PQ_ABI_MAJOR") ]] \
    || fail "$bin does not use $libdir/libpqcache.so.$PQ_ABI_MAJOR (ldd: '$used')"
  log "OK: $bin --small ran against $libdir/libpqcache.so.$PQ_ABI_MAJOR"
done
if ((PQ_WITH_CUDA_PLUGIN)); then
  PQCACHE_CUDA_PLUGIN= env -u LD_LIBRARY_PATH "$work/plugin_probe" present || fail "plug-in not found in $libdir/pqcache"
fi

# The Redis tier from the system: ldconfig, pkg-config and CMake without
# search paths, a round trip through a redis-server of the test's own.
if ((with_redis)); then
  cached=$(ldconfig -p | awk -v so="libpqcache_redis.so.$PQ_ABI_MAJOR" '$1 == so && !found { print $NF; found = 1 }')
  [[ -n $cached && $(realpath "$cached") == $(realpath "$libdir/libpqcache_redis.so.$PQ_ABI_MAJOR") ]] \
    || fail "ldconfig does not know $libdir/libpqcache_redis.so.$PQ_ABI_MAJOR after dpkg -i: '$cached'"
  flags=$(env -u PKG_CONFIG_PATH -u PKG_CONFIG_LIBDIR pkg-config --cflags --libs pqcache-redis) \
    || fail "pkg-config does not find pqcache-redis after dpkg -i"
  [[ $(echo $flags) == "-lpqcache_redis -lpqcache" ]] || fail "pkg-config --cflags --libs pqcache-redis gives '$flags'"
  log "pkg-config --cflags --libs pqcache-redis: $flags"
  # shellcheck disable=SC2086
  "$PQ_C_COMPILER" -std=c99 -pedantic -Wall -Wextra -Werror -o "$work/redis_consumer_pc" "$TESTS_DIR/redis_consumer.c" $flags \
    || fail "redis_consumer.c with the system pkg-config"
  "$CMAKE_COMMAND" -S "$TESTS_DIR/redis_cmake_consumer" -B "$work/redis_cmake_consumer" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF >"$work/redis_cmake_consumer.log" 2>&1 \
    && "$CMAKE_COMMAND" --build "$work/redis_cmake_consumer" >>"$work/redis_cmake_consumer.log" 2>&1 \
    || { cat "$work/redis_cmake_consumer.log" >&2; fail "find_package(pqcache-redis) from /usr"; }
  for bin in "$work/redis_consumer_pc" "$work/redis_cmake_consumer/redis_consumer"; do
    used=$(env -u LD_LIBRARY_PATH ldd "$bin" | awk -v so="libpqcache_redis.so.$PQ_ABI_MAJOR" '$1 == so { print $3 }')
    [[ -n $used && $(realpath "$used") == $(realpath "$libdir/libpqcache_redis.so.$PQ_ABI_MAJOR") ]] \
      || fail "$bin does not use $libdir/libpqcache_redis.so.$PQ_ABI_MAJOR (ldd: '$used')"
    (unset LD_LIBRARY_PATH; run_redis_consumer "$bin" "$work/redis-$(basename "$bin")")
  done
fi

# The bindings as a user of the installed packages builds with them: no
# search path for pkg-config, the loader or the JVM.
library=$libdir/libpqcache.so.$PQ_ABI_MAJOR
if has_packaged_component go; then
  if command -v go >/dev/null; then
    (unset PKG_CONFIG_PATH PKG_CONFIG_LIBDIR LD_LIBRARY_PATH; go_consumer /usr/share/gocode "$work/go" "$library")
  else
    log "SKIPPED (Go program): go is not installed (package golang-go)"
  fi
fi
if has_packaged_component java; then
  if command -v java >/dev/null; then
    (unset LD_LIBRARY_PATH; java_consumer /usr/share/maven-repo "$work/java" "$jni" "$library")
  else
    log "SKIPPED (Java program): java is not installed (package openjdk-17-jdk-headless)"
  fi
fi

if ((with_python)); then
  init=$(dpkg -L "$PQ_DEB_NAME_PYTHON" | grep '/pqcache/__init__\.py$') || fail "$PQ_DEB_NAME_PYTHON has no pqcache/__init__.py"
  pydir=$(dirname "$init")
  compgen -G "$pydir/__pycache__/__init__.cpython-*.pyc" >/dev/null \
    || fail "postinst did not byte-compile $pydir (py3compile)"
  log "OK: postinst byte-compiled $pydir: $(ls "$pydir/__pycache__" | tr '\n' ' ')"
  clean_env=(env -u PYTHONPATH -u PYTHONHOME -u LD_LIBRARY_PATH -u PYTHONDONTWRITEBYTECODE -u PYTHONPYCACHEPREFIX)
  got=$(cd / && "${clean_env[@]}" /usr/bin/python3 -c 'import pqcache; print(pqcache.__file__, pqcache.version())') \
    || fail "Debian's python3 cannot import pqcache from $PQ_DEB_NAME_PYTHON"
  [[ $got == "$init $PQ_VERSION" ]] || fail "python3 imported '$got', expected '$init $PQ_VERSION'"
  # Bytecode a program writes at run time (optimised here, which py3compile
  # does not write) must go on removal too.
  (cd / && "${clean_env[@]}" /usr/bin/python3 -O -c 'import pqcache') || fail "python3 -O -c 'import pqcache'"
  compgen -G "$pydir/__pycache__/__init__.cpython-*.opt-1.pyc" >/dev/null \
    || fail "python3 -O wrote no bytecode into $pydir/__pycache__"
  log "OK: /usr/bin/python3 imports pqcache $PQ_VERSION from $pydir"
  # pqcache.redis finds the system's libpqcache_redis.so.N by its SONAME
  # (libpqcache-redis0) and round-trips a state.
  if ((with_redis)) && start_redis_server "$work/redis-python"; then
    got=$(cd / && "${clean_env[@]}" /usr/bin/python3 - "$redis_port" "$libdir/libpqcache_redis.so.$PQ_VERSION" <<'PY' 2>&1
import os, sys
import numpy as np
import pqcache, pqcache.redis as pqr
port, expected = int(sys.argv[1]), sys.argv[2]
mapped = {line.split()[-1] for line in open("/proc/self/maps") if "libpqcache_redis" in line}
assert {os.path.realpath(p) for p in mapped} == {os.path.realpath(expected)}, (mapped, pqr.library_path())
def context():
    return pqcache.Context(1, 4, 2, 16, "f32", worker_threads=1)
with context() as a, context() as b, pqr.Redis("127.0.0.1", port) as r:
    a.add_sequence(1)
    kv = np.random.default_rng(3).standard_normal((300, 2, 16)).astype(np.float32)
    a.prefill(1, 0, kv, kv)
    r.put(a, 1, "packaging:python", block_bytes=4096)
    r.get(b, 2, "packaging:python")
    assert bytes(b.save(2)) == bytes(a.save(1))
    r.delete("packaging:python")
    print("pqcache.redis round trip OK:", a.state_size(1), "bytes through", pqr.library_path(), "=", sorted(mapped)[0])
PY
) || { stop_redis_server; echo "$got" >&2; fail "Debian's python3 with pqcache.redis on the system's libpqcache_redis"; }
    stop_redis_server
    log "OK: $got"
  fi
fi
if [[ -n ${PQ_CARGO:-} ]]; then
  (unset LD_LIBRARY_PATH; bash "$TESTS_DIR/check_rust_consumer.sh" "$work/rust" system) \
    || fail "README's Rust dlopen example on the system's library"
else
  log "SKIPPED (Rust program): cargo is not installed"
fi

# Remove and purge, then nothing may be left: no file or link of any
# package, and no directory of theirs that no other package uses.
for d in "${debs[@]}"; do dpkg-deb -c "$d"; done | awk '{print $1, $6}' | sed 's| \./| /|' >"$work/contents"
trap - EXIT
purge
for n in "${names[@]}"; do
  dpkg-query -W "$n" >/dev/null 2>&1 && fail "$n is still known to dpkg after dpkg -P"
done
while read -r mode path; do
  path=${path%/}
  [[ -e $path || -L $path ]] || continue
  if [[ $mode == d* ]]; then
    dpkg-query -S "$path" >/dev/null 2>&1 || fail "the directory $path is left after dpkg -P, and no package owns it"
  else
    fail "$path is left after dpkg -P"
  fi
done <"$work/contents"
log "OK: none of the $(grep -vc '^d' "$work/contents") files and links of the packages is left after dpkg -P"
ldconfig -p | has "libpqcache.so.$PQ_ABI_MAJOR" && fail "ldconfig still lists libpqcache.so.$PQ_ABI_MAJOR after dpkg -P"
ldconfig -p | has "libpqcache_redis.so.$PQ_ABI_MAJOR" && fail "ldconfig still lists libpqcache_redis.so.$PQ_ABI_MAJOR after dpkg -P"
log "PASS: installed, used and purged ${names[*]}"
