# CPack configuration: .deb and .rpm packages split the way distributions
# split a library (docs/packaging.md). Included by pq_configure_cpack() at the
# end of the top-level directory, once every install rule exists; runs in
# that function's scope, so nothing here leaks into the project.
include(GNUInstallDirs)  # its variables are directory-scoped: set them here too
include(${PQ_PACKAGING_DIR}/names.cmake)

# ---- Which components become packages ------------------------------------------
# Only the components something installs into (the CUDA plug-in and the
# bindings are optional). Anything else that installs is reported, not packaged.
get_cmake_property(_pq_defined_components COMPONENTS)
set(_pq_components "")
foreach(_comp IN LISTS PQ_PACKAGE_COMPONENTS)
  if(_comp IN_LIST _pq_defined_components)
    list(APPEND _pq_components ${_comp})
  endif()
endforeach()
set(_pq_unpackaged ${_pq_defined_components})
# "Unspecified" is registered by the libdir rule's install(CODE ...
# ALL_COMPONENTS), which runs inside every package; it installs nothing.
list(REMOVE_ITEM _pq_unpackaged ${PQ_PACKAGE_COMPONENTS} Unspecified)
if(_pq_unpackaged)
  message(WARNING "packaging: install components not packaged by CPack: ${_pq_unpackaged} "
                  "(add them to PQ_PACKAGE_COMPONENTS in packaging/names.cmake)")
endif()
message(STATUS "packaging: CPack components: ${_pq_components}")

# Debian's copyright and changelog in every package (Debian policy 12.5, 12.7).
foreach(_comp IN LISTS _pq_components)
  install(FILES ${PQ_PACKAGING_BINARY_DIR}/debian/copyright ${PQ_PACKAGING_BINARY_DIR}/debian/changelog.gz
    DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/${PQ_DEB_NAME_${_comp}} COMPONENT ${_comp})
endforeach()

# ---- Common -----------------------------------------------------------------------
set(CPACK_PACKAGE_NAME libpqcache)
set(CPACK_PACKAGE_VENDOR "The libpqcache authors")
set(CPACK_PACKAGE_CONTACT "${PQ_PACKAGE_MAINTAINER}")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_RESOURCE_FILE_LICENSE ${PROJECT_SOURCE_DIR}/LICENSE)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)  # lintian: unstripped-binary-or-object
set(CPACK_COMPONENTS_ALL ${_pq_components})
set(CPACK_COMPONENTS_GROUPING IGNORE)  # one package per component
find_program(PQ_RPMBUILD rpmbuild)
if(NOT DEFINED CPACK_GENERATOR)
  set(CPACK_GENERATOR DEB)
  if(PQ_RPMBUILD)
    list(APPEND CPACK_GENERATOR RPM)
  endif()
endif()
set(CPACK_PROJECT_CONFIG_FILE ${PQ_PACKAGING_DIR}/cpack-project-config.cmake)
set(CPACK_SOURCE_GENERATOR TGZ)
set(CPACK_SOURCE_IGNORE_FILES "/\\\\.git/" "/build[^/]*/" "/__pycache__/" "/target/")

# Per component: summary (RPM Summary, first line of the Debian Description),
# description, Debian section and RPM group.
set(_pq_summary_runtime "PQCache KV-cache selection library for LLM inference")
set(_pq_summary_cuda "PQCache KV-cache selection library - CUDA plug-in")
set(_pq_summary_dev "PQCache KV-cache selection library - development files")
set(_pq_summary_go "PQCache KV-cache selection library - Go binding (source)")
set(_pq_summary_java "PQCache KV-cache selection library - Java binding")
set(_pq_summary_python "PQCache KV-cache selection library - Python 3 binding")
set(_pq_summary_redis "PQCache KV-cache selection library - Redis tier")
set(_pq_summary_redis_dev "PQCache KV-cache selection library - Redis tier development files")
set(_pq_summary_rust_sys "Rust crate pqcache-sys - raw FFI declarations of libpqcache")
set(_pq_summary_rust "Rust crate pqcache - safe Rust API of libpqcache")
set(_pq_intro
  "libpqcache keeps the KV cache of long prompts in host memory, builds a\n"
  "product-quantization index of the keys of every layer and head, and at\n"
  "each decode step selects the past tokens that matter for the current\n"
  "query (PQCache, SIGMOD 2025).\n"
  ".\n")
