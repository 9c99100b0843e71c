"""The partitioned layout's call protocol and its guards, against a real redis-server.

One schema (``contract/redis_functions/protocol.json``) is read by the Python encoder and
substituted into the Lua library when it is loaded: these tests check that what the encoder sends
is what the library decodes, name by name, for every event type (the expected names worked out by
hand from docs/events.md, not from the encoder), and that a call or a delivery the library cannot
apply is refused or quarantined with its reason, never dropped.
"""

from __future__ import annotations

import json
import uuid

import pytest
import redis

from contract import functions
from pipelines.speed.partitioned import PartitionedProcessor, encode
from pipelines.speed.processor import ProcessorConfig
from tests.unit.events import T0, ev


def _decode(r: redis.Redis, *records) -> list[dict]:
    args = [
        a
        for offset, e in records
        for a in encode(offset, json.dumps(e).encode() if isinstance(e, dict) else e)
    ]
    out = []
    for flat in r.fcall_ro("p_decode", 0, *args):
        flat = [v.decode() for v in flat]
        out.append(dict(zip(flat[::2], flat[1::2], strict=True)))
    return out


COMMON = {"event_id", "user", "received_time", "event_time", "offset", "type"}

CASES = [
    (
        ev("user_registered", 7, 0, handle="ann", display_name="Ann A."),
        {"user": "7", "handle": "ann", "display_name": "Ann A."},
    ),
    (ev("status_updated", 7, 0, text="héllo ✓"), {"user": "7", "text": "héllo ✓"}),
    (ev("followed", 7, 0, followee_id=9), {"user": "7", "followee": "9"}),
    (ev("unfollowed", 7, 0, followee_id=9), {"user": "7", "followee": "9"}),
    (ev("post_created", 7, 0, post_id=2**62, text=""), {"user": "7", "post_id": str(2**62), "text": ""}),
    (ev("post_deleted", 7, 0, post_id=5), {"user": "7", "post_id": "5"}),
    # keyed by the recipient: the inbox's owner is the user, the author is the sender
    (
        ev("message_sent", 7, 0, message_id=11, recipient_id=8, text="m"),
        {"user": "8", "sender": "7", "message_id": "11", "text": "m"},
    ),
    (ev("message_read", 8, 0, message_id=11), {"user": "8", "message_id": "11"}),
    (ev("user_erased", 7, 0), {"user": "7"}),
]


@pytest.mark.parametrize("event,fields", CASES, ids=[c[0]["type"] for c in CASES])
def test_every_event_type_is_decoded_by_name_as_the_contract_means_it(redis_url, event, fields):
    r = redis.Redis.from_url(redis_url)
    functions.ensure_partitioned_loaded(r)
    (got,) = _decode(r, (41, event))
    want = {
        "offset": "41",
        "type": event["type"],
        "event_id": event["event_id"],
        "received_time": str(T0),
        "event_time": str(T0),
        **fields,
    }
    assert got == want


def test_a_record_the_contract_rejects_travels_with_its_reason_and_the_next_one_still_decodes(redis_url):
    r = redis.Redis.from_url(redis_url)
    functions.ensure_partitioned_loaded(r)
    got = _decode(r, (1, b'{"type": "post_created", '), (2, None), (3, ev("followed", 7, 0, followee_id=9)))
    assert got[0] == {"offset": "1", "type": "!", "reason": "bad_json"}
    assert got[1] == {"offset": "2", "type": "!", "reason": "bad_json"}
    assert got[2]["followee"] == "9" and got[2]["offset"] == "3"


def test_the_protocol_in_redis_is_the_one_in_the_repository(redis_url):
    r = redis.Redis.from_url(redis_url)
    functions.ensure_partitioned_loaded(r)
    assert r.fcall_ro("p_version", 0).decode() == functions.partitioned_version()
    # the version names the protocol: a changed schema is a different library
    assert functions.partitioned_version().split("-")[1] in functions.partitioned_source()


