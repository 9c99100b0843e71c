"""Snowflake worker ids from the log's registry in Kafka (contract/writers.py), on a real broker.

Every writer of a log (API process, generator run, --inject) gets a worker id no other writer of
that log ever had; one that cannot get one refuses to start with one line.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from collections import defaultdict
from dataclasses import replace

import orjson
import pytest

from contract import writers
from contract.ids import snowflake_without_worker, snowflake_worker
from infra.settings import REPO_ROOT

pytestmark = pytest.mark.integration


@pytest.fixture
def log(kafka_stack, topic_factory):
    """A fresh event log (a topic of this test) and the settings that name it; its registry
    ``<log>.writers`` is created by the first allocation, and deleted after the test."""
    from infra.stack import delete_topic

    topic = topic_factory(partitions=4)
    settings = replace(kafka_stack.settings, events_topic=topic)
    yield settings
    try:
        delete_topic(settings, writers.registry_topic(settings))
    except Exception:  # noqa: BLE001 - cleanup must not mask the test's own outcome
        pass


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nobody listens once the socket is closed


def _one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


def test_the_first_allocation_creates_a_compacted_single_partition_registry(log):
    from confluent_kafka.admin import ConfigResource

    from infra.stack import admin_client

    claim = writers.allocate(log, "api")
    assert claim.worker_id == 0 and claim.offset == 0 and claim.topic == f"{log.events_topic}.writers"
    admin = admin_client(log)
    meta = admin.list_topics(claim.topic, timeout=10).topics[claim.topic]
    assert len(meta.partitions) == 1
    resource = ConfigResource(ConfigResource.Type.TOPIC, claim.topic)
    configs = admin.describe_configs([resource])[resource].result(timeout=10)
    assert configs["cleanup.policy"].value == "compact" and configs["retention.ms"].value == "-1"
    assert writers.ensure_topic(log) == claim.topic  # idempotent: the topic is kept as it is
    (record,) = writers.read_claims(log)
    assert (
        record["worker_id"] == 0 and record["kind"] == "api" and record["won"] and record["key"] == claim.key
    )
    assert {"pid", "host", "claimed_at"} <= set(record)


def test_fifty_sequential_allocations_are_all_distinct(log):
    got = [writers.allocate(log, "generator").worker_id for _ in range(50)]
    assert got == list(range(50))  # distinct, the lowest free id each time


def test_concurrent_allocations_get_different_ids(log):
    """Eight writers read the same end of the registry at once and claim the same lowest id: the
    claim at the lowest offset wins it, the others move on to the next free one."""
    writers.ensure_topic(log)
    n = 8
    start = threading.Barrier(n)
    got: list[int] = []
    errors: list[BaseException] = []

    def allocate() -> None:
        try:
            start.wait()
            got.append(writers.allocate(log, "api").worker_id)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=allocate) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert sorted(got) == list(range(n))
    claims = writers.read_claims(log)
    won = [c["worker_id"] for c in claims if c["won"]]
    assert sorted(won) == list(range(n))
    # every claim that lost names an id an earlier claim holds
    first = {}
    for c in claims:
        first.setdefault(c["worker_id"], c["offset"])
    assert all(c["won"] == (first[c["worker_id"]] == c["offset"]) for c in claims)


def test_an_exhausted_registry_refuses_with_one_line(log):
    assert [writers.allocate(log, "api", max_ids=3).worker_id for _ in range(3)] == [0, 1, 2]
    with pytest.raises(writers.WriterIdUnavailable) as refused:
        writers.allocate(log, "generator", max_ids=3)
    message = str(refused.value)
    assert "\n" not in message
    assert f"{log.events_topic}.writers" in message and "all 3 worker ids" in message
    assert "3 claims" in message and "make clean" in message


def test_kafka_unreachable_refuses_with_one_line(kafka_stack):
    down = replace(kafka_stack.settings, kafka_bootstrap=f"127.0.0.1:{_closed_port()}")
    with pytest.raises(writers.WriterIdUnavailable) as refused:
        writers.allocate(down, "api", timeout_s=3)
    message = str(refused.value)
    assert "\n" not in message and down.kafka_bootstrap in message and "make up" in message


def _fill(settings, n: int = writers.WORKER_IDS) -> None:
    """Claim every worker id of the log, as ``n`` writers before would have."""
    from confluent_kafka import Producer

    topic = writers.ensure_topic(settings)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "acks": "all"})
    for wid in range(n):
        producer.produce(topic, writers.claim_value(wid, "api"), str(uuid.uuid4()).encode())
    assert producer.flush(30) == 0


def test_writers_refuse_to_start_without_a_worker_id_one_line_no_traceback(log, capsys):
    """All 1024 ids of the log are claimed: the generator CLI (and its --inject) and an API
    process each print one line and exit non-zero before writing anything."""
    from app_sim.api import create_app
    from infra.stack import end_offsets

    _fill(log)
    env = {
        "PATH": "/usr/bin:/bin",
        "SOCIAL_VAR_DIR": str(log.var_dir),
        "SOCIAL_SEAL_PERSONAL_DATA": "0",
    }
    for args in (["--events", "1000", "--users", "20"], ["--events", "0", "--inject", "burst"]):
        cli = subprocess.run(
            [sys.executable, "-m", "app_sim.generator", "--topic", log.events_topic, "--bootstrap",
             log.kafka_bootstrap, "--no-progress", *args],
            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert cli.returncode == 2, cli.stderr
        line = _one_line(cli.stderr)
        assert line.startswith("generator: no snowflake worker id") and "all 1024 worker ids" in line, line
    assert sum(end_offsets(log, log.events_topic).values()) == 0  # nothing written

    with pytest.raises(SystemExit) as refused:
        create_app(log)
    assert refused.value.code == 3  # uvicorn's "failed to start": its supervisor does not restart
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("app API: no snowflake worker id for this api") and "make clean" in line


def test_the_generator_cli_refuses_when_kafka_is_down(tmp_path):
    cli = subprocess.run(
        [sys.executable, "-m", "app_sim.generator", "--bootstrap", f"127.0.0.1:{_closed_port()}",
         "--events", "100", "--users", "10", "--no-progress", "--no-seal"],
        cwd=REPO_ROOT, env={"PATH": "/usr/bin:/bin", "SOCIAL_VAR_DIR": str(tmp_path)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert cli.returncode == 2, cli.stderr
    line = _one_line(cli.stderr)
    assert "did not answer" in line and "make up" in line, line


def test_two_generator_runs_of_one_seed_get_ids_that_differ_only_in_the_worker_bits(log):
    """The `make demo` collision, fixed: two runs of one seed (the main run and a second one, as
    --inject or a concurrent run would be) on one log mint post and message ids that differ in
    the worker bits only, so no id is minted twice."""
    from app_sim.generator import GeneratorConfig, inject, produce

    cfg = GeneratorConfig(users=40, mean_followers=4, seed=9)
    first = produce(2_000, cfg, topic=log.events_topic, bootstrap=log.kafka_bootstrap, progress=False)
    second = produce(2_000, cfg, topic=log.events_topic, bootstrap=log.kafka_bootstrap, progress=False)
    injected = inject(["burst"], topic=log.events_topic, bootstrap=log.kafka_bootstrap, user=1, settings=log)
    assert first.delivery_failures == second.delivery_failures == 0
    assert first.worker_id != second.worker_id

    ids: dict[int, list[int]] = defaultdict(list)  # worker id -> the ids the run minted
    minted = {"post_created": "post_id", "message_sent": "message_id"}  # (deletes and reads name them)
    for value in _read_values(log, 4_000 + injected):
        event = orjson.loads(value)
        if event["type"] in minted:
            new_id = event[minted[event["type"]]]
            ids[snowflake_worker(new_id)].append(new_id)
    assert {first.worker_id, second.worker_id} <= set(ids)
    inject_workers = set(ids) - {first.worker_id, second.worker_id}
    assert len(inject_workers) == 1, ids.keys()  # --inject: a worker id of its own
    a, b = ids[first.worker_id], ids[second.worker_id]
    assert len(a) == len(b) > 100
    assert sorted(snowflake_without_worker(x) for x in a) == sorted(snowflake_without_worker(x) for x in b)
    every = [x for run in ids.values() for x in run]
    assert len(set(every)) == len(every)  # no id minted twice in the log
    assert {c["kind"] for c in writers.read_claims(log)} == {"generator", "inject"}


def _read_values(settings, expected: int) -> list[bytes]:
    import time

    from confluent_kafka import Consumer, TopicPartition

    from infra.stack import end_offsets

    ends = end_offsets(settings, settings.events_topic)
    assert sum(ends.values()) == expected
    c = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": "registry-test",
            "enable.auto.commit": False,
        }
    )
    out: list[bytes] = []
    try:
        c.assign([TopicPartition(settings.events_topic, p, 0) for p in ends])
        deadline = time.monotonic() + 60
        while len(out) < expected and time.monotonic() < deadline:
            out += [m.value() for m in c.consume(1000, timeout=0.5) if m.error() is None]
    finally:
        c.close()
    assert len(out) == expected
    return out
