"""Every Kafka and Redis client of the project is built by infra/clients.py: one producer
configuration, one consumer factory, one Redis factory with one timeout policy. A client built
anywhere else in the code (a service, a job, a story, a DAG) fails here, naming the line."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from infra import clients

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("infra", "contract", "app_sim", "pipelines", "stories", "social", "dags")
OWNER = ROOT / "infra" / "clients.py"
CLIENT_CLASSES = {"Producer", "Consumer", "AdminClient", "Redis", "StrictRedis", "RedisCluster"}
KAFKA_FACTORIES = {"kafka_producer", "kafka_consumer", "kafka_admin", "producer_config", "consumer_config"}


def sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if p != OWNER)


def bypasses(path: Path) -> list[str]:
    """Where ``path`` builds a client, spells a client configuration or picks a Redis timeout."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name in CLIENT_CLASSES:
                found.append(f"{where}: {name}(...)")
            if name == "from_url" and isinstance(f, ast.Attribute):
                owner = f.value
                owner_name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
                if owner_name in CLIENT_CLASSES:
                    found.append(f"{where}: {owner_name}.from_url(...)")
            if any(k.arg == "socket_timeout" for k in node.keywords):
                found.append(f"{where}: a Redis timeout of its own")
            first = node.args[0] if node.args else None
            if (
                name in KAFKA_FACTORIES
                and isinstance(first, ast.Attribute)
                and first.attr == "kafka_bootstrap"
            ):
                found.append(f"{where}: a Kafka client given the bootstrap alone (give it the settings)")
        if isinstance(node, ast.Constant) and node.value == "kafka.bootstrap.servers":
            found.append(f"{where}: Spark Kafka options of its own (clients.spark_kafka_options)")
        if isinstance(node, ast.Dict):
            if any(isinstance(k, ast.Constant) and k.value == "bootstrap.servers" for k in node.keys):
                found.append(f"{where}: a Kafka client configuration of its own")
    return found


def test_no_client_is_built_outside_infra_clients():
    found = [b for p in sources() for b in bypasses(p)]
    assert not found, "build these with infra.clients:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "code",
    [
        "from confluent_kafka import Producer\np = Producer({'acks': 'all'})",
        "import confluent_kafka\nc = confluent_kafka.Consumer({})",
        "import redis\nr = redis.Redis.from_url('redis://x')",
        "import redis.asyncio\nr = redis.asyncio.Redis(host='h')",
        "cfg = {'bootstrap.servers': 'b', 'group.id': 'g'}",
        "r = connect_somehow('redis://x', socket_timeout=3)",
        "from infra import clients\nc = clients.kafka_consumer(settings.kafka_bootstrap, 'g')",
        "df.write.format('kafka').option('kafka.bootstrap.servers', b)",
    ],
)
def test_the_check_sees_each_kind_of_bypass(tmp_path, code):
    path = ROOT / "stories" / f"_bypass_probe_{abs(hash(code))}.py"
    try:
        path.write_text(code + "\n")
        assert len(bypasses(path)) == 1, bypasses(path)
    finally:
        path.unlink()


def test_every_producer_is_durable_whatever_its_profile():
    for profile in clients.PRODUCER_PROFILES:
        cfg = clients.producer_config("b:9092", "t", profile=profile)  # type: ignore[arg-type]
        assert cfg["acks"] == "all" and cfg["enable.idempotence"] is True, profile
        assert cfg["bootstrap.servers"] == "b:9092"


def test_a_redis_clients_timeout_is_its_roles():
    for role, seconds in clients.REDIS_TIMEOUTS_S.items():
        r = clients.redis_client("redis://127.0.0.1:1/0", role)  # type: ignore[arg-type]
        assert r.connection_pool.connection_kwargs["socket_timeout"] == seconds
        a = clients.redis_client("redis://127.0.0.1:1/0", role, asyncio=True)  # type: ignore[arg-type]
        assert a.connection_pool.connection_kwargs["socket_timeout"] == seconds


def sasl_settings(**more):
    from infra.settings import Settings

    return Settings(
        kafka_bootstrap="k1:9093,k2:9093",
        kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="SCRAM-SHA-512",
        kafka_sasl_username="social",
        kafka_sasl_password='p"w\\d',
        kafka_ssl_ca_location="/etc/ca.pem",
        **more,
    )


def test_every_confluent_client_gets_the_security_settings():
    s = sasl_settings()
    expected = {
        "bootstrap.servers": "k1:9093,k2:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "social",
        "sasl.password": 'p"w\\d',
        "ssl.ca.location": "/etc/ca.pem",
    }
    for config in (
        clients.producer_config(s, "t"),
        clients.consumer_config(s, "g"),
        clients.kafka_base(s),
    ):
        assert {k: config[k] for k in expected} == expected
    assert clients.kafka_base("b:9092") == {"bootstrap.servers": "b:9092"}


def test_plaintext_settings_add_only_the_protocol():
    from infra.settings import Settings

    assert clients.kafka_base(Settings()) == {
        "bootstrap.servers": "127.0.0.1:9092",
        "security.protocol": "PLAINTEXT",
    }
    assert clients.spark_kafka_options(Settings()) == {
        "kafka.bootstrap.servers": "127.0.0.1:9092",
        "kafka.security.protocol": "PLAINTEXT",
    }


def test_spark_gets_the_same_security_in_java_names_kafka_prefixed(tmp_path):
    cert, key = tmp_path / "client.pem", tmp_path / "client.key"
    cert.write_text("-----BEGIN CERTIFICATE-----\nC\n-----END CERTIFICATE-----\n")
    key.write_text("-----BEGIN PRIVATE KEY-----\nK\n-----END PRIVATE KEY-----\n")
    s = sasl_settings(kafka_ssl_certificate_location=str(cert), kafka_ssl_key_location=str(key))
    options = clients.spark_kafka_options(s)
    assert all(k.startswith("kafka.") for k in options)
    assert options["kafka.bootstrap.servers"] == "k1:9093,k2:9093"
    assert options["kafka.security.protocol"] == "SASL_SSL"
    assert options["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    # the password's quote and backslash escaped inside the JAAS line
    assert options["kafka.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="social" password="p\\"w\\\\d";'
    )
    assert options["kafka.ssl.truststore.type"] == "PEM"
    assert options["kafka.ssl.truststore.location"] == "/etc/ca.pem"
    assert options["kafka.ssl.keystore.certificate.chain"] == cert.read_text()
    assert options["kafka.ssl.keystore.key"] == key.read_text()


def test_plain_sasl_uses_the_plain_login_module():
    from infra.settings import Settings

    s = Settings(
        kafka_security_protocol="SASL_PLAINTEXT", kafka_sasl_mechanism="PLAIN", kafka_sasl_username="u"
    )
    jaas = clients.java_kafka_security(s)["sasl.jaas.config"]
    assert jaas.startswith("org.apache.kafka.common.security.plain.PlainLoginModule required")
    assert "ssl.truststore.location" not in clients.java_kafka_security(s)
