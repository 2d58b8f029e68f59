"""Checks every copy of the selector enum against include/pqcache.h, from the
sources alone: no Go, Java or Rust toolchain and no built binding needed.

The rule is the one each binding's own test applies (docs/design.md,
"Adding a selector"):

  1. The header's truth: the (PQ_SELECTOR_NAME, value) pairs of its
     `enum pq_selector` block, and PQ_SELECTOR_COUNT. The values are 0 to
     PQ_SELECTOR_COUNT - 1, each once.
  2. A binding's list: its enum's (name, value) pairs, the name written the
     binding's way and read back as PQ_SELECTOR_<NAME in capitals>
     (Go SelectorSparQ, Java SPARQ, Rust SparQ, Python "sparq": all
     PQ_SELECTOR_SPARQ), and its count constant.
  3. The two lists hold the same pairs (each selector missing, extra or of
     another value is named), the binding has PQ_SELECTOR_COUNT of them, and
     its count constant is PQ_SELECTOR_COUNT.

The places read: the core's registry (src/selectors/registry.cpp, an entry's
value is its position, which registry.cpp's static_assert also requires),
Go (bindings/go/config.go), Java (Selector.java), Rust (pqcache-sys's
generated constants and the pqcache crate's Selector) and Python (SELECTORS in
bindings/python/pqcache/__init__.py).

    python3 tests/check_selector_enums.py [REPO_ROOT]

CTest runs it as `selector_enums`. Exit status 1 names each binding and
selector that differs.
"""

import re
import sys
from pathlib import Path

PREFIX = "PQ_SELECTOR_"
COUNT = "PQ_SELECTOR_COUNT"
STATIC_ASSERT = "static_assert(std::size(kSelectors) == PQ_SELECTOR_COUNT"


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def block(text: str, start: str, end: str, where: str) -> str:
    """The text between the first `start` and the next `end` after it."""
    i = text.find(start)
    if i < 0:
        raise SystemExit(f"selector_enums: {where}: no '{start}' (the check is out of date)")
    j = text.find(end, i + len(start))
    return text[i + len(start):j]


def header_facts(header: Path):
    """(pairs {PQ_SELECTOR_X: value}, PQ_SELECTOR_COUNT) of the header."""
    text = strip_comments(header.read_text())
    body = block(text, "enum pq_selector {", "}", str(header))
    pairs = {m[1]: int(m[2]) for m in re.finditer(r"\b(PQ_SELECTOR_\w+)\s*=\s*(\d+)", body)}
    count = re.search(r"^\s*#\s*define\s+PQ_SELECTOR_COUNT\s+(\d+)", text, re.M)
    if not pairs or not count:
        raise SystemExit(f"selector_enums: {header}: no enum pq_selector values or no {COUNT}")
    return pairs, int(count[1])


def header_problems(pairs: dict, count: int) -> list:
    """The header's own rule: values 0 to PQ_SELECTOR_COUNT - 1, each once."""
    values = sorted(pairs.values())
    if values != list(range(count)):
        return [f"include/pqcache.h: the values of enum pq_selector are {values}, "
                f"not 0 to {COUNT} - 1 = {count - 1} each once"]
    return []


def compare(binding: str, pairs: dict, count_name: str, count_const, header: dict,
            count: int) -> list:
    """Every difference of one binding's (name, value) pairs and count constant
    from the header's, one line each, naming the binding and the selector."""
    problems = []
    for name in sorted(set(header) | set(pairs)):
        if name not in pairs:
            problems.append(f"{binding}: missing {name} (= {header[name]} in the header)")
        elif name not in header:
            problems.append(f"{binding}: {name} (= {pairs[name]}) is not in the header")
        elif pairs[name] is None:
            problems.append(f"{binding}: {name} names a constant that has no value here")
        elif pairs[name] != header[name]:
            problems.append(f"{binding}: {name} is {pairs[name]}, the header says {header[name]}")
    if len(pairs) != count:
        problems.append(f"{binding}: {len(pairs)} selectors, {COUNT} is {count}")
    if count_const is None:
        problems.append(f"{binding}: no {count_name}")
    elif count_const != count:
        problems.append(f"{binding}: {count_name} is {count_const}, {COUNT} is {count}")
    return problems


def header_name(binding_name: str) -> str:
    """A binding's name of a selector written the header's way."""
    return PREFIX + binding_name.upper()


def resolve(expr: str, header: dict, count: int):
    """The value of a literal, or of a reference to a header constant
    (sys::PQ_SELECTOR_X, _c.PQ_SELECTOR_X) as the header defines it."""
    expr = expr.strip()
    if expr.isdigit():
        return int(expr)
    ref = re.search(r"\b(PQ_SELECTOR_\w+)", expr)
    if ref and ref[1] == COUNT:
        return count
    return header.get(ref[1]) if ref else None


