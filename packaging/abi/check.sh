#!/usr/bin/env bash
# CTest abi_check: dumps the freshly built libpqcache.so (its -g copy, see
# CMakeLists.txt) with abi-dumper and compares it with the committed
# baseline with abi-compliance-checker, binary and source compatibility.
#   - same ABI major as the baseline: any incompatible change fails;
#   - the major (PQ_VERSION_MAJOR = SONAME) was bumped: incompatible
#     changes are allowed and reported; run update-baseline.sh.
# Exits 77 (skipped) when abi-dumper or abi-compliance-checker is missing.
#
#   check.sh --library LIB --header pqcache.h --baseline-dir DIR --work-dir DIR
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/common.sh"

while (($#)); do
  case $1 in
    --library) lib=$2; shift 2 ;;
    --header) header=$2; shift 2 ;;
    --baseline-dir) baseline_dir=$2; shift 2 ;;
    --work-dir) work=$2; shift 2 ;;
    *) echo "check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
: "${lib:?--library}" "${header:?--header}" "${baseline_dir:?--baseline-dir}" "${work:?--work-dir}"
require_tools
fail() { echo "FAIL: $*" >&2; exit 1; }

baseline=$baseline_dir/baseline.dump.gz
[[ -f $baseline && -f $baseline_dir/baseline.info ]] \
  || fail "no ABI baseline in $baseline_dir: run packaging/abi/update-baseline.sh"
base_major=$(sed -n 's/^abi_major=//p' "$baseline_dir/baseline.info")
base_version=$(sed -n 's/^version=//p' "$baseline_dir/baseline.info")
major=$(header_major "$header")
version=$(header_version "$header")
lib_major=$(soname_major "$lib")
[[ $lib_major == "$major" ]] || fail "SONAME major $lib_major of $lib differs from PQ_VERSION_MAJOR $major"
echo "abi_check: baseline $base_version (ABI $base_major), built $version (ABI $major)"

rm -rf "$work"
mkdir -p "$work"
gzip -dc "$baseline" >"$work/old.dump"
dump_abi "$lib" "$header" "$work/new.dump" "$version"

# Every exported function must be in the dump with its signature; one
# defined in a file compiled without -g would be checked by name only.
missing=""
for sym in $(nm -D --defined-only "$lib" | awk '$2 == "T" { sub(/@.*/, "", $3); print $3 }'); do
  grep -q "'ShortName' => '$sym'" "$work/new.dump" || missing+=" $sym"
done
[[ -z $missing ]] || fail "the ABI dump lacks the signatures of:$missing (defined outside src/api/api.cpp? \
compile that file with -g in packaging/abi/CMakeLists.txt)"

rc=0
# The checker writes logs/ into its working directory: run it in $work. The
# XML report carries the problems in a form the scripts below can read.
(cd "$work" && abi-compliance-checker -l pqcache -old old.dump -new new.dump \
  -report-path report.xml -report-format xml >checker.log 2>&1) || rc=$?
sed 's/^/  /' "$work/checker.log"
((rc <= 1)) || fail "abi-compliance-checker failed (exit $rc)"

# Problems as "severity kind: type or symbol: change" lines.
problems=$(python3 - "$work/report.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
for rep in ET.parse(sys.argv[1]).getroot().iter("report"):
    for group in list(rep.iter("problems_with_types")) + list(rep.iter("problems_with_symbols")):
        for item in group:
            for owner in item:
                for p in owner.iter("problem"):
                    change = p.find("change")
                    text = change.text if change is not None else ""
                    for k, v in (change.attrib if change is not None else {}).items():
                        text = text.replace("@" + k, v)
                    print(f"{rep.get('kind')} {group.get('severity')} {p.get('id')}: "
                          f"{owner.get('name')}: {text}")
PY
)
[[ -n $problems ]] && { echo "abi_check: changes the checker reports:"; sed 's/^/  /' <<<"$problems"; }

# Parameter_Changed_Register is read from the DWARF location of a parameter,
# which with -Og says where the optimiser keeps the value after entry (the
# 0.3.0 baseline has pq_config_default's `c` "in rdx"); the registers that
# carry a C function's arguments are fixed by its prototype (System V
# x86-64 ABI), which the checker compares on its own. Such reports are not
# incompatibilities: when they are all the checker objects to, it passes.
if ((rc == 1)); then
  others=$(grep -v -e '^binary Low ' -e '^binary Safe ' -e '^source Low ' -e '^source Safe ' \
             -e ' Parameter_Changed_Register: ' <<<"$problems" | grep -c . || true)
  if ((others == 0)); then
    echo "abi_check: the checker's only objections are parameter registers read from DWARF (see above); ignored"
    rc=0
  fi
fi

# The project's rule for grown structs (struct_growth.py), which the
# checker rates as Low warnings only.
growth_rc=0
python3 "$here/struct_growth.py" "$work/report.xml" "$header" || growth_rc=$?
((growth_rc <= 1)) || fail "struct_growth.py failed"

if ((rc == 0 && growth_rc == 0)); then
  echo "abi_check: PASS: compatible with the $base_version baseline"
elif ((major > base_major)); then
  echo "abi_check: PASS: incompatible changes, and the ABI major was bumped ($base_major -> $major)."
  echo "  Record the new ABI with packaging/abi/update-baseline.sh. Report: $work/report.xml"
else
  fail "incompatible ABI change without an ABI major bump (PQ_VERSION_MAJOR is still $major): \
restore compatibility, or bump PQ_VERSION_MAJOR with the project's major version, then run \
packaging/abi/update-baseline.sh. Report: $work/report.xml"
fi
