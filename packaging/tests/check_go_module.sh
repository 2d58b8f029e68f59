#!/usr/bin/env bash
# CTest packaging_go_module: the Go module as a package user gets it.
#   - the golang-...-dev .deb (packaging_deb_rpm made it): Architecture all,
#     Section golang, Depends on the exact libpqcache-dev and on pkg-config;
#     the module's source under /usr/share/gocode/src/<module path>: go.mod
#     naming that path, the package's files (no tests), the SWIG-generated
#     internal/pqswig, `#cgo pkg-config: pqcache` and no other cgo flags, no
#     path of the build machine;
#   - with the runtime, dev and Go packages unpacked into a scratch root
#     (dpkg -x), a Go program outside the source tree built against the
#     module in module mode (go.work) and in GOPATH mode, GOPROXY=off, cgo's
#     flags from the root's pkg-config, and run (bindings_consumers.sh).
# Exits 77 (skipped) with the reason when the Go binding is not built or go
# is not installed.
#
#   check_go_module.sh PACKAGES_SCRATCH_DIR SCRATCH_DIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
source "$TESTS_DIR/bindings_consumers.sh"

: "${PQ_DEB_NAME_RUNTIME:?}" "${PQ_DEB_NAME_DEV:?}" "${PQ_DEB_NAME_GO:?}" "${PQ_DEB_VERSION:?}"
consumer_test_init go "$@"
command -v go >/dev/null || skip "go is not installed (package golang-go)"

godeb=$(deb_file "$pkgdir/out" "$PQ_DEB_NAME_GO")
[[ $(dpkg-deb -f "$godeb" Architecture) == all ]] || fail "$PQ_DEB_NAME_GO is not Architecture: all"
[[ $(dpkg-deb -f "$godeb" Section) == golang ]] || fail "$PQ_DEB_NAME_GO is not in Section golang"
depends=$(dpkg-deb -f "$godeb" Depends)
log "$PQ_DEB_NAME_GO: Depends: $depends"
has -F "$PQ_DEB_NAME_DEV (= $PQ_DEB_VERSION)" <<<"$depends" || fail "$PQ_DEB_NAME_GO does not depend on $PQ_DEB_NAME_DEV (= $PQ_DEB_VERSION)"
has "pkg-config" <<<"$depends" || fail "$PQ_DEB_NAME_GO does not depend on pkg-config"

root=$scratch/root
for n in "$PQ_DEB_NAME_RUNTIME" "$PQ_DEB_NAME_DEV" "$PQ_DEB_NAME_GO"; do
  dpkg-deb -x "$(deb_file "$pkgdir/out" "$n")" "$root"
done
gocode=$root/usr/share/gocode
module=$gocode/src/$PQ_GO_MODULE_PATH
expect_files "$module" go.mod pqcache.go tensor.go internal/pqswig/pqcache.go internal/pqswig/pqcache_wrap.c
# Only what the Go package's files need: no tests, no build outputs, and
# nothing of the Go package outside its directory.
others=$(dpkg-deb -c "$godeb" | awk '{print $6}' | sed 's|^\./||' | grep -v '/$' \
         | grep -v -e "^usr/share/gocode/src/$PQ_GO_MODULE_PATH/" -e "^usr/share/doc/$PQ_DEB_NAME_GO/" || true)
[[ -z $others ]] || fail "$PQ_DEB_NAME_GO holds files outside its module and doc directories: $others"
unexpected=$(cd "$module" && find . -type f ! -name '*.go' ! -name go.mod ! -name '*_wrap.c' -o -name '*_test.go')
[[ -z $unexpected ]] || fail "unexpected files in the module: $unexpected"
for pkg in "$module" "$module/internal/pqswig"; do
  # cgo directives, in a /* */ preamble or in // lines: exactly one, pkg-config.
  directives=$(grep -hE '^[[:space:]]*(//[[:space:]]*)?#cgo ' "$pkg"/*.go | sed 's|^[[:space:]/]*||' || true)
  [[ $directives == '#cgo pkg-config: pqcache' ]] \
    || fail "${pkg#"$root"}: the cgo directives are '$directives', expected only '#cgo pkg-config: pqcache'"
done
has -r -e "$PQ_SOURCE_DIR" -e "$PQ_BUILD_DIR" "$module" && fail "the module's files name a path of the build machine"
log "OK: $(cd "$module" && find . -type f | wc -l) files in /usr/share/gocode/src/$PQ_GO_MODULE_PATH"

PKG_CONFIG_SYSROOT_DIR=$root PKG_CONFIG_LIBDIR=$root/usr/$PQ_LIBDIR/pkgconfig PKG_CONFIG_PATH= LD_LIBRARY_PATH=$root/usr/$PQ_LIBDIR \
  go_consumer "$gocode" "$scratch/go" "$root/usr/$PQ_LIBDIR/libpqcache.so.$PQ_ABI_MAJOR"
log "PASS: the Go module of $PQ_DEB_NAME_GO builds and runs in module (go.work) and GOPATH mode"
