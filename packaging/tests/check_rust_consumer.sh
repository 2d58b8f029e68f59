#!/usr/bin/env bash
# CTest packaging_rust_consumer: the Rust crates as a user outside this tree
# gets them, against the library of the packages.
#   - `cargo package --workspace --offline` makes the two .crate files (and
#     builds each from its packaged sources alone);
#   - they are vendored the way `cargo vendor` lays a directory source out;
#   - a new Cargo project in the scratch folder depends on
#     `pqcache = { version = "=X", default-features = false }` through that
#     source, its main.rs is the dlopen example of README.md as written,
#     and it runs against the runtime .deb unpacked with dpkg -x (or, given
#     `system`, the library dpkg -i installed);
#   - the binary does not link libpqcache: it loads it.
#
#   check_rust_consumer.sh SCRATCH_DIR PACKAGES_SCRATCH_DIR|system
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

scratch=${1:?usage: check_rust_consumer.sh SCRATCH_DIR PACKAGES_SCRATCH_DIR|system}
library_from=${2:?usage: check_rust_consumer.sh SCRATCH_DIR PACKAGES_SCRATCH_DIR|system}
: "${PQ_CARGO:?}" "${PQ_DEB_NAME_RUNTIME:?}" "${PQ_DEB_VERSION:?}"
fresh_dir "$scratch"

# ---- the library: the runtime package unpacked, or the system's -----------------------
if [[ $library_from == system ]]; then
  libdir=
else
  deb=$library_from/out/${PQ_DEB_NAME_RUNTIME}_${PQ_DEB_VERSION}_$(dpkg --print-architecture).deb
  [[ -f $deb ]] || fail "$deb is missing (packaging_deb_rpm makes it)"
  dpkg-deb -x "$deb" "$scratch/root"
  libdir=$scratch/root/usr/$PQ_LIBDIR
  expect_files "$libdir" "libpqcache.so.$PQ_ABI_MAJOR"
fi

# ---- the .crate files ----------------------------------------------------------------
export CARGO_HOME=${PQ_CARGO_HOME:-$scratch/cargo-home}
export CARGO_TARGET_DIR=$scratch/package-target
start=$SECONDS
# --allow-dirty: the tests run on working trees with changes in progress too.
"$PQ_CARGO" package --workspace --offline --allow-dirty \
  --manifest-path "$PQ_SOURCE_DIR/bindings/rust/Cargo.toml" >"$scratch/package.log" 2>&1 \
  || { cat "$scratch/package.log" >&2; fail "cargo package --workspace --offline"; }
log "cargo package (each crate built from its packaged sources): $((SECONDS - start)) s"
crates=("$CARGO_TARGET_DIR/package/pqcache-sys-$PQ_VERSION.crate" "$CARGO_TARGET_DIR/package/pqcache-$PQ_VERSION.crate")
for c in "${crates[@]}"; do [[ -f $c ]] || fail "cargo package made no $c"; done

# ---- vendored: a directory source, as `cargo vendor` writes it -----------------------
vendor=$scratch/vendor
mkdir -p "$vendor"
for c in "${crates[@]}"; do
  tar -xzf "$c" -C "$vendor"
  dir=$vendor/$(basename "$c" .crate)
  printf '{"files":{},"package":"%s"}\n' "$(sha256sum "$c" | cut -d' ' -f1)" >"$dir/.cargo-checksum.json"
done

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
replace-with = "vendored"

[source.vendored]
directory = "$vendor"
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
  || { cat "$app/src/main.rs" "$scratch/build.log" >&2; fail "the dlopen example does not build from the vendored crates"; }
log "consumer built from the vendored crates: $((SECONDS - start)) s"
bin=$CARGO_TARGET_DIR/debug/pqcache-consumer
if readelf -d "$bin" | has 'NEEDED.*libpqcache'; then fail "$bin links libpqcache; the example must load it"; fi
if [[ -n $libdir ]]; then
  out=$(LD_LIBRARY_PATH=$libdir "$bin" 2>&1) || { echo "$out" >&2; fail "the dlopen example failed"; }
else
  out=$(env -u LD_LIBRARY_PATH "$bin" 2>&1) || { echo "$out" >&2; fail "the dlopen example failed on the system library"; }
fi
[[ $out == *"1 sequence(s)"* ]] || fail "unexpected output: $out"
log "OK: $out (library from ${libdir:-the system})"
