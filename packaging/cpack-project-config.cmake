# Read by cpack for every generator (CPACK_PROJECT_CONFIG_FILE).
if(CPACK_GENERATOR STREQUAL "RPM")
  # CPack 3.25 probes weak-dependency support with `${RPM_EXECUTABLE}
  # --suggests` but never sets RPM_EXECUTABLE, so it drops every Suggests tag.
  find_program(RPM_EXECUTABLE rpm)
endif()
