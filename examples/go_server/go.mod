module pqcache_go_server

go 1.19
