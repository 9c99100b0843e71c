"""No record stops the stream (issue 17): every poison class, and ~150 contract-valid extremes,
through the real stack (Kafka, the speed layer subprocess, Delta), and every record accounted for.

Poison classes, each with the outcome worked out by hand from the contract (docs/events.md):

1. the API poison request (``X-Device-Time: 9223372036854775807``, ``X-Sent-Time: 0``) is refused
   by the API (400 naming the header) and so never reaches the log; the same event written by a raw
   producer is quarantined ``bad_value:device_time`` instead of overflowing the corrected time;
2. a raw ``post_created`` with ``received_time`` = int64 max (or past year 9999) is quarantined
   ``bad_value:received_time`` before anything computes a date from it;
3. year-9999 device times are out of range (``bad_value``), and an in-range device time after the
   send time is outside the clock window (``clock_skew:device_time``);
7. a value that is not UTF-8 is quarantined ``not_utf8`` and the quarantine stays readable by
   pyarrow (its bytes kept as base64).

The test only uses ``speed_layer_factory(topic, namespace)``, ``.wait_caught_up()``,
``.proc.poll()`` and :func:`accounting`, the one place that reads the speed layer's output.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from pathlib import Path

import orjson
import pytest

import contract
from infra.settings import Settings

pytestmark = pytest.mark.integration

I64 = 2**63 - 1
MAX_MS = 4_102_444_799_999  # 2099-12-31T23:59:59.999Z, the contract's last millisecond
DAY = 86_400_000
SKEW, OFFLINE = DAY, 30 * DAY  # the contract's clock window (x-clock-window)


def accounting(settings: Settings, namespace: str) -> dict:
    """The speed layer's accounting so far, read from its Delta tables with pyarrow alone.

    ``totals``: events_read, applied, duplicates, quarantined summed over the ``batches`` table;
    ``reasons``: {(partition, offset): reason} of the ``quarantine`` table. Both tables are
    append-only, so their rows are the Parquet files the Delta log added (and never removed);
    reading them with pyarrow is itself the check that every text column is valid UTF-8.
    """
    import pyarrow.parquet as pq

    def rows(table: str) -> list[dict]:
        root = Path(settings.lake_dir) / namespace / table
        live: dict[str, None] = {}
        for commit in sorted((root / "_delta_log").glob("*.json")):
            for line in commit.read_text().splitlines():
                action = json.loads(line)
                if "add" in action:
                    live[action["add"]["path"]] = None
                elif "remove" in action:
                    live.pop(action["remove"]["path"], None)
        out: list[dict] = []
        for path in live:
            out += pq.read_table(root / path).to_pylist()
        return out

    totals = {k: 0 for k in ("events_read", "applied", "duplicates", "quarantined")}
    for row in rows("batches"):
        for k in totals:
            totals[k] += row[k]
    reasons = {(r["partition"], r["offset"]): r["reason"] for r in rows("quarantine")}
    return {"totals": totals, "reasons": reasons}


def _ev(etype: str, user_id: int, received: int, **fields) -> dict:
    return {
        "event_id": str(uuid.uuid4()),
        "type": etype,
        "schema_version": 1,
        "user_id": user_id,
        "device_time": received,
        "sent_time": received,
        "received_time": received,
        **fields,
    }


def _extremes(n: int, seed: int = 17) -> list[dict]:
    """``n`` contract-valid events built from the edges of every range (valid by construction)."""
    rng = random.Random(seed)
    ids = [1, 2, I64, I64 - 1, 2**62, 2**53 + 1]
    texts = ["", "😀" * 280, "é" * 280, "a\u0000b", "\u202eRTL\u200d", " ", "x" * 280, '"};\\']
    out = []
    for i in range(n):
        received = rng.choice([0, 1, DAY, MAX_MS, MAX_MS - 1, rng.randrange(0, MAX_MS + 1)])
        skew = rng.choice([0, SKEW, -SKEW, rng.randrange(-SKEW, SKEW + 1)])
        sent = received - skew if 0 <= received - skew <= MAX_MS else received
        held = min(rng.choice([0, OFFLINE, rng.randrange(0, OFFLINE + 1)]), sent, received)
        user = rng.choice(ids + [rng.randrange(1, I64 + 1)])
        other = rng.choice([x for x in ids if x != user])
        new_id = I64 - i if i % 2 else 1_000_000 + i  # an id reused by its owner is reused_id
        etype = rng.choice(
            ["user_registered", "status_updated", "followed", "unfollowed", "post_created", "message_sent"]
        )
        fields = {
            "user_registered": {
                "handle": rng.choice(["_" * 15, "A", "z9_"]),
                "display_name": rng.choice(["d" * 50, "😀" * 50, "é"]),
            },
            "status_updated": {"text": rng.choice(texts)},
            "followed": {"followee_id": other},
            "unfollowed": {"followee_id": other},
            "post_created": {"post_id": new_id, "text": rng.choice(texts)},
            "message_sent": {"message_id": new_id, "recipient_id": other, "text": rng.choice(texts)},
        }[etype]
        event = _ev(etype, user, received, **fields)
        event["event_id"] = f"fuzz-{i:04d}-" + "é" * (64 - 10)  # the longest event_id, unique
        event["sent_time"], event["device_time"] = sent, sent - held
        assert contract.validate(event) is None, event
        out.append(event)
    return out


def test_no_record_stops_the_stream_and_every_record_is_accounted_for(
    speed_layer_factory, topic_factory, kafka_stack
):
    from confluent_kafka import Producer

    from tests.integration.test_api import api_settings, start_api

    topic = topic_factory(partitions=4)
    namespace = f"poison-{uuid.uuid4().hex[:8]}"
    now = int(time.time() * 1000)

    # 1. the API refuses the poison request outright, naming the header; nothing is appended
    api = start_api(api_settings(kafka_stack.settings, topic))
    try:
        with api.client() as c:
            token = c.post("/v1/users", json={"handle": "poisoner", "display_name": "P"}).json()["token"]
            c.headers["Authorization"] = f"Bearer {token}"
            refused = c.post(
                "/v1/posts",
                json={"text": "from the far future"},
                headers={"X-Device-Time": str(I64), "X-Sent-Time": "0"},
            )
            year_9999 = c.post(
                "/v1/posts", json={"text": "pinned"}, headers={"X-Device-Time": "253402300799999"}
            )
    finally:
        api.stop()
    assert refused.status_code == 400 and "X-Device-Time" in refused.json()["detail"], refused.text
    assert year_9999.status_code == 400 and "X-Device-Time" in year_9999.json()["detail"], year_9999.text

    alice, bob = 1001, 1002
    reg_alice = _ev("user_registered", alice, now, handle="alice", display_name="Alice")
    post = _ev("post_created", alice, now, post_id=77, text="before the poison")
    # (label, key, value, expected outcome): "applied", "duplicate" or the quarantine reason
    wave1: list[tuple[str, bytes | None, bytes | None, str]] = [
        ("registration via the API", None, None, "applied"),  # counted from the API's own write
        ("alice registers", b"1001", orjson.dumps(reg_alice), "applied"),
        (
            "bob registers",
            b"1002",
            orjson.dumps(_ev("user_registered", bob, now, handle="bob", display_name="Bob")),
            "applied",
        ),
        ("bob follows alice", b"1002", orjson.dumps(_ev("followed", bob, now, followee_id=alice)), "applied"),
        ("alice posts", b"1001", orjson.dumps(post), "applied"),
        # issue 17 #1 written by a raw producer: device_time int64 max, sent_time 0
        (
            "API poison, raw",
            b"1001",
            orjson.dumps(
                _ev("post_created", alice, now, post_id=78, text="x") | {"device_time": I64, "sent_time": 0}
            ),
            "bad_value:device_time",
        ),
        # issue 17 #2: received_time int64 max, and just past year 9999
        (
            "received int64 max",
            b"1001",
            orjson.dumps(_ev("post_created", alice, now, post_id=79, text="x") | {"received_time": I64}),
            "bad_value:received_time",
        ),
        (
            "received year 10000",
            b"1001",
            orjson.dumps(
                _ev("post_created", alice, now, post_id=80, text="x") | {"received_time": 253_402_300_800_000}
            ),
            "bad_value:received_time",
        ),
        # issue 17 #3: year-9999 device times; an in-range device time ahead of its send time
        (
            "device year 9999",
            b"1001",
            orjson.dumps(
                _ev("post_created", alice, now, post_id=81, text="x") | {"device_time": 253_402_300_799_999}
            ),
            "bad_value:device_time",
        ),
        (
            "sent year 9999",
            b"1002",
            orjson.dumps(
                _ev("status_updated", bob, now, text="x")
                | {"sent_time": 253_402_300_799_999, "device_time": 253_402_300_799_999}
            ),
            "bad_value:device_time",
        ),
        (
            "sent int64 max",
            b"1002",
            orjson.dumps(_ev("status_updated", bob, now, text="x") | {"sent_time": I64}),
            "bad_value:sent_time",
        ),
        (
            "device after sent",
            b"1001",
            orjson.dumps(_ev("post_created", alice, now, post_id=82, text="x") | {"device_time": MAX_MS}),
            "clock_skew:device_time",
        ),
        (
            "sent 2 days ahead",
            b"1001",
            orjson.dumps(
                _ev("post_created", alice, now, post_id=83, text="x")
                | {"sent_time": now + 2 * DAY, "device_time": now + 2 * DAY}
            ),
            "clock_skew:sent_time",
        ),
        (
            "held 31 days",
            b"1001",
            orjson.dumps(
                _ev("post_created", alice, now, post_id=84, text="x") | {"device_time": now - 31 * DAY}
            ),
            "clock_skew:device_time",
        ),
        (
            "device beyond int64",
            b"1001",
            orjson.dumps(_ev("post_created", alice, now, post_id=85, text="x")).replace(
                f'"device_time":{now}'.encode(), b'"device_time":9223372036854775808'
            ),
            "mistyped_field:device_time",
        ),
        (
            "received negative",
            b"1001",
            orjson.dumps(_ev("post_created", alice, now, post_id=86, text="x") | {"received_time": -1}),
            "bad_value:received_time",
        ),
        # issue 17 #7: bytes that are not UTF-8, in the value and in the key
        ("latin-1 value", b"1001", b'{"type": "post_created", "text": "caf\xe9"}', "not_utf8"),
        ("binary value", b"\xff\xfe", b"\xff\xfe\x00\x80", "not_utf8"),
        ("binary key, bad json", b"\xc3\x28", b"{not json", "bad_json"),
        ("empty value", b"1001", b"", "bad_json"),
        (
            "stateful: bob deletes alice's post",
            b"1002",
            orjson.dumps(_ev("post_deleted", bob, now, post_id=77)),
            "not_own_post",
        ),
        ("alice registers again (same record)", b"1001", orjson.dumps(reg_alice), "duplicate"),
    ]
    wave1 += [
        (f"extreme {i}", contract.record_key(e), orjson.dumps(e), "applied")
        for i, e in enumerate(_extremes(120))
    ]
    wave2 = [
        (
            "alice posts after the poison",
            b"1001",
            orjson.dumps(_ev("post_created", alice, now + 1, post_id=90, text="after")),
            "applied",
        ),
        (
            "received int64 max again",
            b"1002",
            orjson.dumps(_ev("status_updated", bob, now, text="x") | {"received_time": I64}),
            "bad_value:received_time",
        ),
        (
            "bob's status after the poison",
            b"1002",
            orjson.dumps(_ev("status_updated", bob, now + 2, text="still here")),
            "applied",
        ),
    ]

    producer = Producer(
        {"bootstrap.servers": kafka_stack.settings.kafka_bootstrap, "enable.idempotence": True}
    )
    positions: dict[tuple[int, int], str] = {}

    def produce(records) -> None:
        for label, key, value, expected in records:
            if value is None:
                continue

            def done(err, msg, label=label, expected=expected):
                assert err is None, err
                positions[(msg.partition(), msg.offset())] = expected

            producer.produce(topic, value, key, on_delivery=done)
            producer.flush(30)  # one at a time: the log order is the list order
        assert producer.flush(30) == 0

    produce(wave1)
    sl = speed_layer_factory(topic=topic, namespace=namespace)
    sl.wait_caught_up(timeout=300)
    assert sl.proc.poll() is None, "the speed layer stopped on a poison record"
    produce(wave2)
    sl.wait_caught_up(timeout=300)
    assert sl.proc.poll() is None, "the speed layer stopped on a poison record"

    expected = [e for *_, e in wave1 + wave2]
    got = accounting(kafka_stack.settings, namespace)
    totals = got["totals"]
    reasons = [e for e in expected if e not in ("applied", "duplicate")]
    # every quarantined record is there with the reason worked out above, at its log position
    assert got["reasons"] == {pos: e for pos, e in positions.items() if e not in ("applied", "duplicate")}
    assert totals == {
        "events_read": len(expected),  # 1 API registration + 22 hand-made + 120 extremes + 3
        "applied": expected.count("applied"),
        "duplicates": expected.count("duplicate"),
        "quarantined": len(reasons),
    }
    assert totals["events_read"] == totals["applied"] + totals["duplicates"] + totals["quarantined"]
    # both positions are visible to Kafka's own tools as consumer-group offsets (the archiver
    # commits them when they move): the speed layer's fences and the archive's end, the log's end
    from confluent_kafka import Consumer, TopicPartition

    from infra.stack import end_offsets
    from pipelines.speed.stream import consumer_group

    ends = end_offsets(kafka_stack.settings, topic)
    for role in ("speed-layer", "archiver"):
        c = Consumer(
            {"bootstrap.servers": kafka_stack.bootstrap, "group.id": consumer_group(namespace, role)}
        )
        try:
            got = c.committed([TopicPartition(topic, p) for p in ends], timeout=30)
        finally:
            c.close()
        committed = {tp.partition: tp.offset for tp in got}
        assert {p: committed[p] for p, o in ends.items() if o} == {p: o for p, o in ends.items() if o}, role
