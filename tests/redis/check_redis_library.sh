#!/usr/bin/env bash
# Binary checks of the Redis tier, run by CTest (tests/redis/CMakeLists.txt):
#
#   check_redis_library.sh <libpqcache_redis.so> <libpqcache.so>
#
#  - libpqcache_redis.so exports pq_redis_* only (plus its version node),
#    its SONAME is libpqcache_redis.so.<major>, it needs libhiredis;
#  - libpqcache.so does not need libhiredis: the core gains no dependency.
set -euo pipefail
redis_lib=$1
core_lib=$2
status=0

syms=$(nm -D --defined-only "$redis_lib" | awk 'NF >= 3 { sub(/@.*/, "", $3); print $2, $3 }')
offenders=$(awk '!($2 ~ /^pq_redis_/) && !($1 == "A" && $2 ~ /^PQCACHE_REDIS_[0-9]+$/)' <<<"$syms")
if [[ -n $offenders ]]; then
  echo "FAIL: $redis_lib exports symbols other than pq_redis_*:" >&2
  sed 's/^/  /' <<<"$offenders" >&2
  status=1
else
  echo "OK: $redis_lib exports $(grep -c ' pq_redis_' <<<"$syms") pq_redis_* symbols and nothing else"
fi

soname=$(readelf -d "$redis_lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
if [[ $soname =~ ^libpqcache_redis\.so\.[0-9]+$ ]]; then
  echo "OK: SONAME $soname"
else
  echo "FAIL: SONAME of $redis_lib is '$soname'" >&2
  status=1
fi

needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
if needed "$redis_lib" | grep -q '^libhiredis'; then
  echo "OK: $redis_lib needs $(needed "$redis_lib" | grep '^libhiredis')"
else
  echo "FAIL: $redis_lib does not need libhiredis" >&2
  status=1
fi
if needed "$core_lib" | grep -q '^libhiredis'; then
  echo "FAIL: $core_lib needs libhiredis; only libpqcache_redis.so may" >&2
  status=1
else
  echo "OK: $core_lib does not need libhiredis"
fi
exit $status
