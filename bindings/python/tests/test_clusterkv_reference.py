"""ClusterKV against the authors' efficiency path (sjtu-zhao-lab/ClusterKV at
cb66a2291c660dbc4f38de26514af7c4d54e8f31): build_cluster of
clusterkv/clusterkv_utils/__init__.py (cosine assignment to centroids that
update_centroids_kernel sets to the mean of their members' raw keys, niter
rounds, then a last assignment) and the selection of the get_neigh_c and
get_sel_indices kernels (clusters by q . centroid, descending; their tokens
in label order; cut to the budget), re-typed below in numpy.

Aligned settings: one query head per kv head (the authors rank per query
head), the prompt's middle clustered into NLIST clusters, each later window
of 320 middle tokens into 8. Two things are given to the reference rather
than drawn or counted as the authors do (docs/selector-references.md): the
initial centroids (torch.randint there; the library's even-rank tokens
here), and the budget, which the library spends first on the middle tokens
no window holds yet (the authors attend to those beyond the budget).
(Checked: a reference that ranks by cosine instead of q . c, that
normalises its centroids, or that runs 10 rounds instead of 20, fails.)"""
import numpy as np

import pqcache

HEADS, DIM, PROMPT, SINK, LOCAL, K, NLIST = 2, 16, 300, 4, 16, 40, 24
WINDOW, WINDOW_NLIST, NITER = 320, 8, 20
STEPS = 360


def build_cluster(keys, nlist, niter=NITER):
    """build_cluster for one kv head: keys [seq_len, head_dim] -> centroids,
    labels. init_idx is the library's (even ranks) instead of randint."""
    seq_len = len(keys)
    init_idx = (2 * np.arange(nlist) + 1) * seq_len // (2 * nlist)
    centroids = keys[init_idx].copy()
    epsilon = 1e-8
    keys_normalized = keys / (np.linalg.norm(keys, axis=-1, keepdims=True) + epsilon)

    def assign():
        cn = centroids / (np.linalg.norm(centroids, axis=-1, keepdims=True) + epsilon)
        return (keys_normalized @ cn.T).argmax(axis=1)

    for _ in range(niter):
        labels = assign()
        for c in range(nlist):  # update_centroids_kernel: mean where count > 0
            members = labels == c
            if members.any():
                centroids[c] = keys[members].mean(axis=0)
    return centroids, assign()


def select(q, centroids, labels, positions, budget):
    """get_neigh_c + get_sel_indices for one query head: clusters by q . c,
    descending, their tokens (label order, ascending inside), the first
    `budget` of them."""
    order = np.argsort(-(centroids @ q), kind="stable")
    chosen = []
    for c in order:
        chosen += positions[labels == c].tolist()
        if len(chosen) >= budget:
            break
    return chosen[:budget]


def test_every_selection_matches_the_authors_clustering_and_ranking():
    rng = np.random.default_rng(5)
    total = PROMPT + STEPS
    keys = rng.normal(size=(total, HEADS, DIM)).astype(np.float32)
    queries = rng.normal(size=(total, HEADS, DIM)).astype(np.float32)
    with pqcache.Context(1, HEADS, HEADS, DIM, "f32", selector="clusterkv", sink_tokens=SINK,
                         local_tokens=LOCAL, topk_tokens=K, cluster_count=NLIST) as ctx:
        ctx.add_sequence(0)
        ctx.prefill(0, 0, keys[:PROMPT], keys[:PROMPT])
        clusters = []  # per head: [(centroids, labels, positions)]
        for h in range(HEADS):
            first = np.arange(SINK, PROMPT - LOCAL)
            clusters.append([(*build_cluster(keys[first, h].astype(np.float64), NLIST), first)])
        clustered_end = PROMPT - LOCAL
        windows = 0
        for step in range(STEPS):
            n = PROMPT + step
            if step > 0:
                ctx.append(0, 0, keys[n - 1:n], keys[n - 1:n])
            middle_end = n - LOCAL
            while middle_end - clustered_end >= WINDOW:
                window = np.arange(clustered_end, clustered_end + WINDOW)
                for h in range(HEADS):
                    clusters[h].append((*build_cluster(keys[window, h].astype(np.float64),
                                                       WINDOW_NLIST), window))
                clustered_end += WINDOW
                windows += 1
            sel = ctx.select(0, 0, queries[n - 1])
            for h, row in enumerate(sel.heads()):
                middle = sorted(p for p in row.tolist() if SINK <= p < middle_end)
                pending = list(range(clustered_end, middle_end))[::-1][:K]
                budget = K - len(pending)
                centroids = np.concatenate([c for c, _, _ in clusters[h]])
                labels = np.concatenate([l + sum(len(c) for c, _, _ in clusters[h][:i])
                                         for i, (_, l, _) in enumerate(clusters[h])])
                positions = np.concatenate([p for _, _, p in clusters[h]])
                chosen = select(queries[n - 1, h].astype(np.float64), centroids, labels,
                                positions, budget) if budget > 0 else []
                assert middle == sorted(pending + chosen), (
                    f"step {step}, head {h}: the library kept "
                    f"{sorted(set(middle) - set(pending + chosen))}, the reference "
                    f"{sorted(set(pending + chosen) - set(middle))}")
        assert windows == 1, "no window of new tokens was clustered: the test would not see it"
