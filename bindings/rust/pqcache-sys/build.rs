//! Finds libpqcache for the "link" feature, in this order:
//!   1. $PQCACHE_LIB_DIR (a directory holding libpqcache.so);
//!   2. `pkg-config --variable=libdir pqcache`, when pkg-config and pqcache.pc exist;
//!   3. the repository's build directory (../../../build from this crate), if
//!      it holds the library;
//!   4. else no directory: the linker's own search path (a system install,
//!      e.g. Debian's libpqcache-dev). A library it does not find is then
//!      the linker's error "unable to find library -lpqcache"; nothing is
//!      linked before a binary or test is, so `cargo package` (which builds
//!      the library crate only) has nothing to warn about.
//!
//! A directory named explicitly (1 or 2) that lacks libpqcache.so gets a
//! warning: that is a misconfiguration, not a fallback.
//! Without the "link" feature nothing is linked: the library is then loaded
//! at run time through `pqcache_sys::dynamic`.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PQCACHE_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    if env::var_os("CARGO_FEATURE_LINK").is_none() {
        return;
    }

    println!("cargo:rustc-link-lib=dylib=pqcache");
    let Some((dir, source)) = find_library_dir() else {
        return; // the linker's default search path
    };
    if !dir.join("libpqcache.so").exists() {
        println!(
            "cargo:warning=libpqcache.so not found in {} (from {source}); build the library \
             or set PQCACHE_LIB_DIR",
            dir.display()
        );
    }
    let dir = dir.display();
    println!("cargo:rustc-link-search=native={dir}");
    // This crate's own tests find the .so without LD_LIBRARY_PATH; dependents
    // read the directory from DEP_PQCACHE_LIB_DIR (links = "pqcache").
    println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    println!("cargo:lib_dir={dir}");
}

fn find_library_dir() -> Option<(PathBuf, &'static str)> {
    if let Some(dir) = env::var_os("PQCACHE_LIB_DIR").filter(|d| !d.is_empty()) {
        return Some((PathBuf::from(dir), "$PQCACHE_LIB_DIR"));
    }
    if let Some(dir) = pkg_config_libdir() {
        return Some((dir, "pkg-config"));
    }
    // Only when it is there: a packaged crate (cargo package, a registry)
    // has no repository around it.
    let manifest = env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let build = Path::new(&manifest).join("../../../build");
    build
        .join("libpqcache.so")
        .exists()
        .then_some((build, "the repository's build directory"))
}

/// The libdir of pqcache.pc, if pkg-config is installed and knows the package.
fn pkg_config_libdir() -> Option<PathBuf> {
    let output = Command::new("pkg-config")
        .args(["--variable=libdir", "pqcache"])
        .output()
        .ok()?;
    let dir = String::from_utf8(output.stdout).ok()?;
    let dir = dir.trim();
    (output.status.success() && !dir.is_empty()).then(|| PathBuf::from(dir))
}
