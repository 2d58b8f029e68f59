#!/usr/bin/env bash
# Generates pqcache-sys/src/generated.rs, the raw Rust declarations of
# include/pqcache.h, with bindgen (the Debian package `bindgen`; it loads
# libclang at run time). The file is committed: the crate builds offline
# with no bindgen and no build-time dependency (docs/bindings/rust.md).
#
#   bindings/rust/generate-sys.sh           rewrite generated.rs
#   bindings/rust/generate-sys.sh --check   regenerate into a temporary file and
#                                           fail (exit 1, with the diff) when it
#                                           differs from the committed one;
#                                           exit 77 (SKIPPED) without bindgen or
#                                           rustfmt, or with another bindgen
#                                           version than the one that made it
#
# Run it after every change to include/pqcache.h. $BINDGEN and $RUSTFMT name
# the programs (default: the ones on PATH).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
header=$(cd "$here/../../include" && pwd)/pqcache.h
committed=$here/pqcache-sys/src/generated.rs

check=0
case "${1:-}" in
  "") ;;
  --check) check=1 ;;
  -h|--help) sed -n '2,16p' "${BASH_SOURCE[0]}"; exit 0 ;;
  *) echo "generate-sys.sh: unknown option $1" >&2; exit 2 ;;
esac

# Without the tools the check cannot run: it says so and is counted as
# skipped (CTest's SKIP_RETURN_CODE); generating fails.
missing() {
  if ((check)); then echo "SKIPPED: $1"; exit 77; fi
  echo "generate-sys.sh: $1" >&2; exit 1
}
bindgen=${BINDGEN:-bindgen}
command -v "$bindgen" >/dev/null ||
  missing "no $bindgen: bindgen is not installed (Debian package bindgen; scripts/setup.sh installs it)"
# bindgen formats its output with the rustfmt that $RUSTFMT names, as `cargo fmt` does.
RUSTFMT=${RUSTFMT:-rustfmt}
command -v "$RUSTFMT" >/dev/null ||
  missing "no $RUSTFMT: rustfmt is not installed (rustup's rustfmt component, or the Debian package rustfmt)"
RUSTFMT=$(command -v "$RUSTFMT")
export RUSTFMT
version=$("$bindgen" --version)

# bindgen's output differs between its versions (paths, attributes, extern
# blocks); a comparison with another version's would fail on those, not on
# the header.
if ((check)); then
  made_by=$(sed -n 's|^// Made by \(bindgen .*\) from include/pqcache.h.*|\1|p' "$committed")
  if [[ $made_by != "$version" ]]; then
    echo "SKIPPED: $committed was made by ${made_by:-an unknown generator}, this is $version;" \
         "compare with that version (Debian 12's bindgen)"
    exit 77
  fi
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Options shared by both runs:
#   --size_t-is-usize             size_t is usize (the callbacks' sizes);
#   --disable-header-comment      the file's own header below names the version once;
#   -std=c99                      the header's language.
# The header's comments are plain /* */ ones, which bindgen does not carry:
# the items have no documentation of their own here, the header has it
# (clang's -fparse-all-comments would carry them, but attaches the section
# banners and some comments to the wrong items).
common=(--size_t-is-usize --disable-header-comment)
clang_args=(-std=c99)

