#!/usr/bin/env bash
# CTest packaging_deb_rpm: cpack -G "DEB;RPM" from the build tree into a
# private folder, then
#   - the .debs: file lists, control fields (Depends, shlibs, ldconfig
#     trigger), the plug-in's real NEEDED, lintian (no errors); the Redis
#     tier's runtime and -dev packages, the Rust crates' librust-*-dev;
#   - decode_loop.c built against the unpacked .debs (dpkg -x), through
#     pkg-config and find_package, and run; the plug-in found in
#     <libdir>/pqcache/ with the CUDA package, absent without it;
#     redis_consumer.c through pkg-config pqcache-redis and
#     find_package(pqcache-redis), run against a redis-server of its own;
#   - the .rpms: rpm -qlp, rpm -qp --requires, no shared directory claimed,
#     rpm2cpio | cpio gives the same files as the .debs, rpmlint if installed.
# The folder stays for packaging_deb_system (dpkg -i) and for inspection.
#
#   check_packages.sh SCRATCH_DIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

scratch=${1:?usage: check_packages.sh SCRATCH_DIR}
: "${CPACK_COMMAND:?}" "${PQ_DEB_NAME_RUNTIME:?}" "${PQ_DEB_NAME_CUDA:?}" "${PQ_DEB_NAME_DEV:?}" "${PQ_DEB_VERSION:?}"
fresh_dir "$scratch"
out=$scratch/out
config=$PQ_BUILD_DIR/CPackConfig.cmake
[[ -f $config ]] || fail "$config is missing"

generators=DEB
if command -v rpmbuild >/dev/null; then
  generators="DEB;RPM"
else
  log "NOTE: rpmbuild not installed (package rpm): the .rpm checks are skipped"
fi
start=$SECONDS
"$CPACK_COMMAND" --config "$config" -G "$generators" -B "$out" >"$scratch/cpack.log" 2>&1 \
  || { cat "$scratch/cpack.log" >&2; fail "cpack -G $generators"; }
log "cpack -G \"$generators\": $((SECONDS - start)) s"

components=$(sed -n 's/^set(CPACK_COMPONENTS_ALL "\(.*\)")$/\1/p' "$config" | tr ';' ' ')
log "components: $components"
has_component() { [[ " $components " == *" $1 "* ]]; }
has_component runtime && has_component dev || fail "CPackConfig.cmake lacks the runtime or dev component"
if ((PQ_WITH_CUDA_PLUGIN)) && ! has_component cuda; then fail "the CUDA plug-in is built but not packaged"; fi

arch=$(dpkg --print-architecture)
deb() { deb_file "$out" "$1"; }
debs=("$(deb "$PQ_DEB_NAME_RUNTIME")" "$(deb "$PQ_DEB_NAME_DEV")")
has_component cuda && debs+=("$(deb "$PQ_DEB_NAME_CUDA")")
for c in go java python redis redis_dev rust_sys rust; do
  if has_component $c; then
    name=$(sed -n "s/^set(CPACK_DEBIAN_${c^^}_PACKAGE_NAME \"\(.*\)\")$/\1/p" "$config")
    debs+=("$(deb "$name")")
  fi
done
for d in "${debs[@]}"; do [[ -f $d ]] || fail "missing package $d"; done

# ---- .deb contents and control fields ------------------------------------------------
lib=usr/$PQ_LIBDIR
field() { dpkg-deb -f "$1" "$2"; }
contents() { dpkg-deb -c "$1" | awk '{print $6}' | sed 's|^\./||'; }
for d in "${debs[@]}"; do
  pkg=$(field "$d" Package)
  log "$(basename "$d"): Depends: $(field "$d" Depends)"
  contents "$d" | has -x "usr/share/doc/$pkg/copyright" || fail "$pkg has no /usr/share/doc/$pkg/copyright"
  [[ -n $(field "$d" Maintainer) && -n $(field "$d" Description) ]] || fail "$pkg lacks Maintainer or Description"
