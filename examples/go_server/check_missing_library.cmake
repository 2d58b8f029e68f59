# Runs go_server with a library path that does not exist, both through -lib
# and through $PQCACHE_LIB, and checks that it exits with status 2 and a
# message that says what is missing and how to provide it.
# Usage: cmake -DPROGRAM=<go_server> -DLIBRARY=<missing path> -P this file
foreach(_how flag env)
  if(_how STREQUAL "flag")
    execute_process(COMMAND ${PROGRAM} -lib ${LIBRARY}
      RESULT_VARIABLE _status OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  else()
    execute_process(COMMAND ${CMAKE_COMMAND} -E env PQCACHE_LIB=${LIBRARY} ${PROGRAM}
      RESULT_VARIABLE _status OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  endif()
  message(STATUS "${_how}: exit status ${_status}, stderr:\n${_err}")
  if(NOT _status EQUAL 2)
    message(FATAL_ERROR "${_how}: expected exit status 2, got '${_status}'")
  endif()
  string(REGEX REPLACE "([][+.*^$?|()])" "\\\\\\1" _library_re "${LIBRARY}")
  foreach(_expected
      "cannot load libpqcache from \"${_library_re}\""
      "cannot open shared object file"
      "-lib or \\$PQCACHE_LIB")
    if(NOT _err MATCHES "${_expected}")
      message(FATAL_ERROR "${_how}: stderr does not match '${_expected}'")
    endif()
  endforeach()
endforeach()