string(CONCAT _pq_desc_runtime ${_pq_intro}
  "This package holds the shared library with the CPU backend. The CUDA\n"
  "backend is a separate plug-in package, loaded at run time when present.")
string(CONCAT _pq_desc_cuda ${_pq_intro}
  "This package holds the CUDA plug-in libpqcache_cuda.so, which\n"
  "libpqcache loads from its pqcache/ directory for PQ_BACKEND_CUDA and\n"
  "PQ_BACKEND_AUTO. The CUDA runtime is linked in statically; the plug-in\n"
  "needs only the NVIDIA driver's libcuda.so.1 (driver 580 or newer, for\n"
  "CUDA 13) at run time; without it, libpqcache reports no usable device.")
string(CONCAT _pq_desc_dev ${_pq_intro}
  "This package holds the C header pqcache.h, the pkg-config file and the\n"
  "CMake package (find_package(pqcache), target pqcache::pqcache).")
string(CONCAT _pq_desc_go ${_pq_intro}
  "This package holds the source of the Go module ${PQ_GO_MODULE_PATH}\n"
  "(cgo, with the SWIG-generated layer) under /usr/share/gocode/src, the Go\n"
  "path of Debian's Go packages. cgo takes the C flags from pkg-config.")
string(CONCAT _pq_desc_java ${_pq_intro}
  "This package holds the Java binding: ${PQ_JAVA_JAR_NAME}-${PROJECT_VERSION}.jar (package\n"
  "io.pqcache), its Maven coordinates ${PQ_MAVEN_GROUP_ID}:${PQ_MAVEN_ARTIFACT_ID} in\n"
  "/usr/share/maven-repo, and its JNI module libpqcache_jni.so.")
string(CONCAT _pq_desc_python ${_pq_intro}
  "This package holds the Python 3 binding (module pqcache; pqcache.redis\n"
  "needs the Redis tier's library, package ${PQ_DEB_NAME_redis}).")
string(CONCAT _pq_desc_redis ${_pq_intro}
  "This package holds libpqcache_redis, which saves a sequence's state to a\n"
  "Redis server in checksummed blocks and restores it into another context,\n"
  "in another process or on another machine, whole or in steps.")
string(CONCAT _pq_desc_redis_dev ${_pq_intro}
  "This package holds the Redis tier's C header pqcache_redis.h, the\n"
  "pkg-config file pqcache-redis.pc and the CMake package\n"
  "(find_package(pqcache-redis), target pqcache::redis).")
string(CONCAT _pq_desc_rust_sys ${_pq_intro}
  "This package holds the source of the Rust crate pqcache-sys (raw\n"
  "declarations of pqcache.h; its default feature \"link\" links libpqcache,\n"
  "without it the library is loaded at run time) under\n"
  "/usr/share/cargo/registry, for cargo's directory source replacement.")
string(CONCAT _pq_desc_rust ${_pq_intro}
  "This package holds the source of the Rust crate pqcache, the safe API\n"
  "on pqcache-sys, under /usr/share/cargo/registry, for cargo's directory\n"
  "source replacement.")
set(_pq_deb_section_runtime libs)
set(_pq_deb_section_cuda libs)
set(_pq_deb_section_dev libdevel)
set(_pq_deb_section_go golang)
set(_pq_deb_section_java java)
set(_pq_deb_section_python python)
set(_pq_deb_section_redis libs)
set(_pq_deb_section_redis_dev libdevel)
set(_pq_deb_section_rust_sys rust)
set(_pq_deb_section_rust rust)
set(_pq_rpm_group_runtime "System Environment/Libraries")
set(_pq_rpm_group_cuda "System Environment/Libraries")
set(_pq_rpm_group_dev "Development/Libraries")
set(_pq_rpm_group_go "Development/Libraries")
set(_pq_rpm_group_java "Development/Libraries")
set(_pq_rpm_group_python "Development/Libraries")
set(_pq_rpm_group_redis "System Environment/Libraries")
set(_pq_rpm_group_redis_dev "Development/Libraries")
set(_pq_rpm_group_rust_sys "Development/Libraries")
set(_pq_rpm_group_rust "Development/Libraries")

