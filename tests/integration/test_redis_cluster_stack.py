"""The serving store on a Redis Cluster of 3 masters, as `make up` starts it (SOCIAL_REDIS_MASTERS=3,
the cluster profile's default: docs/architecture.md, "On Redis Cluster"), under the real stream.

The cluster is the stack's own service (:class:`infra.services.RedisServer`, three nodes joined by
``redis-cli --cluster create``) beside the session's Kafka; the speed layer, the archiver, verify,
restore and the API are given its address in SOCIAL_REDIS_URL, as a user gives it, and find the
other masters themselves. What must hold, as on one Redis (test_partitioned_layout.py):

- the stream == the specification (every user's views, every record's disposition, the
  accounting), with the partitions' keys spread over all three masters;
- verify's replay comparison, in a frozen copy of all three masters taken at one instant while the
  stream applies, and the whole verify at the end (Delta views, batch layer, replay);
- restore after the namespace is dropped from every master, key by key equal to what was there;
- read-your-write through the API: a reader's ``as_of`` covers its write;
- a master killed with SIGKILL mid-stream, down for a while as events flow (SOCIAL_FAULT_RUN_S / 2:
  5 s in `make test`, 30 s in `make test-faults`), and started again by the stack from its
  append-only file: the speed layer stops loudly (or rides it out) and, started again as `make up`
  starts it, the views, every record's one changelog entry and the accounting equal the
  specification;
- with a replica per master (SOCIAL_REDIS_REPLICAS=1), a master killed and not started again until
  its replica has taken its slots over (failover): the same, the promoted replica serving.

Part of the Redis Cluster subset of CI (``-m redis_cluster``).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from app_sim.generator import GeneratorConfig, produce
from contract import functions
from contract.serving import partition_of
from infra import clients
from pipelines.speed import compacted
from tests.integration.test_partitioned_layout import _delta_facts, _records, _spec_facts, _wait_line
from tests.integration.verifying import assert_verified, run_verify, verify_keyed, worker_spark
from tests.spec import harness

pytestmark = [pytest.mark.integration, pytest.mark.redis_cluster]

RUN_S = float(os.environ.get("SOCIAL_FAULT_RUN_S", "10"))  # `make test-faults` sets 60
DOWN_S = min(30.0, RUN_S / 2)  # how long the killed master stays down while events flow


@pytest.fixture(scope="module")
def redis_cluster_stack(kafka_stack, tmp_path_factory):
    """Settings whose Redis is a 3-master cluster the stack started (its RedisServer service on a
    free block of ports: 3 clients, 3 cluster buses), beside the session's Kafka."""
    from infra.stack import RedisServer, Stack, free_port_block

    port = free_port_block(6)
    settings = dataclasses.replace(
        kafka_stack.settings,
        redis_port=port,
        redis_masters=3,
        redis_url=f"redis://127.0.0.1:{port}/0",
        serving_layout="partitioned",
        var_dir=tmp_path_factory.mktemp("redis-cluster-var"),
    )
    stack = Stack(settings, service_types=(RedisServer,))
    try:
        started = stack.up()
        assert started == {f"redis-{i}": "started" for i in (1, 2, 3)}, started
        yield settings
    finally:
        stack.down()


def _on(cluster) -> dict:
    """The settings that point a speed layer (or any process) at ``cluster``: its address and shape."""
    names = ("redis_url", "redis_port", "redis_masters", "redis_replicas", "redis_node_timeout_ms")
    return {name: getattr(cluster, name) for name in names}


def _until_applied(client, ns: str, records: int, timeout_s: float = 300.0) -> None:
    """Until the partitions' own fences sum to ``records`` (the stream applied that many)."""
    deadline = time.monotonic() + timeout_s
    while sum(functions.layout_fences(client, ns, "partitioned", 8, whole=False).values()) < records:
        assert time.monotonic() < deadline, (
            f"the stream applied under {records:,} records in {timeout_s:.0f} s"
        )
        time.sleep(0.1)


