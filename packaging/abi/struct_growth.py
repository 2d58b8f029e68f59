#!/usr/bin/env python3
"""Applies the project's struct-extension rule to an abi-compliance-checker
XML report (docs/packaging.md, "ABI policy").

abi-compliance-checker rates a field appended at the end of a struct as a
Low-severity warning and keeps the verdict "compatible". For libpqcache that
holds only for structs whose first field is struct_size (pq_config,
pq_layer_info, pq_stats): the library reads and writes only as many bytes as
the caller's struct_size says. A struct without it (pq_tensor, pq_selection)
that grows is read past its end by the library when an old caller passes
it, so this script reports it as incompatible.

    struct_growth.py REPORT.xml pqcache.h
Prints one line per grown struct; exit 1 if any lacks struct_size."""
import re
import sys
import xml.etree.ElementTree as ET


def structs_with_struct_size(header_text):
    """Names of the structs whose first member is struct_size."""
    text = re.sub(r"/\*.*?\*/", "", header_text, flags=re.S)
    names = set()
    for m in re.finditer(r"typedef\s+struct\s+(\w+)\s*\{([^}]*)\}", text):
        members = [s.strip() for s in m.group(2).split(";") if s.strip()]
        if members and re.search(r"\bstruct_size$", members[0]):
            names.add(m.group(1))
    return names


def main():
    report, header = sys.argv[1], sys.argv[2]
    with open(header, encoding="utf-8") as f:
        sized = structs_with_struct_size(f.read())
    grown = set()
    for rep in ET.parse(report).getroot().iter("report"):
        if rep.get("kind") != "binary":
            continue
        for problems in rep.iter("problems_with_types"):
            for t in problems.iter("type"):
                kinds = {p.get("id") for p in t.iter("problem")}
                if kinds & {"DataType_Size", "Added_Field_And_Size"}:
                    grown.add(t.get("name").replace("struct ", "").strip())
    bad = 0
    for name in sorted(grown):
        if name in sized:
            print(f"  {name} grew; it carries struct_size: a compatible extension")
        else:
            print(f"  {name} grew and has no struct_size: old callers pass a smaller struct "
                  "that the library reads past its end (incompatible)")
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
