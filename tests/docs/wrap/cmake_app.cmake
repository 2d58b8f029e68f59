# The downstream project around a CMake snippet that shows only the lines
# about pqcache: the example the -dev package ships, built as `app`.
cmake_minimum_required(VERSION 3.16)
project(app LANGUAGES C)
add_executable(app decode_loop.c)
@SNIPPET@
