# Included by tests/CMakeLists.txt. Checks of the public surface that are not
# GoogleTest programs:
#  - header_c99: tests/header_c99.c includes pqcache.h under
#    -std=c99 -pedantic -Wall -Wextra -Werror (a header regression breaks the
#    build), links libpqcache.so and checks the C ABI at run time;
#  - public_exports / public_needed / public_soname: nm and readelf on the
#    built libpqcache.so (tests/check_exports.sh);
#  - cuda_plugin_exports: the same for libpqcache_cuda.so when it is built.

add_executable(header_c99 ${CMAKE_CURRENT_LIST_DIR}/header_c99.c)
target_link_libraries(header_c99 PRIVATE pqcache)
set_target_properties(header_c99 PROPERTIES C_STANDARD 99 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
target_compile_options(header_c99 PRIVATE -std=c99 -pedantic -Wall -Wextra -Werror)
add_test(NAME header_c99 COMMAND header_c99)

# The same header must also compile cleanly as C++ (bindings, C++ callers).
set(_pq_header_cxx ${CMAKE_CURRENT_BINARY_DIR}/header_cxx.cpp)
file(GENERATE OUTPUT ${_pq_header_cxx}
  CONTENT "#include \"pqcache.h\"\nint pq_header_cxx_probe() { return PQ_VERSION_NUMBER + (int)sizeof(pq_config); }\n")
add_library(header_cxx OBJECT ${_pq_header_cxx})
target_include_directories(header_cxx PRIVATE ${PROJECT_SOURCE_DIR}/include)
target_compile_options(header_cxx PRIVATE -pedantic -Wall -Wextra -Werror)

find_program(PQ_NM nm REQUIRED)
find_program(PQ_READELF readelf REQUIRED)
set(_pq_check ${CMAKE_CURRENT_LIST_DIR}/check_exports.sh)

add_test(NAME public_exports
  COMMAND bash ${_pq_check} exports $<TARGET_FILE:pqcache>)
add_test(NAME public_needed
  COMMAND bash ${_pq_check} needed $<TARGET_FILE:pqcache>)
add_test(NAME public_soname
  COMMAND bash ${_pq_check} soname $<TARGET_FILE:pqcache> ${PROJECT_SOURCE_DIR}/include/pqcache.h)

if(TARGET pqcache_cuda)
  add_test(NAME cuda_plugin_exports
    COMMAND bash ${_pq_check} plugin $<TARGET_FILE:pqcache_cuda>)
endif()