# ---- Debian -------------------------------------------------------------------------
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${PQ_PACKAGE_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_VERSION ${PQ_DEB_VERSION})
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SOURCE libpqcache)
# dpkg-shlibdeps computes the C/C++ runtime dependencies of every ELF file;
# GENERATE_SHLIBS writes the runtime package's shlibs file and the ldconfig
# postinst/postrm (toolchain notes 8, pitfall 1).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(_pq_runtime_dep "${PQ_DEB_NAME_runtime} (= ${PQ_DEB_VERSION})")
foreach(_comp IN LISTS _pq_components)
  string(TOUPPER ${_comp} _COMP)
  set(CPACK_DEBIAN_${_COMP}_PACKAGE_NAME ${PQ_DEB_NAME_${_comp}})
  set(CPACK_DEBIAN_${_COMP}_PACKAGE_SECTION ${_pq_deb_section_${_comp}})
  set(CPACK_DEBIAN_${_COMP}_DESCRIPTION "${_pq_summary_${_comp}}\n${_pq_desc_${_comp}}")
endforeach()
# Multi-Arch: same (Debian's multiarch spec) on the shared libraries, the
# plug-in and their -dev packages, so that libpqcache0:amd64 and
# libpqcache0:i386 (or a cross build's libpqcache-dev:arm64) install side by
# side: their ELF files, .pc and CMake files are in the multiarch directory
# (CMAKE_INSTALL_LIBDIR, lib/<triplet> on Debian), and what they have
# elsewhere is the same for every architecture (the headers and the example
# as in the source tree, copyright, and changelog.gz, dated by the source:
# packaging/CMakeLists.txt). Not the Java package (its JNI module is in
# /usr/lib/jni, shared by every architecture), nor the Python one (one
# dist-packages/pqcache/ for every architecture, its modules byte-compiled
# by postinst), nor the Architecture all ones. Only with the multiarch
# library directory: with -DCMAKE_INSTALL_LIBDIR=lib, two architectures'
# libpqcache.so.0 would be one path.
set(_pq_multiarch_same "")
if(CMAKE_LIBRARY_ARCHITECTURE AND CMAKE_INSTALL_LIBDIR STREQUAL "lib/${CMAKE_LIBRARY_ARCHITECTURE}")
  set(_pq_multiarch_same runtime cuda dev redis redis_dev)
else()
  message(STATUS "packaging: no Multi-Arch: same: the library directory ${CMAKE_INSTALL_LIBDIR} is not lib/<multiarch triplet>")
endif()
foreach(_comp IN LISTS _pq_multiarch_same)
  if(_comp IN_LIST _pq_components)
    string(TOUPPER ${_comp} _COMP)
    if(CMAKE_VERSION VERSION_GREATER_EQUAL 3.31)
      set(CPACK_DEBIAN_${_COMP}_PACKAGE_MULTIARCH same)
    else()
      # CPack before 3.31 has no Multi-Arch variable. It writes each control
      # field as "Name: value" with the value as given, so the field goes in
      # after the Source field's value.
      set(CPACK_DEBIAN_${_COMP}_PACKAGE_SOURCE "${CPACK_DEBIAN_PACKAGE_SOURCE}\nMulti-Arch: same")
    endif()
  endif()
endforeach()
# The JNI and Python modules NEED libpqcache.so.N, which is not installed on
# the build machine: dpkg-shlibdeps finds it in the build tree, and the
# dependency on the runtime package is written explicitly below.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${CMAKE_BINARY_DIR})
# ldconfig through dpkg's trigger (lintian: lacks-ldconfig-trigger, an
# error) rather than from maintainer scripts. CPack writes a postinst and a
# postrm calling ldconfig for any shared object under /usr/lib, even in a
# private subdirectory (the plug-in, the JNI module); a script of our own with
# the same name stops that (lintian: maintscript-calls-ldconfig).
set(_pq_no_ldconfig_scripts ${PQ_PACKAGING_DIR}/debian/noscripts/postinst
                            ${PQ_PACKAGING_DIR}/debian/noscripts/postrm)