def _equal_to_the_specification(sl, ns: str, *, changelog: bool = True):
    """The records of the speed layer's topic read back from Kafka, and the specification evaluated
    over them; the views every user reads (timelines: their first 50), every record's disposition
    (``changelog``: all still in Redis, one entry per record) and the accounting must equal it, and
    every partition hold every other's deliveries below its fence. Returns (records per partition,
    the views read)."""
    client = clients.redis_client(sl.settings.redis_url)
    per_p = _records(sl.settings, sl.topic)
    want = harness.expected_under(sl.settings, {p: [v for _, v in recs] for p, recs in per_p.items()})
    users = sorted({int(k) for recs in per_p.values() for k, _ in recs if k and k.isdigit()})
    got = harness.partitioned_views(sl.settings.redis_url, ns, users, 50, lambda u: partition_of(u, 8))
    wanted = harness.spec_views(want, users)
    wanted["timeline"] = {u: t[:50] for u, t in wanted["timeline"].items()}
    problems = harness.diff_views(wanted, got)
    if changelog:
        problems += harness.diff_dispositions(
            want.dispositions, harness.partitioned_dispositions(client, ns, range(8))
        )
    problems += harness.diff_accounting(
        want.accounting(), harness.partitioned_accounting(client, ns, range(8))
    )
    assert not problems, f"after {sl.restarts} restart(s) of the speed layer:\n" + "\n".join(problems[:20])
    ends = {p: len(recs) for p, recs in per_p.items()}
    if changelog:  # each record decided once: one changelog entry per record of every partition
        assert {p: client.xlen(f"{ns}:{{{p}}}:changelog") for p in range(8)} == ends
    # every partition has every other's deliveries below its fence (an outbox on a cluster keeps
    # delivered entries a moment longer: until the targets' masters have them on disk)
    own, whole = functions.partitioned_state(client, ns, 8)
    assert whole and own == ends, own
    return per_p, want, got


def test_stream_verify_and_restore_on_three_masters_equal_the_specification(
    redis_cluster_stack, topic_factory, speed_layer_factory
):
    cluster = redis_cluster_stack
    topic = topic_factory(8)
    ns = "onrc"
    sl = speed_layer_factory(
        topic=topic,
        namespace=ns,
        **_on(cluster),
        archive_interval_s=2.0,
        fanout_threshold=5,
        max_offsets_per_trigger=1_000,
    )
    client = clients.redis_client(cluster.redis_url)
    assert functions.is_cluster_client(client)
    sl.wait_running()
    _wait_line(sl.archiver_log, b"archiver running")
    cfg = GeneratorConfig(users=200, seed=11, mean_followers=15, invalid_share=0.01, duplicate_share=0.01)
    worker_spark(sl.settings)
    with ThreadPoolExecutor(1) as pool:
        producing = pool.submit(
            produce, 6_000, cfg, topic=topic, bootstrap=cluster.kafka_bootstrap, rate=300, progress=False
        )
        _until_applied(client, ns, 3_500)
        live = verify_keyed(sl.settings, topic, ns)  # a copy of the three masters at one instant
        summary = producing.result()
    assert live["ok"] is True, {n: f for n, f in live.get("families", {}).items() if not f["ok"]} or live
    assert live["compared_in"].startswith("a frozen copy"), live["compared_in"]
    assert 3_500 <= sum(live["position"].values()) < 6_000, live["position"]
    assert summary.delivery_failures == 0
    ends = sl.wait_caught_up(timeout=600)
    # the compacted topics' publisher reads its cuts across the masters, up to the end
    deadline = time.monotonic() + 120
    while (published := compacted.position(client, ns, 8)) != ends:
        assert time.monotonic() < deadline, f"the compacted topics published up to {published}, not {ends}"
        time.sleep(0.5)
    sl.stop()

    # the partitions' keys live on every master, each partition's on its slot's owner only
    masters = {node.port: clients.redis_client(f"redis://127.0.0.1:{node.port}/0", cluster=False)
               for node in client.get_primaries()}  # fmt: skip
    assert len(masters) == 3
    holding = {port for port, m in masters.items() if next(m.scan_iter(match=f"{ns}:*", count=1000), None)}
    assert holding == set(masters), f"only masters {holding} hold keys of {ns}"

    # the archive holds the records; Redis keeps only the changelog's tail
    per_p, want, got = _equal_to_the_specification(sl, ns, changelog=False)
    assert sum(len(t) for t in got["timeline"].values()) > 500

    # the archive cut at settled positions across the masters, the views compacted from it
    assert _delta_facts(sl.settings, ns) == _spec_facts(want)
    report = run_verify(sl.settings, topic, ns)
    assert_verified(report, summary)

    # restore after the namespace is dropped from every master: equal to a copy taken before
    from pipelines.restore import restore
    from pipelines.speed.compare import compare_namespaces

    for key in client.scan_iter(match=f"{ns}:*", count=2000):
        client.copy(key, b"before" + key[len(ns) :])  # the same hash tag: the same slot
    functions.drop_namespace(client, ns)
    assert next(client.scan_iter(match=f"{ns}:*"), None) is None
    restored = restore(worker_spark(sl.settings), sl.settings, ns)
    assert restored["position"] == {str(p): len(recs) for p, recs in per_p.items()}
    same = compare_namespaces(client, ns, "before", sl.settings.timeline_length)
    assert same["ok"], {n: f for n, f in same["families"].items() if not f["ok"]}
    assert same["families"]["tl"]["keys"] > 50


