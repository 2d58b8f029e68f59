# The Go and Java programs built as a package user builds them (sourced after
# common.sh): packaging_go_module and packaging_java_maven run them against
# the .debs unpacked into a scratch root, packaging_deb_system against the
# .debs installed with dpkg. docs/bindings/go.md and java.md show the same
# commands. The caller's environment says where pkg-config and the dynamic
# loader look: PKG_CONFIG_LIBDIR and LD_LIBRARY_PATH into a scratch root, or
# nothing for the system.
: "${PQ_GO_MODULE_PATH:?}" "${PQ_MAVEN_GROUP_ID:?}" "${PQ_MAVEN_ARTIFACT_ID:?}"

# consumer_test_init COMPONENT PACKAGES_SCRATCH_DIR SCRATCH_DIR: the start of
# packaging_go_module and packaging_java_maven. Sets pkgdir (packaging_deb_rpm's
# folder, with the .debs in out/) and scratch (emptied); skips (77) when
# CPack does not package COMPONENT.
consumer_test_init() {
  local usage="usage: $(basename "$0") PACKAGES_SCRATCH_DIR SCRATCH_DIR"
  pkgdir=${2:?$usage}
  scratch=${3:?$usage}
  has_packaged_component "$1" || skip "the $1 binding is not packaged (configured with -DPQ_BUILD_BINDINGS=OFF?)"
  fresh_dir "$scratch"
}

# same_file A B: A and B are the same file (through any links).
same_file() { [[ -e $1 && -e $2 && $(realpath "$1") == "$(realpath "$2")" ]]; }

# loaded_library BINARY: the file ldd resolves libpqcache.so.N to.
loaded_library() { ldd "$1" | awk -v so="libpqcache.so.$PQ_ABI_MAJOR" '$1 == so { print $3 }'; }

# go_consumer GOCODE OUT LIBRARY
# Builds packaging/tests/go_consumer (a copy in OUT, outside the source tree)
# against the module installed in the Go path GOCODE (/usr/share/gocode, or a
# scratch root's), two ways, with GOPROXY=off and no replace directive:
#   - module mode, the module named in a go.work (go work init . <module>);
#   - GOPATH mode (GO111MODULE=off, GOPATH=<own>:GOCODE), as Debian's
#     dh-golang builds, here with GOFLAGS=-mod=mod set (GOPATH mode ignores it).
# No CGO_* flags: cgo must take them from `#cgo pkg-config: pqcache`
# (checked in `go build -x`'s log). Both programs run and must load LIBRARY.
go_consumer() {
  local gocode=$1 out=$2 library=$3
  local module=$gocode/src/$PQ_GO_MODULE_PATH
  [[ -f $module/go.mod ]] || fail "no Go module at $module"
  grep -qx "module $PQ_GO_MODULE_PATH" "$module/go.mod" || fail "$module/go.mod does not say module $PQ_GO_MODULE_PATH"
  local app=$out/app
  mkdir -p "$app"
  cp "$TESTS_DIR/go_consumer/main.go" "$app/"
  # Private caches, no $HOME configuration, no network, no flags from outside.
  local goenv=(env -u CGO_CFLAGS -u CGO_CPPFLAGS -u CGO_LDFLAGS -u GOFLAGS -u GOWORK -u GO111MODULE
               GOENV=off GOCACHE="$out/gocache" GOMODCACHE="$out/gomodcache" GOPROXY=off
               GOTOOLCHAIN=local CGO_ENABLED=1)
  local gopath=$out/gopath
  (
    cd "$app"
    "${goenv[@]}" GOPATH="$gopath" go mod init example.com/pqcache-consumer
    "${goenv[@]}" GOPATH="$gopath" go mod edit -require="$PQ_GO_MODULE_PATH@v$PQ_VERSION"
    "${goenv[@]}" GOPATH="$gopath" go work init . "$module"
    "${goenv[@]}" GOPATH="$gopath" go build -x -o "$out/consumer-workspace" .
  ) >"$out/go-workspace.log" 2>&1 || { cat "$out/go-workspace.log" >&2; fail "module mode with go.work: go build"; }
  has -i replace "$app/go.mod" "$app/go.work" && fail "the consumer's go.mod or go.work has a replace directive"
  has -F "pkg-config --cflags -- pqcache" "$out/go-workspace.log" \
    || fail "cgo did not ask pkg-config for pqcache (go build -x log: $out/go-workspace.log)"
  (
    cd "$app"
    "${goenv[@]}" GO111MODULE=off GOFLAGS=-mod=mod GOPATH="$gopath:$gocode" go build -o "$out/consumer-gopath" .
  ) >"$out/go-gopath.log" 2>&1 || { cat "$out/go-gopath.log" >&2; fail "GOPATH mode: go build"; }
  local bin used
  for bin in "$out/consumer-workspace" "$out/consumer-gopath"; do
    "$bin" "$PQ_VERSION" >"$out/run.log" 2>&1 || { cat "$out/run.log" >&2; fail "$bin"; }
    used=$(loaded_library "$bin")
    same_file "$used" "$library" || fail "$bin loads '$used', not $library"
    log "OK: Go $(basename "$bin"): $(cat "$out/run.log")"
  done
}

# maven_plugin_version ARTIFACT: the newest version of a Maven plugin that
# Debian installed with its jar in /usr/share/maven-repo (not 'debian').
maven_plugin_version() {
  local dir=/usr/share/maven-repo/org/apache/maven/plugins/$1 v
  [[ -d $dir ]] || return 0
  for v in $(ls "$dir" | sort -rV); do
    [[ $v != debian && -e $dir/$v/$1-$v.jar ]] && { echo "$v"; return 0; }
  done
}

