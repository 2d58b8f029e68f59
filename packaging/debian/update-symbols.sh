#!/usr/bin/env bash
# Rewrites the dpkg symbols files of the shared library packages,
# packaging/debian/runtime/symbols (libpqcache0) and
# packaging/debian/redis/symbols (libpqcache-redis0), from the libraries of a
# build tree, with dpkg-gensymbols (package dpkg-dev), as debhelper's
# dh_makeshlibs does. A symbol already in the file keeps its version; a new
# one gets the project's version (docs/packaging.md, "The symbols files").
# A symbol that is gone is an ABI break: the script stops and says which,
# unless the SONAME changed (an ABI major bump), when the file starts anew.
#
#   packaging/debian/update-symbols.sh BUILD_DIR
set -euo pipefail

build=$(cd "${1:?usage: update-symbols.sh BUILD_DIR}" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
config=$build/CPackConfig.cmake
[[ -f $config ]] || { echo "update-symbols.sh: $config is missing (configure the build first)" >&2; exit 1; }
command -v dpkg-gensymbols >/dev/null || { echo "update-symbols.sh: dpkg-gensymbols missing (package dpkg-dev)" >&2; exit 1; }
cpack_var() { sed -n "s/^set($1 \"\(.*\)\")$/\1/p" "$config"; }
version=$(cpack_var CPACK_DEBIAN_PACKAGE_VERSION)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# update COMPONENT DEV_COMPONENT LIBRARY FILE
update() {
  local package dev library=$3 file=$4 soname basis=()
  package=$(cpack_var "CPACK_DEBIAN_${1^^}_PACKAGE_NAME")
  dev=$(cpack_var "CPACK_DEBIAN_${2^^}_PACKAGE_NAME")
  [[ -n $package && -n $dev ]] || { echo "update-symbols.sh: $config has no package for $1 or $2" >&2; exit 1; }
  [[ -f $library ]] || { echo "update-symbols.sh: $library is not built" >&2; exit 1; }
  soname=$(readelf -d "$library" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
  if [[ -f $file ]] && [[ $(head -1 "$file") == "$soname $package #MINVER#" ]]; then
    basis=(-I"$file")
  else
    echo "update-symbols.sh: $file written anew for $soname ($package): every symbol gets $version"
  fi
  # -c1: fail if a symbol of the file is gone. Told the package, version and
  # library, dpkg-gensymbols reads nothing from the folder it runs in.
  (cd "$work" && dpkg-gensymbols -c1 -p"$package" -v"$version" -e"$library" "${basis[@]}" -O"$work/symbols") \
    || { echo "update-symbols.sh: dpkg-gensymbols failed for $package (lost symbols are an ABI break: the diff above)" >&2; exit 1; }
  # The -dev package, for dpkg-shlibdeps (lintian:
  # symbols-file-missing-build-depends-package-field); kept from the file.
  ((${#basis[@]})) || sed -i "1a * Build-Depends-Package: $dev" "$work/symbols"
  if cmp -s "$work/symbols" "$file"; then
    echo "update-symbols.sh: $file unchanged"
  else
    cp "$work/symbols" "$file"
    echo "update-symbols.sh: $file rewritten (new symbols: version $version); commit it"
  fi
}

update runtime dev "$build/libpqcache.so.$version" "$here/runtime/symbols"
if [[ -n $(cpack_var CPACK_DEBIAN_REDIS_PACKAGE_NAME) ]]; then
  update redis redis_dev "$build/redis/libpqcache_redis.so.$version" "$here/redis/symbols"
else
  echo "update-symbols.sh: the build has no Redis tier (hiredis): $here/redis/symbols left as it is"
fi
