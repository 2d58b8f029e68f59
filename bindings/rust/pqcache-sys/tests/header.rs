//! The declarations (bindgen's, src/generated.rs, and lib.rs's) against the
//! C compiler's view of include/pqcache.h: struct sizes and field offsets (pq_struct_layout), field
//! C types, constant values and callback signatures (pq_rust_header_facts),
//! and the names of every function, constant and callback type in the header
//! text itself. Any drift fails here.
//!
//! CTest passes the programs' paths in $PQ_STRUCT_LAYOUT and
//! $PQ_HEADER_FACTS; by hand, they default to the repository's build/.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use pqcache_sys::*;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..")
}

/// Runs the C program named by `env_var` (default: `default` under the
/// repository's build/) and returns its stdout lines.
fn run_c_program(env_var: &str, default: &str) -> Vec<String> {
    let path = std::env::var_os(env_var)
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("build").join(default));
    let output = Command::new(&path).output().unwrap_or_else(|e| {
        panic!(
            "cannot run {} ({e}); build it or set ${env_var}",
            path.display()
        )
    });
    assert!(
        output.status.success(),
        "{} failed: {:?}",
        path.display(),
        output
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Asserts equal maps, listing only the keys whose values differ (a full
/// map dump would hide the one wrong field among a hundred).
fn assert_same<K: Ord + std::fmt::Debug, V: PartialEq + std::fmt::Debug>(
    what: &str,
    rust: &BTreeMap<K, V>,
    c: &BTreeMap<K, V>,
) {
    let keys: BTreeSet<&K> = rust.keys().chain(c.keys()).collect();
    let differences: Vec<String> = keys
        .into_iter()
        .filter(|k| rust.get(k) != c.get(k))
        .map(|k| format!("  {k:?}: Rust {:?}, C {:?}", rust.get(k), c.get(k)))
        .collect();
    assert!(
        differences.is_empty(),
        "{what} differ (None: missing on that side):\n{}",
        differences.join("\n")
    );
}

fn assert_same_names(what: &str, rust: &BTreeSet<String>, header: &BTreeSet<String>) {
    let missing: Vec<&String> = header.difference(rust).collect();
    let extra: Vec<&String> = rust.difference(header).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{what}: in the header but not declared in Rust: {missing:?}; declared but not in the header: {extra:?}"
    );
}

fn header_text() -> String {
    std::fs::read_to_string(repo_root().join("include/pqcache.h")).expect("read include/pqcache.h")
}

#[test]
fn struct_sizes_and_offsets_match_the_c_compiler() {
    let mut c_sizes = BTreeMap::new();
    let mut c_offsets = BTreeMap::new();
    for line in run_c_program("PQ_STRUCT_LAYOUT", "tests/pq_struct_layout") {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let [name, field, n] = parts[..] else {
            panic!("unexpected line {line:?}")
        };
        let n: usize = n.parse().unwrap();
        if field == "sizeof" {
            c_sizes.insert(name.to_owned(), n);
        } else {
            c_offsets.insert((name.to_owned(), field.to_owned()), n);
        }
    }

    let mut rust_sizes = BTreeMap::new();
    let mut rust_offsets = BTreeMap::new();
    for &(name, size, fields) in STRUCTS {
        rust_sizes.insert(name.to_owned(), size);
        for &(field, offset, _) in fields {
            rust_offsets.insert((name.to_owned(), field.to_owned()), offset);
        }
    }
    assert_same("struct sizes", &rust_sizes, &c_sizes);
    // Every field on both sides, at the same offset.
    assert_same("field offsets", &rust_offsets, &c_offsets);
}

#[test]
fn field_types_and_constants_match_the_c_compiler() {
    let facts = run_c_program("PQ_HEADER_FACTS", "bindings/rust/pq_rust_header_facts");
    let mut c_types = BTreeMap::new();
    let mut c_constants = BTreeMap::new();
    let mut c_version_string = None;
    let mut c_callbacks = BTreeMap::new();
    for line in &facts {
        let parts: Vec<&str> = line.split_whitespace().collect();
        match parts[..] {
            ["field", name, field, ref ctype @ ..] => {
                c_types.insert((name.to_owned(), field.to_owned()), ctype.join(" "));
            }
            ["const", name, value] => {
                c_constants.insert(name.to_owned(), value.parse::<i64>().unwrap());
            }
            ["string", "PQ_VERSION_STRING", value] => c_version_string = Some(value.to_owned()),
            ["callback", name, ref ctype @ ..] => {
                c_callbacks.insert(name.to_owned(), ctype.join(" "));
            }
            _ => panic!("unexpected line {line:?}"),
        }
    }

    let rust_types: BTreeMap<(String, String), String> = STRUCTS
        .iter()
        .flat_map(|&(name, _, fields)| {
            fields.iter().map(move |&(field, _, ctype)| {
                ((name.to_owned(), field.to_owned()), ctype.to_owned())
            })
        })
        .collect();
    assert_same("field C types", &rust_types, &c_types);

    let rust_constants: BTreeMap<String, i64> = rust_constants()
        .into_iter()
        .map(|(n, v)| (n.to_owned(), v))
        .collect();
    assert_same("constants", &rust_constants, &c_constants);
    // "unknown" on the C side: the typedef is not the signature Rust declares.
    let rust_callbacks: BTreeMap<String, String> = CALLBACKS
        .iter()
        .map(|&(name, ctype)| (name.to_owned(), ctype.to_owned()))
        .collect();
    assert_same("callback types", &rust_callbacks, &c_callbacks);
    assert_eq!(c_version_string.as_deref(), PQ_VERSION_STRING.to_str().ok());
    assert_eq!(
        PQ_SONAME.to_str().unwrap(),
        format!("libpqcache.so.{PQ_VERSION_MAJOR}")
    );
    assert_eq!(
        env!("CARGO_PKG_VERSION"),
        PQ_VERSION_STRING.to_str().unwrap(),
        "crate version vs header"
    );
}

/// Every constant of the header as declared on the Rust side.
fn rust_constants() -> Vec<(&'static str, i64)> {
    macro_rules! table { ($($c:ident),* $(,)?) => { vec![$((stringify!($c), $c as i64)),*] }; }
    table![
        PQ_VERSION_MAJOR,
        PQ_VERSION_MINOR,
        PQ_VERSION_PATCH,
        PQ_VERSION_NUMBER,
        PQ_OK,
        PQ_ERR_INVALID_ARGUMENT,
        PQ_ERR_OUT_OF_MEMORY,
        PQ_ERR_BAD_STATE,
        PQ_ERR_NOT_FOUND,
        PQ_ERR_UNSUPPORTED,
        PQ_ERR_BACKEND,
        PQ_ERR_INTERNAL,
        PQ_ERR_BUFFER_TOO_SMALL,
        PQ_ERR_CORRUPT,
        PQ_ERR_INCOMPATIBLE,
        PQ_DTYPE_F32,
        PQ_DTYPE_F16,
        PQ_DTYPE_BF16,
        PQ_DTYPE_FP8_E4M3,
        PQ_DTYPE_FP8_E5M2,
        PQ_MEMORY_HOST,
        PQ_MEMORY_DEVICE,
        PQ_SELECTOR_PQ,
        PQ_SELECTOR_EXACT,
        PQ_SELECTOR_WINDOW,
        PQ_SELECTOR_SPARQ,
        PQ_SELECTOR_INFLLM,
        PQ_SELECTOR_QUEST,
        PQ_SELECTOR_RANDOM,
        PQ_SELECTOR_H2O,
        PQ_SELECTOR_SCOPE,
        PQ_SELECTOR_SNAPKV,
        PQ_SELECTOR_PYRAMIDKV,
        PQ_SELECTOR_SCISSORHANDS,
        PQ_SELECTOR_KEYFORMER,
        PQ_SELECTOR_CLUSTERKV,
        PQ_SELECTOR_ADAKV,
        PQ_SELECTOR_ZIGZAGKV,
        PQ_SELECTOR_PYRAMIDINFER,
        PQ_SELECTOR_FASTGEN,
        PQ_SELECTOR_INFINIGEN,
        PQ_SELECTOR_COUNT,
        PQ_TOKEN_PLAIN,
        PQ_TOKEN_SPECIAL,
        PQ_TOKEN_PUNCTUATION,
        PQ_GQA_SUM_SOFTMAX,
        PQ_GQA_MAX,
        PQ_GQA_MEAN,
        PQ_KMEANS_INIT_RANDOM,
        PQ_KMEANS_INIT_KMEANSPP,
        PQ_BACKEND_CPU,
        PQ_BACKEND_CUDA,
        PQ_BACKEND_AUTO,
        PQ_CACHE_LRU,
        PQ_CACHE_LFU,
        PQ_ROTARY_NONE,
        PQ_ROTARY_HALF,
        PQ_ROTARY_INTERLEAVED,
        PQ_POOLING_MAX,
        PQ_POOLING_AVG,
        PQ_TAIL_NONE,
        PQ_TAIL_CODE_MEANS,
        PQ_KV_TIER_HOST,
        PQ_KV_TIER_DISK,
        PQ_KV_TIER_CALLER,
        PQ_ROWS_PER_TOKEN,
        PQ_ROWS_PER_HEAD,
        PQ_ROWS_PER_REQUEST,
        PQ_LAYOUT_TOKEN_MAJOR,
        PQ_LAYOUT_HEAD_MAJOR,
        PQ_LOG_ERROR,
        PQ_LOG_WARN,
        PQ_LOG_INFO,
        PQ_LOG_DEBUG,
        PQ_BUILD_STAGE_KMEANS,
        PQ_BUILD_STAGE_ENCODE,
    ]
}

/// The identifier that ends `text` (after trimming `*` and spaces).
fn last_identifier(text: &str) -> &str {
    let text = text.trim_end();
    let start = text
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    &text[start..]
}

#[test]
fn every_function_and_constant_of_the_header_is_declared() {
    let header = header_text();
    let mut functions = BTreeSet::new();
    let mut constants = BTreeSet::new();
    let mut callbacks = BTreeSet::new();
    for line in header.lines() {
        let line = line.trim();
        if let (Some(_), Some(start)) = (line.strip_prefix("typedef "), line.find("(*")) {
            // typedef int (*pq_write_fn)(...): a function-pointer type.
            let rest = &line[start + 2..];
            callbacks.insert(rest[..rest.find(')').expect("(*name)")].trim().to_owned());
        } else if let Some(rest) = line.strip_prefix("PQ_API ") {
            let name =
                last_identifier(&rest[..rest.find('(').expect("a PQ_API line names a function")]);
            functions.insert(name.to_owned());
        } else if let Some(rest) = line.strip_prefix("#define ") {
            let name = rest.split_whitespace().next().unwrap_or("");
            if name.starts_with("PQ_") && name != "PQ_API" {
                constants.insert(name.to_owned());
            }
        } else if line.starts_with("PQ_") && line.contains('=') {
            constants.insert(line[..line.find('=').unwrap()].trim().to_owned());
        }
    }
    assert!(
        functions.len() >= 28,
        "the header scan found too few functions: {functions:?}"
    );

    let declared: BTreeSet<String> = Api::FUNCTION_NAMES.iter().map(|s| s.to_string()).collect();
    assert_same_names("functions", &declared, &functions);

    assert!(
        callbacks.contains("pq_write_fn"),
        "the header scan found no pq_write_fn: {callbacks:?}"
    );
    let declared: BTreeSet<String> = CALLBACKS.iter().map(|c| c.0.to_owned()).collect();
    assert_same_names("callback types", &declared, &callbacks);

    let mut declared: BTreeSet<String> = rust_constants().iter().map(|c| c.0.to_owned()).collect();
    declared.insert("PQ_VERSION_STRING".to_owned());
    assert_same_names("constants", &declared, &constants);
}

#[cfg(feature = "link")]
#[test]
fn linked_library_reports_this_version_and_status_names() {
    use std::ffi::CStr;
    unsafe {
        assert_eq!((LINKED.pq_version_number)(), PQ_VERSION_NUMBER);
        assert_eq!(
            CStr::from_ptr((LINKED.pq_version_string)()),
            PQ_VERSION_STRING
        );
        // The library names its statuses; each must name the constant that
        // has that value here.
        for (name, value) in rust_constants()
            .into_iter()
            .filter(|c| c.0.starts_with("PQ_ERR_"))
        {
            let text = CStr::from_ptr((LINKED.pq_status_string)(value as i32))
                .to_string_lossy()
                .into_owned();
            assert!(
                text.starts_with(name),
                "pq_status_string({value}) = {text:?}, expected {name}"
            );
        }
    }
}
