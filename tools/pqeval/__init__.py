"""Evaluation of libpqcache's selectors on real attention traces."""
