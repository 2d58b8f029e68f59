//! With the "link" feature, this crate's own tests get an rpath
//! to the directory pqcache-sys linked libpqcache from (DEP_PQCACHE_LIB_DIR,
//! from its `links = "pqcache"`), so `cargo test` runs without
//! LD_LIBRARY_PATH. Programs that depend on this crate are not affected.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if let Some(dir) = std::env::var_os("DEP_PQCACHE_LIB_DIR") {
        let dir = dir.to_string_lossy();
        println!("cargo:rustc-link-arg-tests=-Wl,-rpath,{dir}");
    }
}