# The symbols files (packaging/debian/*/symbols, written by
# packaging/debian/update-symbols.sh) give each exported function the
# version that brought it, so that dpkg-shlibdeps asks a program for the
# oldest libpqcache0 that has what it calls (shlibs alone says this version).
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA
    ${PQ_PACKAGING_DIR}/debian/runtime/triggers ${PQ_PACKAGING_DIR}/debian/runtime/symbols
    ${_pq_no_ldconfig_scripts})
foreach(_COMP CUDA JAVA)
  set(CPACK_DEBIAN_${_COMP}_PACKAGE_CONTROL_EXTRA ${_pq_no_ldconfig_scripts})
endforeach()
# The Redis tier's library is a public shared library like libpqcache.
set(CPACK_DEBIAN_REDIS_PACKAGE_CONTROL_EXTRA
    ${PQ_PACKAGING_DIR}/debian/runtime/triggers ${PQ_PACKAGING_DIR}/debian/redis/symbols
    ${_pq_no_ldconfig_scripts})
# The Python package byte-compiles its modules in postinst (py3compile) and
# removes the bytecode in prerm (py3clean), as dh_python3 does; the scripts
# are made from packaging/debian/python/*.in by packaging/CMakeLists.txt.
set(CPACK_DEBIAN_PYTHON_PACKAGE_CONTROL_EXTRA
    ${PQ_PACKAGING_BINARY_DIR}/debian/python/postinst ${PQ_PACKAGING_BINARY_DIR}/debian/python/prerm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_CUDA_PACKAGE_DEPENDS "${_pq_runtime_dep}")
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "${_pq_runtime_dep}")
# Debian's Java policy: a library does not depend on a JRE (lintian:
# needless-dependency-on-jre); the application that uses it does.
set(CPACK_DEBIAN_JAVA_PACKAGE_DEPENDS "${_pq_runtime_dep}")
# The SWIG extension module is built for one CPython minor version
# (_pqcache_swig.cpython-3XY-*.so): depend on exactly that one.
if("python" IN_LIST _pq_components)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  set(_pq_py "${Python3_VERSION_MAJOR}.${Python3_VERSION_MINOR}")
  math(EXPR _pq_py_next "${Python3_VERSION_MINOR} + 1")
  set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS
      "${_pq_runtime_dep}, python3 (>= ${_pq_py}), python3 (<< ${Python3_VERSION_MAJOR}.${_pq_py_next}), python3-numpy")
  set(CPACK_RPM_PYTHON_PACKAGE_REQUIRES "python(abi) = ${_pq_py}, python3-numpy")
endif()
# The plug-in's ELF NEEDs only libc, libstdc++ and libgcc_s (cudart is
# static); the NVIDIA driver's libcuda.so.1 is dlopened by cudart on first
# use. It is a Recommends, not a Depends: in containers the driver comes from
# the host (nvidia-container-toolkit) and no package provides it. Debian calls
# the package libcuda1 (non-free); Ubuntu's libnvidia-compute-<branch>
# Provides libcuda1 with the driver version. CUDA 13 needs driver >= 580.
set(CPACK_DEBIAN_CUDA_PACKAGE_RECOMMENDS "libcuda1 (>= 580)")
set(CPACK_DEBIAN_DEV_PACKAGE_RECOMMENDS "pkgconf | pkg-config")
# The Go module is source only (Go files and the SWIG wrapper's C file, which
# cgo compiles in the user's build): Architecture all. cgo needs the header
# and pkg-config (`#cgo pkg-config: pqcache`), and the wrapper was generated
# from this version's header, hence the exact dev package.
set(CPACK_DEBIAN_GO_PACKAGE_ARCHITECTURE all)
set(CPACK_DEBIAN_GO_PACKAGE_DEPENDS "${PQ_DEB_NAME_dev} (= ${PQ_DEB_VERSION}), pkgconf | pkg-config")
# libpqcache_redis NEEDs libhiredis (dpkg-shlibdeps finds its package) and
# libpqcache.so.N, which is not installed here: written explicitly, as for
# the bindings. The -dev package's .pc says Requires: pqcache and its header
# includes pqcache.h.
set(CPACK_DEBIAN_REDIS_PACKAGE_DEPENDS "${_pq_runtime_dep}")
set(CPACK_DEBIAN_REDIS_DEV_PACKAGE_DEPENDS
    "${PQ_DEB_NAME_redis} (= ${PQ_DEB_VERSION}), ${PQ_DEB_NAME_dev} (= ${PQ_DEB_VERSION})")
