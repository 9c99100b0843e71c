"""The dual-write experiment's truth and divergence counting, on hand-made logs and stores.

The stores live in a real redis-server (started here, on a free port, in a temporary folder),
written with the serving store's key layout (contract/serving.py) and read as the API reads them
(timelines through ``social_timeline``); every expected figure below is worked out by hand from
docs/views.md. The last test folds generated logs through the speed layer's own Redis functions
at several fan-out thresholds: the log design's store shows no divergence at any of them.
"""

from __future__ import annotations

import json
import socket

import pytest
import redis

from app_sim.api.dual_write import FAULTS
from stories.dual_write import (
    METRICS,
    attribute,
    divergences,
    fold,
    read_journal,
    read_store,
    scaled,
    sweep_by_fault,
)

PAD = 19


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def r(tmp_path_factory):
    from infra.settings import get_settings
    from infra.stack import RedisServer

    settings = get_settings(redis_port=_free_port(), var_dir=tmp_path_factory.mktemp("redis-var"))
    server = RedisServer(settings)
    server.start()
    client = redis.Redis(port=settings.redis_port, decode_responses=True)
    yield client
    client.close()
    server.stop()


def ev(n: int, kind: str, user: int, **fields) -> dict:
    return {
        "event_id": f"e{n}",
        "type": kind,
        "schema_version": 1,
        "user_id": user,
        "device_time": fields.pop("t", 1000 + n),
        "sent_time": 1000 + n,
        "received_time": 1000 + n,
        **fields,
    }


LOG = [
    ev(1, "user_registered", 1, handle="a", display_name="A"),
    ev(2, "user_registered", 2, handle="b", display_name="B"),
    ev(3, "user_registered", 3, handle="c", display_name="C"),
    ev(4, "followed", 1, followee_id=2),
    ev(5, "post_created", 2, post_id=100, text="x"),
    ev(6, "post_created", 1, post_id=101, text="y"),
    ev(7, "message_sent", 2, recipient_id=1, message_id=500, text="hi"),
    ev(8, "message_sent", 3, recipient_id=1, message_id=501, text="yo"),
    ev(9, "message_read", 1, message_id=500),
    ev(10, "status_updated", 1, text="a"),
    ev(11, "status_updated", 1, text="b"),
    {**ev(8, "message_sent", 3, recipient_id=1, message_id=501, text="yo"), "received_time": 2000},  # a retry
    ev(13, "message_read", 3, message_id=999),  # not in u3's inbox: no effect
    ev(14, "post_created", 3, post_id=102, text="z"),
    ev(15, "post_deleted", 3, post_id=102),
    ev(16, "post_deleted", 1, post_id=100),  # someone else's post: no effect
]


def test_fold_follows_the_spec():
    t = fold(LOG)
    assert (t.events, t.duplicates, t.no_effect) == (16, 1, 2)
    assert t.users == {1, 2, 3}
    # u1: own post 101 and 100 of followee 2; u2: own 100; u3: 102 deleted
    assert t.timeline == {1: {(2, 100), (1, 101)}, 2: {(2, 100)}, 3: set()}  # (author, post)
    assert t.inbox == {1: {500: True, 501: False}}
    assert t.status == {1: "b"}


def test_fold_keeps_the_latest_n_by_corrected_time():
    log = [
        ev(1, "user_registered", 1, handle="a", display_name="A"),
        ev(2, "post_created", 1, post_id=7, text="old", t=10),
        ev(3, "post_created", 1, post_id=5, text="new", t=30),
        ev(4, "post_created", 1, post_id=6, text="new, higher id", t=30),
    ]
    # newest first: (30, 6), (30, 5), (10, 7); N = 2 keeps the two at t=30
    assert fold(log, timeline_length=2).timeline[1] == {(1, 5), (1, 6)}


