"""The local stack for real: a KRaft broker and Redis started by infra.stack, used, stopped."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid

import pytest
import redis
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, Producer
from confluent_kafka.admin import ConfigResource

from infra.settings import REPO_ROOT
from infra.stack import BACKBONE, EVENTS_TOPIC_CONFIGS, Stack, StackError, admin_client, port_listening

pytestmark = pytest.mark.integration


def test_event_topic_is_created_with_retain_forever_configs(kafka_stack):
    s = kafka_stack.settings
    admin = admin_client(s)
    topic = admin.list_topics(s.events_topic, timeout=10).topics[s.events_topic]
    assert len(topic.partitions) == s.events_partitions
    configs = admin.describe_configs([ConfigResource("topic", s.events_topic)])
    described = next(iter(configs.values())).result(timeout=10)
    for key, value in EVENTS_TOPIC_CONFIGS.items():
        assert described[key].value == value, key


def test_a_record_goes_through_the_real_broker(kafka_stack, topic_factory):
    topic = topic_factory(partitions=3)
    producer = Producer(
        {"bootstrap.servers": kafka_stack.bootstrap, "acks": "all", "enable.idempotence": True}
    )
    producer.produce(topic, key=b"42", value=b'{"hello": "log"}')
    assert producer.flush(10) == 0

    consumer = Consumer(
        {
            "bootstrap.servers": kafka_stack.bootstrap,
            "group.id": f"test-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe([topic])
        record = None
        for _ in range(60):
            record = consumer.poll(1.0)
            if record is not None and not record.error():
                break
        assert record is not None and record.error() is None
        assert (record.key(), record.value()) == (b"42", b'{"hello": "log"}')
    finally:
        consumer.close()


def test_event_topic_stamps_records_at_append(kafka_stack):
    s = kafka_stack.settings
    producer = Producer({"bootstrap.servers": kafka_stack.bootstrap, "acks": "all"})
    delivered = []
    producer.produce(
        s.events_topic, key=b"1", value=b"{}", timestamp=1, on_delivery=lambda e, m: delivered.append(m)
    )
    producer.flush(10)
    assert delivered and delivered[0].error() is None
    # the producer asked for timestamp 1; the broker overwrote it with its append time
    kind, ts = delivered[0].timestamp()
    assert kind == TIMESTAMP_LOG_APPEND_TIME and ts > 1


def test_redis_answers(kafka_stack):
    client = redis.Redis.from_url(kafka_stack.redis_url)
    assert client.ping()
    key = f"test:{uuid.uuid4().hex}"
    client.set(key, "v", ex=60)
    assert client.get(key) == b"v"
    assert client.config_get("appendonly") == {"appendonly": "yes"}


def test_up_twice_is_harmless(kafka_stack):
    stack = Stack(kafka_stack.settings, service_types=BACKBONE)
    pids = {s.name: s.pid() for s in stack.services}
    assert stack.up() == {name: "already running" for name in pids}
    assert {s.name: s.pid() for s in stack.services} == pids


def test_down_stops_exactly_what_up_started(tmp_path, kafka_stack, private_settings):
    # A second stack (own free ports, own var dir), so the session stack keeps running.
    settings = private_settings(tmp_path / "var")
    stack = Stack(settings, service_types=BACKBONE)
    try:
        assert stack.up() == {"kafka": "started", "redis": "started"}
        ports = [p for s in stack.services for p in s.ports()]
        assert all(port_listening(p) for p in ports)
    finally:
        stopped = stack.down()
    assert stopped == {"redis": "stopped", "kafka": "stopped"}
    assert not list(settings.run_dir.glob("*.pid"))
    assert not any(port_listening(p) for p in ports)


def test_a_taken_port_gives_a_clear_error(tmp_path, private_settings):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        settings = private_settings(tmp_path / "var", kafka_port=taken)

        with pytest.raises(StackError, match=f"port {taken}"):
            Stack(settings, service_types=BACKBONE).up()
        assert not list(settings.run_dir.glob("*.pid")), "nothing may start when a port is taken"

        env = {
            **os.environ,
            "SOCIAL_VAR_DIR": str(settings.var_dir),
            "SOCIAL_KAFKA_PORT": str(taken),
            "SOCIAL_KAFKA_CONTROLLER_PORT": str(settings.kafka_controller_port),
            "SOCIAL_REDIS_PORT": str(settings.redis_port),
        }
        cli = subprocess.run(
            [sys.executable, "-m", "infra.stack", "up"],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
    assert cli.returncode == 1
    assert cli.stderr.strip().startswith("error: kafka: port") and "Traceback" not in cli.stderr
    assert len(cli.stderr.strip().splitlines()) == 1


def test_up_twice_with_every_service_is_fast_and_reads_no_log(kafka_stack):
    """Issue 17: `make up` on a running stack answers from health checks (the Spark UI's REST API
    for the speed layer, /v1/health for the API) within seconds, whatever its logs hold."""
    import dataclasses
    import time

    from infra.stack import ApiServer, Archiver, MetricsExporter, SpeedLayer
    from tests.conftest import _free_port

    settings = dataclasses.replace(
        kafka_stack.settings,
        views_namespace=f"upstack-{uuid.uuid4().hex[:8]}",
        api_port=_free_port(18200, set()),
        analytics=0,  # one JVM fewer: the analytics' own start is tested in test_analytics
    )
    stack = Stack(settings)
    speed_layer, archiver, api = SpeedLayer(settings), Archiver(settings), ApiServer(settings)
    try:
        assert stack.up() == {
            "kafka": "already running",
            "redis": "already running",
            "speed_layer": "started",
            "archiver": "started",
            "analytics": "off (SOCIAL_ANALYTICS=0)",
            "api": "started",
            "metrics": "started",
            "prometheus": "off (SOCIAL_PROMETHEUS=1 starts it)",
            "airflow": "off (SOCIAL_AIRFLOW_STANDALONE=1 starts it)",
        }
        assert speed_layer.application() == f"speed-layer-{settings.views_namespace}"
        assert archiver.application() == f"archiver-{settings.views_namespace}"
        pids = {s.name: s.pid() for s in stack.services}
        for service in (speed_layer, archiver, api):
            service.log_file.write_bytes(b"")  # readiness must not depend on what a log says
        started = time.monotonic()
        running = {name: "already running" for name in pids}
        off = {
            "analytics": "off (SOCIAL_ANALYTICS=0)",
            "prometheus": "off (SOCIAL_PROMETHEUS=1 starts it)",
            "airflow": "off (SOCIAL_AIRFLOW_STANDALONE=1 starts it)",
        }
        assert stack.up() == {**running, **off}
        assert time.monotonic() - started < 10
        assert {s.name: s.pid() for s in stack.services} == pids
    finally:
        MetricsExporter(settings).stop()
        api.stop()
        archiver.stop()
        speed_layer.stop()


class _Sleeper:
    """A stand-in for a service that needs the stores (as the speed layer and the API do)."""

    @staticmethod
    def make(name: str, code: str):
        from infra.stack import Service

        class Stub(Service):
            marker = f"kappa-stub-{name}"

            def ports(self):
                return []

            def command(self):
                return [sys.executable, "-c", code, self.marker]

            def wait_ready(self, deadline):
                import time

                time.sleep(0.3)
                if not self.is_running():
                    raise self._died()

        Stub.name = name
        return Stub


def test_a_failed_start_never_stops_what_a_running_service_needs(tmp_path, private_settings):
    """Issue 17: the store a running service needs stays up when a later service fails to start,
    even when this `up` had to restart it (the broker-restart case of the issue), and the running
    service itself is left alone; what nothing running needs is rolled back."""
    import signal

    from infra.stack import RedisServer

    settings = private_settings(tmp_path / "var")
    sleeper = _Sleeper.make("sleeper", "import time; time.sleep(600)")
    broken = _Sleeper.make("broken", "import sys; sys.exit(3)")
    try:
        assert Stack(settings, service_types=(RedisServer, sleeper)).up() == {
            "redis": "started",
            "sleeper": "started",
        }
        redis_server = RedisServer(settings)
        os.kill(redis_server.pid(), signal.SIGKILL)  # the store dies under the running service
        while redis_server.is_running():
            pass
        with pytest.raises(StackError, match="broken exited during start-up"):
            Stack(settings, service_types=(RedisServer, sleeper, broken)).up()
        assert redis_server.is_running(), "the restarted store was stopped although sleeper needs it"
        assert sleeper(settings).is_running()
        assert not broken(settings).is_running()

        # nothing running needs a store started by a failed `up` on a stopped stack: rolled back
        Stack(settings, service_types=(RedisServer, sleeper)).down()
        with pytest.raises(StackError, match="broken exited during start-up"):
            Stack(settings, service_types=(RedisServer, sleeper, broken)).up()
        assert not redis_server.is_running() and not sleeper(settings).is_running()
    finally:
        Stack(settings, service_types=(RedisServer, sleeper, broken)).down()


def test_make_tail_prints_the_log_with_kafkas_console_consumer(kafka_stack, topic_factory):
    from confluent_kafka import Producer

    from infra.settings import REPO_ROOT
    from infra.stack import settings_env

    topic = topic_factory(partitions=1)
    producer = Producer({"bootstrap.servers": kafka_stack.bootstrap})
    for i in range(3):
        producer.produce(topic, f'{{"n": {i}}}'.encode(), f"k{i}".encode())
    assert producer.flush(30) == 0
    done = subprocess.run(
        [sys.executable, "-m", "infra.tail", "--topic", topic, "--from-beginning", "--max-messages", "3"],
        cwd=REPO_ROOT,
        env=settings_env(kafka_stack.settings),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
    assert len(lines) == 3, done.stdout
    for i, line in enumerate(lines):
        assert "Partition:0" in line and f"Offset:{i}" in line and "Time:" in line, line
        assert line.endswith(f'k{i}\t{{"n": {i}}}'), line
