"""The worker-id registry's pure logic (contract/writers.py): who owns an id, which id is next.

The allocation against a real broker (races, exhaustion, Kafka down): tests/integration/test_writer_registry.py.
"""

from __future__ import annotations

import orjson

from contract import writers
from infra.settings import Settings


def claim(worker_id, kind="api") -> bytes:
    return orjson.dumps({"worker_id": worker_id, "kind": kind, "pid": 1, "host": "h", "claimed_at": 0})


def test_the_claim_at_the_lowest_offset_owns_an_id_in_any_read_order():
    records = [(0, claim(0)), (1, claim(1)), (2, claim(1, "generator")), (3, claim(2))]
    assert writers.owners(records) == {0: 0, 1: 1, 2: 3}
    assert writers.owners(reversed(records)) == {0: 0, 1: 1, 2: 3}
    # a later read folds into what an earlier one found
    owned = writers.owners(records[:1])
    assert writers.owners(records[1:], owned) is owned and owned == {0: 0, 1: 1, 2: 3}


def test_records_that_are_not_claims_are_ignored():
    junk = [
        (0, b"not json"),
        (1, None),  # a tombstone
        (2, b"[1, 2]"),
        (3, orjson.dumps({"kind": "api"})),
        (4, orjson.dumps({"worker_id": "5"})),
        (5, orjson.dumps({"worker_id": 1024})),
        (6, orjson.dumps({"worker_id": -1})),
        (7, orjson.dumps({"worker_id": True})),
        (8, claim(7)),
    ]
    assert writers.owners(junk) == {7: 8}


def test_the_lowest_free_id_within_the_limit():
    assert writers.lowest_free({}) == 0
    assert writers.lowest_free({0: 0, 1: 5, 3: 2}) == 2
    assert writers.lowest_free({0: 0, 1: 1}, max_ids=2) is None
    assert writers.lowest_free({w: w for w in range(writers.WORKER_IDS)}) is None
    assert writers.WORKER_IDS == 1024


def test_each_log_has_its_own_registry_unless_one_is_set():
    assert writers.registry_topic(Settings()) == "social.events.writers"
    assert writers.registry_topic(Settings(), "other.log") == "other.log.writers"
    assert writers.registry_topic(Settings(writers_topic="my.writers"), "other.log") == "my.writers"


def test_the_registry_is_compacted_and_kept_forever():
    configs = writers.topic_configs(Settings())
    assert configs["cleanup.policy"] == "compact"
    assert configs["retention.ms"] == configs["retention.bytes"] == "-1"
    assert writers.topic_configs(Settings(profile="cluster"))["min.insync.replicas"] == "2"


def test_a_claim_names_its_writer():
    value = orjson.loads(writers.claim_value(42, "generator"))
    assert set(value) == {"worker_id", "kind", "pid", "host", "claimed_at"}
    assert value["worker_id"] == 42 and value["kind"] == "generator" and value["claimed_at"] > 0
