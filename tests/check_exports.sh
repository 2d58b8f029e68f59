#!/usr/bin/env bash
# Binary-level checks of the built libraries, run by CTest
# (tests/public_header.cmake):
#
#   check_exports.sh exports <libpqcache.so>
#       nm -D: the only defined dynamic symbols are pq_* (plus the symbol
#       version node PQCACHE_<n>), and the core entry points are there.
#   check_exports.sh needed <lib.so>
#       readelf -d: no NEEDED libcuda / libcudart / libcublas / libcublasLt;
#       the core must load on a machine without the CUDA libraries.
#   check_exports.sh soname <libpqcache.so> <pqcache.h>
#       readelf -d: SONAME is libpqcache.so.<PQ_VERSION_MAJOR of the header>.
#   check_exports.sh plugin <libpqcache_cuda.so>
#       nm -D: the CUDA plug-in exports pq_cuda_plugin_entry only, and does
#       not need libcudart.so (it links the static CUDA runtime).
set -euo pipefail

mode=${1:-}
lib=${2:-}
if [[ -z $mode || -z $lib ]]; then
  echo "usage: $0 exports|needed|soname|plugin <lib.so> [pqcache.h]" >&2
  exit 2
fi
if [[ ! -f $lib ]]; then
  echo "FAIL: $lib does not exist" >&2
  exit 1
fi

# Defined dynamic symbols as "TYPE NAME", without @@VERSION suffixes.
defined_symbols() {
  nm -D --defined-only "$1" | awk 'NF >= 3 { sub(/@.*/, "", $3); print $2, $3 }'
}

case "$mode" in
  exports)
    syms=$(defined_symbols "$lib")
    # Allowed: pq_* and the version node (an absolute symbol named after the
    # version script's node, e.g. "A PQCACHE_0").
    offenders=$(awk '!($2 ~ /^pq_/) && !($1 == "A" && $2 ~ /^PQCACHE_[0-9]+$/)' <<<"$syms")
    status=0
    if [[ -n $offenders ]]; then
      echo "FAIL: $lib exports symbols other than pq_*:" >&2
      sed 's/^/  /' <<<"$offenders" >&2
      status=1
    fi
    for required in pq_create pq_destroy pq_prefill_layer pq_decode_append pq_decode_select \
                    pq_fetch_kv pq_last_error pq_status_string; do
      if ! awk -v want="$required" '$2 == want { found = 1 } END { exit !found }' <<<"$syms"; then
        echo "FAIL: $lib does not export $required" >&2
        status=1
      fi
    done
    count=$(grep -c ' pq_' <<<"$syms" || true)
    ((status == 0)) && echo "OK: $lib exports $count pq_* symbols and nothing else"
    exit $status
    ;;
  needed)
    needed=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
    echo "NEEDED of $lib:"
    sed 's/^/  /' <<<"$needed"
    bad=$(grep -E '^lib(cuda|cudart|cublas|cublasLt)\.so' <<<"$needed" || true)
    if [[ -n $bad ]]; then
      echo "FAIL: $lib must not depend on the CUDA libraries:" >&2
      sed 's/^/  /' <<<"$bad" >&2
      exit 1
    fi
    echo "OK: no CUDA library in NEEDED"
    ;;
  soname)
    header=${3:-}
    if [[ -z $header || ! -f $header ]]; then
      echo "usage: $0 soname <lib.so> <pqcache.h>" >&2
      exit 2
    fi
    major=$(sed -n 's/^#define PQ_VERSION_MAJOR \([0-9][0-9]*\).*/\1/p' "$header")
    expected="libpqcache.so.$major"
    soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
    if [[ $soname != "$expected" ]]; then
      echo "FAIL: SONAME of $lib is '$soname', expected '$expected' (PQ_VERSION_MAJOR $major)" >&2
      exit 1
    fi
    echo "OK: SONAME $soname"
    ;;
  plugin)
    syms=$(defined_symbols "$lib")
    offenders=$(awk '$2 != "pq_cuda_plugin_entry" && $1 != "A"' <<<"$syms")
    status=0
    if [[ -n $offenders ]]; then
      echo "FAIL: $lib exports more than pq_cuda_plugin_entry:" >&2
      sed 's/^/  /' <<<"$offenders" >&2
      status=1
    fi
    if ! awk '$2 == "pq_cuda_plugin_entry" { found = 1 } END { exit !found }' <<<"$syms"; then
      echo "FAIL: $lib does not export pq_cuda_plugin_entry" >&2
      status=1
    fi
    needed=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
    echo "NEEDED of $lib:"
    sed 's/^/  /' <<<"$needed"
    if grep -Eq '^lib(cuda|cudart)\.so' <<<"$needed"; then
      echo "FAIL: $lib needs libcuda/libcudart (the runtime must be static, the driver dlopened)" >&2
      status=1
    fi
    ((status == 0)) && echo "OK: plug-in exports pq_cuda_plugin_entry only"
    exit $status
    ;;
  *)
    echo "unknown mode '$mode'" >&2
    exit 2
    ;;
esac