done

runtime=$(deb "$PQ_DEB_NAME_RUNTIME")
rfiles=$(contents "$runtime")
grep -qx "$lib/libpqcache.so.$PQ_VERSION" <<<"$rfiles" || fail "runtime package lacks libpqcache.so.$PQ_VERSION"
grep -qx "$lib/libpqcache.so.$PQ_ABI_MAJOR" <<<"$rfiles" || fail "runtime package lacks the soname link"
grep -Eq "libpqcache\.so$|pqcache\.h$|pqcache_cuda" <<<"$rfiles" && fail "runtime package holds dev or CUDA files"
# Fails unless the file list $2 of package $1 holds every path after them.
expect_listed() {
  local package=$1 files=$2 f
  shift 2
  for f; do
    grep -qx "$f" <<<"$files" || fail "$package lacks /$f"
  done
}

# A shared library package's control files as debhelper writes them: shlibs
# naming the SONAME's package, and the ldconfig trigger.
check_library_control() {
  local deb=$1 library=$2 package=$3 ctl=$scratch/control-$3
  dpkg-deb -e "$deb" "$ctl"
  grep -qx "$library $PQ_ABI_MAJOR $package (>= $PQ_DEB_VERSION)" "$ctl/shlibs" \
    || fail "$package shlibs is '$(cat "$ctl/shlibs" 2>/dev/null)'"
  grep -qx "activate-noawait ldconfig" "$ctl/triggers" || fail "$package does not trigger ldconfig"
}
check_library_control "$runtime" libpqcache "$PQ_DEB_NAME_RUNTIME"
field "$runtime" Depends | has "libc6" || fail "runtime Depends lacks libc6 (dpkg-shlibdeps)"

dev=$(deb "$PQ_DEB_NAME_DEV")
dfiles=$(contents "$dev")
expect_listed "$PQ_DEB_NAME_DEV" "$dfiles" "$lib/libpqcache.so" "usr/$PQ_INCLUDEDIR/pqcache.h" \
  "$lib/pkgconfig/pqcache.pc" "$lib/cmake/pqcache/pqcache-config.cmake" \
  "$lib/cmake/pqcache/pqcache-config-version.cmake"
grep -q "libpqcache\.so\.[0-9]" <<<"$dfiles" && fail "dev package holds the runtime library"
field "$dev" Depends | has -F "$PQ_DEB_NAME_RUNTIME (= $PQ_DEB_VERSION)" || fail "dev does not depend on the runtime (= version)"

if has_component cuda; then
  cuda=$(deb "$PQ_DEB_NAME_CUDA")
  contents "$cuda" | has -x "$lib/pqcache/libpqcache_cuda.so" || fail "CUDA package lacks $lib/pqcache/libpqcache_cuda.so"
  field "$cuda" Depends | has -F "$PQ_DEB_NAME_RUNTIME (= $PQ_DEB_VERSION)" || fail "CUDA package does not depend on the runtime"
  field "$cuda" Recommends | has "libcuda1" || fail "CUDA package does not recommend the driver's libcuda1"
fi

