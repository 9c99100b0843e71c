"""An existing Kafka with SASL/SCRAM and ACLs, for real: a KRaft broker started here whose only
client listener is SASL_PLAINTEXT (SCRAM-SHA-512), with the StandardAuthorizer denying every
operation no ACL allows. The project's user ``social`` is created as ``kafka-configs
--alter --add-config SCRAM-SHA-512=...`` does (the AlterUserScramCredentials API) and allowed only
the topics under ``ext.``; ``nobody`` exists and is allowed nothing.

Tested: the settings' security group reaches the confluent clients (the check, a producer and a
consumer) and the Java client (Kafka's console consumer, the ``make tail`` command; Spark's Kafka
source and sink); each start-up check's one line (infra/external.py) when the password is wrong,
the user may not, or the topic is unfit; and the stack's own processes (speed layer, archiver, API)
started by ``up`` on this Kafka and a Redis with a password, neither started by ``up``.
"""

from __future__ import annotations

import os
import random
import subprocess
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from infra import clients, tail
from infra.external import ExternalUnfit, check_kafka
from infra.processes import port_free
from infra.services import KafkaBroker
from infra.settings import Settings, get_settings

pytestmark = pytest.mark.integration

ADMIN, ADMIN_PASSWORD = "admin", "admin-s3cret"
USER, PASSWORD = "social", "social-s3cret"
JAAS = "org.apache.kafka.common.security.scram.ScramLoginModule required"
PREFIX = "ext."


class ScramBroker(KafkaBroker):
    """The stack's KRaft node with a SASL/SCRAM client listener and ACLs that deny by default.

    The controller listener stays PLAINTEXT on 127.0.0.1 (its principal, ANONYMOUS, is a super
    user, as the broker's own ``admin`` is: the node's requests to itself)."""

    def server_properties(self) -> dict[str, str]:
        props = super().server_properties()
        port, controller = self.broker_port, self.controller_port
        props.update(
            {
                "listeners": f"SASL_PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
                "advertised.listeners": f"SASL_PLAINTEXT://127.0.0.1:{port}",
                "inter.broker.listener.name": "SASL_PLAINTEXT",
                "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
                "sasl.enabled.mechanisms": "SCRAM-SHA-512",
                "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
                "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": (
                    f'{JAAS} username="{ADMIN}" password="{ADMIN_PASSWORD}";'
                ),
                "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                "allow.everyone.if.no.acl.found": "false",
                "super.users": f"User:{ADMIN};User:ANONYMOUS",
            }
        )
        return props

    def format_args(self) -> list[str]:
        # the broker's own user must exist before it starts (it talks to itself with it)
        return ["--add-scram", f"SCRAM-SHA-512=[name={ADMIN},password={ADMIN_PASSWORD}]"]


def free_ports(n: int) -> list[int]:
    rng = random.Random()
    ports: list[int] = []
    while len(ports) < n:
        port = rng.randrange(19000, 20000)
        if port not in ports and port_free(port):
            ports.append(port)
    return ports


def as_user(settings: Settings, user: str, password: str, **more) -> Settings:
    return replace(
        settings,
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_mechanism="SCRAM-SHA-512",
        kafka_sasl_username=user,
        kafka_sasl_password=password,
        **{"kafka_external": 1, **more},
    )


