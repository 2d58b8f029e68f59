//! The dlopen example of the docs compiles as written: it is the doc test
//! of `Library::load` (src/library.rs), and README.md and
//! docs/bindings/rust.md carry the same lines.

use std::path::Path;

fn read(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The visible lines of the first doc-test block after `marker` in a Rust
/// source: `/// ` stripped, hidden `# ` lines left out.
fn doc_example(source: &str, marker: &str) -> Vec<String> {
    let after = &source[source.find(marker).expect("the marker is in the source")..];
    let mut lines = after
        .lines()
        .map(|l| l.trim_start().trim_start_matches("///"));
    lines
        .by_ref()
        .find(|l| l.trim() == "```")
        .expect("a doc-test block");
    lines
        .take_while(|l| l.trim() != "```")
        .map(|l| l.strip_prefix(' ').unwrap_or(l).to_owned())
        .filter(|l| !l.starts_with("# "))
        .collect()
}

#[test]
fn the_dlopen_example_of_the_docs_is_the_doc_test() {
    let source = read("src/library.rs");
    let marker = "Without the `link` feature";
    let example = doc_example(&source, marker);
    assert!(
        example.iter().any(|l| l.contains("Library::load")),
        "{example:?}"
    );
    let block = example.join("\n");
    for doc in ["../../../README.md", "../../../docs/bindings/rust.md"] {
        let text = read(doc);
        assert!(
            text.contains(&block),
            "{doc} does not carry the dlopen example of Library::load as written:\n{block}"
        );
    }
}
