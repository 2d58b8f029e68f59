//! Without libpqcache the server must start, say why it cannot use it, and
//! exit with status 2 (never crash in the dynamic loader).

use std::process::{Command, Output};

fn run_server(configure: impl FnOnce(&mut Command)) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rust_server"));
    command.env_remove("PQCACHE_LIB");
    configure(&mut command);
    command.output().expect("run rust_server")
}

fn assert_explains_missing_library(output: &Output, path: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "stderr: {stderr}");
    assert!(stderr.contains("libpqcache is not available"), "{stderr}");
    assert!(
        stderr.contains(path) && stderr.contains("No such file"),
        "names the path and the loader's reason: {stderr}"
    );
    assert!(
        stderr.contains("--library") && stderr.contains("$PQCACHE_LIB"),
        "says what to do: {stderr}"
    );
    assert!(
        output.stdout.is_empty(),
        "nothing was run: {}",
        String::from_utf8_lossy(&output.stdout)
    );
}

#[test]
fn a_missing_library_given_by_argument_is_explained() {
    let path = "/nonexistent/pqcache/libpqcache.so.0";
    let output = run_server(|c| {
        c.args(["--library", path]);
    });
    assert_explains_missing_library(&output, path);
}

#[test]
fn a_missing_library_given_by_environment_is_explained() {
    let path = "/nonexistent/env/libpqcache.so";
    let output = run_server(|c| {
        c.env("PQCACHE_LIB", path);
    });
    assert_explains_missing_library(&output, path);
}

#[test]
fn bad_arguments_are_refused() {
    let output = run_server(|c| {
        c.args(["--steps", "many"]);
    });
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--steps needs a number"));
}
