"""Fault runs against the cluster profile's Kafka: what a producer saw acknowledged vs. the log.

Each run writes generator events (``app_sim.generator``) at a steady rate for a bounded time,
injects one fault at a set moment (kill -9 of a broker, of a partition leader, ...), then reads
the whole topic back and compares it with the producer's delivery reports, event id by event id:

- ``acked``: ids whose delivery report had no error (the write was acknowledged);
- ``lost``: acknowledged ids that are not in the log;
- ``duplicated``: acknowledged ids in the log more often than they were sent.

With ``acks=all``, ``enable.idempotence`` and ``min.insync.replicas=2`` on 3 replicas both must
be 0 whatever single broker dies; with ``acks=1`` a leader acknowledges before its followers
copied the write, so a leader killed at the wrong moment takes acknowledged writes with it.
The report of each run is a JSON file under ``var/reports/faults/`` (docs/cluster-and-faults.md: Fault runs).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

from app_sim.generator import EventGenerator, GeneratorConfig
from contract import writers
from infra import clients
from infra.cli import command_name, run_main
from infra.settings import Settings
from infra.stack import KafkaBroker, admin_client, end_offsets
from stories.bench_common import wait_fences


@dataclass
class FaultRun:
    """What one run did and found (the JSON report)."""

    name: str
    acks: str
    idempotence: bool
    fault: str
    seconds: float
    sent: int = 0
    acked: int = 0
    failed: int = 0  # delivery reports with an error: never acknowledged, the producer knows
    in_log: int = 0
    lost: int = 0
    duplicated: int = 0
    first_errors: list[str] = field(default_factory=list)
    fault_error: str | None = None  # the injection itself failed (the fault may not have happened)
    events: list[str] = field(default_factory=list)  # what happened when, seconds from the start

    @property
    def exactly_once(self) -> bool:
        return self.lost == 0 and self.duplicated == 0

    def write(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{self.name}.json"
        path.write_text(json.dumps({**asdict(self), "exactly_once": self.exactly_once}, indent=2) + "\n")
        return path


def guarantee(acks: str, idempotence: bool) -> dict:
    """What a fault run changes in the project's producer: the guarantee under test (success
    reports stay on: they are counted)."""
    return {
        "acks": acks,
        "enable.idempotence": idempotence,
        "delivery.timeout.ms": 120_000,  # long enough to ride out a leader election
    }


def leader_of(settings: Settings, topic: str, partition: int) -> int:
    """Node id of the partition's current leader."""
    meta = admin_client(settings).list_topics(topic, timeout=10).topics[topic]
    return meta.partitions[partition].leader


def node(settings: Settings, node_id: int) -> KafkaBroker:
    return KafkaBroker(settings, node_id - 1)


def kill9(broker: KafkaBroker) -> int:
    """SIGKILL the node's JVM (no clean shutdown, no flush): a crash."""
    pid = broker.pid()
    if pid is None or not broker.is_running():
        raise RuntimeError(f"{broker.name} is not running")
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while broker.is_running() and time.monotonic() < deadline:
        time.sleep(0.05)
    return pid


def read_ids(settings: Settings, topic: str, timeout_s: float = 120.0) -> Counter:
    """Every event id in the topic, with how often it is there (a full read to the end offsets)."""
    from confluent_kafka import TopicPartition

    ends = end_offsets(settings, topic)
    consumer = clients.kafka_consumer(
        settings, f"faults-read-{time.time_ns()}", {"auto.offset.reset": "earliest"}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p, end in ends.items() if end > 0])
    left = {p: end for p, end in ends.items() if end > 0}
    ids: Counter = Counter()
    deadline = time.monotonic() + timeout_s
    try:
        while left and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, timeout=1.0):
                if msg.error() is not None:
                    continue
                ids[orjson.loads(msg.value())["event_id"]] += 1
                if msg.offset() + 1 >= left.get(msg.partition(), 0):
                    left.pop(msg.partition(), None)
    finally:
        consumer.close()
    if left:
        raise RuntimeError(f"could not read {topic} to its end in {timeout_s} s: {left}")
    return ids


def _injecting(inject: Callable[[FaultRun], None], result: FaultRun) -> None:
    """Run the injection; its failure is part of the report, not a lost thread's traceback."""
    try:
        inject(result)
    except Exception as exc:  # noqa: BLE001 - any failure of the fault is reported, then asserted on
        result.fault_error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        result.events.append(f"fault injection failed: {result.fault_error}")


