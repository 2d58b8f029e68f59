#!/usr/bin/env bash
# CTest packaging_rust_consumer: the Rust crates as a user outside this tree
# gets them, from the packages librust-pqcache-sys-dev and librust-pqcache-dev.
#   - `cargo package --workspace --offline` makes the two .crate files (and
#     builds each from its packaged sources alone) without a warning;
#   - the crates' packages (dpkg -x, or given `system` the ones dpkg -i
#     installed) hold /usr/share/cargo/registry/<crate>-<version>/ with a
#     .cargo-checksum.json that lists every file with its sha256, as
#     Debian's librust-*-dev do;
#   - a new Cargo project in the scratch folder depends on
#     `pqcache = { version = "=X", default-features = false }` with crates-io
#     replaced by that directory ("debian-packages", as Debian's cargo
#     configuration names it), offline; its main.rs is the dlopen example of
#     README.md as written, and it runs against the runtime .deb unpacked
#     with dpkg -x (or, given `system`, the library dpkg -i installed);
#   - the binary does not link libpqcache: it loads it;
#   - given `system`, the same program with the default feature "link"
#     (pqcache-sys's build script finds libpqcache-dev through pkg-config)
#     links the installed library and runs;
#   - a damaged registry (a file changed after packaging) is refused by
#     cargo: the checksums are checked, not decoration.
#
#   check_rust_consumer.sh SCRATCH_DIR PACKAGES_SCRATCH_DIR|system
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

scratch=${1:?usage: check_rust_consumer.sh SCRATCH_DIR PACKAGES_SCRATCH_DIR|system}
library_from=${2:?usage: check_rust_consumer.sh SCRATCH_DIR PACKAGES_SCRATCH_DIR|system}
: "${PQ_CARGO:?}" "${PQ_DEB_NAME_RUNTIME:?}" "${PQ_DEB_VERSION:?}"
fresh_dir "$scratch"

# ---- the library and the crates: the packages unpacked, or the system's ----------------
: "${PQ_DEB_NAME_RUST_SYS:?}" "${PQ_DEB_NAME_RUST:?}"
if [[ $library_from == system ]]; then
  libdir=
  registry=/usr/share/cargo/registry
else
  for name in "$PQ_DEB_NAME_RUNTIME" "$PQ_DEB_NAME_RUST_SYS" "$PQ_DEB_NAME_RUST"; do
    dpkg-deb -x "$(deb_file "$library_from/out" "$name")" "$scratch/root"  # packaging_deb_rpm makes them
  done
  libdir=$scratch/root/usr/$PQ_LIBDIR
  expect_files "$libdir" "libpqcache.so.$PQ_ABI_MAJOR"
  registry=$scratch/root/usr/share/cargo/registry
fi
# Every file of a crate is listed with its sha256, and nothing else is.
for crate in pqcache-sys pqcache; do
  dir=$registry/$crate-$PQ_VERSION
  [[ -f $dir/Cargo.toml && -f $dir/.cargo-checksum.json ]] || fail "$dir lacks Cargo.toml or .cargo-checksum.json"
  python3 - "$dir" <<'PY' || fail "$dir/.cargo-checksum.json does not match the crate's files"
import hashlib, json, os, sys
root = sys.argv[1]
listed = json.load(open(os.path.join(root, ".cargo-checksum.json")))
assert set(listed) == {"files", "package"}, f"keys {sorted(listed)}"
found = {}
for base, _, names in os.walk(root):
    for name in names:
        path = os.path.relpath(os.path.join(base, name), root)
        if path != ".cargo-checksum.json":
            found[path] = hashlib.sha256(open(os.path.join(base, name), "rb").read()).hexdigest()
if found != listed["files"]:
    missing, extra = set(found) - set(listed["files"]), set(listed["files"]) - set(found)
    wrong = [p for p in set(found) & set(listed["files"]) if found[p] != listed["files"][p]]
    sys.exit(f"unlisted {sorted(missing)}, listed but absent {sorted(extra)}, wrong sum {sorted(wrong)}")
