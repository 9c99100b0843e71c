"""The partitioned layout on a Redis Cluster of 3 real masters (infra/redis_cluster.py; the
fixture is tests/conftest.py's ``redis_cluster``): the client factory finds the cluster behind one
node's URL, the library is on every master at this version, each partition's keys live on the
master that owns its slot and a namespace's partitions are spread over the masters. The views
themselves are the property test's (tests/unit/test_properties.py, the cluster variant)."""

from __future__ import annotations

import json
import uuid

import pytest
import redis
import redis.asyncio

from contract import functions
from contract.serving import partition_of
from infra import clients
from pipelines.speed.partitioned import PartitionedProcessor
from pipelines.speed.processor import Processor, ProcessorConfig
from tests.unit.events import ev

pytestmark = pytest.mark.redis_cluster

PARTITIONS = 8


def users_by_partition(n: int = PARTITIONS) -> dict[int, int]:
    """One user id whose events the contract keys to each partition."""
    out: dict[int, int] = {}
    u = 1
    while len(out) < n:
        out.setdefault(partition_of(u, n), u)
        u += 1
    return out


def test_one_setting_names_a_single_redis_or_a_cluster(redis_url, redis_cluster_url):
    single = clients.redis_client(redis_url)
    assert type(single) is redis.Redis  # the single Redis: the client it always was
    assert type(clients.redis_client(redis_url, asyncio=True)) is redis.asyncio.Redis
    cluster = clients.redis_client(redis_cluster_url)
    assert isinstance(cluster, redis.RedisCluster) and len(cluster.get_primaries()) == 3
    assert isinstance(clients.redis_client(redis_cluster_url, asyncio=True), redis.asyncio.RedisCluster)
    # a probe asks the node at the URL (is it up?), not the cluster behind it
    assert type(clients.redis_client(redis_cluster_url, "probe")) is redis.Redis
    # the role's read timeout, on every node's connections
    for node in cluster.get_primaries():
        kwargs = cluster.get_redis_connection(node).connection_pool.connection_kwargs
        assert kwargs["socket_timeout"] == clients.REDIS_TIMEOUTS_S["job"]


def test_the_partitioned_layout_is_spread_over_the_masters_each_partition_on_its_slots_owner(
    redis_cluster_url,
):
    ns = f"c{uuid.uuid4().hex[:8]}"
    cfg = ProcessorConfig(
        redis_url=redis_cluster_url, namespace=ns, layout="partitioned", partitions=PARTITIONS
    )
    proc = PartitionedProcessor(cfg, PARTITIONS)
    r = proc.r
    assert isinstance(r, redis.RedisCluster)
    primaries = r.get_primaries()
    assert len(primaries) == 3
    # the library at this version on every master, each asked on its own
    for node in primaries:
        assert (
            r.get_redis_connection(node).fcall_ro("p_version", 0).decode() == functions.partitioned_version()
        )

    for node in primaries:
        r.get_redis_connection(node).config_resetstat()
    # every user follows the next partition's user, posts and messages them: deliveries everywhere
    who = users_by_partition()
    logs: dict[int, list[dict]] = {p: [] for p in range(PARTITIONS)}
    for p, u in who.items():
        v = who[(p + 1) % PARTITIONS]
        logs[p] += [
            ev("user_registered", u, 0, handle=f"u{u}", display_name=f"U {u}"),
            ev("followed", u, 1, followee_id=v),
        ]
    for p, u in who.items():
        logs[p] += [ev("post_created", u, 2, post_id=100 + p, text=f"p{p}")]
        v = who[(p + 1) % PARTITIONS]
        logs[partition_of(v, PARTITIONS)] += [
            ev("message_sent", u, 3, message_id=200 + p, recipient_id=v, text="m")
        ]
    for p, events in logs.items():
        applied = proc.process(p, [(o, json.dumps(e).encode()) for o, e in enumerate(events)])
        assert applied.records == len(events)
    proc.settle()
    assert proc.fences() == {p: len(logs[p]) for p in range(PARTITIONS)}
    assert proc.delivered() == proc.fences()
    # a timeline holds its owner's post and the followee's (a delivery from another partition,
    # usually on another master)
    for p, u in who.items():
        tl = r.zrange(functions.pkey(ns, p, "tl", u), 0, -1)
        assert {int(m[:19]) for m in tl} == {100 + p, 100 + (p + 1) % PARTITIONS}, (u, tl)

    # each call went straight to its slot's owner, routed by the key it names (infra/clients.py),
    # never after a COMMAND GETKEYS round trip per call
    for node in primaries:
        stats = r.get_redis_connection(node).info("commandstats")
        assert "cmdstat_command|getkeys" not in stats and stats["cmdstat_fcall"]["calls"] > 0, node.name
    # every key of the namespace, read from each master directly: a partition's keys are on the one
    # master that owns its slot, and the partitions are spread over all three
    holders: dict[int, set[str]] = {}
    for node in primaries:
        direct = r.get_redis_connection(node)
        for key in direct.scan_iter(match=f"{ns}:*", count=1000):
            key = key.decode()
            p = int(key[len(ns) + 2 : key.index("}")])
            slot = r.keyslot(key)
            assert slot == r.keyslot(functions.pkey(ns, p, "fence")), key
            assert r.nodes_manager.get_node_from_slot(slot).name == node.name, key
            holders.setdefault(p, set()).add(node.name)
    assert set(holders) == set(range(PARTITIONS))
    assert all(len(names) == 1 for names in holders.values()), holders
    assert len(set().union(*holders.values())) == 3, holders  # spread: every master holds partitions
    assert functions.drop_namespace(r, ns) > 0  # a scratch namespace goes from every master
    assert not [k for n in primaries for k in r.get_redis_connection(n).scan_iter(match=f"{ns}:*")]


def test_the_keyed_layout_is_refused_on_a_cluster_in_one_line(redis_cluster_url):
    ns = f"c{uuid.uuid4().hex[:8]}"
    with pytest.raises(functions.LayoutError, match="SOCIAL_SERVING_LAYOUT=partitioned"):
        Processor(ProcessorConfig(redis_url=redis_cluster_url, namespace=ns))
    client = clients.redis_client(redis_cluster_url)
    with pytest.raises(functions.LayoutError, match="SOCIAL_SERVING_LAYOUT=partitioned"):
        functions.check_layout(client, ns, "keyed")
    functions.check_layout(client, ns, "partitioned")  # an empty namespace in the partitioned layout