def _proc(url, ns, partitions=2, record_freshness=False):
    cfg = ProcessorConfig(
        redis_url=url, namespace=ns, timeline_length=3, fanout_threshold=5, record_freshness=record_freshness
    )
    return PartitionedProcessor(cfg, partitions)


def test_a_call_routed_by_another_partitions_key_is_refused(redis_url):
    ns = f"t{uuid.uuid4().hex[:8]}"
    proc = _proc(redis_url, ns)
    head = proc._head("apply", partition=0)
    with pytest.raises(redis.ResponseError, match="protocol: key"):
        proc.r.fcall("p_apply", 1, functions.pkey(ns, 1, "fence"), *head)


def test_every_key_a_call_writes_is_in_its_partitions_slot(redis_url):
    """The layout that shards: after a log with cross-partition follows, posts, deletes, messages
    and an erasure, every key of the namespace carries one partition's hash tag."""
    ns = f"t{uuid.uuid4().hex[:8]}"
    proc = _proc(redis_url, ns)
    logs = {
        0: [
            ev("followed", 2, 0, followee_id=1),
            ev("message_sent", 1, 1, message_id=3, recipient_id=2, text="x"),
            ev("post_created", 2, 2, post_id=9, text="b"),
        ],
        1: [
            ev("post_created", 1, 0, post_id=5, text="a"),
            ev("post_deleted", 1, 3, post_id=5),
            ev("user_erased", 1, 4),
        ],
    }
    for p, events in logs.items():
        proc.process(p, [(o, json.dumps(e).encode()) for o, e in enumerate(events)])
    proc.settle()
    keys = [k.decode() for k in proc.r.scan_iter(match=f"{ns}:*")]
    assert keys
    assert all(k.startswith((f"{ns}:{{0}}:", f"{ns}:{{1}}:")) for k in keys), keys


def test_restore_rows_are_named_and_routed_by_their_partition(redis_url):
    """``p_restore`` (pipelines/restore.py) writes each kind of row the protocol names, by name, over
    its own partition's keys only; an unknown kind, a wrong width or another partition's key is
    refused with the reason."""
    ns = f"t{uuid.uuid4().hex[:8]}"
    r = redis.Redis.from_url(redis_url)
    functions.ensure_partitioned_loaded(r)
    fence = functions.pkey(ns, 3, "fence")
    rows = functions.protocol()["restore_rows"]
    # worked by hand: user 7 (partition 3) follows 9, wrote post 5, got message 11 from 8, read it
    assert r.fcall("p_restore", 1, fence, ns, 3, "U", 3, "7", "ann", "Ann") == 1
    assert r.fcall("p_restore", 1, fence, ns, 3, "F", 2, "7", "9") == 1
    assert r.fcall("p_restore", 1, fence, ns, 3, "P", 5, "7", "5", str(T0), "hi", "0") == 1
    assert r.fcall("p_restore", 1, fence, ns, 3, "I", 6, "7", "11", "8", "m", str(T0), "1") == 1
    assert r.fcall("p_restore", 1, fence, ns, 3, "Z", 2, "3", "40", "0", "12") == 2
    assert r.fcall("p_restore", 1, fence, ns, 3, "Y", 1, "40") == 1
    k = lambda *parts: functions.pkey(ns, 3, *parts)  # noqa: E731
    assert json.loads(r.hget(k("users"), "7")) == {"handle": "ann", "display_name": "Ann"}
    assert r.smembers(k("following", 7)) == {b"9"} and r.smembers(k("lfol", 9)) == {b"7"}
    assert r.zrange(k("posts", 7), 0, -1, withscores=True) == [(b"0" * 18 + b"5", float(T0))]
    assert json.loads(r.get(k("b", "0" * 18 + "5" + "0" * 18 + "7")))["text"] == "hi"
    assert json.loads(r.hget(k("msgs", 7), "11"))["sender_id"] == 8 and r.hget(k("msgs", 7), "11:r") == b"1"
    assert r.smembers(k("sent", 8)) == {b"7:11"}
    assert r.get(k("fence")) == b"40" and r.hgetall(k("dfence")) == {b"3": b"40", b"0": b"12"}
    assert r.xlen(k("marks")) == 1  # complete at its fence: the archiver's cut to go on from
    # writer 3's dedup state (R = 4): highest seq 10; of 7..10 arrived 7, 9 and 10 (3 is below the
    # window); the window holds seq s at byte s mod 4: 8 (0), 9 (1), 10 (1), 7 (1)
    assert r.fcall("p_restore", 1, fence, ns, 3, "W", 5, "3", "10", str(T0), "4", "7 9 10 3") == 1
    assert r.hget(k("dq"), "3") == f"10:{T0}:0111".encode() and r.zscore(k("dqt"), "3") == T0
    assert all(key.decode().startswith(f"{ns}:{{3}}:") for key in r.scan_iter(match=f"{ns}:*"))
    with pytest.raises(redis.ResponseError, match="protocol: restore rows V"):
        r.fcall("p_restore", 1, fence, ns, 3, "V", 1, "7")
    with pytest.raises(redis.ResponseError, match="protocol: restore rows U of 2"):
        r.fcall("p_restore", 1, fence, ns, 3, "U", 2, "7", "ann")
    with pytest.raises(redis.ResponseError, match="protocol: key"):
        r.fcall("p_restore", 1, functions.pkey(ns, 2, "fence"), ns, 3, "U", 3, "7", "ann", "Ann")
    assert set(rows) == set("USFCPRTINEGDWHXZY")


