#!/usr/bin/env bash
# CTest packaging_java_maven: the Java binding as a package user gets it.
#   - the -java .deb (packaging_deb_rpm made it): the jar as Debian's Java
#     policy names it (/usr/share/java/<name>-<version>.jar and a <name>.jar
#     link), the pom and jar links in /usr/share/maven-repo under the
#     coordinates and under 'debian', the poms' coordinates and Debian
#     properties, and the same tree, links and poms as maven-repo-helper's
#     mh_installpom + mh_installjar -l make from the upstream pom (when
#     maven-repo-helper and debhelper are installed; else SKIPPED with the
#     reason); the JNI module in /usr/lib/jni (Debian's Java policy);
#   - with the runtime and Java packages unpacked into a scratch root
#     (dpkg -x), a Java program outside the source tree compiled by Debian's
#     maven offline against the coordinates (SKIPPED, with javac instead,
#     when maven or its plugins are missing) and run (bindings_consumers.sh).
# Exits 77 (skipped) with the reason when the Java binding is not built.
#
#   check_java_maven.sh PACKAGES_SCRATCH_DIR SCRATCH_DIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
source "$TESTS_DIR/bindings_consumers.sh"

: "${PQ_DEB_NAME_RUNTIME:?}" "${PQ_DEB_NAME_JAVA:?}" "${PQ_DEB_VERSION:?}" "${PQ_JAVA_JAR_NAME:?}"
consumer_test_init java "$@"
javadeb=$(deb_file "$pkgdir/out" "$PQ_DEB_NAME_JAVA")
root=$scratch/root
dpkg-deb -x "$(deb_file "$pkgdir/out" "$PQ_DEB_NAME_RUNTIME")" "$root"
dpkg-deb -x "$javadeb" "$root"

# ---- the jar and the Maven repository ---------------------------------------------------
jar=usr/share/java/$PQ_JAVA_JAR_NAME-$PQ_VERSION.jar
[[ -f $root/$jar && ! -L $root/$jar ]] || fail "/$jar is missing or not a file"
[[ $(readlink "$root/usr/share/java/$PQ_JAVA_JAR_NAME.jar") == "$PQ_JAVA_JAR_NAME-$PQ_VERSION.jar" ]] \
  || fail "/usr/share/java/$PQ_JAVA_JAR_NAME.jar is not a link to $PQ_JAVA_JAR_NAME-$PQ_VERSION.jar"
python3 -c 'import sys, zipfile; sys.exit("io/pqcache/PqContext.class" not in zipfile.ZipFile(sys.argv[1]).namelist())' \
  "$root/$jar" || fail "/$jar lacks io/pqcache/PqContext.class"