def write(r, ns: str, unread: dict, msgs: dict, tl: dict, status: dict) -> None:
    for key in r.scan_iter(f"{ns}:*"):
        r.delete(key)
    if unread:
        r.hset(f"{ns}:unread", mapping=unread)
    for u, messages in msgs.items():
        for mid, read in messages.items():
            body = {"message_id": mid, "sender_id": 9, "text": "t", "event_time": 1, "read": read}
            r.hset(f"{ns}:msgs:{u}", mid, json.dumps(body))
            r.zadd(f"{ns}:inbox:{u}", {str(mid).zfill(PAD): 1})
    for u, posts in tl.items():  # (author, post): a member is the post id then the author's
        r.zadd(f"{ns}:tl:{u}", {str(p).zfill(PAD) + str(a).zfill(PAD): p for a, p in posts})
        for a, p in posts:
            body = {"post_id": p, "author_id": a, "text": "t", "event_time": p}
            r.set(f"{ns}:p:{a}:{p}", json.dumps(body))
    for u, text in status.items():
        r.hset(f"{ns}:status", u, json.dumps({"text": text, "event_time": 1}))


def test_a_store_equal_to_the_log_has_no_divergence(r):
    write(
        r,
        "same",
        unread={1: 1, 2: 0},
        msgs={1: {500: True, 501: False}},
        tl={1: [(2, 100), (1, 101)], 2: [(2, 100)]},
        status={1: "b"},
    )
    found = divergences(read_store(r, "same", {1, 2, 3}), fold(LOG))
    assert {m: len(v) for m, v in found.items()} == dict.fromkeys(found, 0)


def test_each_kind_of_divergence_is_counted(r):
    write(
        r,
        "t",
        unread={1: 2, 3: 1},  # u1 has 1 unread message in the store's inbox, u3 none
        msgs={1: {500: True, 502: False}},  # 501 missing, 502 extra
        tl={1: [(1, 101), (3, 102)], 2: [(2, 100)]},  # u1: 100 missing, 102 (deleted) extra
        status={1: "a", 2: "x"},  # u1's last is "b"; u2 never set one
    )
    # another namespace whose name starts the same must not be read
    write(r, "t-replayed", unread={1: 5}, msgs={1: {777: False}}, tl={1: [(1, 777)]}, status={1: "zz"})
    found = divergences(read_store(r, "t", {1, 2, 3}), fold(LOG))
    assert found == {
        "counter_mismatch_users": [1, 3],
        "inbox_missing": [(1, 501)],
        "inbox_extra": [(1, 502)],
        "timeline_missing": [(1, (2, 100))],
        "timeline_extra": [(1, (3, 102))],
        "status_not_last": [1, 2],
    }

    journal = [
        {"fault": "race", "type": "message_sent", "user_id": 2, "recipient_id": 1, "message_id": 500},
        {"fault": "store_fail", "type": "post_created", "user_id": 3, "post_id": 102},
        {"fault": "timeout", "type": "status_updated", "user_id": 1},
        {"fault": "crash", "type": "followed", "user_id": 1, "followee_id": 2},
    ]
    by_fault = attribute(found, journal)
    nonzero = {f: {m: n for m, n in counts.items() if n} for f, counts in by_fault.items()}
    assert nonzero == {
        "race": {"counter_mismatch_users": 1, "inbox_missing": 1, "inbox_extra": 1},  # u1's inbox
        "crash": {"timeline_missing": 1, "timeline_extra": 1},  # u1's follow touches u1's timeline
        "store_fail": {"timeline_extra": 1},  # post 102
        "timeout": {"status_not_last": 1},  # u1's status
        "unattributed": {"counter_mismatch_users": 1, "status_not_last": 1},  # u3's counter, u2's status
    }


def test_the_journal_of_one_run_is_its_mode_within_its_window(r):
    from app_sim.api.dual_write import journal_key

    r.delete(journal_key("jt"))
    for at, mode, fault in (
        (100, "dual", "race"),
        (200, "log", "race"),
        (300, "dual", "crash"),
        (401, "dual", "timeout"),
    ):
        r.rpush(journal_key("jt"), json.dumps({"fault": fault, "mode": mode, "at": at}))
    got = read_journal(r, "jt", "dual", (100, 400))
    assert [(j["at"], j["fault"]) for j in got] == [(100, "race"), (300, "crash")]  # bounds included
    assert len(read_journal(r, "jt")) == 4


