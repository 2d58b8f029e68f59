module pqcache

go 1.19
