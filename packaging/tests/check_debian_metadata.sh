#!/usr/bin/env bash
# CTest packaging_debian_metadata: the Debian conventions of the .debs that
# packaging_deb_rpm made (docs/packaging.md, "Multi-Arch, symbols files and
# the crates' Provides"):
#   - Multi-Arch: same on libpqcache0, libpqcache0-cuda, libpqcache-redis0
#     and their -dev packages, and what makes it safe: every file in the
#     multiarch library directory but the headers and the example, which are
#     the source tree's, and copyright and changelog.gz, which do not name
#     the architecture (two architectures' packages share those paths);
#   - the symbols control file of libpqcache0 and libpqcache-redis0: the
#     committed packaging/debian/{runtime,redis}/symbols, for the packaged
#     library's SONAME and the package, with its -dev package and no version
#     newer than this one, in dpkg-gensymbols' own form; dpkg-gensymbols -c4
#     against the packaged library fails when a pq_* function is exported
#     that the file lacks (or the file lists one that is gone);
#   - the crates' debcargo-style Provides, computed here from each crate's
#     Cargo.toml [features];
#   - lintian -I on those packages: no tag about Multi-Arch, symbols files or
#     Provides.
# Exits 77 (skipped) with the reason without dpkg-deb, dpkg-gensymbols or
# lintian.
#
#   check_debian_metadata.sh PACKAGES_SCRATCH_DIR SCRATCH_DIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage="usage: $(basename "$0") PACKAGES_SCRATCH_DIR SCRATCH_DIR"
out=${1:?$usage}/out
scratch=${2:?$usage}
: "${PQ_DEB_NAME_RUNTIME:?}" "${PQ_DEB_NAME_DEV:?}" "${PQ_DEB_NAME_CUDA:?}" "${PQ_DEB_VERSION:?}"
for tool in dpkg-deb:dpkg dpkg-gensymbols:dpkg-dev dpkg-architecture:dpkg-dev lintian:lintian; do
  command -v "${tool%%:*}" >/dev/null || skip "${tool%%:*} is not installed (package ${tool#*:})"
done
fresh_dir "$scratch"
lib=usr/$PQ_LIBDIR
field() { dpkg-deb -f "$1" "$2"; }
checked=()  # the .debs lintian looks at

# ---- Multi-Arch: same ------------------------------------------------------------
same=("$PQ_DEB_NAME_RUNTIME" "$PQ_DEB_NAME_DEV")
has_packaged_component cuda && same+=("$PQ_DEB_NAME_CUDA")
has_packaged_component redis && same+=("${PQ_DEB_NAME_REDIS:?}" "${PQ_DEB_NAME_REDIS_DEV:?}")
triplet=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
arch=$(dpkg --print-architecture)
for name in "${same[@]}"; do checked+=("$(deb_file "$out" "$name")"); done
# lintian's tags about Multi-Arch and the multiarch directories
multiarch_tags='multi-?arch|arch-dependent-file-not-in-arch-specific-directory|triplet-dir'
if [[ $PQ_LIBDIR != "lib/$triplet" ]]; then
  multiarch_tags=''  # non-multi-arch-lib-dir and such are the packager's choice then
  # cpack.cmake leaves the field out then (dpkg-deb -f says "no"): two
  # architectures' libraries would be one path.
  for name in "${same[@]}"; do
    [[ $(field "$(deb_file "$out" "$name")" Multi-Arch) == no ]] \
      || fail "$name is Multi-Arch with the library directory $PQ_LIBDIR, not lib/$triplet"
  done
  log "NOTE: library directory $PQ_LIBDIR, not lib/$triplet: no Multi-Arch field, as it should be"
