"""The selector rule every binding applies the same way (docs/design.md,
"Adding a selector"): SELECTORS' (name, value) pairs equal the header's
enum pq_selector, read from include/pqcache.h itself, and there are
PQ_SELECTOR_COUNT of them, SELECTOR_COUNT included. The rule's Python is
tests/check_selector_enums.py (CTest's selector_enums, which reads every
binding's source); here it checks the binding as imported."""

import importlib.util
import os
from pathlib import Path

import pqcache
from pqcache import pqcache_swig


def source_dir() -> Path:
    """The source tree: $PQ_HEADER's (python_binding), $PQ_SOURCE_DIR
    (python_wheel, which copies the tests out of it), else this file's."""
    if os.environ.get("PQ_HEADER"):
        return Path(os.environ["PQ_HEADER"]).resolve().parents[1]
    if os.environ.get("PQ_SOURCE_DIR"):
        return Path(os.environ["PQ_SOURCE_DIR"])
    return Path(__file__).resolve().parents[3]


def the_rule():
    path = source_dir() / "tests/check_selector_enums.py"
    spec = importlib.util.spec_from_file_location("check_selector_enums", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_selectors_mirror_the_header():
    rule = the_rule()
    header, count = rule.header_facts(source_dir() / "include/pqcache.h")
    # The binding's list, each name written the header's way: "sparq" is
    # PQ_SELECTOR_SPARQ.
    binding = {rule.header_name(name): value for name, value in pqcache.SELECTORS.items()}
    problems = rule.header_problems(header, count)
    problems += rule.compare("Python SELECTORS", binding, "SELECTOR_COUNT", pqcache.SELECTOR_COUNT,
                             header, count)
    if pqcache_swig.PQ_SELECTOR_COUNT != count:
        problems.append(f"the SWIG layer's PQ_SELECTOR_COUNT is {pqcache_swig.PQ_SELECTOR_COUNT}, "
                        f"the header says {count}")
    assert not problems, ("the selector enum differs from include/pqcache.h:\n  "
                          + "\n  ".join(problems))