print(f"{root}: {len(found)} files, checksums match")
PY
done
log "OK: $registry holds pqcache-sys-$PQ_VERSION and pqcache-$PQ_VERSION with matching .cargo-checksum.json"

# ---- the .crate files ----------------------------------------------------------------
export CARGO_HOME=${PQ_CARGO_HOME:-$scratch/cargo-home}
export CARGO_TARGET_DIR=$scratch/package-target
start=$SECONDS
# --allow-dirty: the tests run on working trees with changes in progress too.
"$PQ_CARGO" package --workspace --offline --allow-dirty \
  --manifest-path "$PQ_SOURCE_DIR/bindings/rust/Cargo.toml" >"$scratch/package.log" 2>&1 \
  || { cat "$scratch/package.log" >&2; fail "cargo package --workspace --offline"; }
log "cargo package (each crate built from its packaged sources): $((SECONDS - start)) s"
for c in "$CARGO_TARGET_DIR/package/pqcache-sys-$PQ_VERSION.crate" "$CARGO_TARGET_DIR/package/pqcache-$PQ_VERSION.crate"; do
  [[ -f $c ]] || fail "cargo package made no $c"
done
# No warning on a successful package (a missing homepage, a library the
# build script could not find, ...).
if has -i 'warning' "$scratch/package.log"; then
  cat "$scratch/package.log" >&2
  fail "cargo package warns"
fi
log "OK: cargo package printed no warning"

# ---- the consumer: README's dlopen example as written ----------------------------------
app=$scratch/app
mkdir -p "$app/src" "$app/.cargo"
cat >"$app/Cargo.toml" <<EOF
[package]
name = "pqcache-consumer"
version = "0.1.0"
edition = "2021"
publish = false

[dependencies]
pqcache = { version = "=$PQ_VERSION", default-features = false }
EOF
cat >"$app/.cargo/config.toml" <<EOF
[source.crates-io]
replace-with = "debian-packages"