# The Redis tier: a runtime package named by its SONAME and a -dev package,
# split as libpqcache0 / libpqcache-dev are.
if has_component redis; then
  : "${PQ_DEB_NAME_REDIS:?}" "${PQ_DEB_NAME_REDIS_DEV:?}"
  has_component redis_dev || fail "the Redis tier has a runtime package but no -dev package"
  redis_deb=$(deb "$PQ_DEB_NAME_REDIS")
  redis_files=$(contents "$redis_deb")
  grep -qx "$lib/libpqcache_redis.so.$PQ_VERSION" <<<"$redis_files" || fail "$PQ_DEB_NAME_REDIS lacks libpqcache_redis.so.$PQ_VERSION"
  [[ $(dpkg-deb --fsys-tarfile "$redis_deb" | tar -tvf - "./$lib/libpqcache_redis.so.$PQ_ABI_MAJOR" | awk '{print $NF}') == "libpqcache_redis.so.$PQ_VERSION" ]] \
    || fail "$PQ_DEB_NAME_REDIS lacks the soname link libpqcache_redis.so.$PQ_ABI_MAJOR -> libpqcache_redis.so.$PQ_VERSION"
  grep -Eq "libpqcache_redis\.so$|\.h$|\.pc$" <<<"$redis_files" && fail "$PQ_DEB_NAME_REDIS holds development files"
  check_library_control "$redis_deb" libpqcache_redis "$PQ_DEB_NAME_REDIS"
  for want in "libhiredis" "$PQ_DEB_NAME_RUNTIME (= $PQ_DEB_VERSION)" "libc6"; do
    field "$redis_deb" Depends | has -F "$want" || fail "$PQ_DEB_NAME_REDIS Depends lacks $want: $(field "$redis_deb" Depends)"
  done
  redis_dev_deb=$(deb "$PQ_DEB_NAME_REDIS_DEV")
  redis_dev_files=$(contents "$redis_dev_deb")
  expect_listed "$PQ_DEB_NAME_REDIS_DEV" "$redis_dev_files" "$lib/libpqcache_redis.so" \
    "usr/$PQ_INCLUDEDIR/pqcache_redis.h" "$lib/pkgconfig/pqcache-redis.pc" \
    "$lib/cmake/pqcache-redis/pqcache-redis-config.cmake" \
    "$lib/cmake/pqcache-redis/pqcache-redis-config-version.cmake"
  for want in "$PQ_DEB_NAME_REDIS (= $PQ_DEB_VERSION)" "$PQ_DEB_NAME_DEV (= $PQ_DEB_VERSION)"; do
    field "$redis_dev_deb" Depends | has -F "$want" || fail "$PQ_DEB_NAME_REDIS_DEV Depends lacks $want"
  done
  log "OK: $PQ_DEB_NAME_REDIS and $PQ_DEB_NAME_REDIS_DEV: files, shlibs, trigger, Depends"
