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