def allow(admin, user: str, operations: list[str]) -> None:
    """ACLs for ``user`` on every topic under PREFIX (what a Kafka team would grant the project),
    and Read on the consumer groups it commits to (``social.``: the speed layer's and the archive's
    positions) and ``make tail``'s (``console-consumer-``)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    bindings = [
        AclBinding(
            ResourceType.TOPIC,
            PREFIX,
            ResourcePatternType.PREFIXED,
            f"User:{user}",
            "*",
            AclOperation[op],
            AclPermissionType.ALLOW,
        )
        for op in operations
    ]
    bindings += [
        AclBinding(
            ResourceType.GROUP,
            group,
            ResourcePatternType.PREFIXED,
            f"User:{user}",
            "*",
            AclOperation.READ,
            AclPermissionType.ALLOW,
        )
        for group in ("social.", "console-consumer-")
    ]
    for future in admin.create_acls(bindings, request_timeout=20).values():
        future.result(timeout=20)


@pytest.fixture(scope="module")
def scram_kafka(tmp_path_factory):
    """(admin settings, the project user's settings) of a running SASL/SCRAM broker with ACLs."""
    from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    from infra.jars import fetch

    fetch()  # no-op when `make setup` ran
    port, controller = free_ports(2)
    admin_settings = as_user(
        get_settings(  # the environment's JVM and Spark flags (the Makefile's), as every stack test
            var_dir=tmp_path_factory.mktemp("var-scram"),
            kafka_port=port,
            kafka_controller_port=controller,
            kafka_bootstrap=f"127.0.0.1:{port}",
            events_topic=f"{PREFIX}events",
            events_partitions=4,
            compacted_partitions=1,
        ),
        ADMIN,
        ADMIN_PASSWORD,
        kafka_external=0,
    )
    broker = ScramBroker(admin_settings)
    broker.start()  # creates ext.events (4 partitions, kept forever) and its writer registry as admin
    try:
        admin = clients.kafka_admin(admin_settings)
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
        for user, password in ((USER, PASSWORD), ("nobody", "nobody-s3cret")):
            upsert = UserScramCredentialUpsertion(user, info, password.encode())
            for future in admin.alter_user_scram_credentials([upsert], request_timeout=20).values():
                future.result(timeout=20)
        allow(admin, USER, ["READ", "WRITE", "DESCRIBE", "DESCRIBE_CONFIGS", "CREATE"])
        yield admin_settings, as_user(admin_settings, USER, PASSWORD)
    finally:
        broker.stop()


def _round_trip(settings, client_id: str) -> bytes:
    """A record produced to partition 0 of the event topic and consumed back, with ``settings``'
    security, by the confluent clients; returns its value (the Java tools read it next)."""
    from confluent_kafka import TopicPartition

    value = uuid.uuid4().hex.encode()
    producer = clients.kafka_producer(settings, client_id)
    producer.produce(settings.events_topic, value, b"1", partition=0)
    assert producer.flush(20) == 0
    consumer = clients.kafka_consumer(settings, client_id)
    try:
        consumer.assign([TopicPartition(settings.events_topic, 0, 0)])
        seen = [m.value() for m in iter(lambda: consumer.poll(5), None) if m.error() is None]
    finally:
        consumer.close()
    assert value in seen
    return value


def test_the_project_user_passes_and_its_clients_produce_and_consume(scram_kafka):

    _admin, settings = scram_kafka
    line = check_kafka(settings)
    assert line == (
        f"kafka at {settings.kafka_bootstrap} (SASL_PLAINTEXT, SCRAM-SHA-512 as social): topic ext.events, "
        "4 partitions, kept forever; registry ext.events.writers"
    )
    value = _round_trip(settings, "external-test")

    # the Java client with the same settings: `make tail`'s console consumer reads it back
    cmd = tail.command(settings, settings.events_topic, True, 1)
    assert PASSWORD not in " ".join(cmd)  # the JAAS line is in a file only this user reads
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert value.decode() in done.stdout, done.stderr[-2000:]


def test_a_missing_topic_is_created_when_the_user_may(scram_kafka):
    admin_settings, settings = scram_kafka
    fresh = replace(settings, events_topic=f"{PREFIX}fresh-{uuid.uuid4().hex[:6]}")
    assert "4 partitions, kept forever" in check_kafka(fresh)
    topic = (
        clients.kafka_admin(admin_settings)
        .list_topics(fresh.events_topic, timeout=10)
        .topics[fresh.events_topic]
    )
    assert len(topic.partitions) == 4


def test_a_wrong_password_is_one_line(scram_kafka):
    _admin, settings = scram_kafka
    with pytest.raises(ExternalUnfit) as failed:
        check_kafka(replace(settings, kafka_sasl_password="wrong-s3cret"), timeout_s=20)
    (line,) = failed.value.problems
    assert line.startswith(
        f"kafka at {settings.kafka_bootstrap} (SASL_PLAINTEXT, SCRAM-SHA-512 as social): authentication failed ("
    )
    assert "wrong-s3cret" not in line and "\n" not in line


def test_a_user_without_acls_is_one_line(scram_kafka):
    _admin, settings = scram_kafka
    nobody = replace(settings, kafka_sasl_username="nobody", kafka_sasl_password="nobody-s3cret")
    with pytest.raises(ExternalUnfit) as failed:
        check_kafka(nobody)
    assert failed.value.problems == [
        f"kafka at {settings.kafka_bootstrap} (SASL_PLAINTEXT, SCRAM-SHA-512 as nobody): not allowed to describe "
        "topic ext.events (ACLs the project needs on it: Read, Write, Describe)"
    ]


def test_an_unfit_topic_is_a_line_per_problem(scram_kafka):
    from confluent_kafka.admin import NewTopic

    admin_settings, settings = scram_kafka
    short = f"{PREFIX}short-{uuid.uuid4().hex[:6]}"
    admin = clients.kafka_admin(admin_settings)
    new = NewTopic(short, num_partitions=2, replication_factor=1, config={"retention.ms": "604800000"})
    admin.create_topics([new])[short].result(timeout=20)
    with pytest.raises(ExternalUnfit) as failed:
        check_kafka(replace(settings, events_topic=short))
    where = f"kafka at {settings.kafka_bootstrap} (SASL_PLAINTEXT, SCRAM-SHA-512 as social)"
    assert failed.value.problems == [
        f"{where}: topic {short} has 2 partitions, the contract's is 4 "
        "(SOCIAL_EVENTS_PARTITIONS; a record's partition is part of its identity)",
        f"{where}: topic {short} is not kept forever (retention.ms=604800000; the log is the source of truth: "
        "retention.ms=-1, retention.bytes=-1, cleanup.policy=delete)",
    ]


def test_spark_reads_and_writes_the_log_with_the_same_settings(scram_kafka):
    """The Spark Kafka source (the replay's, the archiver's reader: ``kafka_options``) and sink (the
    analytics' alerts: ``clients.spark_kafka_options``), given the security settings ``kafka.``-prefixed."""
    from confluent_kafka import TopicPartition

    from infra.kafka_admin import end_offsets
    from pipelines.replay import read_range
    from pipelines.spark import build_spark

    _admin, settings = scram_kafka
    topic = settings.events_topic
    value = uuid.uuid4().hex.encode()
    producer = clients.kafka_producer(settings, "external-test-spark")
    producer.produce(topic, value, b"2", partition=1)
    assert producer.flush(20) == 0
    ends = end_offsets(settings, topic)
    spark = build_spark("external-kafka", replace(settings, spark_master="local[1]"), testing=True)
    try:
        rows = read_range(spark, settings, topic, dict.fromkeys(ends, 0), ends).select("value").collect()
        assert value in [bytes(r.value) for r in rows]
        written = uuid.uuid4().hex
        (
            spark.createDataFrame([("3", written)], "key STRING, value STRING")
            .write.format("kafka")
            .options(**clients.spark_kafka_options(settings))
            .option("topic", topic)
            .save()
        )
    finally:
        spark.stop()
    after = end_offsets(settings, topic)
    grew = [p for p in after if after[p] > ends[p]]
    consumer = clients.kafka_consumer(settings, "external-test-spark")
    try:
        consumer.assign([TopicPartition(topic, p, ends[p]) for p in grew])
        seen = [m.value() for m in iter(lambda: consumer.poll(5), None) if m.error() is None]
    finally:
        consumer.close()
    assert written.encode() in seen


def test_up_starts_only_the_projects_processes_on_the_external_kafka_and_redis(scram_kafka, tmp_path):
    """``up`` with SOCIAL_KAFKA_EXTERNAL=1 and SOCIAL_REDIS_EXTERNAL=1: both checked, neither
    started; the speed layer applies the log into the password-protected Redis, the archiver
    archives it to Delta, the API answers; no password reaches a file the stack wrote."""
    import shutil
    import time
    import urllib.request

    from app_sim.generator import GeneratorConfig, produce
    from contract import functions, namespaces
    from infra.kafka_admin import end_offsets
    from infra.stack import Stack
    from pipelines.lake import archived, covers

    _admin, user_settings = scram_kafka
    redis_port, api_port = free_ports(2)
    redis_password = "redis-" + uuid.uuid4().hex[:8]
    server = subprocess.Popen(
        [shutil.which("redis-server") or "redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
         "--requirepass", redis_password, "--appendonly", "yes", "--save", "", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    settings = replace(
        user_settings,
        var_dir=tmp_path / "var",
        events_topic=f"{PREFIX}stack-{uuid.uuid4().hex[:6]}",
        events_partitions=4,
        redis_external=1,
        redis_url=f"redis://:{redis_password}@127.0.0.1:{redis_port}/0",
        redis_port=redis_port,
        api_port=api_port,
        api_workers=1,
        analytics=0,
        off_path_nice=0,
    )
    stack = Stack(settings)
    try:
        deadline = time.monotonic() + 20
        while True:  # the Redis answers
            try:
                clients.redis_client(settings.redis_url, "probe").ping()
                break
            except Exception:  # noqa: BLE001 - not up yet
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
        outcome = stack.up()
        assert [k for k, v in outcome.items() if "external" in k] == ["redis (external)", "kafka (external)"]
        assert outcome["speed_layer"] == outcome["archiver"] == outcome["api"] == "started"
        assert not any(s.name in ("kafka", "redis") for s in stack.services)

        config = GeneratorConfig(users=100, mean_followers=5, seed=65)
        summary = produce(3_000, config, topic=settings.events_topic, bootstrap=settings, progress=False)
        assert summary.delivery_failures == 0
        ends = end_offsets(settings, settings.events_topic)
        namespace = namespaces.active(settings)
        r = clients.redis_client(settings.redis_url)
        deadline = time.monotonic() + 120

        def fences() -> dict[int, int]:
            return functions.layout_fences(r, namespace, settings.serving_layout, len(ends))

        while not (
            covers(fences(), ends)
            and (a := archived(settings.lake_dir, namespace))
            and covers(a.end_offsets, ends)
        ):
            assert time.monotonic() < deadline, f"not applied and archived: fences {fences()}, log {ends}"
            time.sleep(1)
        url = f"http://127.0.0.1:{api_port}/v1/health"
        with urllib.request.urlopen(url, timeout=5) as answer:
            assert answer.status == 200
    finally:
        stack.down()
        server.kill()
        server.wait(10)
    logs = {p.name for p in (settings.var_dir / "log").glob("*.log")}
    assert {"speed_layer.log", "archiver.log", "api.log"} <= logs
    # no file the stack wrote holds a password: logs, Spark's event logs and checkpoints, the lake
    # (read once the drivers' JVMs, which outlive their Python process by a moment, closed theirs)
    events = settings.var_dir / "spark-events"
    deadline = time.monotonic() + 30
    while any(p.suffix == ".inprogress" for p in events.rglob("*")) and time.monotonic() < deadline:
        time.sleep(0.5)
    # os.walk skips a directory removed while it walks (a driver's spark-tmp block manager, deleted
    # as its JVM exits), where Path.rglob raised FileNotFoundError (CI, 2026-12-06)
    written = [Path(d) / f for d, _dirs, files in os.walk(settings.var_dir) for f in files]
    assert any("spark-events" in p.parts for p in written)  # Spark's event logs are among them

    def holds_a_password(path: Path) -> bool:
        try:
            data = path.read_bytes()
        except FileNotFoundError:  # a driver's temporary file (spark-tmp), removed as its JVM exits
            return False
        return redis_password.encode() in data or PASSWORD.encode() in data

    leaks = [p for p in written if holds_a_password(p)]
    assert not leaks, leaks


class TlsBroker(KafkaBroker):
    """The stack's KRaft node whose only client listener is SSL, asking every client for a
    certificate its CA signed (mutual TLS); its key store and trust store are PEM files."""

    keystore: Path  # the server's private key and certificate in one PEM file
    ca: Path

    def server_properties(self) -> dict[str, str]:
        props = super().server_properties()
        port, controller = self.broker_port, self.controller_port
        props.update(
            {
                "listeners": f"SSL://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
                "advertised.listeners": f"SSL://127.0.0.1:{port}",
                "inter.broker.listener.name": "SSL",
                "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,SSL:SSL",
                "ssl.keystore.type": "PEM",
                "ssl.keystore.location": str(self.keystore),
                "ssl.truststore.type": "PEM",
                "ssl.truststore.location": str(self.ca),
                "ssl.client.auth": "required",
            }
        )
        return props


@pytest.fixture(scope="module")
def tls_kafka(tmp_path_factory):
    """The project's settings (SSL, the CA, a client certificate) for a running mutual-TLS broker."""
    from tests.certs import tls_files

    d = tmp_path_factory.mktemp("tls")
    tls = tls_files(d)
    port, controller = free_ports(2)
    settings = get_settings(
        var_dir=d / "var",
        kafka_port=port,
        kafka_controller_port=controller,
        kafka_bootstrap=f"127.0.0.1:{port}",
        events_topic=f"{PREFIX}tls-events",
        events_partitions=2,
        kafka_security_protocol="SSL",
        kafka_ssl_ca_location=str(tls.ca),
        kafka_ssl_certificate_location=str(tls.client_cert),
        kafka_ssl_key_location=str(tls.client_key),
    )
    broker = TlsBroker(settings)
    broker.keystore = d / "server-keystore.pem"
    broker.keystore.write_text(tls.server_key.read_text() + tls.server_cert.read_text())
    broker.ca = tls.ca
    broker.start()  # creates the event topic and its registry, through TLS with the client certificate
    try:
        yield replace(settings, kafka_external=1)
    finally:
        broker.stop()


def test_a_mutual_tls_broker_is_reached_by_both_clients_with_the_pem_files(tls_kafka):

    settings = tls_kafka
    assert check_kafka(settings) == (
        f"kafka at {settings.kafka_bootstrap} (SSL): topic ext.tls-events, 2 partitions, kept forever; "
        "registry ext.tls-events.writers"
    )
    value = _round_trip(settings, "external-test-tls")
    # Java: the CA as a PEM trust store, the client's certificate and key as a PEM key store
    done = subprocess.run(
        tail.command(settings, settings.events_topic, True, 1), capture_output=True, text=True, timeout=90
    )
    assert value.decode() in done.stdout, done.stderr[-2000:]


def test_an_untrusted_broker_certificate_is_one_line(tls_kafka):
    settings = replace(tls_kafka, kafka_ssl_ca_location="")  # the system's CAs: not the test's
    with pytest.raises(ExternalUnfit) as failed:
        check_kafka(settings, timeout_s=20)
    (line,) = failed.value.problems
    assert line.startswith(f"kafka at {settings.kafka_bootstrap} (SSL): TLS handshake failed (")
    assert "certificate verify failed" in line and "\n" not in line