fi
# The Rust crates as Debian's librust-*-dev ship them (the sources and
# .cargo-checksum.json; packaging_rust_consumer builds against them).
if has_component rust_sys; then
  : "${PQ_DEB_NAME_RUST_SYS:?}" "${PQ_DEB_NAME_RUST:?}"
  for pair in "$PQ_DEB_NAME_RUST_SYS:pqcache-sys" "$PQ_DEB_NAME_RUST:pqcache"; do
    name=${pair%%:*} crate=${pair#*:}
    d=$(deb "$name")
    crate_files=$(contents "$d")
    for f in Cargo.toml Cargo.toml.orig src/lib.rs .cargo-checksum.json; do
      grep -qx "usr/share/cargo/registry/$crate-$PQ_VERSION/$f" <<<"$crate_files" || fail "$name lacks /usr/share/cargo/registry/$crate-$PQ_VERSION/$f"
    done
    [[ $(field "$d" Architecture) == all ]] || fail "$name is not Architecture: all"
    [[ $(field "$d" Section) == rust ]] || fail "$name is not in section rust"
  done
  field "$(deb "$PQ_DEB_NAME_RUST")" Depends | has -F "$PQ_DEB_NAME_RUST_SYS (= $PQ_DEB_VERSION)" \
    || fail "$PQ_DEB_NAME_RUST does not depend on $PQ_DEB_NAME_RUST_SYS (= version)"
  field "$(deb "$PQ_DEB_NAME_RUST_SYS")" Depends | has -F "$PQ_DEB_NAME_DEV (= $PQ_DEB_VERSION)" \
    || fail "$PQ_DEB_NAME_RUST_SYS does not depend on $PQ_DEB_NAME_DEV (= version) (its default feature links)"
  log "OK: $PQ_DEB_NAME_RUST_SYS and $PQ_DEB_NAME_RUST hold their crates under /usr/share/cargo/registry"
fi

# The Go and Java packages' contents in detail: packaging_go_module and
# packaging_java_maven.
if has_component java; then
  jfiles=$(contents "$(deb "$(sed -n 's/^set(CPACK_DEBIAN_JAVA_PACKAGE_NAME "\(.*\)")$/\1/p' "$config")")")
  for f in "usr/share/java/$PQ_JAVA_JAR_NAME-$PQ_VERSION.jar" "usr/share/java/$PQ_JAVA_JAR_NAME.jar" "usr/$PQ_JNIDIR/libpqcache_jni.so"; do
    grep -qx "$f" <<<"$jfiles" || fail "Java package lacks /$f"
  done
  grep -q "^usr/share/maven-repo/.*\.pom$" <<<"$jfiles" || fail "Java package has no pom in /usr/share/maven-repo"
fi
if has_component go; then
  gfiles=$(contents "$(deb "$(sed -n 's/^set(CPACK_DEBIAN_GO_PACKAGE_NAME "\(.*\)")$/\1/p' "$config")")")
  grep -q "^usr/share/gocode/src/.*/go\.mod$" <<<"$gfiles" || fail "Go package lacks a go.mod in /usr/share/gocode/src"
fi
if has_component python; then
  pname=$(sed -n 's/^set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME "\(.*\)")$/\1/p' "$config")
  pfiles=$(contents "$(deb "$pname")")
  grep -q "/pqcache/__init__\.py$" <<<"$pfiles" || fail "Python package lacks pqcache/__init__.py"
  grep -q "/pqcache/_pqcache_swig.*\.so$" <<<"$pfiles" || fail "Python package lacks its extension module"
  # Bytecode: compiled by postinst and removed by prerm, as dh_python3 does.
  pctl=$scratch/control-python
  dpkg-deb -e "$(deb "$pname")" "$pctl"
  has -x $'\tpy3compile -p '"$pname" "$pctl/postinst" || fail "$pname's postinst does not run py3compile -p $pname"
  has -x $'\tpy3clean -p '"$pname" "$pctl/prerm" || fail "$pname's prerm does not run py3clean -p $pname"
  grep -q "__pycache__\|\.pyc$" <<<"$pfiles" && fail "Python package ships bytecode (postinst compiles it)"
fi

# ---- Unpacked .debs: build and run against them ----------------------------------------
root=$scratch/root
for d in "${debs[@]}"; do dpkg-deb -x "$d" "$root"; done
if has_component cuda; then
  # What the plug-in really needs: the C/C++ runtime only (cudart is static,
  # the driver is dlopened); this is what the package declares.
  needed=$(readelf -d "$root/$lib/pqcache/libpqcache_cuda.so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
  log "libpqcache_cuda.so NEEDED: $needed"
  for n in $needed; do
    case $n in
      libc.so.6|libm.so.6|libstdc++.so.6|libgcc_s.so.1|ld-linux-*.so.2|libdl.so.2|libpthread.so.0|librt.so.1) ;;
      *) fail "the plug-in NEEDs $n, which its package does not declare" ;;
    esac
  done
  plugin=present
else
  plugin=absent
fi
# A package's .pc names /usr itself, so pkg-config prints normalised paths
# and drops the system directories, and plugindir is a clean path.
pc_dir=$root/$lib/pkgconfig
has -x "prefix=/usr" "$pc_dir/pqcache.pc" || fail "the .deb's pqcache.pc does not say prefix=/usr: $(cat "$pc_dir/pqcache.pc")"
got=$(PKG_CONFIG_LIBDIR=$pc_dir PKG_CONFIG_PATH= pkg-config --cflags --libs pqcache)
[[ $(echo $got) == "-lpqcache" ]] \
  || fail "pkg-config --cflags --libs pqcache gives '$got'; expected -lpqcache (/usr/include and /usr/$PQ_LIBDIR dropped)"