def test_a_delivery_the_library_cannot_apply_is_quarantined_and_counted(redis_url):
    ns = f"t{uuid.uuid4().hex[:8]}"
    proc = _proc(redis_url, ns)
    head = proc._head("deliver", partition=0)
    fence = functions.pkey(ns, 0, "fence")
    # one segment (source 1, up to offset 8, 3 deliveries): an unknown kind, a known kind with the
    # wrong number of fields, and one that applies
    segment = [1, 8, 3, 5, "repost", 2, "1", "2", 6, "post", 1, "1", 7, "erase", 1, "42"]
    got = proc.r.fcall("p_deliver", 1, fence, *head, *segment)
    assert got == [1, 0, 2]
    dlq = proc.r.xrange(functions.pkey(ns, 0, "dlq"))
    assert [(f[b"offset"], f[b"kind"]) for _, f in dlq] == [(b"5", b"repost"), (b"6", b"post")]
    assert b"unexpected delivery repost" in dlq[0][1][b"reason"]
    assert proc.r.hget(functions.pkey(ns, 0, "stats"), "deliveries_quarantined") == b"2"
    assert proc.r.hget(functions.pkey(ns, 0, "dfence"), "1") == b"8"
    # the fence: the same deliveries again change nothing
    assert proc.r.fcall("p_deliver", 1, fence, *head, 1, 8, 1, 7, "erase", 1, "42") == [0, 1, 0]


def test_freshness_counts_each_record_once_when_its_deliveries_are_in(redis_url):
    """Received -> visible everywhere: a record is in its partition's histogram after the pump
    that delivered it, once (a batch run again after a crash is skipped by the fence and not
    counted again); a record the contract rejects is not an event and is not counted."""
    ns = f"t{uuid.uuid4().hex[:8]}"
    proc = _proc(redis_url, ns, record_freshness=True)
    records = [(o, json.dumps(ev("post_created", 1, o, post_id=o + 1, text="p")).encode()) for o in range(4)]
    records.append((4, b"{not json"))
    key = functions.pkey(ns, 1, "freshness")
    proc.process(1, records)
    assert proc.r.hgetall(key) == {}  # applied, not yet delivered
    proc.pump([1])
    proc.process(1, records)  # the same batch again: the fence skips every record
    proc.pump([1])
    assert sum(int(n) for n in proc.r.hgetall(key).values()) == 4
    # the records' receive times are T0 (2026 in the simulated clock): past the cap, last bucket
    assert list(proc.r.hgetall(key)) == [b"12000"]
