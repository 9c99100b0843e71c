"""What the stack's readers ask of the serving store, on a Redis Cluster of 3 real masters
(tests/conftest.py's ``redis_cluster``) as on one Redis: the metrics exporter's consistent counts
(a MULTI per partition, each on its slot's master) and the command statistics of every master."""

from __future__ import annotations

import pytest

from contract import functions
from infra import clients
from pipelines.metrics import serving_counts

pytestmark = pytest.mark.redis_cluster


def test_the_exporters_counts_read_every_partition_on_its_master(redis_cluster_url, redis_url):
    for url in (redis_cluster_url, redis_url):
        r = clients.redis_client(url)
        ns = "readers"
        for p in range(8):
            r.set(functions.pkey(ns, p, "fence"), 100 + p)
            r.hset(functions.pkey(ns, p, "stats"), mapping={"applied": 10 * p, "duplicates": p})
            r.hset(functions.pkey(ns, p, "freshness"), mapping={"3": p})
        fences, stats, hists = serving_counts(r, ns, "partitioned", list(range(8)))
        assert fences == {p: 100 + p for p in range(8)}, url
        assert [int(s[b"applied"]) for s in stats] == [10 * p for p in range(8)]
        assert [int(h[b"3"]) for h in hists] == list(range(8))
        functions.drop_namespace(r, ns)


def test_command_stats_of_a_cluster_are_every_masters_summed(redis_cluster_url):
    r = clients.redis_client(redis_cluster_url)
    nodes = {
        n.port: clients.redis_client(f"redis://127.0.0.1:{n.port}/0", cluster=False)
        for n in r.get_primaries()
    }
    for i in range(300):
        r.incr(f"stats:{i}")  # INCRBY (as redis-py sends it), keys on all three masters
    per_node = {
        port: n.info("commandstats").get("cmdstat_incrby", {}).get("calls", 0) for port, n in nodes.items()
    }
    assert len(per_node) == 3 and all(per_node.values()), per_node
    summed = functions.command_stats(r)["cmdstat_incrby"]
    assert summed["calls"] == sum(per_node.values())
    assert summed["usec_per_call"] == summed["usec"] / summed["calls"]


def test_the_library_version_is_every_masters_and_a_stale_one_is_named(redis_cluster_url):
    """verify's library check (``loaded_versions``): one version where every master runs it; a master
    left on another (a half-done upgrade) makes the answer name each master's, no version at all."""
    r = clients.redis_client(redis_cluster_url)
    want = functions.partitioned_version()
    functions.ensure_partitioned_loaded(r)
    assert functions.loaded_versions(r)["partitioned"] == want
    first, *rest = sorted(r.get_primaries(), key=lambda n: n.port)
    stale = functions._versioned(functions.partitioned_source(), "0-stale")
    r.get_redis_connection(first).function_load(stale, replace=True)
    try:
        said = functions.loaded_versions(r)["partitioned"]
        assert said != want and f"{first.host}:{first.port}=0-stale" in said
        assert all(f"{n.host}:{n.port}={want}" in said for n in rest), said
    finally:
        functions.ensure_partitioned_loaded(r)
    assert functions.loaded_versions(r)["partitioned"] == want