def run(
    settings: Settings,
    topic: str,
    *,
    name: str,
    fault: str,
    inject: Callable[[FaultRun], None],
    acks: str = "all",
    idempotence: bool = True,
    seconds: float = 20.0,
    fault_at_s: float = 5.0,
    rate: float = 2000.0,
    users: int = 200,
) -> FaultRun:
    """Write at ``rate`` events/s for ``seconds``, call ``inject`` at ``fault_at_s``, then count."""

    # before the clock starts: a worker id of the run's own (see the GeneratorConfig below)
    # (a loaded 3-node cluster can take more than the default 30 s to create the registry and ack)
    worker_id = writers.allocate(settings, "faults", events_topic=topic, timeout_s=120.0).worker_id
    result = FaultRun(name=name, acks=acks, idempotence=idempotence, fault=fault, seconds=seconds)
    acked: Counter = Counter()
    start = time.monotonic()

    def on_delivery(err, msg):
        if err is None:
            acked[orjson.loads(msg.value())["event_id"]] += 1
        else:
            result.failed += 1
            if len(result.first_errors) < 3:
                result.first_errors.append(str(err))

    producer = clients.kafka_producer(
        settings, "faults", overrides=guarantee(acks, idempotence), on_delivery=on_delivery
    )
    # Wall-clock ids from a worker id of the run's own, allocated above from the log's registry
    # (contract.writers): a fault run appended to a topic that already has other writers' events
    # (spark_worker_killed) never reuses their post and message ids.
    config = GeneratorConfig(
        users=users,
        mean_followers=5.0,
        seed=zlib.crc32(name.encode()) & 0xFFFF,
        realtime=True,
        worker_id=worker_id,
    )
    records = EventGenerator(int(rate * seconds) + users * 10, config).records()
    # paced here, not by app_sim.generator.produce(rate=): the fault starts mid-run, and every
    # record's delivery report is counted by event id with this run's acks and idempotence
    fault_thread: threading.Thread | None = None
    for key, value, _injected in records:
        now = time.monotonic() - start
        if now >= seconds:
            break
        if fault_thread is None and now >= fault_at_s:
            result.events.append(f"{now:.1f}s fault: {fault}")
            fault_thread = threading.Thread(target=_injecting, args=(inject, result), daemon=True)
            fault_thread.start()
        while True:
            try:
                producer.produce(topic, orjson.dumps(value), key)
                break
            except BufferError:
                producer.poll(0.05)
        result.sent += 1
        producer.poll(0)
        ahead = result.sent / rate - (time.monotonic() - start)
        if ahead > 0:
            time.sleep(ahead)
    if fault_thread is not None:
        fault_thread.join(timeout=180)
        if fault_thread.is_alive():
            result.fault_error = "the injection was still running 180 s after the writes ended"

    remaining = producer.flush(150)
    result.failed += remaining
    result.events.append(f"{time.monotonic() - start:.1f}s producer flushed ({remaining} undelivered)")
    _count(result, acked, read_ids(settings, topic))
    return result


def _count(result: FaultRun, acked: Counter, in_log: Counter) -> None:
    """The run's acknowledged ids (``acked``: id -> acknowledged sends) against the log's
    (``in_log``, :func:`read_ids`): acked, in the log, lost and duplicated, into ``result``."""
    result.acked = sum(acked.values())
    result.in_log = sum(in_log.values())
    result.lost = sum(max(0, n - in_log.get(i, 0)) for i, n in acked.items())
    # more copies in the log than acknowledged sends of an id (a retry written twice)
    result.duplicated = sum(max(0, in_log[i] - acked.get(i, 0)) for i in in_log if in_log[i] > 1)


def spark_worker_killed(settings: Settings, *, seconds: float = 30.0, rate: float = 1000.0) -> dict:
    """Against a running cluster profile (``SOCIAL_PROFILE=cluster make up``): write for ``seconds``,
    kill -9 Spark worker 1 with its executors (its whole process group: a lost machine) while the
    speed layer runs micro-batches, restart it later; then the speed layer must apply every event
    (fences = end offsets) with events read = applied + duplicates + rejected + quarantined."""
    from contract import functions, namespaces
    from contract.serving import connect
    from infra.stack import SparkWorker

    if not settings.clustered:
        raise SystemExit("run with SOCIAL_PROFILE=cluster against `SOCIAL_PROFILE=cluster make up`")
    worker = SparkWorker(settings, 0)

    def kill_worker(run: FaultRun) -> None:
        pid = worker.pid()
        if pid is None or not worker.is_running():
            raise RuntimeError(f"{worker.name} is not running")
        os.killpg(pid, signal.SIGKILL)  # the worker JVM and the executors it launched
        run.events.append(f"kill -9 {worker.name} and its executors (process group {pid})")
        time.sleep(seconds / 3)
        worker.start()
        run.events.append(f"{worker.name} restarted")

    topic = settings.events_topic
    run_ = run(settings, topic, name="spark_worker_killed", fault="kill -9 a Spark worker mid-batch",
               inject=kill_worker, seconds=seconds, fault_at_s=seconds / 4, rate=rate)  # fmt: skip
    namespace = namespaces.active(settings)
    client = connect(settings.redis_url)
    ends = end_offsets(settings, topic)
    caught_up = wait_fences(client, namespace, ends, 600, settings.serving_layout) is not None
    run_.events.append(f"speed layer caught up: {caught_up}")
    stats = functions.accounting(client, namespace, sorted(ends), settings.serving_layout)
    read = sum(ends.values())
    report = {
        **asdict(run_),
        "exactly_once": run_.exactly_once,
        "caught_up": caught_up,
        "accounting": {**stats, "events_read": read},
        "accounting_ok": read
        == stats["applied"] + stats["duplicates"] + stats["rejected"] + stats["quarantined"],
    }
    path = settings.reports_dir / "faults" / "spark_worker_killed.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    import argparse

    from infra.settings import get_settings

    p = argparse.ArgumentParser(prog=command_name("stories.faults"), description=__doc__.splitlines()[0])
    p.add_argument("run", choices=["spark-worker"])
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--rate", type=float, default=1000.0)
    args = p.parse_args(argv)
    try:
        report = spark_worker_killed(get_settings(), seconds=args.seconds, rate=args.rate)
    except writers.WriterIdUnavailable as exc:  # refuse to start: one line, no traceback
        print(f"faults: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({k: v for k, v in report.items() if k != "first_errors"}, indent=2))
    return 0 if report["exactly_once"] and report["caught_up"] and report["accounting_ok"] else 1


if __name__ == "__main__":
    sys.exit(run_main(main, "stories.faults"))
