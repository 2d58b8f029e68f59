/**
 * libpqcache for Java. Only {@code io.pqcache} is exported; the SWIG-generated
 * layer {@code io.pqcache.swig} stays private to the module (on the class
 * path, where modules are not enforced, it is public but not part of the API).
 */
module io.pqcache {
  exports io.pqcache;
}
