"""Checks the layering of src/: every folder has a rank, and a file may
include only headers of its own folder or of folders ranked below it (so
the include graph climbs back nowhere); every quoted include names an
existing file by its path from src/ (or the public header); no header
includes itself through others (no cycle in the file graph); every folder
with sources is one the build compiles (PQ_CORE_FOLDERS in CMakeLists.txt);
and no source file passes the line limit.

The components built beside the core, redis/ (libpqcache_redis) and
kernels/ (the CUDA plug-in), sit above every ranked folder: they may include
any header of src/, their own folder's and the public ones of include/;
every quoted include must name such a file, and the line limit holds for
them too.

    python3 tests/check_layout.py [SRC_DIR]

CTest runs it as `source_layout`. The ranks, bottom first, are the design's
(docs/design.md, "Layout"): a folder sees the ones above it in this
list, never the ones below.
"""

import re
import sys
from pathlib import Path

RANKS = ["base", "format", "store", "pq", "backend", "selectors", "config", "layer", "sequence",
         "api"]
LINE_LIMIT = 500
SOURCE_SUFFIXES = (".h", ".cpp", ".cu", ".cuh")
# Built beside the core, above every ranked folder (may include any of them).
COMPONENTS = ["redis", "kernels"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def cycles(graph: dict) -> list:
    """Every include cycle in graph (file -> files it includes), once."""
    found, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in graph.get(node, ()):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return found


def built_folders(cmake: Path) -> set:
    match = re.search(r"set\(PQ_CORE_FOLDERS([^)]*)\)", cmake.read_text())
    return set(match.group(1).split()) if match else set()


def main(src: Path) -> int:
    problems = []
    graph = {}
    built = built_folders(src.parent / "CMakeLists.txt")
    rank = {name: i for i, name in enumerate(RANKS)}
    for path in sorted(src.rglob("*")):
        if path.suffix not in SOURCE_SUFFIXES or not path.is_file():
            continue
        rel = path.relative_to(src)
        folder = rel.parts[0] if len(rel.parts) > 1 else None
        if folder not in rank:
            problems.append(f"{rel}: not in one of the ranked folders {RANKS}")
            continue
        text = path.read_text()
        if path.suffix == ".cpp" and str(rel.parent) not in built:
            problems.append(f"{rel}: its folder is not in PQ_CORE_FOLDERS (CMakeLists.txt), "
                            "so the build would not compile it")
        graph[str(rel)] = []
        lines = text.count("\n")
        if lines > LINE_LIMIT:
            problems.append(f"{rel}: {lines} lines; the limit is {LINE_LIMIT}")
        for name in INCLUDE.findall(text):
            if name == "pqcache.h":
                continue
            target = src / name
            if not target.is_file():
                problems.append(f'{rel}: #include "{name}" names no file under src/ '
                                "(includes are paths from src/)")
                continue
            graph[str(rel)].append(name)
            to = Path(name).parts[0]
            if to not in rank:
                problems.append(f'{rel}: #include "{name}" is outside the ranked folders')
            elif rank[to] > rank[folder]:
                problems.append(f'{rel}: #include "{name}": {folder}/ may not include {to}/, '
                                f"which is above it ({' < '.join(RANKS)})")
    for cycle in cycles(graph):
        problems.append("include cycle: " + " -> ".join(cycle))
    checked = [name for name in COMPONENTS if (src.parent / name).is_dir()]
    for name in checked:
        problems += check_component(src.parent / name, src)
    for p in problems:
        print(f"check_layout: {p}")
    if problems:
        return 1
    print(f"check_layout: {src}: every include goes to its own folder or one below it "
          f"({' < '.join(RANKS)}), {sum(map(len, graph.values()))} includes among {len(graph)} "
          f"files and no cycle; no file over {LINE_LIMIT} lines, in src/ and in "
          f"{', '.join(name + '/' for name in checked) or 'no component'}")
    return 0


def check_component(folder: Path, src: Path) -> list:
    """A component built beside the core: the line limit, and quoted includes
    that name a file of its own folder, of src/ or of include/."""
    problems = []
    public = src.parent / "include"
    for path in sorted(folder.rglob("*")):
        if path.suffix not in SOURCE_SUFFIXES or not path.is_file():
            continue
        rel = path.relative_to(src.parent)
        text = path.read_text()
        lines = text.count("\n")
        if lines > LINE_LIMIT:
            problems.append(f"{rel}: {lines} lines; the limit is {LINE_LIMIT}")
        for name in INCLUDE.findall(text):
            if not any((base / name).is_file() for base in (path.parent, src, public)):
                problems.append(f'{rel}: #include "{name}" names no file of {folder.name}/, '
                                "src/ or include/")
    return problems


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "src"
    sys.exit(main(root))
