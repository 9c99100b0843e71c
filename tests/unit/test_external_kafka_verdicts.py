"""The verdicts of the start-up check on an existing Kafka's event topic (infra/external.py), from
its facts alone: one line per problem, naming the broker, the topic and what the design needs.
The check against a real SASL/SCRAM broker with ACLs: tests/integration/test_external_kafka.py."""

from __future__ import annotations

from infra.external import kafka_where, topic_problems
from infra.settings import Settings

KEPT = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}
ALLOWED = ["READ", "WRITE", "DESCRIBE", "DESCRIBE_CONFIGS"]


def test_a_fit_topic_has_no_problem():
    assert topic_problems("kafka at k", "social.events", 8, 8, KEPT, ALLOWED) == []
    assert topic_problems("kafka at k", "social.events", 8, 8, KEPT, ["ALL"]) == []
    assert topic_problems("kafka at k", "social.events", 8, 8, KEPT, None) == []  # the broker did not say


def test_each_problem_is_one_line():
    problems = topic_problems(
        "kafka at k",
        "social.events",
        3,
        8,
        {**KEPT, "retention.ms": "604800000", "cleanup.policy": "compact"},
        ["DESCRIBE", "READ"],
    )
    assert problems == [
        "kafka at k: topic social.events has 3 partitions, the contract's is 8 "
        "(SOCIAL_EVENTS_PARTITIONS; a record's partition is part of its identity)",
        "kafka at k: topic social.events is not kept forever (retention.ms=604800000, cleanup.policy=compact; "
        "the log is the source of truth: retention.ms=-1, retention.bytes=-1, cleanup.policy=delete)",
        "kafka at k: not allowed to write topic social.events (ACLs the project needs on it: Read, Write, Describe)",
    ]


def test_where_names_the_broker_and_how_it_is_reached_never_the_password():
    plain = Settings(kafka_bootstrap="k:9092")
    assert kafka_where(plain) == "kafka at k:9092 (PLAINTEXT)"
    sasl = Settings(
        kafka_bootstrap="k:9094",
        kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="SCRAM-SHA-256",
        kafka_sasl_username="social",
        kafka_sasl_password="pw-not-shown",
    )
    assert kafka_where(sasl) == "kafka at k:9094 (SASL_SSL, SCRAM-SHA-256 as social)"


def test_with_an_external_kafka_the_stack_starts_no_broker_and_shows_it_as_external(tmp_path):
    from infra.stack import SERVICES, Stack

    own = Stack(Settings(var_dir=tmp_path))
    assert "kafka" in [s.name for s in own.services]
    external = Stack(Settings(var_dir=tmp_path, kafka_external=1, kafka_bootstrap="k1:9094,k2:9094"))
    names = [s.name for s in external.services]
    assert "kafka" not in names and "redis" in names and len(names) == len(own.services) - 1
    assert external.status()[0] == ("kafka", "external", "-", "k1:9094,k2:9094", "-")
    assert SERVICES[0].__name__ == "KafkaBroker"  # the order `up` starts them in is unchanged
