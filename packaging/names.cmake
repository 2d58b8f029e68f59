# Package names and versions, shared by packaging/CMakeLists.txt (tests,
# Debian files) and cpack.cmake. Needs PQ_ABI_MAJOR and PROJECT_VERSION.

# The components that become packages, in dependency order. Each is packaged
# only when something installs into it (cuda needs the plug-in target, java and
# python need their bindings).
set(PQ_PACKAGE_COMPONENTS runtime cuda dev go java python redis redis_dev rust_sys rust)

# Debian names. The runtime package carries the SONAME major (Debian policy
# 8.1), and so does the plug-in, which is loaded by that library only.
set(PQ_DEB_NAME_runtime libpqcache${PQ_ABI_MAJOR})
set(PQ_DEB_NAME_cuda libpqcache${PQ_ABI_MAJOR}-cuda)
set(PQ_DEB_NAME_dev libpqcache-dev)
set(PQ_DEB_NAME_java libpqcache-java)
set(PQ_DEB_NAME_python python3-pqcache)
# The Redis tier, libpqcache_redis.so.N: Debian policy 8.1 names the runtime
# package after the SONAME, '_' becoming '-' (libpqcache-redis0).
set(PQ_DEB_NAME_redis libpqcache-redis${PQ_ABI_MAJOR})
set(PQ_DEB_NAME_redis_dev libpqcache-redis-dev)
# The Rust crates' sources, as Debian's Rust team (debcargo) names and lays
# them out: librust-<crate>-dev installs /usr/share/cargo/registry/<crate>-<version>.
set(PQ_RUST_CRATE_rust_sys pqcache-sys)
set(PQ_RUST_CRATE_rust pqcache)
set(PQ_DEB_NAME_rust_sys librust-${PQ_RUST_CRATE_rust_sys}-dev)
set(PQ_DEB_NAME_rust librust-${PQ_RUST_CRATE_rust}-dev)
set(PQ_RUST_REGISTRY_DIR share/cargo/registry)
# The Go module's path is the one in bindings/go/go.mod. Its -dev package is
# named as dh-make-golang names one for an unknown host: the host without its
# public suffix, then the path's elements joined by '-' (libpqcache.org/pqcache
# -> golang-libpqcache-pqcache-dev); Fedora's go2rpm gives the same stem.
file(STRINGS ${PROJECT_SOURCE_DIR}/bindings/go/go.mod _pq_go_module REGEX "^module[ \t]")
string(REGEX REPLACE "^module[ \t]+([^ \t]+).*$" "\\1" PQ_GO_MODULE_PATH "${_pq_go_module}")
string(REGEX REPLACE "^([^/]+)\\.[^./]+/" "\\1/" _pq_go_stem "${PQ_GO_MODULE_PATH}")
string(REPLACE "/" "-" _pq_go_stem "${_pq_go_stem}")
string(TOLOWER "golang-${_pq_go_stem}" _pq_go_stem)
set(PQ_DEB_NAME_go ${_pq_go_stem}-dev)
# RPM names as openSUSE's shared library policy (and rpmlint) want them: the
# runtime package carries the SONAME major there too.
set(PQ_RPM_NAME_runtime libpqcache${PQ_ABI_MAJOR})
set(PQ_RPM_NAME_cuda libpqcache${PQ_ABI_MAJOR}-cuda)
set(PQ_RPM_NAME_dev libpqcache-devel)
set(PQ_RPM_NAME_java libpqcache-java)
set(PQ_RPM_NAME_python python3-pqcache)
set(PQ_RPM_NAME_go ${_pq_go_stem}-devel)
# openSUSE's shared library policy keeps the SONAME's '_' (rpmlint's
# shlib-policy-name-error otherwise); Fedora names crates rust-<crate>-devel.
set(PQ_RPM_NAME_redis libpqcache_redis${PQ_ABI_MAJOR})
set(PQ_RPM_NAME_redis_dev libpqcache-redis-devel)
set(PQ_RPM_NAME_rust_sys rust-${PQ_RUST_CRATE_rust_sys}-devel)
set(PQ_RPM_NAME_rust rust-${PQ_RUST_CRATE_rust}-devel)

# The Java binding's Maven coordinates (the pom in /usr/share/maven-repo) and
# its jar's name in /usr/share/java (<name>-<version>.jar and a <name>.jar
# link, Debian's Java policy 2.4).
set(PQ_MAVEN_GROUP_ID org.libpqcache)
set(PQ_MAVEN_ARTIFACT_ID pqcache)
set(PQ_JAVA_JAR_NAME pqcache)
# The JNI module's directory, whatever the libdir: Debian's Java policy puts
# JNI libraries in /usr/lib/jni and requires every JVM to search it (Debian's
# OpenJDK also searches /usr/lib/<multiarch>/jni; the policy names only this).
set(PQ_JNI_INSTALL_DIR lib/jni)

# A native Debian version (no revision), so that "(= version)" dependencies
# between the split packages match the version field exactly.
set(PQ_DEB_VERSION ${PROJECT_VERSION})
set(PQ_RPM_RELEASE 1)

if(NOT DEFINED PQ_PACKAGE_MAINTAINER)
  set(PQ_PACKAGE_MAINTAINER "libpqcache maintainers <maintainers@users.noreply.a-seed-5eb96a62.example>"
      CACHE STRING "Maintainer of the .deb/.rpm packages (Name <email>)")
endif()
