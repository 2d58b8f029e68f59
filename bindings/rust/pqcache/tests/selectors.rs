//! The selector rule every binding applies the same way (docs/design.md,
//! "Adding a selector"; tests/check_selector_enums.py applies it to every
//! binding's source): `Selector`'s (name, value) pairs equal the header's
//! `enum pq_selector`, read from include/pqcache.h itself, and there are
//! `PQ_SELECTOR_COUNT` of them, `SELECTOR_COUNT` included. (pqcache-sys's
//! constants are checked against the C compiler in pqcache-sys/tests/header.rs.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use pqcache::{sys, Selector, SELECTOR_COUNT};

/// The pairs of the header's `enum pq_selector`, and `PQ_SELECTOR_COUNT`.
fn header_selectors() -> (BTreeMap<String, i64>, i64) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../include/pqcache.h");
    let text = std::fs::read_to_string(&path).expect("read include/pqcache.h");
    // Without the comments: they mention selectors too.
    let mut code = String::new();
    let mut rest = text.as_str();
    while let Some(start) = rest.find("/*") {
        code.push_str(&rest[..start]);
        rest = rest[start..]
            .split_once("*/")
            .map_or("", |(_, after)| after);
    }
    code.push_str(rest);
    let start = code
        .find("enum pq_selector {")
        .expect("enum pq_selector in the header");
    let body = &code[start..start + code[start..].find('}').unwrap()];
    let pairs: BTreeMap<String, i64> = body
        .split(',')
        .filter_map(|item| item.split_once('='))
        .map(|(name, value)| {
            let name = name.trim().rsplit(char::is_whitespace).next().unwrap();
            (
                name.to_owned(),
                value.trim().parse().expect("a literal selector value"),
            )
        })
        .collect();
    let count = code
        .lines()
        .find_map(|line| line.trim().strip_prefix("#define PQ_SELECTOR_COUNT "))
        .expect("#define PQ_SELECTOR_COUNT in the header")
        .trim()
        .parse()
        .unwrap();
    assert!(!pairs.is_empty(), "no selectors in {}", path.display());
    (pairs, count)
}

/// Every way the binding's pairs and count constant differ from the
/// header's, one a line.
fn differences(
    binding: &BTreeMap<String, i64>,
    count_name: &str,
    count_const: i64,
    header: &BTreeMap<String, i64>,
    count: i64,
) -> Vec<String> {
    let mut problems = Vec::new();
    let mut values: Vec<i64> = header.values().copied().collect();
    values.sort();
    if values != (0..count).collect::<Vec<_>>() {
        problems.push(format!(
            "the header's values {values:?} are not 0 to PQ_SELECTOR_COUNT - 1 = {}",
            count - 1
        ));
    }
    for name in header.keys().chain(binding.keys()).collect::<BTreeSet<_>>() {
        match (binding.get(name), header.get(name)) {
            (None, Some(want)) => problems.push(format!("missing {name} (= {want} in the header)")),
            (Some(got), None) => problems.push(format!("{name} (= {got}) is not in the header")),
            (Some(got), Some(want)) if got != want => {
                problems.push(format!("{name} is {got}, the header says {want}"))
            }
            _ => {}
        }
    }
    if binding.len() as i64 != count {
        problems.push(format!(
            "{} selectors, PQ_SELECTOR_COUNT is {count}",
            binding.len()
        ));
    }
    if count_const != count {
        problems.push(format!(
            "{count_name} is {count_const}, PQ_SELECTOR_COUNT is {count}"
        ));
    }
    problems
}

#[test]
fn selector_mirrors_the_header() {
    let (header, count) = header_selectors();
    // The binding's list, each variant named the header's way: SparQ is
    // PQ_SELECTOR_SPARQ.
    let binding: BTreeMap<String, i64> = Selector::ALL
        .iter()
        .map(|&(name, s)| (format!("PQ_SELECTOR_{}", name.to_uppercase()), s as i64))
        .collect();
    let mut problems = differences(
        &binding,
        "SELECTOR_COUNT",
        SELECTOR_COUNT as i64,
        &header,
        count,
    );
    if sys::PQ_SELECTOR_COUNT as i64 != count {
        problems.push(format!(
            "sys::PQ_SELECTOR_COUNT is {}, the header says {count}",
            sys::PQ_SELECTOR_COUNT
        ));
    }
    assert!(
        problems.is_empty(),
        "Rust Selector differs from include/pqcache.h:\n  {}",
        problems.join("\n  ")
    );
    // Each variant comes back from its C value.
    for &(name, s) in Selector::ALL {
        assert_eq!(Selector::try_from(s as i32), Ok(s), "{name}");
    }
}
