"""Evaluation of libpqcache's selectors on real models.

Modules: tasks (long-context tasks after RULER), hf (the models in
transformers), longctx (tasks and perplexity through pqcache.transformers),
capture / trace / replay (attention traces and their replay through the
library), longtrace (long traces and the PQ settings sweep), stats
(bootstrap intervals), report and evaluate (docs/quality.md), cache_hits.

The numpy model's decode steps are small matrix products: with OpenBLAS's
default thread pool they run 10x slower on a shared 2-core machine than on
one thread, so the package defaults OPENBLAS_NUM_THREADS to 1 (set it before
running to override). It must happen before numpy is imported.
"""
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
