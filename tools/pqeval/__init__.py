"""Evaluation of libpqcache's selectors on real models.

Modules: tasks (long-context tasks after RULER), hf (the models in
transformers), longctx (tasks and perplexity through pqcache.transformers),
capture / trace / replay (attention traces and their replay through the
library), longtrace (long traces and the PQ settings sweep), stats
(bootstrap intervals), report and evaluate (docs/quality.md), cache_hits
(block cache hit rates), code_groups (the code-tuple groups behind PQ's
middle mass), hint_coverage (speculation one layer early), opq (a learned
rotation against the rotary-pair grouping), selection_dump (a selector's
selections, to compare two builds) and token_classes (FastGen's token
classes of a trace).

The numpy model's decode steps are small matrix products: with OpenBLAS's
default thread pool they run 10x slower on a shared 2-core machine than on
one thread, so the package defaults OPENBLAS_NUM_THREADS to 1 (set it before
running to override). It must happen before numpy is imported.
"""
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
