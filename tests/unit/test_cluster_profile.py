"""The cluster profile's layout (docs/cluster-and-faults.md), worked out by hand from the settings."""

from __future__ import annotations

import pytest

from infra.settings import Settings, get_settings
from infra.stack import (
    SERVICES,
    KafkaBroker,
    RedisServer,
    SparkMaster,
    SparkWorker,
    Stack,
    events_topic_configs,
)


def test_local_stays_the_default():
    s = get_settings()
    assert s.profile == "local" and s.replication_factor == 1 and s.min_insync_replicas == 1
    assert [x.name for x in Stack(s).services][:2] == ["kafka", "redis"]
    assert not SparkMaster.instances(s) and not SparkWorker.instances(s)


def test_cluster_nodes_ports_and_quorum():
    s = get_settings(profile="cluster", kafka_port=43092, kafka_controller_port=43093)
    assert s.broker_ports() == [(43092, 43093), (43094, 43095), (43096, 43097)]
    assert s.kafka_bootstrap == "127.0.0.1:43092,127.0.0.1:43094,127.0.0.1:43096"
    assert s.spark_master == "spark://127.0.0.1:7077"
    nodes = KafkaBroker.instances(s)
    assert [n.name for n in nodes] == ["kafka-1", "kafka-2", "kafka-3"]
    assert len({n.data_dir for n in nodes}) == 3
    props = nodes[1].server_properties()
    assert props["node.id"] == "2"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:43093,2@127.0.0.1:43095,3@127.0.0.1:43097"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:43094,CONTROLLER://127.0.0.1:43095"
    assert (props["default.replication.factor"], props["min.insync.replicas"]) == ("3", "2")
    assert events_topic_configs(s)["min.insync.replicas"] == "2"
    names = [x.name for x in Stack(s).services]
    assert names[:9] == [
        "kafka-1", "kafka-2", "kafka-3", "redis-1", "redis-2", "redis-3",
        "spark-master", "spark-worker-1", "spark-worker-2",
    ]  # fmt: skip


def test_the_cluster_profile_serves_from_a_redis_cluster_of_three_masters(tmp_path):
    """Node i on SOCIAL_REDIS_PORT + i, its cluster bus on SOCIAL_REDIS_PORT + 3 + i (worked out by
    hand from the setting's documentation), each a master in cluster mode with its own files."""
    s = get_settings(profile="cluster", redis_port=46379, var_dir=tmp_path)
    assert s.redis_cluster_masters == 3
    assert s.redis_ports() == [(46379, 46382), (46380, 46383), (46381, 46384)]
    nodes = RedisServer.instances(s)
    assert [(n.name, n.ports()) for n in nodes] == [
        ("redis-1", [46379, 46382]), ("redis-2", [46380, 46383]), ("redis-3", [46381, 46384]),
    ]  # fmt: skip
    assert {n.home for n in nodes} == {tmp_path / f"redis-{i}" for i in (1, 2, 3)}
    nodes[1].prepare()
    conf = (tmp_path / "redis-2" / "redis.conf").read_text().splitlines()
    assert {"port 46380", "cluster-enabled yes", "cluster-port 46383", "appendonly yes"} <= set(conf)
    assert f'cluster-config-file "{tmp_path / "redis-2" / "nodes.conf"}"' in conf


def test_one_redis_or_a_cluster_is_a_setting_of_either_profile(tmp_path):
    assert get_settings(profile="cluster", redis_masters=1).redis_ports() == [(6379, 0)]
    assert [n.name for n in RedisServer.instances(get_settings(profile="cluster", redis_masters=1))] == [
        "redis"
    ]
    local = get_settings(redis_masters=5, redis_port=46379)
    assert local.redis_cluster_masters == 5 and local.redis_ports()[4] == (46383, 46388)
    for bad in (2, -1):
        with pytest.raises(ValueError, match=f"SOCIAL_REDIS_MASTERS={bad}: expected 1"):
            get_settings(redis_masters=bad)
    with pytest.raises(ValueError, match="SOCIAL_SERVING_LAYOUT=keyed cannot run on a Redis Cluster of 3"):
        get_settings(profile="cluster", serving_layout="keyed")
    # a replica per master: the masters' ports first, then the replicas', then every cluster bus
    replicated = get_settings(profile="cluster", redis_port=46379, redis_replicas=1, var_dir=tmp_path)
    assert replicated.redis_ports() == [(46379 + i, 46385 + i) for i in range(6)]
    nodes = RedisServer.instances(replicated)
    assert [n.name for n in nodes] == [f"redis-{i}" for i in range(1, 7)]
    nodes[5].prepare()
    assert "cluster-node-timeout 15000" in (tmp_path / "redis-6" / "redis.conf").read_text().splitlines()
    with pytest.raises(ValueError, match="SOCIAL_REDIS_REPLICAS=1: replicas are a Redis Cluster's"):
        get_settings(redis_replicas=1)
    # a keyed local stack still sees (and stops) what the cluster profile started
    keyed = get_settings(serving_layout="keyed")
    assert {"redis-1", "redis-2", "redis-3"} <= {x.name for x in Stack(keyed).other_profile_services()}


def test_an_explicit_bootstrap_or_master_wins_over_the_profile():
    s = get_settings(profile="cluster", kafka_bootstrap="k:1", spark_master="local[2]")
    assert (s.kafka_bootstrap, s.spark_master) == ("k:1", "local[2]")


def test_down_sees_a_cluster_started_under_the_other_profile():
    names = {x.name for x in Stack(get_settings()).other_profile_services()}
    assert {"kafka-1", "kafka-3", "spark-master", "spark-worker-2"} <= names and "kafka" not in names


def test_a_workers_command_points_at_the_master():
    s = get_settings(profile="cluster", spark_master_port=43077)
    argv = SparkWorker(s, 1).command()
    assert argv[-1] == "spark://127.0.0.1:43077" and "org.apache.spark.deploy.worker.Worker" in argv
    assert SparkMaster in SERVICES and SparkWorker in SERVICES


def test_an_unknown_profile_is_a_clear_error():
    with pytest.raises(ValueError, match="SOCIAL_PROFILE='clustr'"):
        Settings(profile="clustr")


def test_a_new_leaders_unready_high_watermark_is_asked_again():
    """After a leader election the new leader answers OFFSET_NOT_AVAILABLE until its high
    watermark caught up; librdkafka does not call it retriable, Kafka's protocol does."""
    from confluent_kafka import KafkaError, KafkaException

    from infra.stack import kafka_retriable

    assert not KafkaError(KafkaError.OFFSET_NOT_AVAILABLE).retriable()  # why the rule exists
    assert kafka_retriable(KafkaException(KafkaError(KafkaError.OFFSET_NOT_AVAILABLE)))
    assert kafka_retriable(KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION, retriable=True)))
    # a just-restarted broker taking its partitions back, as get_watermark_offsets reports it
    # (not marked retriable): a writer's registry lookup failed on it right after a broker restart
    for code in (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE):
        assert not KafkaError(code).retriable()
        assert kafka_retriable(KafkaException(KafkaError(code)))
    assert not kafka_retriable(KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)))
    assert not kafka_retriable(ValueError("not a broker error"))