set(CPACK_DEBIAN_REDIS_DEV_PACKAGE_RECOMMENDS "pkgconf | pkg-config")
# The crates are sources (Architecture all, as the Go module). pqcache-sys's
# default feature "link" links libpqcache: the -dev package, as Debian's
# librust-*-sys-dev depend on their C library's; its build script asks
# pkg-config for the library directory when pkg-config is there.
set(CPACK_DEBIAN_RUST_SYS_PACKAGE_ARCHITECTURE all)
set(CPACK_DEBIAN_RUST_SYS_PACKAGE_DEPENDS "${PQ_DEB_NAME_dev} (= ${PQ_DEB_VERSION})")
set(CPACK_DEBIAN_RUST_SYS_PACKAGE_RECOMMENDS "pkgconf | pkg-config")
set(CPACK_DEBIAN_RUST_PACKAGE_ARCHITECTURE all)
set(CPACK_DEBIAN_RUST_PACKAGE_DEPENDS "${PQ_DEB_NAME_rust_sys} (= ${PQ_DEB_VERSION})")
# The virtual packages a debcargo package provides, which other crates'
# Debian packages depend on (librust-pqcache-sys-0.13+link-dev, ...):
# librust-<crate>-<major>-dev, -<major>.<minor>-dev and
# -<major>.<minor>.<patch>-dev, and each feature of Cargo.toml's [features]
# as librust-<crate>+<feature>-dev and at each of those versions, all
# (= version), '_' written '-'. The features add no crate dependency
# (`link` links the C library, which the package depends on anyway; the
# safe crate's `link` is pqcache-sys's), so, as debcargo's collapse_features
# makes them, they are all in the one package (lintian:
# empty-rust-library-declares-provides is for a package of Provides only).
foreach(_comp rust_sys rust)
  string(TOUPPER ${_comp} _COMP)
  string(REPLACE "_" "-" _crate "${PQ_RUST_CRATE_${_comp}}")
  set(_cargo_toml ${PROJECT_SOURCE_DIR}/bindings/rust/${PQ_RUST_CRATE_${_comp}}/Cargo.toml)
  set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_cargo_toml})
  file(STRINGS ${_cargo_toml} _lines)
  set(_in_features FALSE)
  set(_features "")
  foreach(_line IN LISTS _lines)
    if(_line MATCHES "^\\[")
      string(COMPARE EQUAL "${_line}" "[features]" _in_features)
    elseif(_in_features AND _line MATCHES "^([A-Za-z0-9_-]+) *=")
      string(REPLACE "_" "-" _feature "${CMAKE_MATCH_1}")
      list(APPEND _features ${_feature})
    endif()
  endforeach()
  set(_provides "")
  foreach(_feature IN LISTS _features)
    list(APPEND _provides "librust-${_crate}+${_feature}-dev")
  endforeach()
  foreach(_v ${PROJECT_VERSION_MAJOR} ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR} ${PROJECT_VERSION})
    list(APPEND _provides "librust-${_crate}-${_v}-dev")
    foreach(_feature IN LISTS _features)
      list(APPEND _provides "librust-${_crate}-${_v}+${_feature}-dev")
    endforeach()
  endforeach()
  list(TRANSFORM _provides APPEND " (= ${PQ_DEB_VERSION})")
  list(JOIN _provides ", " CPACK_DEBIAN_${_COMP}_PACKAGE_PROVIDES)
endforeach()
# pqcache.redis (in the Python package) loads libpqcache_redis when imported.
if("redis" IN_LIST _pq_components)
  set(CPACK_DEBIAN_PYTHON_PACKAGE_SUGGESTS "${PQ_DEB_NAME_redis} (= ${PQ_DEB_VERSION})")
  set(CPACK_RPM_PYTHON_PACKAGE_SUGGESTS "${PQ_RPM_NAME_redis} = ${PROJECT_VERSION}-${PQ_RPM_RELEASE}")
endif()