[source.debian-packages]
directory = "$registry"
EOF
example=$(awk '/^```rust$/ {block = ""; inside = 1; next}
               /^```$/ && inside {if (block ~ /Library::load/) {printf "%s", block; exit} inside = 0; next}
               inside {block = block $0 "\n"}' "$PQ_SOURCE_DIR/README.md")
[[ $example == *"Library::load"* ]] || fail "README.md has no rust block with Library::load"
{
  echo "fn main() -> Result<(), pqcache::Error> {"
  echo "$example" | sed 's/^/    /'
  echo '    println!("dlopen example: seq 7 added, {} sequence(s)", ctx.sequence_count()?);'
  echo "    Ok(())"
  echo "}"
} >"$app/src/main.rs"
start=$SECONDS
(cd "$app" && "$PQ_CARGO" build --offline >"$scratch/build.log" 2>&1) \
  || { cat "$app/src/main.rs" "$scratch/build.log" >&2; fail "the dlopen example does not build from the crates in $registry"; }
log "consumer built from the crates in $registry: $((SECONDS - start)) s"
bin=$CARGO_TARGET_DIR/debug/pqcache-consumer
if readelf -d "$bin" | has 'NEEDED.*libpqcache'; then fail "$bin links libpqcache; the example must load it"; fi
if [[ -n $libdir ]]; then
  out=$(LD_LIBRARY_PATH=$libdir "$bin" 2>&1) || { echo "$out" >&2; fail "the dlopen example failed"; }
else
  out=$(env -u LD_LIBRARY_PATH "$bin" 2>&1) || { echo "$out" >&2; fail "the dlopen example failed on the system library"; }
fi
[[ $out == *"1 sequence(s)"* ]] || fail "unexpected output: $out"
log "OK: $out (library from ${libdir:-the system})"

# ---- the default feature "link" against the installed library (system only) ------------
if [[ -z $libdir ]]; then
  linked=$scratch/app-linked
  cp -r "$app" "$linked"
  sed -i 's/, default-features = false//' "$linked/Cargo.toml"
  has -x 'pqcache = { version = "='"$PQ_VERSION"'" }' "$linked/Cargo.toml" || fail "could not turn the link feature on in $linked/Cargo.toml"
  (cd "$linked" && env -u PQCACHE_LIB_DIR -u PKG_CONFIG_PATH -u PKG_CONFIG_LIBDIR \
     CARGO_TARGET_DIR="$scratch/linked-target" "$PQ_CARGO" build --offline >"$scratch/build-linked.log" 2>&1) \
    || { cat "$scratch/build-linked.log" >&2; fail "the example with the link feature does not build against the installed libpqcache-dev"; }
  has -i 'warning' "$scratch/build-linked.log" && { cat "$scratch/build-linked.log" >&2; fail "the linked build warns"; }
  bin=$scratch/linked-target/debug/pqcache-consumer
  readelf -d "$bin" | has "NEEDED.*libpqcache.so.$PQ_ABI_MAJOR" || fail "$bin does not link libpqcache.so.$PQ_ABI_MAJOR"
  out=$(env -u LD_LIBRARY_PATH "$bin" 2>&1) || { echo "$out" >&2; fail "the linked example failed on the system library"; }
  [[ $out == *"1 sequence(s)"* ]] || fail "unexpected output: $out"
  log "OK: with the link feature: $out"
fi

# ---- a damaged crate is refused (cargo checks the listed sums) -------------------------
damaged=$scratch/damaged-registry
cp -r "$registry" "$damaged"
echo "// changed after packaging" >>"$damaged/pqcache-$PQ_VERSION/src/lib.rs"
sed -i "s|^directory = .*|directory = \"$damaged\"|" "$app/.cargo/config.toml"
if (cd "$app" && "$PQ_CARGO" build --offline >"$scratch/build-damaged.log" 2>&1); then
  fail "cargo built from a registry whose pqcache/src/lib.rs no longer matches its checksum"
fi
has -i 'checksum' "$scratch/build-damaged.log" || { cat "$scratch/build-damaged.log" >&2; fail "the damaged registry failed for another reason than its checksum"; }
log "OK: a changed file in the registry is refused: $(grep -i -m1 'checksum' "$scratch/build-damaged.log")"

# ---- no library anywhere: the linker's own error, not a silenced one -------------------
# (packages mode only.) The build script no longer warns when it finds no
# library directory; a program that links must then still fail, saying so.
# Held against packaging_deb_system (which installs libpqcache-dev) by a
# shared lock on its lock file.
if [[ -n $libdir ]]; then
  lockfile=/var/lock/pqcache-packaging-system-test.lock
  { exec 7<>"$lockfile"; } 2>/dev/null || { exec 7<"$lockfile"; } 2>/dev/null || exec 7</dev/null
  flock -s -w 300 7 || fail "packaging_deb_system held $lockfile for 5 minutes"
  found=$("$PQ_C_COMPILER" -print-file-name=libpqcache.so)
  if [[ $found == /* ]]; then
    log "SKIPPED (the missing-library check): $found is in the linker's search path"
  else
    nolib=$scratch/app-nolib
    cp -r "$app" "$nolib"
    sed -i 's/, default-features = false//' "$nolib/Cargo.toml"
    sed -i "s|^directory = .*|directory = \"$registry\"|" "$nolib/.cargo/config.toml"
    if (cd "$nolib" && env -u PQCACHE_LIB_DIR -u PKG_CONFIG_PATH PKG_CONFIG_LIBDIR=/nonexistent \
          CARGO_TARGET_DIR="$scratch/nolib-target" "$PQ_CARGO" build --offline >"$scratch/build-nolib.log" 2>&1); then
      fail "the link feature built a program with no libpqcache anywhere"
    fi
    has -E 'unable to find library -lpqcache|cannot find -lpqcache' "$scratch/build-nolib.log" \
      || { cat "$scratch/build-nolib.log" >&2; fail "without libpqcache the link failed for another reason"; }
    log "OK: without any libpqcache the link feature fails as the linker says: $(grep -m1 -oE 'unable to find library -lpqcache|cannot find -lpqcache' "$scratch/build-nolib.log")"
  fi
  exec 7<&-
fi