def test_read_your_write_through_the_api_on_three_masters(
    redis_cluster_stack, topic_factory, speed_layer_factory
):
    """The API reads through the cluster client; each read's ``as_of`` (every partition's fence,
    from the masters that own them) covers the write it waited for, and shows it."""
    from tests.integration.test_api import _wait_visible, api_settings, start_api

    cluster = redis_cluster_stack
    topic = topic_factory(8)
    namespace = f"rywc-{uuid.uuid4().hex[:8]}"
    api = start_api(api_settings(cluster, topic, views_namespace=namespace))
    speed_layer_factory(
        topic=topic,
        namespace=namespace,
        archive=False,
        **_on(cluster),
    )
    try:
        users = {h: api.register(h) for h in ("ann", "ben", "cid", "dot")}
        ann = api.client(users["ann"][1])
        others = {h: api.client(t) for h, (_, t) in users.items() if h != "ann"}
        try:
            for h in others:
                ann.post("/v1/follows", json={"followee_id": users[h][0]}).raise_for_status()
            posts = [others[h].post("/v1/posts", json={"text": f"{h} says hi"}).json() for h in others]
            for w in posts:  # the authors' partitions: several masters
                tl = _wait_visible(ann, "/v1/timeline", w)
            assert {p["post_id"] for p in tl["posts"]} == {w["post_id"] for w in posts}
            assert len({partition_of(users[h][0], 8) for h in others}) > 1
            m = (
                others["ben"]
                .post("/v1/messages", json={"recipient_id": users["ann"][0], "text": "yo"})
                .json()
            )
            assert _wait_visible(ann, "/v1/unread", m)["unread"] == 1
            s = ann.put("/v1/status", json={"text": "sharded"}).json()
            body = _wait_visible(ann, f"/v1/users/{users['ann'][0]}/status", s)
            assert body["status"]["text"] == "sharded"
        finally:
            for c in (ann, *others.values()):
                c.close()
    finally:
        api.stop()