plugindir=$(PKG_CONFIG_LIBDIR=$pc_dir PKG_CONFIG_PATH= pkg-config --variable=plugindir pqcache)
[[ $plugindir == "/usr/$PQ_LIBDIR/pqcache" ]] || fail "pkg-config --variable=plugindir pqcache gives $plugindir"
log "OK: the .deb's pkg-config: '$(echo $got)', plugindir $plugindir"
build_consumers "$root/usr" "$scratch/consumers" "$plugin"
if has_component redis; then
  # A C program against the unpacked Redis packages: pkg-config pqcache-redis
  # (which requires pqcache) and find_package(pqcache-redis).
  flags=$(PKG_CONFIG_SYSROOT_DIR=$root PKG_CONFIG_LIBDIR=$pc_dir PKG_CONFIG_PATH= pkg-config --cflags --libs pqcache-redis) \
    || fail "pkg-config cannot resolve pqcache-redis from the unpacked packages"
  [[ $(echo $flags) == "-I$root/usr/include -L$root/$lib -lpqcache_redis -lpqcache" || $(echo $flags) == "-L$root/$lib -lpqcache_redis -lpqcache" ]] \
    || fail "pkg-config --cflags --libs pqcache-redis gives '$flags'"
  log "pkg-config --cflags --libs pqcache-redis (sysroot $root): $flags"
  # shellcheck disable=SC2086
  "$PQ_C_COMPILER" -std=c99 -pedantic -Wall -Wextra -Werror -I"$root/usr/include" -o "$scratch/redis_consumer_pc" \
    "$TESTS_DIR/redis_consumer.c" $flags || fail "redis_consumer.c with pkg-config pqcache-redis"
  "$CMAKE_COMMAND" -S "$TESTS_DIR/redis_cmake_consumer" -B "$scratch/redis_cmake_consumer" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$root/usr" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF \
    >"$scratch/redis_cmake_consumer.log" 2>&1 && "$CMAKE_COMMAND" --build "$scratch/redis_cmake_consumer" >>"$scratch/redis_cmake_consumer.log" 2>&1 \
    || { cat "$scratch/redis_cmake_consumer.log" >&2; fail "find_package(pqcache-redis) from the unpacked packages"; }
  for bin in "$scratch/redis_consumer_pc" "$scratch/redis_cmake_consumer/redis_consumer"; do
    LD_LIBRARY_PATH=$root/$lib ldd "$bin" | has "libpqcache_redis.so.$PQ_ABI_MAJOR => $root/$lib/" \
      || fail "$bin does not load the unpacked libpqcache_redis.so.$PQ_ABI_MAJOR"
    LD_LIBRARY_PATH=$root/$lib run_redis_consumer "$bin" "$scratch/redis-$(basename "$bin")"
  done
fi
# The runtime package alone: no plug-in next to the library.
only_runtime=$scratch/root-runtime-only
dpkg-deb -x "$runtime" "$only_runtime"
PQCACHE_CUDA_PLUGIN= LD_LIBRARY_PATH=$only_runtime/$lib "$scratch/consumers/plugin_probe" absent \
  || fail "with the runtime package alone, the plug-in should be absent"

# ---- lintian ---------------------------------------------------------------------------
if command -v lintian >/dev/null; then
  lintian_out=$(lintian --tag-display-limit 0 "${debs[@]}" 2>&1 | grep -v '^running with root privileges' || true)
  log "lintian:"
  sed 's/^/  /' <<<"${lintian_out:-(no tags)}"
  grep -q '^E: ' <<<"$lintian_out" && fail "lintian reports errors"
  # Debian's Java policy 2.4: /usr/share/java/<name>-<version>.jar.
  grep -q 'bad-jar-name' <<<"$lintian_out" && fail "lintian: bad-jar-name"