# link_tree SRC DEST [PRUNE]: DEST mirrors SRC with a symbolic link per file
# (cp -rs), leaving out the subtree PRUNE (relative to SRC).
link_tree() {
  local src dest=$2 prune=${3:-} f
  src=$(cd "$1" && pwd)
  if [[ -z $prune ]]; then
    mkdir -p "$dest"
    cp -rs "$src/." "$dest/"
    return
  fi
  (cd "$src" && find . -path "./$prune" -prune -o \( -type f -o -type l \) -print0) |
    while IFS= read -r -d '' f; do
      mkdir -p "$dest/$(dirname "$f")"
      ln -s "$src/${f#./}" "$dest/$f"
    done
}

# java_consumer MAVEN_REPO OUT JNI LIBRARY [JAVA_OPTION...]
# Builds packaging/tests/java_consumer (a copy in OUT) against the artifact
# $PQ_MAVEN_GROUP_ID:$PQ_MAVEN_ARTIFACT_ID:$PQ_VERSION in MAVEN_REPO
# (/usr/share/maven-repo, or a scratch root's), with Debian's maven offline
# (-o) and a local repository that links Debian's /usr/share/maven-repo (its
# plugins) and MAVEN_REPO's artifact; runs it with the jar Maven resolved, and
# checks that the JVM mapped the JNI module JNI and the library LIBRARY.
# Without mvn or Debian's compiler and resources plugins the Maven build is
# SKIPPED with the reason, and javac compiles against the jar's Maven path.
java_consumer() {
  local repo=$1 out=$2 jni=$3 library=$4
  shift 4
  local group_path=${PQ_MAVEN_GROUP_ID//.//}
  local artifact_dir=$group_path/$PQ_MAVEN_ARTIFACT_ID
  local jar=$repo/$artifact_dir/$PQ_VERSION/$PQ_MAVEN_ARTIFACT_ID-$PQ_VERSION.jar
  [[ -e $jar ]] || fail "$jar is missing"
  local app=$out/app
  mkdir -p "$app" "$out/tmp"
  cp -r "$TESTS_DIR/java_consumer/src" "$app/"

  local skip_reason="" compiler resources
  compiler=$(maven_plugin_version maven-compiler-plugin)
  resources=$(maven_plugin_version maven-resources-plugin)
  if ! command -v mvn >/dev/null; then
    skip_reason="mvn is not installed (package maven)"
  elif [[ -z $compiler || -z $resources ]]; then
    skip_reason="Debian's maven-compiler-plugin or maven-resources-plugin is not in /usr/share/maven-repo (packages libmaven-compiler-plugin-java, libmaven-resources-plugin-java)"
  fi
  local classpath
  if [[ -z $skip_reason ]]; then
    local m2=$out/m2
    if same_file "$repo" /usr/share/maven-repo; then
      link_tree /usr/share/maven-repo "$m2"
    else
      link_tree /usr/share/maven-repo "$m2" "$artifact_dir"
      link_tree "$repo/$artifact_dir" "$m2/$artifact_dir"
    fi
    sed -e "s|@PQ_MAVEN_GROUP_ID@|$PQ_MAVEN_GROUP_ID|; s|@PQ_MAVEN_ARTIFACT_ID@|$PQ_MAVEN_ARTIFACT_ID|" \
        -e "s|@PQ_VERSION@|$PQ_VERSION|; s|@COMPILER_PLUGIN_VERSION@|$compiler|" \
        -e "s|@RESOURCES_PLUGIN_VERSION@|$resources|" "$TESTS_DIR/java_consumer/pom.xml.in" >"$app/pom.xml"
    (cd "$app" && mvn -o -B -q -Dmaven.repo.local="$m2" compile) >"$out/mvn.log" 2>&1 \
      || { cat "$out/mvn.log" >&2; fail "mvn -o compile against $PQ_MAVEN_GROUP_ID:$PQ_MAVEN_ARTIFACT_ID:$PQ_VERSION"; }
    [[ -f $app/target/classes/example/PqcacheConsumer.class ]] || fail "mvn compile made no class"
    local resolved=$m2/$artifact_dir/$PQ_VERSION/$PQ_MAVEN_ARTIFACT_ID-$PQ_VERSION.jar
    same_file "$resolved" "$jar" || fail "Maven's local repository does not resolve to $jar"
    log "OK: mvn -o compile (maven-compiler-plugin $compiler, maven-resources-plugin $resources) resolved $PQ_MAVEN_GROUP_ID:$PQ_MAVEN_ARTIFACT_ID:$PQ_VERSION"
    classpath=$app/target/classes:$resolved
  else
    log "SKIPPED (Maven build): $skip_reason; javac against $jar instead"
    javac --release 17 -d "$app/classes" -cp "$jar" "$app/src/main/java/example/PqcacheConsumer.java" \
      >"$out/javac.log" 2>&1 || { cat "$out/javac.log" >&2; fail "javac against $jar"; }
    classpath=$app/classes:$jar
  fi
  java "$@" -Djava.io.tmpdir="$out/tmp" -cp "$classpath" example.PqcacheConsumer "$PQ_VERSION" \
    >"$out/run.log" 2>&1 || { cat "$out/run.log" >&2; fail "the Java program"; }
  local mapped
  mapped=$(sed -n 's/^jni: //p' "$out/run.log")
  [[ $(wc -l <<<"$mapped") == 1 ]] && same_file "$mapped" "$jni" \
    || fail "the JVM loaded the JNI module '$mapped', not $jni"
  mapped=$(sed -n 's/^library: //p' "$out/run.log")
  [[ $(wc -l <<<"$mapped") == 1 ]] && same_file "$mapped" "$library" \
    || fail "the JVM loaded libpqcache '$mapped', not $library"
  log "OK: Java: $(head -1 "$out/run.log"); JNI module $jni"
}
