"""Shared fixtures: one real local stack per test session, and a fresh topic per test.

The session stack runs on its own ports (Kafka 19092/19093, Redis 16379, 500 higher per
pytest-xdist worker after the first, or free ports if those are taken, e.g. by a second test
session) with its state in a temporary folder, so it never
touches a user's `make up` stack on 9092/6379 or their var/. Only tests that ask for
`kafka_stack` (mark them `@pytest.mark.integration`) start it; unit tests start nothing.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.settings import Settings, get_settings

# py4j logs "Closing down clientserver connection" from __del__ at interpreter exit, after pytest
# has closed its streams (a '--- Logging error ---' trace below the summary): keep it quiet.
logging.getLogger("py4j").setLevel(logging.WARNING)


def _interrupted(signum: int, _frame) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def pytest_configure(config: pytest.Config) -> None:
    # SIGTERM (`kill <pid>`, a CI runner's timeout) ends the session as Ctrl-C does: pytest then
    # tears the fixtures down, so the Kafka, Redis and speed layers this session started (each in
    # a session of its own, out of reach of a signal to ours) are stopped instead of left running.
    signal.signal(signal.SIGTERM, _interrupted)


PREFERRED_PORTS = {
    "kafka_port": 19092,
    "kafka_controller_port": 19093,
    "redis_port": 16379,
    "api_port": 18000,
    "metrics_port": 19464,
}


# `make test` runs the integration tests in pytest-xdist workers (gw0, gw1, ...), each with a stack
# of its own: a worker's preferred ports lie WORKER_PORT_STRIDE above the previous worker's, so two
# workers starting at the same moment never both find the same port free and race to bind it.
WORKER_PORT_STRIDE = 500


def worker_index() -> int:
    """This pytest-xdist worker's number (0 without xdist)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker.removeprefix("gw")) if worker.startswith("gw") else 0


def _free_port(preferred: int, avoid: set[int]) -> int:
    """The preferred port (moved up by this worker's stride) if nobody uses it, else a free one
    below the kernel's ephemeral range (infra.stack.free_port_block says why)."""
    from infra.stack import free_port_block, port_free

    preferred += WORKER_PORT_STRIDE * worker_index()
    if preferred not in avoid and port_free(preferred):
        return preferred
    while True:
        port = free_port_block(1)
        if port not in avoid:
            return port


def isolated_settings(var_dir: Path, **overrides) -> Settings:
    """Settings for a private stack: free ports near the preferred ones, state under var_dir."""
    ports: dict[str, int] = {}
    for name, preferred in PREFERRED_PORTS.items():
        ports[name] = overrides.pop(name, None) or _free_port(preferred, set(ports.values()))
    return get_settings(
        **ports,
        kafka_bootstrap=f"127.0.0.1:{ports['kafka_port']}",
        redis_url=f"redis://127.0.0.1:{ports['redis_port']}/0",
        var_dir=var_dir,
        **overrides,
    )


@pytest.fixture
def private_settings() -> Callable[..., Settings]:
    """`private_settings(var_dir, **overrides)`: Settings for one more stack a test starts itself."""
    return isolated_settings


@dataclass(frozen=True)
class RunningStack:
    settings: Settings

    @property
    def bootstrap(self) -> str:
        return self.settings.kafka_bootstrap

    @property
    def redis_url(self) -> str:
        return self.settings.redis_url


@pytest.fixture(scope="session")
def kafka_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    """A real Kafka (KRaft) + Redis for the whole session; stopped at the end, also on failure."""
    from infra.jars import fetch
    from infra.stack import BACKBONE, Stack

    fetch()  # no-op (offline, seconds) when `make setup` already ran
    settings = isolated_settings(tmp_path_factory.mktemp("var"))
    stack = Stack(settings, service_types=BACKBONE)  # tests start the speed layer / API they need
    try:
        stack.up()
        yield RunningStack(settings)
    finally:
        stack.down()


@pytest.fixture
def topic_factory(kafka_stack: RunningStack, request: pytest.FixtureRequest) -> Iterator[Callable[..., str]]:
    """`topic_factory(partitions=8, configs=None) -> name`: a new, uniquely named topic for this test.

    The topics are deleted after the test, so a long session does not pile up partitions.
    """
    from infra.stack import create_topic, delete_topic

    created: list[str] = []
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name)[:80]

    def make(partitions: int = 8, configs: dict[str, str] | None = None) -> str:
        name = f"test.{slug}.{uuid.uuid4().hex[:8]}"
        create_topic(kafka_stack.settings, name, partitions, configs)
        created.append(name)
        return name

    yield make
    for name in created:
        try:
            delete_topic(kafka_stack.settings, name)
        except Exception:  # noqa: BLE001 - cleanup must not mask the test's own outcome
            pass


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    """A redis-server of this module's own, started in milliseconds (the keyed state's tests:
    docs/views.md by hand, the property test, the compaction of a changelog the real functions
    wrote). Both tiers use it; nothing else of the stack is started."""
    server = shutil.which("redis-server")
    if server is None:
        pytest.fail("redis-server not on PATH: run `make setup`")
    from infra.stack import free_port_block

    port = free_port_block(1)
    d = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen(
        [
            server,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--repl-diskless-sync-delay",
            "0",  # a frozen copy's replica syncs at once, as the stack's Redis lets it
            "--dir",
            str(d),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    url = f"redis://127.0.0.1:{port}/0"
    import redis

    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 20
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail("redis-server did not start")
            time.sleep(0.05)
    yield url
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory):
    """A Redis Cluster of this module's own: 3 masters, no replicas, real redis-server processes on
    a block of free ports (infra/redis_cluster.py, ~3 s to start), stopped by pid afterwards. Its
    ``url`` is one node's, as a user gives a cluster's address in SOCIAL_REDIS_URL."""
    from infra import redis_cluster

    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.fail("redis-server or redis-cli not on PATH: run `make setup`")
    cluster = redis_cluster.start(tmp_path_factory.mktemp("redis-cluster"), masters=3)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def redis_cluster_url(redis_cluster) -> str:
    """The address of :func:`redis_cluster` (a node's URL; clients built by infra/clients.py find
    the rest)."""
    return redis_cluster.url