@pytest.mark.faults
def test_a_master_killed_and_down_while_events_flow_loses_and_repeats_nothing(
    redis_cluster_stack, topic_factory, speed_layer_factory
):
    from infra.stack import RedisServer, Stack

    cluster = redis_cluster_stack
    topic = topic_factory(8)
    ns = f"kill-{uuid.uuid4().hex[:6]}"
    sl = speed_layer_factory(
        topic=topic,
        namespace=ns,
        archive=False,  # every changelog entry stays in Redis, to be counted
        **_on(cluster),
        fanout_threshold=5,
        max_offsets_per_trigger=500,
    )
    client = clients.redis_client(cluster.redis_url)
    sl.wait_running()
    rate = 200
    events = int(rate * (DOWN_S + 15))
    cfg = GeneratorConfig(users=150, seed=23, mean_followers=12, invalid_share=0.01, duplicate_share=0.01)
    victim = RedisServer(cluster, 1)  # redis-2
    with ThreadPoolExecutor(1) as pool:
        producing = pool.submit(
            produce, events, cfg, topic=topic, bootstrap=cluster.kafka_bootstrap, rate=rate, progress=False
        )
        _until_applied(client, ns, events // 4)
        pid = victim.pid()
        assert pid is not None and victim.is_running()
        os.kill(pid, signal.SIGKILL)  # mid-run: its last second of writes may be lost with it
        time.sleep(DOWN_S)  # events flow on; the master's partitions cannot be served
        outcome = Stack(cluster, service_types=(RedisServer,)).up()  # as `make up` starts it again
        assert outcome["redis-2"] == "started" and outcome["redis-1"] == "already running", outcome
        summary = producing.result()
    assert summary.delivery_failures == 0
    died = sl.proc is not None and sl.proc.poll() is not None
    if died:  # it stopped loudly, in one line; `make up` starts it again, as here
        assert sl.proc.returncode == 2, sl.tail()
        assert b"pipelines.speed_layer: Redis does not answer: " in sl.log_path.read_bytes(), sl.tail()
        sl.restart()
        sl.wait_running()
    sl.wait_caught_up(timeout=600)
    sl.stop()

    _equal_to_the_specification(sl, ns)


@pytest.fixture
def redis_cluster_with_replicas(kafka_stack, tmp_path):
    """Three masters and a replica each (6 nodes, SOCIAL_REDIS_REPLICAS=1) started by the stack, a
    master taken for failed after 2 s without an answer (SOCIAL_REDIS_NODE_TIMEOUT_MS)."""
    from infra.stack import RedisServer, Stack, free_port_block

    port = free_port_block(12)
    settings = dataclasses.replace(
        kafka_stack.settings,
        redis_port=port,
        redis_masters=3,
        redis_replicas=1,
        redis_node_timeout_ms=2_000,
        redis_url=f"redis://127.0.0.1:{port}/0",
        serving_layout="partitioned",
        var_dir=tmp_path / "var",
    )
    stack = Stack(settings, service_types=(RedisServer,))
    try:
        assert set(stack.up().values()) == {"started"}
        yield settings
    finally:
        stack.down()


def _failed_over(settings, victim_port: int, timeout_s: float = 60.0) -> float:
    """Seconds until the cluster took the master on ``victim_port`` for failed, and three other
    masters (its replica promoted) serve every slot again."""
    probe = clients.redis_client(settings.redis_url, "probe", cluster=False)
    started = time.monotonic()
    while True:
        nodes = {addr: n["flags"] for addr, n in probe.execute_command("CLUSTER NODES").items()}
        victim = nodes.get(f"127.0.0.1:{victim_port}", "")
        serving = [a for a, f in nodes.items() if "master" in f and "fail" not in f]
        ok = probe.execute_command("CLUSTER INFO")["cluster_state"] == "ok"
        if "fail" in victim and "fail?" not in victim and len(serving) == 3 and ok:
            return time.monotonic() - started
        assert time.monotonic() - started < timeout_s, f"no failover in {timeout_s:.0f} s: {nodes}"
        time.sleep(0.1)


@pytest.mark.faults
def test_a_master_killed_is_replaced_by_its_replica_and_nothing_is_lost_or_repeated(
    redis_cluster_with_replicas, topic_factory, speed_layer_factory
):
    from infra.stack import RedisServer, Stack

    cluster = redis_cluster_with_replicas
    topic = topic_factory(8)
    ns = f"failover-{uuid.uuid4().hex[:6]}"
    sl = speed_layer_factory(
        topic=topic,
        namespace=ns,
        archive=False,
        **_on(cluster),
        fanout_threshold=5,
        max_offsets_per_trigger=500,
    )
    client = clients.redis_client(cluster.redis_url)
    sl.wait_running()
    rate, events = 200, 4_000
    cfg = GeneratorConfig(users=150, seed=29, mean_followers=12, invalid_share=0.01, duplicate_share=0.01)
    victim = RedisServer(cluster, 1)  # redis-2, a master
    with ThreadPoolExecutor(1) as pool:
        producing = pool.submit(
            produce, events, cfg, topic=topic, bootstrap=cluster.kafka_bootstrap, rate=rate, progress=False
        )
        _until_applied(client, ns, events // 4)
        os.kill(victim.pid(), signal.SIGKILL)
        took = _failed_over(cluster, victim.port)
        summary = producing.result()
    assert summary.delivery_failures == 0
    assert took < 30, took
    if sl.proc is not None and sl.proc.poll() is not None:  # stopped in one line; started again
        assert b"pipelines.speed_layer: Redis does not answer: " in sl.log_path.read_bytes(), sl.tail()
        sl.restart()
        sl.wait_running()
    sl.wait_caught_up(timeout=600)
    sl.stop()
    # the old master, started again by the stack, comes back as its successor's replica
    assert Stack(cluster, service_types=(RedisServer,)).up()["redis-2"] == "started"
    role = clients.redis_client(f"redis://127.0.0.1:{victim.port}/0", "probe", cluster=False).info(
        "replication"
    )
    assert role["role"] == "slave", role

    _equal_to_the_specification(sl, ns)