else
  log "NOTE: lintian not installed: the .debs are not linted"
fi

# ---- .rpm ------------------------------------------------------------------------------
if [[ $generators == *RPM* ]]; then
  mapfile -t rpms < <(ls "$out"/*.rpm)
  ((${#rpms[@]} == ${#debs[@]})) || fail "${#rpms[@]} RPMs for ${#debs[@]} .debs"
  rpmroot=$scratch/rpmroot
  rpmlib=usr/$PQ_RPM_LIBDIR  # lib64 where the .debs have $PQ_LIBDIR (packaging/CMakeLists.txt)
  mkdir -p "$rpmroot"
  for r in "${rpms[@]}"; do
    name=$(rpm -qp --qf '%{NAME}' "$r" 2>/dev/null)
    log "$(basename "$r"): Requires (not rpmlib/GLIBC): $(rpm -qp --requires "$r" 2>/dev/null | grep -v -e '^rpmlib(' -e '(GLIBC' -e '(GCC_' -e '(CXXABI' -e '(GLIBCXX' | tr '\n' ' ')"
    # Directories that belong to the filesystem package or to other packages
    # must not be claimed (toolchain notes 8, pitfall 2).
    owned=$(rpm -qlp "$r" 2>/dev/null)
    for shared in /usr /usr/lib /usr/lib64 /usr/include /usr/share /usr/share/doc /usr/share/cargo /usr/share/cargo/registry \
                  "/usr/$PQ_RPM_LIBDIR" "/usr/$PQ_RPM_LIBDIR/pkgconfig" "/usr/$PQ_RPM_LIBDIR/cmake" \
                  /usr/share/java "/usr/$PQ_JNIDIR" /usr/share/gocode /usr/share/gocode/src \
                  /usr/share/maven-repo /usr/share/maven-repo/org; do
      grep -qx "$shared" <<<"$owned" && fail "$name claims the shared directory $shared"
    done
    (cd "$rpmroot" && rpm2cpio "$r" | cpio -idm --quiet) || fail "rpm2cpio | cpio of $r"
    case $name in
      libpqcache${PQ_ABI_MAJOR})
        grep -qx "/$rpmlib/libpqcache.so.$PQ_VERSION" <<<"$owned" || fail "$name lacks the library"
        rpm -qp --scripts "$r" 2>/dev/null | has ldconfig || fail "$name does not run ldconfig"
        rpm -qp --provides "$r" 2>/dev/null | has "^libpqcache.so.$PQ_ABI_MAJOR()" || fail "$name does not provide the soname"
        ;;
      libpqcache-devel)
        grep -qx "/$rpmlib/pkgconfig/pqcache.pc" <<<"$owned" || fail "$name lacks pqcache.pc"
        rpm -qp --requires "$r" 2>/dev/null | has "^libpqcache${PQ_ABI_MAJOR} = $PQ_VERSION" \
          || fail "$name does not require the runtime = version"
        ;;
      golang-*-devel)
        grep -q "^/usr/share/gocode/src/.*/internal/pqswig/pqcache_wrap\.c$" <<<"$owned" || fail "$name lacks the SWIG wrapper"
        [[ $(rpm -qp --qf '%{ARCH}' "$r" 2>/dev/null) == noarch ]] || fail "$name is not noarch"
        rpm -qp --requires "$r" 2>/dev/null | has "^libpqcache-devel = $PQ_VERSION" \
          || fail "$name does not require libpqcache-devel = version"
        ;;
      libpqcache_redis${PQ_ABI_MAJOR})
        grep -qx "/$rpmlib/libpqcache_redis.so.$PQ_VERSION" <<<"$owned" || fail "$name lacks the library"
        rpm -qp --scripts "$r" 2>/dev/null | has ldconfig || fail "$name does not run ldconfig"
        rpm -qp --requires "$r" 2>/dev/null | has "^libhiredis.so" || fail "$name does not require libhiredis"
        ;;
      libpqcache-redis-devel)
        grep -qx "/$rpmlib/pkgconfig/pqcache-redis.pc" <<<"$owned" || fail "$name lacks pqcache-redis.pc"
        rpm -qp --provides "$r" 2>/dev/null | has "^pkgconfig(pqcache-redis)" || fail "$name does not provide pkgconfig(pqcache-redis)"
        ;;
      rust-*-devel)
        [[ $(rpm -qp --qf '%{ARCH}' "$r" 2>/dev/null) == noarch ]] || fail "$name is not noarch"
        rpm -qp --provides "$r" 2>/dev/null | has "^crate(" || fail "$name does not provide crate(...)"
        ;;
      libpqcache${PQ_ABI_MAJOR}-cuda)
        grep -qx "/$rpmlib/pqcache/libpqcache_cuda.so" <<<"$owned" || fail "$name lacks the plug-in"
        rpm -qp --suggests "$r" 2>/dev/null | has "^libcuda.so.1" || fail "$name does not suggest libcuda.so.1"
        ;;
    esac
  done
  # Both formats ship the same files, but for the library directory.
  diff <(cd "$root" && find . \( -type f -o -type l \) | sed "s|^\./$lib/|./$rpmlib/|" | sort) \
       <(cd "$rpmroot" && find . \( -type f -o -type l \) | sort) \
    || fail "the .rpm and .deb file lists differ (beyond $lib -> $rpmlib)"
  # The .rpm's pkg-config and CMake files name its own library directory.
  has -x "libdir=\${prefix}/$PQ_RPM_LIBDIR" "$rpmroot/$rpmlib/pkgconfig/pqcache.pc" \
    || fail "the .rpm's pqcache.pc does not name $PQ_RPM_LIBDIR: $(cat "$rpmroot/$rpmlib/pkgconfig/pqcache.pc")"
  has "/$PQ_RPM_LIBDIR/libpqcache.so.$PQ_VERSION" "$rpmroot/$rpmlib/cmake/pqcache/pqcache-targets.cmake" \
    || fail "the .rpm's pqcache-targets.cmake does not name $PQ_RPM_LIBDIR"
  log "OK: rpm2cpio gives the same $(cd "$rpmroot" && find . \( -type f -o -type l \) | wc -l) files as the .debs"

  if command -v rpmlint >/dev/null; then
    # Errors accepted, as policy: no-signature (signing is the distributor's
    # job), no-binary (the -devel package holds a .so link and lib/ files
    # but no ELF), missing-hash-section (GNU hash only, the toolchain
    # default), outside-libdir-files (the Java package: the jar in
    # /usr/share/java, as Debian has it, next to its arch-specific JNI module),
    # no-dependency-on python-base 3 (rpmlint reads the Python version from
    # the path, and the default lib/python3/dist-packages is Debian's; with
    # -DPQ_PYTHON_INSTALL_DIR=lib64/python3.X/site-packages it is satisfied
    # by the package's python(abi) = 3.X).
    rpmlint_out=$(rpmlint "${rpms[@]}" 2>&1 || true)
    log "rpmlint:"
    grep -E ': (E|W): ' <<<"$rpmlint_out" | sed 's/^/  /' || true
    unexpected=$(grep -E ': E: ' <<<"$rpmlint_out" | grep -Ev ': E: (no-signature|no-binary|missing-hash-section|outside-libdir-files|no-dependency-on python-base)( |$)' || true)
    [[ -z $unexpected ]] || fail "rpmlint errors: $unexpected"
  else
    log "NOTE: rpmlint not installed (optional): the .rpms are not linted"
  fi
fi
log "PASS: ${#debs[@]} .debs$([[ $generators == *RPM* ]] && echo " and ${#rpms[@]} .rpms") in $out"