def one(pattern: str, text: str):
    m = re.search(pattern, text, re.M)
    return m[1] if m else None


def bindings(root: Path, header: dict, count: int):
    """(binding, file, pairs, count constant's name, its value) for every copy
    of the enum."""
    def read(rel):
        return strip_comments((root / rel).read_text())

    rel = "src/selectors/registry.cpp"
    text = read(rel)
    entries = re.findall(r'\{\s*(PQ_SELECTOR_\w+)\s*,\s*"(\w+)"\s*,\s*"(PQ_SELECTOR_\w+)"', text)
    # An entry's value is its position; its three names must agree.
    pairs = {header_name(name): i for i, (_, name, _) in enumerate(entries)}
    pairs.update({enum: i for i, (enum, _, _) in enumerate(entries)})
    pairs.update({enum: i for i, (_, _, enum) in enumerate(entries)})
    # Its count is the static_assert's.
    asserted = STATIC_ASSERT in re.sub(r"\s+", " ", text)
    yield "core registry", rel, pairs, STATIC_ASSERT, count if asserted else None

    rel = "bindings/go/config.go"
    text = read(rel)
    pairs = {header_name(m[1]): int(m[2])
             for m in re.finditer(r"^\s*Selector(\w+)\s+Selector\s*=\s*(\d+)", text, re.M)}
    count_expr = one(r"^\s*(?:const\s+)?SelectorCount\s*=\s*(.+)$", text) or ""
    yield "Go", rel, pairs, "SelectorCount", resolve(count_expr, header, count)

    rel = "bindings/java/src/main/java/io/pqcache/Selector.java"
    text = read(rel)
    constants = block(text, "enum Selector {", ";", rel)
    pairs = {header_name(m[1]): int(m[2])
             for m in re.finditer(r"\b([A-Z0-9_]+)\((\d+)\)", constants)}
    count_expr = one(r"\bint\s+COUNT\s*=\s*([^;]+);", text) or ""
    yield "Java", rel, pairs, "Selector.COUNT", resolve(count_expr, header, count)

    # bindgen's declarations of the header (bindings/rust/generate-sys.sh).
    rel = "bindings/rust/pqcache-sys/src/generated.rs"
    text = read(rel)
    sys_pairs = {m[1]: int(m[2]) for m in re.finditer(
        r"^pub const (PQ_SELECTOR_\w+)\s*:\s*pq_selector\s*=\s*(\d+);", text, re.M)}
    sys_count = resolve(one(r"^pub const PQ_SELECTOR_COUNT\s*:\s*\w+\s*=\s*([^;]+);", text) or "",
                        header, count)
    yield "Rust pqcache-sys", rel, sys_pairs, "sys::PQ_SELECTOR_COUNT", sys_count

    rel = "bindings/rust/pqcache/src/config.rs"
    text = read(rel)
    variants = block(text, "pub enum Selector {", "}", rel)
    # A variant's value is the pqcache-sys constant it names.
    pairs = {header_name(m[1]): sys_pairs.get(m[2])
             for m in re.finditer(r"\b(\w+)\s*=\s*sys::(PQ_SELECTOR_\w+)", variants)}
    count_expr = one(r"^pub const SELECTOR_COUNT\s*:\s*\w+\s*=\s*([^;]+);", text) or ""
    # sys::PQ_SELECTOR_COUNT as usize: pqcache-sys's count.
    rust_count = sys_count if COUNT in count_expr else resolve(count_expr, header, count)
    yield "Rust pqcache", rel, pairs, "SELECTOR_COUNT", rust_count

    rel = "bindings/python/pqcache/__init__.py"
    text = (root / rel).read_text()
    names = block(text, "\nSELECTORS = {", "}", rel)
    pairs = {header_name(m[1]): header.get(m[2])
             for m in re.finditer(r'"(\w+)"\s*:\s*_c\.(PQ_SELECTOR_\w+)', names)}
    count_expr = one(r"^SELECTOR_COUNT\s*=\s*(.+)$", text) or ""
    yield "Python", rel, pairs, "SELECTOR_COUNT", resolve(count_expr, header, count)


def main(argv):
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    header, count = header_facts(root / "include/pqcache.h")
    problems = header_problems(header, count)
    checked = []
    for binding, rel, pairs, count_name, count_const in bindings(root, header, count):
        if not pairs:
            problems.append(f"{binding}: found no selectors in {rel} (the check is out of date)")
            continue
        found = compare(binding, pairs, count_name, count_const, header, count)
        problems += [f"{line} [{rel}]" for line in found]
        checked.append(binding)
    if problems:
        print("selector_enums: the selector enums differ from include/pqcache.h:")
        print("\n".join("  " + p for p in problems))
        return 1
    print(f"selector_enums: {count} selectors ({COUNT}); the same in {', '.join(checked)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
