"""pqcache.redis with cluster=True (pq_redis_connect_cluster) against a Redis
Cluster of three masters of its own on loopback, started as
tests/redis/redis_cluster.h starts one: a state put on each node's slots is
got whole and in steps by another context, which selects and fetches what the
first does; the keys are hash-tagged and live on their slot's node. CTest
test python_redis_cluster; without redis-server it reports SKIPPED with the
reason (test_python_redis's module-level skip)."""
import subprocess
import time

import numpy as np
import pytest

import pqcache
from test_python_redis import (LAYERS, PROMPT, Q, DIM, REDIS_SERVER, command, free_port,
                               make_context, prefilled, same, selected)

import pqcache.redis as pqr  # noqa: E402  (after the skip in test_python_redis)

MASTERS, SLOTS = 3, 16384


def start_node(folder):
    """One cluster node on free ports (client and bus); (process, port, bus)."""
    for _ in range(5):  # another process may take a free port first
        port, bus = free_port(), free_port()
        proc = subprocess.Popen([REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1",
                                 "--save", "", "--appendonly", "no", "--dir", str(folder),
                                 "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                                 "--cluster-node-timeout", "5000", "--cluster-port", str(bus)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if command(port, "PING").startswith(b"+PONG"):
                    return proc, port, bus
            except OSError:
                time.sleep(0.05)
        proc.kill()
        proc.wait()
    pytest.fail(f"{REDIS_SERVER} did not start as a cluster node in 5 tries")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Three masters, node i with slots [i * 16384 / 3, (i + 1) * 16384 / 3);
    their client ports, once every node says cluster_state:ok."""
    nodes = []
    try:
        for i in range(MASTERS):
            nodes.append(start_node(tmp_path_factory.mktemp(f"node{i}")))
        for i, (_, port, _) in enumerate(nodes):
            first, last = i * SLOTS // MASTERS, (i + 1) * SLOTS // MASTERS - 1
            assert command(port, "CLUSTER", "ADDSLOTSRANGE", first, last).startswith(b"+OK")
        for _, port, bus in nodes[1:]:
            assert command(nodes[0][1], "CLUSTER", "MEET", "127.0.0.1", port, bus).startswith(b"+OK")
        deadline = time.monotonic() + 30
        while not all(b"cluster_state:ok" in command(port, "CLUSTER", "INFO") and
                      b"cluster_known_nodes:3" in command(port, "CLUSTER", "INFO")
                      for _, port, _ in nodes):
            assert time.monotonic() < deadline, "the cluster did not reach cluster_state:ok in 30 s"
            time.sleep(0.05)
        yield [port for _, port, _ in nodes]
    finally:
        for proc, _, _ in nodes:
            proc.kill()
            proc.wait()


def key_on(ports, node):
    """A key whose hash tag's slot lies in node's range (CLUSTER KEYSLOT)."""
    for n in range(1000):
        key = f"py:{n}"
        slot = int(command(ports[0], "CLUSTER", "KEYSLOT", "{" + key + "}")[1:].strip())
        if slot * MASTERS // SLOTS == node:
            return key
    raise AssertionError(f"no key for node {node}")


def test_put_get_and_streaming_get_on_every_node(cluster):
    query = np.random.default_rng(40).standard_normal((Q, DIM)).astype(np.float32)
    with prefilled(5) as a, make_context() as b, \
            pqr.Redis("127.0.0.1", cluster[0], 5000, cluster=True) as r:
        assert r.cluster is True
        for node in range(MASTERS):
            key = key_on(cluster, node)
            r.put(a, 5, key, block_bytes=4096)
            assert r.info(key)["state_bytes"] == a.state_size(5)
            # The state is on its slot's node, under the hash-tagged names.
            assert command(cluster[node], "EXISTS", "{" + key + "}:manifest") == b":1\r\n"
            others = [p for i, p in enumerate(cluster) if i != node]
            assert all(command(p, "DBSIZE") == b":0\r\n" for p in others)
            r.get(b, 10 + node, key)
            assert b.length(10 + node, 1) == PROMPT
            with r.get_begin(b, 20 + node, key) as t:
                t.finish()
            for seq in (10 + node, 20 + node):
                for layer in range(LAYERS):
                    same(selected(b, seq, layer, query), selected(a, 5, layer, query))
            r.delete(key)
            with pytest.raises(pqcache.PQError) as e:
                r.info(key)
            assert e.value.status_name == "PQ_ERR_NOT_FOUND"


def test_cluster_must_be_a_bool(cluster):
    with pytest.raises(TypeError, match="cluster must be a bool"):
        pqr.Redis("127.0.0.1", cluster[0], cluster="yes")