def test_the_sweep_pairs_each_faults_rate_with_what_it_touched_and_the_logs_total():
    def point(scale, mode, writes, by_fault, total):
        return {
            "scale": scale,
            "mode": mode,
            "permille": {f: int(10 * scale) for f in FAULTS},
            "writes": writes,
            "faults_injected": dict.fromkeys(FAULTS, int(2 * scale)),
            "total": total,
            "by_fault": {**dict.fromkeys(FAULTS, 0), **by_fault},
        }

    report = {
        "sweep": {
            "points": [
                point(2, "dual", 400, {"race": 8, "timeout": 1}, 9),  # out of order on purpose
                point(0, "dual", 500, {"unattributed": 1}, 1),
                point(0, "log", 500, {}, 0),
                point(2, "log", 400, {}, 0),
            ]
        }
    }
    curves = sweep_by_fault(report)
    assert curves["race"] == [
        {"scale": 0, "permille": 0, "injected": 0, "dual_writes": 500, "dual": 0,
         "dual_per_1000_writes": 0.0, "log_total": 0, "log_writes": 500},
        {"scale": 2, "permille": 20, "injected": 4, "dual_writes": 400, "dual": 8,
         "dual_per_1000_writes": 20.0, "log_total": 0, "log_writes": 400},
    ]  # fmt: skip
    assert [c["dual"] for c in curves["timeout"]] == [0, 1]


def test_the_sweep_scales_every_rate_but_crash_beyond_its_own():
    rates = {"crash": 5, "race": 150, "timeout": 15, "store_fail": 20}
    assert scaled(rates, 0) == dict.fromkeys(rates, 0)
    assert scaled(rates, 3) == {"crash": 5, "race": 450, "timeout": 45, "store_fail": 60}
    assert scaled(rates, 0.5) == {"crash": 2, "race": 75, "timeout": 8, "store_fail": 10}  # half-even
    assert scaled({"race": 400}, 3) == {"race": 1000}  # a per-mille rate


@pytest.mark.parametrize("threshold", [0, 1, 3, 10, 10_000])
def test_the_log_designs_store_shows_no_divergence_at_any_fan_out_threshold(r, threshold):
    """The speed layer's own Redis functions fold a generated log (posts, deletes, follows and
    unfollows, messages and reads, duplicates, offline devices); the store, read as the API reads
    it (stored timelines merged with followed authors above the threshold at read time), equals
    the independent fold at every threshold: from everyone fanned out (10,000) to no one (0)."""
    from collections import defaultdict

    import contract
    from app_sim.generator import GeneratorConfig, generate
    from pipelines.speed.processor import Processor, ProcessorConfig

    n = 6  # a short timeline, so truncation and the refill from the slack are exercised too
    users = 25
    records = [
        ev
        for _key, ev, injected in generate(
            3_000, GeneratorConfig(users=users, seed=11, mean_followers=8, duplicate_share=0.02)
        )
        if injected in (None, "duplicate")
    ]
    ns = f"fanout{threshold}"
    for key in r.scan_iter(f"{ns}:*"):
        r.delete(key)
    url = f"redis://127.0.0.1:{r.connection_pool.connection_kwargs['port']}/0"
    proc = Processor(
        ProcessorConfig(
            redis_url=url, namespace=ns, timeline_length=n, timeline_slack=3, fanout_threshold=threshold
        )
    )
    per_partition: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
    for e in records:
        p = int(contract.record_key(e)) % 4
        per_partition[p].append((len(per_partition[p]), json.dumps(e).encode()))
    for p, recs in per_partition.items():
        for i in range(0, len(recs), 500):  # batches, as micro-batches would cut them
            proc.process(p, recs[i : i + 500])
    truth = fold(records, timeline_length=n)
    assert truth.duplicates > 0 and any(truth.timeline.values())
    celebs = r.scard(f"{ns}:celebs")
    assert (celebs > 0) == (threshold < 10_000), celebs  # the merge at read time is exercised
    found = divergences(read_store(r, ns, truth.users, n), truth, only=truth.users)
    assert {m: found[m] for m in METRICS if found[m]} == {}
