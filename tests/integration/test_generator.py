"""The generator against a real broker: everything it reports is what the log holds."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import replace

import orjson
import pytest

import contract
from app_sim.generator import DUPLICATE, GeneratorConfig, generate, produce

pytestmark = pytest.mark.integration

N = 100_000


def _read_all(bootstrap: str, topic: str, expected: int, timeout_s: float = 120.0):
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"verify-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    out = []

    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < expected and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, timeout=1.0):
                if msg.error():
                    raise RuntimeError(msg.error())
                out.append((msg.key(), msg.value(), msg.partition(), msg.offset()))
    finally:
        consumer.close()
    return out


def test_generator_writes_what_it_reports(kafka_stack, topic_factory):
    topic = topic_factory(partitions=8)
    cfg = GeneratorConfig(users=500, mean_followers=30, seed=7, invalid_share=0.01, duplicate_share=0.01)
    summary = produce(N, cfg, topic=topic, bootstrap=kafka_stack.bootstrap, progress=False)
    assert summary.events == N and summary.delivery_failures == 0

    records = _read_all(kafka_stack.bootstrap, topic, N)
    assert len(records) == N

    # Log order per partition is what the generator wrote in that partition's order (the run's
    # snowflake worker id was allocated from the log's registry: the same one, offline).
    expected = list(generate(N, replace(cfg, worker_id=summary.worker_id)))
    expected_by_key = defaultdict(list)
    for key, value, _injected in expected:
        raw = value if isinstance(value, bytes) else orjson.dumps(value)
        expected_by_key[key].append(raw)

    per_type: Counter = Counter()
    reasons: Counter = Counter()
    partition_of_key: dict[bytes, int] = {}
    seen_ids: set[str] = set()
    duplicates = 0
    got_by_key = defaultdict(list)
    for key, value, partition, _offset in sorted(records, key=lambda r: (r[2], r[3])):
        assert partition_of_key.setdefault(key, partition) == partition, "a key changed partition"
        got_by_key[key].append(value)
        event, reason = contract.parse_and_validate(value)
        if reason is not None:
            reasons[reason] += 1
            continue
        assert key == contract.record_key(event)
        if event["event_id"] in seen_ids:
            duplicates += 1
            continue
        seen_ids.add(event["event_id"])
        per_type[event["type"]] += 1

    assert got_by_key == expected_by_key  # same records, same per-key order as generated offline
    assert duplicates == summary.duplicates == N // 100
    stateless = {r: n for r, n in summary.invalid.items() if r not in contract.STATEFUL_REASONS}
    assert dict(reasons) == stateless
    stateful = sum(n for r, n in summary.invalid.items() if r in contract.STATEFUL_REASONS)
    # stateful invalid records pass the stateless contract; the speed layer quarantines them
    assert sum(per_type.values()) == sum(summary.per_type.values()) + stateful
    for t, n in summary.per_type.items():
        extra = {
            "post_deleted": summary.invalid.get("not_own_post", 0),
            "message_read": summary.invalid.get("not_in_inbox", 0),
        }.get(t, 0)
        assert per_type[t] == n + extra, t
    assert len(partition_of_key) > 8 and len(set(partition_of_key.values())) == 8
    assert DUPLICATE not in reasons


def test_a_paused_run_has_its_first_part_in_the_log_at_the_pause_and_is_still_one_run(
    kafka_stack, topic_factory
):
    """``produce(pause_at=k, on_pause=f)``: when ``f`` runs, exactly the first k records are in
    the log (flushed, acknowledged); afterwards the log holds the same records, in the same order
    per partition, as the same run without a pause."""
    from infra.stack import end_offsets

    cfg = GeneratorConfig(users=50, mean_followers=5, seed=3, worker_id=5)  # byte-equal runs: one worker id
    paused, plain = topic_factory(partitions=4), topic_factory(partitions=4)
    at_pause: list[int] = []
    summary = produce(
        1_000,
        cfg,
        topic=paused,
        bootstrap=kafka_stack.bootstrap,
        progress=False,
        pause_at=400,
        on_pause=lambda: at_pause.append(sum(end_offsets(kafka_stack.settings, paused).values())),
    )
    produce(1_000, cfg, topic=plain, bootstrap=kafka_stack.bootstrap, progress=False)
    assert at_pause == [400]
    assert summary.events == 1_000 and summary.delivery_failures == 0

    def per_partition(topic: str) -> dict[int, list[bytes]]:
        out: dict[int, list[bytes]] = defaultdict(list)
        for _key, value, partition, _offset in sorted(
            _read_all(kafka_stack.bootstrap, topic, 1_000), key=lambda r: (r[2], r[3])
        ):
            out[partition].append(value)
        return out

    assert per_partition(paused) == per_partition(plain)


def test_a_sealed_run_with_erasures_leaves_no_erased_users_field_readable(
    kafka_stack, topic_factory, tmp_path
):
    """With a sealer, every personal field goes out sealed with its user's key and opens to the
    plaintext of the same run; a user erased in the run (and still turning up after it) has no key
    once ``produce`` returns, so none of their values opens, before or after the erasure. The
    caller's sealer is left as it was given."""
    from contract.keys import KeyStore, Sealer, key_id, open_value

    topic = topic_factory(partitions=4)
    cfg = GeneratorConfig(users=60, mean_followers=6, seed=5, duplicate_share=0.01, erasure_share=0.004)
    n = 20_000
    store = KeyStore(tmp_path / "keys.sqlite3")
    sealer = Sealer(store)
    summary = produce(n, cfg, topic=topic, bootstrap=kafka_stack.bootstrap, progress=False, sealer=sealer)
    assert summary.events == n and summary.delivery_failures == 0
    assert sealer.shred_erased is False

    plain_by_key = defaultdict(list)
    erased = set()
    for key, value, injected in generate(n, replace(cfg, worker_id=summary.worker_id)):
        plain_by_key[key].append(value)
        if type(value) is dict and injected is None and value["type"] == "user_erased":
            erased.add(value["user_id"])
    assert len(erased) >= 2, erased  # the run really erases users
    assert store.erased() == erased

    sealed_by_key = defaultdict(list)  # per key (so per partition), in log order
    for key, value, *_position in sorted(
        _read_all(kafka_stack.bootstrap, topic, n), key=lambda r: (r[2], r[3])
    ):
        sealed_by_key[key].append(value)
    opened = shredded = 0
    for key, plains in plain_by_key.items():
        assert len(sealed_by_key[key]) == len(plains), key
        for plain, raw in zip(plains, sealed_by_key[key], strict=True):
            if type(plain) is not dict or plain.get("type") not in contract.EVENT_TYPES:
                continue
            sent = orjson.loads(raw)
            for name in contract.personal_fields(plain["type"]):
                value = sent.get(name)
                if not (type(value) is str and contract.is_sealed(value)):
                    assert value == plain.get(name)  # a value the field's rule refuses: left as is
                    continue
                user = key_id(value)
                assert user == plain["user_id"]
                if user in erased:
                    assert store.get(user) is None
                    shredded += 1
                else:
                    assert open_value(store.get(user), name, value) == plain[name]
                    opened += 1
    assert opened > 1_000 and shredded > 10, (opened, shredded)
