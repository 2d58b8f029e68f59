# cmake -P script (bindings/rust/CMakeLists.txt runs it after `cargo package`):
# lays the .crate files out as Debian's Rust team ships crates in
# librust-<crate>-dev, a cargo directory source under
# /usr/share/cargo/registry: <crate>-<version>/ holds the .crate's contents
# (the normalised Cargo.toml, Cargo.toml.orig, the sources) and
# .cargo-checksum.json, which cargo checks before it builds from a directory
# source: "files" maps every file's path to its sha256, "package" is the
# .crate's sha256 where one is known and may be empty, as debcargo writes it
# (there is no registry .crate behind a system package).
#
#   cmake -DCRATES="a.crate|b.crate" -DOUT=DIR -P rust-registry.cmake
if(NOT CRATES OR NOT OUT)
  message(FATAL_ERROR "usage: cmake -DCRATES=<.crate|...> -DOUT=<dir> -P rust-registry.cmake")
endif()
string(REPLACE "|" ";" CRATES "${CRATES}")
file(REMOVE_RECURSE "${OUT}")
file(MAKE_DIRECTORY "${OUT}")
foreach(_crate IN LISTS CRATES)
  if(NOT EXISTS "${_crate}")
    message(FATAL_ERROR "rust-registry: ${_crate} is missing (did cargo package run?)")
  endif()
  get_filename_component(_name "${_crate}" NAME)
  string(REGEX REPLACE "\\.crate$" "" _name "${_name}")
  file(ARCHIVE_EXTRACT INPUT "${_crate}" DESTINATION "${OUT}")
  set(_dir "${OUT}/${_name}")
  if(NOT EXISTS "${_dir}/Cargo.toml")
    message(FATAL_ERROR "rust-registry: ${_crate} has no ${_name}/Cargo.toml")
  endif()
  # Every file of the .crate, as cargo vendor keeps them (a dependency's
  # Cargo.lock is ignored by cargo).
  file(GLOB_RECURSE _files RELATIVE "${_dir}" LIST_DIRECTORIES false "${_dir}/*")
  list(REMOVE_ITEM _files .cargo-checksum.json)
  list(SORT _files)
  set(_entries "")
  foreach(_file IN LISTS _files)
    if(_file MATCHES "[\"\\\\]")
      message(FATAL_ERROR "rust-registry: ${_file}: a quote or backslash in a path")
    endif()
    file(SHA256 "${_dir}/${_file}" _sum)
    list(APPEND _entries "\"${_file}\":\"${_sum}\"")
  endforeach()
  list(JOIN _entries "," _entries)
  file(WRITE "${_dir}/.cargo-checksum.json" "{\"files\":{${_entries}},\"package\":\"\"}\n")
  list(LENGTH _files _count)
  message(STATUS "rust-registry: ${_name}: ${_count} files and .cargo-checksum.json")
endforeach()
