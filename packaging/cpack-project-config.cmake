# Read by cpack for every generator (CPACK_PROJECT_CONFIG_FILE).

# The install rules choose the library directory by the package being
# filled (packaging/CMakeLists.txt: lib64 in the .rpm); the install script
# runs in this process and sees its environment.
set(ENV{PQ_PACKAGE_GENERATOR} "${CPACK_GENERATOR}")
if(CPACK_GENERATOR STREQUAL "RPM")
  # CPack 3.25 probes weak-dependency support with `${RPM_EXECUTABLE}
  # --suggests` but never sets RPM_EXECUTABLE, so it drops every Suggests tag.
  find_program(RPM_EXECUTABLE rpm)
endif()
