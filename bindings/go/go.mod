module libpqcache.org/pqcache

go 1.19
