# README.md's Python example as a program: the arrays it takes from its caller.
import numpy as np

keys = np.random.randn(4096, 8, 128).astype(np.float16)     # [tokens][kv_heads][dim]
values = np.random.randn(4096, 8, 128).astype(np.float16)
query = np.random.randn(32, 128).astype(np.float16)         # [q_heads][dim]
@SNIPPET@
counts = [len(h) for h in sel.heads()]
assert k.shape[0] == 8 and min(counts) > 0, counts
print("selected per kv head:", counts)