# 1. Constants, types and structs.
#   --allowlist-type/var          only the header's own names, pq_* and PQ_*;
#   --blocklist-type __.*         glibc's __int32_t & co., pulled in by int32_t
#                                 (bindgen writes i32 for int32_t itself);
#   --blocklist-type pq_context|pq_pool
#                                 the opaque handles are written by hand in lib.rs:
#                                 bindgen's opaque struct would be Copy, Send and
#                                 Sync, which a C handle is not;
#   --no-derive-copy --no-derive-debug
#                                 c_struct! derives Debug, Clone and Copy for every
#                                 struct: bindgen derives none for a struct that
#                                 holds a blocklisted type (int32_t is __int32_t,
#                                 pq_hooks holds a pq_pool*);
#   --no-prepend-enum-name        PQ_OK, not pq_status_PQ_OK;
#   --default-enum-style consts   an enum is a type alias and constants, never a
#                                 Rust enum: an unknown value from C is a number;
#   --default-macro-constant-type signed
#                                 a #define'd number is an int in C: i32, not u32;
#   --no-layout-tests             tests/header.rs checks every size, offset and
#                                 field type against the C compiler at test time.
"$bindgen" "$header" "${common[@]}" -o "$work/types.rs" \
  --ignore-functions \
  --allowlist-type 'pq_.*' --allowlist-var 'PQ_.*' \
  --blocklist-type '__.*' --blocklist-type 'pq_context|pq_pool' \
  --no-derive-copy --no-derive-debug \
  --no-prepend-enum-name --default-enum-style consts \
  --default-macro-constant-type signed \
  --no-layout-tests \
  -- "${clang_args[@]}"

# 2. The functions, each in its own extern "C" block.
"$bindgen" "$header" "${common[@]}" -o "$work/functions.rs" \
  --generate functions --allowlist-function 'pq_.*' \
  -- "${clang_args[@]}"

# Two rewrites of bindgen's output, both checked below:
# - clang types a C enum `unsigned int` when no value is negative, and bindgen
#   keeps that type (it has no option to choose it); the header's enum values
#   travel as int32_t (struct fields, parameters), so every enum alias is i32;
# - every struct goes into crate::c_struct! { }, which adds its FIELDS table
#   (name, offset, C type) for tests/header.rs.
awk '
  /^pub type pq_[a-z0-9_]+ = ::std::os::raw::c_(u)?int;$/ { sub(/= .*/, "= i32;"); enums++ }
  /^#\[repr\(C\)\]$/ { print "crate::c_struct! {"; open = 1; structs++ }
  { print }
  /^}$/ && open { print "}"; open = 0 }
  END { printf "%d %d\n", enums, structs > "/dev/stderr" }
' "$work/types.rs" >"$work/types-rewritten.rs" 2>"$work/counts"
read -r enums structs <"$work/counts"
header_enums=$(grep -c '^typedef enum pq_[a-z0-9_]* {$' "$header")
header_structs=$(grep -c '^typedef struct pq_[a-z0-9_]* {$' "$header")
if [[ $enums != "$header_enums" || $structs != "$header_structs" ]]; then
  echo "generate-sys.sh: rewrote $enums enum aliases and $structs structs, the header defines" \
       "$header_enums enums and $header_structs structs: bindgen's output is not what this script expects" >&2
  exit 1
fi

{
  echo "// Raw declarations of include/pqcache.h. Do not edit: bindings/rust/generate-sys.sh"
  echo "// writes this file; rerun it after changing the header."
  echo "// Made by $version from include/pqcache.h, enum aliases typed i32."
  echo
  echo "use crate::{pq_context, pq_pool}; // the opaque handles, declared by hand in lib.rs"
  echo
  cat "$work/types-rewritten.rs"
  echo
  echo "// Every function, as crate::pq_functions! takes them: it declares them (feature"
  echo "// \"link\") and derives the Api table of function pointers from the same list."
  echo "crate::pq_functions! {"
  cat "$work/functions.rs"
  echo "}"
} >"$work/generated.rs"
# What `cargo fmt` would make of it, so that formatting the crate leaves it as is.
"$RUSTFMT" --edition 2021 "$work/generated.rs"

if ((check)); then
  # Formatted alike on both sides, so that another rustfmt version is no difference.
  cp "$committed" "$work/committed.rs"
  "$RUSTFMT" --edition 2021 "$work/committed.rs"
  if ! diff -u --label "committed $committed" --label "regenerated from $header" \
       "$work/committed.rs" "$work/generated.rs"; then
    echo "FAIL: generated.rs does not match include/pqcache.h: run bindings/rust/generate-sys.sh" >&2
    exit 1
  fi
  echo "generated.rs matches include/pqcache.h ($version)"
else
  cp "$work/generated.rs" "$committed"
  echo "wrote $committed ($version)"
fi
