#!/usr/bin/env bash
# CTest packaging_install: `cmake --install` of the build tree into a staged
# prefix, by component, then the installed file list, the relocatable .pc
# and CMake package, and decode_loop.c built against the stage both ways;
# with the Redis tier, redis_consumer.c through pkg-config pqcache-redis.
#
#   check_install.sh SCRATCH_DIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

scratch=${1:?usage: check_install.sh SCRATCH_DIR}
fresh_dir "$scratch"
stage=$scratch/stage

components=(runtime dev)
((PQ_WITH_CUDA_PLUGIN)) && components+=(cuda)
with_redis=0
has_packaged_component redis && { components+=(redis redis_dev); with_redis=1; }
for comp in "${components[@]}"; do
  "$CMAKE_COMMAND" --install "$PQ_BUILD_DIR" --prefix "$stage" --component "$comp" \
    >"$scratch/install-$comp.log" 2>&1 || { cat "$scratch/install-$comp.log" >&2; fail "install of $comp"; }
done
log "installed components ${components[*]} into $stage:"
(cd "$stage" && find . \( -type f -o -type l \) | sort | sed 's/^/  /')

lib=$PQ_LIBDIR
expect_files "$stage" \
  "$lib/libpqcache.so.$PQ_VERSION" "$lib/libpqcache.so.$PQ_ABI_MAJOR" "$lib/libpqcache.so" \
  "$PQ_INCLUDEDIR/pqcache.h" "$lib/pkgconfig/pqcache.pc" \
  "$lib/cmake/pqcache/pqcache-config.cmake" "$lib/cmake/pqcache/pqcache-config-version.cmake" \
  "$lib/cmake/pqcache/pqcache-targets.cmake"
[[ $(readlink "$stage/$lib/libpqcache.so.$PQ_ABI_MAJOR") == "libpqcache.so.$PQ_VERSION" ]] \
  || fail "libpqcache.so.$PQ_ABI_MAJOR does not point at libpqcache.so.$PQ_VERSION"
[[ $(readlink "$stage/$lib/libpqcache.so") == "libpqcache.so.$PQ_ABI_MAJOR" ]] \
  || fail "the dev link libpqcache.so does not point at the soname"
# The installed library carries no path of the build machine.
if readelf -d "$stage/$lib/libpqcache.so.$PQ_VERSION" | has -E 'R(UN)?PATH'; then
  fail "the installed libpqcache.so has an RPATH/RUNPATH"
fi
if ((PQ_WITH_CUDA_PLUGIN)); then
  expect_files "$stage" "$lib/pqcache/libpqcache_cuda.so"
  plugin=present
else
  plugin=absent
fi
# Relocatable: no absolute path of the stage in the .pc or the CMake files.
if grep -rq "$stage" "$stage/$lib/pkgconfig" "$stage/$lib/cmake"; then
  fail "the .pc or CMake files name the staging prefix $stage (not relocatable)"
fi

# The runtime component alone holds no dev file and the dev one no library.
"$CMAKE_COMMAND" --install "$PQ_BUILD_DIR" --prefix "$scratch/runtime-only" --component runtime >/dev/null
[[ ! -e $scratch/runtime-only/$lib/libpqcache.so && ! -e $scratch/runtime-only/$PQ_INCLUDEDIR/pqcache.h ]] \
  || fail "the runtime component installs development files"

build_consumers "$stage" "$scratch/consumers" "$plugin"
if ((with_redis)); then
  # The Redis tier: its .pc (relocatable, requires pqcache) and CMake package.
  expect_files "$stage" "$lib/libpqcache_redis.so.$PQ_VERSION" "$lib/libpqcache_redis.so.$PQ_ABI_MAJOR" \
    "$lib/libpqcache_redis.so" "$PQ_INCLUDEDIR/pqcache_redis.h" "$lib/pkgconfig/pqcache-redis.pc" \
    "$lib/cmake/pqcache-redis/pqcache-redis-config.cmake"
  flags=$(PKG_CONFIG_LIBDIR=$stage/$lib/pkgconfig PKG_CONFIG_PATH= pkg-config --cflags --libs pqcache-redis) \
    || fail "pkg-config cannot resolve pqcache-redis under $stage/$lib/pkgconfig"
  # shellcheck disable=SC2086
  "$PQ_C_COMPILER" -std=c99 -pedantic -Wall -Wextra -Werror -o "$scratch/redis_consumer" \
    "$TESTS_DIR/redis_consumer.c" $flags || fail "redis_consumer.c with pkg-config pqcache-redis ($flags)"
  LD_LIBRARY_PATH=$stage/$lib ldd "$scratch/redis_consumer" | has "libpqcache_redis.so.$PQ_ABI_MAJOR => $stage/$lib/" \
    || fail "redis_consumer does not load the staged libpqcache_redis"
  LD_LIBRARY_PATH=$stage/$lib run_redis_consumer "$scratch/redis_consumer" "$scratch/redis"
  log "OK: the Redis tier from the stage: pkg-config pqcache-redis: $flags"
fi

# Moving the whole tree keeps it working (the relocatable part of the
# promise): build again from a copy at another path.
mv "$stage" "$scratch/moved"
build_consumers "$scratch/moved" "$scratch/consumers-moved" "$plugin"
log "PASS"