# ---- RPM ------------------------------------------------------------------------------
set(CPACK_RPM_COMPONENT_INSTALL ON)
set(CPACK_RPM_FILE_NAME RPM-DEFAULT)
set(CPACK_PACKAGE_RELOCATABLE OFF)  # as distributions' packages: fixed paths
set(CPACK_RPM_PACKAGE_RELEASE ${PQ_RPM_RELEASE})
set(CPACK_RPM_PACKAGE_LICENSE "Apache-2.0")
set(CPACK_RPM_PACKAGE_VENDOR "${CPACK_PACKAGE_VENDOR}")
# CPack 3.25 has no Packager tag; rpmbuild fills it from the %packager macro.
set(CPACK_RPM_SPEC_MORE_DEFINE "%define packager ${PQ_PACKAGE_MAINTAINER}")
# rpmbuild's automatic Requires/Provides (libc.so.6(GLIBC_2.34)(64bit),
# libpqcache.so.0()(64bit), ...) are the RPM way and are kept.
set(CPACK_RPM_PACKAGE_AUTOREQPROV ON)
set(_pq_rpm_runtime_dep "${PQ_RPM_NAME_runtime} = ${PROJECT_VERSION}-${PQ_RPM_RELEASE}")
foreach(_comp IN LISTS _pq_components)
  string(TOUPPER ${_comp} _COMP)
  set(CPACK_RPM_${_COMP}_PACKAGE_NAME ${PQ_RPM_NAME_${_comp}})
  set(CPACK_RPM_${_COMP}_PACKAGE_SUMMARY "${_pq_summary_${_comp}}")
  string(REPLACE "\n.\n" "\n\n" _pq_rpm_desc "${_pq_desc_${_comp}}")
  set(CPACK_RPM_${_COMP}_PACKAGE_DESCRIPTION "${_pq_rpm_desc}")
  set(CPACK_RPM_${_COMP}_PACKAGE_GROUP "${_pq_rpm_group_${_comp}}")
endforeach()
set(CPACK_RPM_RUNTIME_POST_INSTALL_SCRIPT_FILE ${PQ_PACKAGING_DIR}/rpm/ldconfig.sh)
set(CPACK_RPM_RUNTIME_POST_UNINSTALL_SCRIPT_FILE ${PQ_PACKAGING_DIR}/rpm/ldconfig.sh)
# Shared objects are 0755 on RPM systems (rpmlint: shared-library-not-
# executable) but 0644 under Debian policy, which is what CMake installs on a
# Debian build machine (CMAKE_INSTALL_SO_NO_EXE): set the mode for the RPMs.
set(CPACK_RPM_RUNTIME_USER_FILELIST
    "%attr(0755,root,root) /usr/${PQ_RPM_LIBDIR}/libpqcache.so.${PROJECT_VERSION}")
set(CPACK_RPM_CUDA_USER_FILELIST "%attr(0755,root,root) /usr/${PQ_RPM_LIBDIR}/pqcache/libpqcache_cuda.so")
set(CPACK_RPM_REDIS_USER_FILELIST
    "%attr(0755,root,root) /usr/${PQ_RPM_LIBDIR}/libpqcache_redis.so.${PROJECT_VERSION}")
set(CPACK_RPM_REDIS_POST_INSTALL_SCRIPT_FILE ${PQ_PACKAGING_DIR}/rpm/ldconfig.sh)
set(CPACK_RPM_REDIS_POST_UNINSTALL_SCRIPT_FILE ${PQ_PACKAGING_DIR}/rpm/ldconfig.sh)
set(CPACK_RPM_REDIS_PACKAGE_REQUIRES "${_pq_rpm_runtime_dep}")
set(CPACK_RPM_REDIS_DEV_PACKAGE_REQUIRES
    "${PQ_RPM_NAME_redis} = ${PROJECT_VERSION}-${PQ_RPM_RELEASE}, ${PQ_RPM_NAME_dev} = ${PROJECT_VERSION}-${PQ_RPM_RELEASE}")
set(CPACK_RPM_REDIS_DEV_PACKAGE_PROVIDES
    "pkgconfig(pqcache-redis) = ${PROJECT_VERSION}, cmake(pqcache-redis) = ${PROJECT_VERSION}")
