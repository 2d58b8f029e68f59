"""Evaluation of libpqcache's selectors on real attention traces.

The numpy model's decode steps are small matrix products: with OpenBLAS's
default thread pool they run 10x slower on a shared 2-core machine than on
one thread, so the package defaults OPENBLAS_NUM_THREADS to 1 (set it before
running to override). It must happen before numpy is imported.
"""
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