group_path=${PQ_MAVEN_GROUP_ID//.//}
artifact_dir=usr/share/maven-repo/$group_path/$PQ_MAVEN_ARTIFACT_ID
for v in "$PQ_VERSION" debian; do
  pom=$root/$artifact_dir/$v/$PQ_MAVEN_ARTIFACT_ID-$v.pom
  link=$root/$artifact_dir/$v/$PQ_MAVEN_ARTIFACT_ID-$v.jar
  [[ -f $pom ]] || fail "/$artifact_dir/$v/$PQ_MAVEN_ARTIFACT_ID-$v.pom is missing"
  # Relative (Debian policy 10.5), and to the jar in /usr/share/java.
  [[ -L $link && $(readlink "$link") == ../* ]] || fail "$link is not a relative link"
  same_file "$link" "$root/$jar" || fail "$link does not point at /$jar"
  fields=$(python3 - "$pom" <<'PY'
import sys
import xml.etree.ElementTree as ET
ns = {"m": "http://maven.apache.org/POM/4.0.0"}
p = ET.parse(sys.argv[1]).getroot()
print(" ".join(p.findtext("m:" + f, "", ns) for f in ("groupId", "artifactId", "version", "packaging")),
      p.findtext("m:properties/m:debian.originalVersion", "", ns),
      p.findtext("m:properties/m:debian.package", "", ns),
      p.find("m:properties/m:debian.hasPackageVersion", ns) is not None)
PY
  ) || fail "$pom does not parse"
  expected="$PQ_MAVEN_GROUP_ID $PQ_MAVEN_ARTIFACT_ID $v jar $PQ_VERSION $PQ_DEB_NAME_JAVA True"
  [[ $fields == "$expected" ]] || fail "$pom says '$fields', expected '$expected'"
done
log "OK: $PQ_MAVEN_GROUP_ID:$PQ_MAVEN_ARTIFACT_ID:$PQ_VERSION and :debian in /usr/share/maven-repo, linked to /$jar"

# The same layout as maven-repo-helper's, from the upstream pom the build
# made: the tree (files, links and their targets) and the poms (XML compared
# canonically, whitespace aside).
upstream_pom=$PQ_BUILD_DIR/bindings/java/$PQ_MAVEN_ARTIFACT_ID-$PQ_VERSION.pom
[[ -f $upstream_pom ]] || fail "$upstream_pom is missing"
if ! command -v mh_installpom >/dev/null || ! command -v dh_link >/dev/null; then
  log "SKIPPED (comparison with maven-repo-helper): mh_installpom or dh_link is not installed (packages maven-repo-helper, debhelper)"
else
  mh=$scratch/mh
  mkdir -p "$mh/debian"
  printf 'Source: libpqcache\nMaintainer: test <test@example.org>\n\nPackage: %s\nArchitecture: all\nDescription: test\n test\n' \
    "$PQ_DEB_NAME_JAVA" >"$mh/debian/control"
  (cd "$mh" && mh_installpom -p"$PQ_DEB_NAME_JAVA" --has-package-version "$upstream_pom" \
     && mh_installjar -p"$PQ_DEB_NAME_JAVA" -l "$upstream_pom" "$PQ_BUILD_DIR/bindings/java/pqcache.jar") \
    >"$scratch/mh.log" 2>&1 || { cat "$scratch/mh.log" >&2; fail "mh_installpom / mh_installjar"; }
  listing() { (cd "$1" && find usr/share/java usr/share/maven-repo -printf '%y %p %l\n' | sort); }
  diff <(listing "$mh/debian/$PQ_DEB_NAME_JAVA") <(listing "$root") \
    || fail "the package's /usr/share/java and /usr/share/maven-repo differ from maven-repo-helper's (< mh, > package)"
  for v in "$PQ_VERSION" debian; do
    rel=$artifact_dir/$v/$PQ_MAVEN_ARTIFACT_ID-$v.pom
    python3 -c 'import sys, xml.etree.ElementTree as ET
c = [ET.canonicalize(from_file=f, strip_text=True) for f in sys.argv[1:]]
sys.exit(c[0] != c[1])' "$mh/debian/$PQ_DEB_NAME_JAVA/$rel" "$root/$rel" \
      || { diff "$mh/debian/$PQ_DEB_NAME_JAVA/$rel" "$root/$rel" >&2; fail "/$rel differs from mh_installpom's"; }
  done
  log "OK: the same files, links and poms as mh_installpom --has-package-version + mh_installjar -l"
fi

# ---- the JNI module, and a program resolved through the coordinates -------------------------
jni=usr/$PQ_JNIDIR/libpqcache_jni.so
[[ -f $root/$jni ]] || fail "/$jni is missing"
command -v java >/dev/null || skip "java is not installed (package openjdk-17-jdk-headless); the layout checks passed"
LD_LIBRARY_PATH=$root/usr/$PQ_LIBDIR \
  java_consumer "$root/usr/share/maven-repo" "$scratch/java" "$root/$jni" \
  "$root/usr/$PQ_LIBDIR/libpqcache.so.$PQ_ABI_MAJOR" -Djava.library.path="$root/usr/$PQ_JNIDIR"
log "PASS: $PQ_DEB_NAME_JAVA: Debian's jar name, the Maven repository layout, a program resolved through $PQ_MAVEN_GROUP_ID:$PQ_MAVEN_ARTIFACT_ID:$PQ_VERSION"
