# Shared by check.sh and update-baseline.sh (sourced).
set -euo pipefail

# header_major HEADER: PQ_VERSION_MAJOR of the header.
header_major() { sed -n 's/^#define PQ_VERSION_MAJOR \([0-9][0-9]*\).*/\1/p' "$1"; }
# header_version HEADER: PQ_VERSION_STRING of the header.
header_version() { sed -n 's/^#define PQ_VERSION_STRING "\([^"]*\)".*/\1/p' "$1"; }
# soname_major LIB: N of the SONAME libpqcache.so.N.
soname_major() { readelf -d "$1" | sed -n 's/.*(SONAME).*\[libpqcache\.so\.\([0-9][0-9]*\)\]/\1/p'; }

# dump_abi LIB HEADER OUT VERSION: abi-dumper over the public header only
# (-public-headers: types and functions of pqcache.h count, the C++ inside
# does not; -skip-cxx leaves out C++ symbols altogether).
dump_abi() {
  local lib=$1 header=$2 out=$3 version=$4
  local headers_dir
  headers_dir=$(mktemp -d)
  cp "$header" "$headers_dir/pqcache.h"  # only this header is public
  abi-dumper "$lib" -o "$out" -lver "$version" -public-headers "$headers_dir" \
    -skip-cxx -sort -quiet >"$out.log" 2>&1 || { rm -rf "$headers_dir"; cat "$out.log" >&2; return 1; }
  rm -rf "$headers_dir"
}

# require_tools: exit 77 (CTest: skipped) when a tool is missing.
require_tools() {
  local t
  for t in abi-dumper abi-compliance-checker readelf nm; do
    if ! command -v "$t" >/dev/null; then
      echo "SKIPPED: $t is not installed (scripts/setup.sh installs abi-dumper and abi-compliance-checker)"
      exit 77
    fi
  done
}