else
  for name in "${same[@]}"; do
    d=$(deb_file "$out" "$name")
    [[ $(field "$d" Multi-Arch) == same ]] || fail "$name is not Multi-Arch: same (Multi-Arch: '$(field "$d" Multi-Arch)')"
    [[ $(field "$d" Architecture) == "$arch" ]] || fail "$name is Multi-Arch: same but Architecture: $(field "$d" Architecture)"
    root=$scratch/root-$name
    dpkg-deb -x "$d" "$root"
    shared=0
    while read -r f; do
      case $f in
        "$lib"/*) continue ;;
        usr/include/*)
          cmp -s "$root/$f" "$PQ_SOURCE_DIR/include/${f#usr/include/}" \
            || fail "$name: /$f is not include/${f#usr/include/} of the source tree (another architecture's would differ)" ;;
        "usr/share/doc/$name/examples/"*)
          cmp -s "$root/$f" "$PQ_SOURCE_DIR/examples/${f#"usr/share/doc/$name/examples/"}" \
            || fail "$name: /$f is not the source tree's example" ;;
        "usr/share/doc/$name/copyright" | "usr/share/doc/$name/changelog.gz")
          zcat -f "$root/$f" | has -F -e "$triplet" -e "$arch" && fail "$name: /$f names the architecture" ;;
        *) fail "$name is Multi-Arch: same but ships /$f outside /$lib, a path every architecture's $name would have" ;;
      esac
      shared=$((shared + 1))
    done < <(cd "$root" && find . \( -type f -o -type l \) | sed 's|^\./||' | sort)
    log "OK: $name: Multi-Arch: same; $shared files outside /$lib, the same for every architecture"
  done
fi

# ---- symbols files -----------------------------------------------------------------
# check_symbols PACKAGE DEV_PACKAGE LIBRARY_NAME COMMITTED_FILE
check_symbols() {
  local name=$1 dev=$2 library=$3 file=$4 d ctl root so soname first ver sym
  d=$(deb_file "$out" "$name")
  ctl=$scratch/control-$name root=$scratch/lib-$name
  dpkg-deb -e "$d" "$ctl"
  dpkg-deb -x "$d" "$root"
  [[ -f $ctl/symbols ]] || fail "$name has no symbols control file (lintian: no-symbols-control-file)"
  cmp -s "$ctl/symbols" "$file" || fail "$name's symbols control file is not ${file#"$PQ_SOURCE_DIR"/}"
  so=$root/$lib/$library.so.$PQ_VERSION
  soname=$(readelf -d "$so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
  first=$(head -1 "$file")
  [[ $first == "$soname $name #MINVER#" ]] \
    || fail "${file#"$PQ_SOURCE_DIR"/} begins '$first', not '$soname $name #MINVER#' (packaging/debian/update-symbols.sh writes it anew)"
  has -x -F "* Build-Depends-Package: $dev" "$file" || fail "${file#"$PQ_SOURCE_DIR"/} lacks '* Build-Depends-Package: $dev'"
  while read -r sym ver; do
    dpkg --compare-versions "$ver" le "$PQ_DEB_VERSION" || fail "${file#"$PQ_SOURCE_DIR"/}: $sym has version $ver, newer than $PQ_DEB_VERSION"
  done < <(sed -n 's/^ \([^ ]*\) \([^ ]*\)$/\1 \2/p' "$file")
  # -c4: any difference fails, a new symbol, a gone one or a new library.
  # Told the package, version and library, it reads nothing from the folder.
  (cd "$scratch" && dpkg-gensymbols -c4 -p"$name" -v"$PQ_DEB_VERSION" -e"$so" -I"$file" -O"$scratch/symbols-$name") \
    >"$scratch/gensymbols-$name.log" 2>&1 \
    || { cat "$scratch/gensymbols-$name.log" >&2
         fail "$library.so's exported symbols differ from ${file#"$PQ_SOURCE_DIR"/} (the diff above): after adding a function, run packaging/debian/update-symbols.sh on the build tree and commit the file"; }
  cmp -s "$scratch/symbols-$name" "$file" \
    || fail "${file#"$PQ_SOURCE_DIR"/} is not as dpkg-gensymbols writes it: $(diff "$file" "$scratch/symbols-$name" | head -5)"
  log "OK: $name: symbols file of $soname, $(grep -c '^ ' "$file") symbols, matching the packaged library (dpkg-gensymbols -c4)"
}
check_symbols "$PQ_DEB_NAME_RUNTIME" "$PQ_DEB_NAME_DEV" libpqcache "$PQ_SOURCE_DIR/packaging/debian/runtime/symbols"
if has_packaged_component redis; then
  check_symbols "$PQ_DEB_NAME_REDIS" "$PQ_DEB_NAME_REDIS_DEV" libpqcache_redis "$PQ_SOURCE_DIR/packaging/debian/redis/symbols"
fi

# ---- the crates' Provides ------------------------------------------------------------
# What debcargo writes for a crate whose features are all in its one package:
# librust-<crate>[-<version>][+<feature>]-dev (= version) for the versions
# <major>, <major>.<minor>, <major>.<minor>.<patch>.
if has_packaged_component rust_sys; then
  IFS=. read -r major minor _ <<<"$PQ_VERSION"
  for pair in "${PQ_DEB_NAME_RUST_SYS:?}:pqcache-sys" "${PQ_DEB_NAME_RUST:?}:pqcache"; do
    name=${pair%%:*} crate=${pair#*:}
    d=$(deb_file "$out" "$name")
    checked+=("$d")
    mapfile -t features < <(awk '/^\[/ { f = ($0 == "[features]"); next }
                                 f && /^[A-Za-z0-9_-]+ *=/ { sub(/ *=.*/, ""); gsub(/_/, "-"); print }' \
                                "$PQ_SOURCE_DIR/bindings/rust/$crate/Cargo.toml")
    ((${#features[@]})) || fail "bindings/rust/$crate/Cargo.toml: no [features] read"
    expected=()
    for v in "" "-$major" "-$major.$minor" "-$PQ_VERSION"; do
      [[ -n $v ]] && expected+=("librust-$crate$v-dev (= $PQ_DEB_VERSION)")
      for feature in "${features[@]}"; do expected+=("librust-$crate$v+$feature-dev (= $PQ_DEB_VERSION)"); done
    done
    got=$(field "$d" Provides | sed 's/,[[:space:]]*/\n/g' | sed '/^$/d' | sort)
    want=$(printf '%s\n' "${expected[@]}" | sort)
    [[ $got == "$want" ]] || fail "$name's Provides differ from debcargo's for features ${features[*]}: $(diff <(echo "$want") <(echo "$got"))"
    log "OK: $name provides $(wc -l <<<"$got") debcargo names (features: ${features[*]})"
  done
fi

# ---- lintian ---------------------------------------------------------------------------
# Info tags too (-I): no-symbols-control-file is one. The tags of these
# fields: every tag naming symbols or Provides, and the Multi-Arch ones.
lintian_out=$(lintian -I --tag-display-limit 0 "${checked[@]}" 2>&1 | grep -v '^running with root privileges' || true)
echo "$lintian_out" >"$scratch/lintian.log"
tags=$(grep -E '^[EWIPX]: ' <<<"$lintian_out" \
       | grep -E ": [a-z0-9.+-]*(symbols|provide${multiarch_tags:+|$multiarch_tags})[a-z0-9.+-]*( |$)" || true)
[[ -z $tags ]] || fail "lintian: $tags"
log "OK: lintian -I on ${#checked[@]} packages: no tag about ${multiarch_tags:+Multi-Arch, }symbols or Provides ($(grep -cE '^[EWIPX]: ' <<<"$lintian_out" || true) other tags; $scratch/lintian.log)"
log "PASS"
