#!/usr/bin/env bash
# Regenerates the ABI baseline (packaging/abi/baseline.dump.gz and
# baseline.info) from a build tree's debug copy of libpqcache.so. Run it
# after the last public-header change of a release, and whenever the ABI
# major is bumped; commit both files. See docs/packaging.md, "ABI policy".
#
#   packaging/abi/update-baseline.sh [BUILD_DIR]   (default: build)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/common.sh"
root=$(cd "$here/../.." && pwd)
build=${1:-$root/build}
[[ $build = /* ]] || build=$root/$build
require_tools

echo "update-baseline: building pqcache_abi in $build"
cmake --build "$build" --target pqcache_abi >/dev/null
header=$root/include/pqcache.h
version=$(header_version "$header")
lib=$build/packaging/abi/lib/libpqcache.so.$version
[[ -f $lib ]] || { echo "update-baseline: $lib is missing (version $version of the header)" >&2; exit 1; }
major=$(header_major "$header")
[[ $(soname_major "$lib") == "$major" ]] || { echo "update-baseline: SONAME major of $lib is not $major" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dump_abi "$lib" "$header" "$tmp/baseline.dump" "$version"
gzip -9nc "$tmp/baseline.dump" >"$here/baseline.dump.gz"
cat >"$here/baseline.info" <<INFO
# The ABI baseline of packaging/abi/check.sh; written by update-baseline.sh.
abi_major=$major
version=$version
INFO
echo "update-baseline: wrote $here/baseline.dump.gz (libpqcache.so.$major, version $version)"