# Fedora's rust-<crate>-devel provide crate(<name>) = version (rust-packaging).
set(CPACK_RPM_RUST_SYS_PACKAGE_ARCHITECTURE noarch)
set(CPACK_RPM_RUST_SYS_PACKAGE_PROVIDES "crate(${PQ_RUST_CRATE_rust_sys}) = ${PROJECT_VERSION}")
set(CPACK_RPM_RUST_SYS_PACKAGE_REQUIRES "${PQ_RPM_NAME_dev} = ${PROJECT_VERSION}-${PQ_RPM_RELEASE}")
set(CPACK_RPM_RUST_PACKAGE_ARCHITECTURE noarch)
set(CPACK_RPM_RUST_PACKAGE_PROVIDES "crate(${PQ_RUST_CRATE_rust}) = ${PROJECT_VERSION}")
set(CPACK_RPM_RUST_PACKAGE_REQUIRES "${PQ_RPM_NAME_rust_sys} = ${PROJECT_VERSION}-${PQ_RPM_RELEASE}")
# What Fedora's pkgconfig and cmake dependency generators would add (this
# build machine's rpmbuild has neither): `dnf install 'pkgconfig(pqcache)'`.
set(CPACK_RPM_DEV_PACKAGE_PROVIDES "pkgconfig(pqcache) = ${PROJECT_VERSION}, cmake(pqcache) = ${PROJECT_VERSION}")
set(CPACK_RPM_CUDA_PACKAGE_REQUIRES "${_pq_rpm_runtime_dep}")
set(CPACK_RPM_DEV_PACKAGE_REQUIRES "${_pq_rpm_runtime_dep}")
set(CPACK_RPM_JAVA_PACKAGE_REQUIRES "${_pq_rpm_runtime_dep}, java-headless >= 1:17")
set(CPACK_RPM_GO_PACKAGE_ARCHITECTURE noarch)
set(CPACK_RPM_GO_PACKAGE_REQUIRES "${PQ_RPM_NAME_dev} = ${PROJECT_VERSION}-${PQ_RPM_RELEASE}, pkgconfig")
string(PREPEND CPACK_RPM_PYTHON_PACKAGE_REQUIRES "${_pq_rpm_runtime_dep}, ")
# CPack 3.25 writes Suggests but not Recommends for RPM. The driver library is
# named by its soname, which NVIDIA's and RPM Fusion's driver packages provide.
if(CMAKE_SIZEOF_VOID_P EQUAL 8)
  set(CPACK_RPM_CUDA_PACKAGE_SUGGESTS "libcuda.so.1()(64bit)")
else()
  set(CPACK_RPM_CUDA_PACKAGE_SUGGESTS "libcuda.so.1")
endif()
# Directories a package must not claim (toolchain notes 8, pitfall 2): every
# parent of an install directory that belongs to the filesystem or to other
# packages. The package's own directories (lib/pqcache, lib/cmake/pqcache,
# the Python package) stay owned.
set(_pq_shared_dirs
  ${PQ_RPM_LIBDIR}/pkgconfig ${PQ_RPM_LIBDIR}/cmake ${PQ_JNI_INSTALL_DIR}
  ${CMAKE_INSTALL_INCLUDEDIR} ${CMAKE_INSTALL_DATADIR}/java ${CMAKE_INSTALL_DATADIR}/doc
  ${CMAKE_INSTALL_DATADIR}/gocode/src ${CMAKE_INSTALL_DATADIR}/maven-repo/org
  ${PQ_RUST_REGISTRY_DIR})
if(DEFINED PQ_PYTHON_INSTALL_DIR)
  list(APPEND _pq_shared_dirs ${PQ_PYTHON_INSTALL_DIR})
else()
  list(APPEND _pq_shared_dirs lib/python3/dist-packages)
endif()
set(CPACK_RPM_EXCLUDE_FROM_AUTO_FILELIST_ADDITION "")
foreach(_dir IN LISTS _pq_shared_dirs)
  while(_dir AND NOT _dir STREQUAL "/" AND NOT _dir STREQUAL ".")
    list(APPEND CPACK_RPM_EXCLUDE_FROM_AUTO_FILELIST_ADDITION /usr/${_dir})
    get_filename_component(_dir "${_dir}" DIRECTORY)
  endwhile()
endforeach()
list(REMOVE_DUPLICATES CPACK_RPM_EXCLUDE_FROM_AUTO_FILELIST_ADDITION)

include(CPack)
