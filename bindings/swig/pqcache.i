/* pqcache.i - the one SWIG interface of libpqcache, for Go, Java and Python.
 *
 * SWIG reads include/pqcache.h itself, so a function added to the header is
 * wrapped without touching this file. What differs per language (typemaps
 * for buffers, error handling, module names) lives in one file per
 * language, included below; each binding adds its idiomatic layer on top of
 * the generated one (bindings/<language>/). Rust has no SWIG target: its
 * crate in bindings/rust is written by hand over the same header. */
#if defined(SWIGPYTHON)
%module pqcache_swig
#else
%module pqcache
#endif

%{
#include "pqcache.h"
%}

%include <stdint.i>

/* For C libraries that keep handles into a context (the Redis tier): a
 * binding's own objects check their context themselves, and a C callback
 * cannot be made from these languages' functions through SWIG. */
%ignore pq_watch_destroy;
%ignore pq_unwatch_destroy;

#if defined(SWIGGO)
%include "go.i"
#elif defined(SWIGJAVA)
%include "java.i"
#elif defined(SWIGPYTHON)
%include "python.i"
#endif

%include "pqcache.h"
