"""Property-based differential test, Redis part: (a) the speed layer against (d) the specification.

(a) is the real processor and Redis functions (:class:`pipelines.speed.processor.Processor`)
against a redis-server started for this module; (d) is :mod:`tests.spec.views`, docs/views.md
written out in plain Python. Hypothesis draws a log from the grammar of hostile logs
(:mod:`tests.spec.logs`), random micro-batch boundaries, cross-partition interleavings, group
sizes (events per FCALL), re-runs of a batch (the fence skips them), N, the slack and the fan-out
threshold; after a random subset of the cuts, and at the end, the views as users read them
(timelines through ``social_timeline``, inbox with read states, unread, status, follows, users),
every record's disposition and reason, and the accounting must equal the specification's over
the same log prefix.

``SOCIAL_PROPERTY_EXAMPLES`` sets the examples per property (CI default below; ``make
test-properties`` runs a soak). Each class of the grammar also has a named test with an explicit
log, and every minimal failing example Hypothesis found is a named regression test below.
The Spark side, (b) the replay and (c) the batch layer, is tests/integration/test_properties.py.
"""

from __future__ import annotations

import os
import uuid

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infra import clients
from tests.spec import harness
from tests.spec import views as spec
from tests.spec.logs import GRACE_MS, MAX_OFFLINE, MAX_SKEW, REORDER, T0, WINDOW_MS, Log, Rec, logs

EXAMPLES = int(os.environ.get("SOCIAL_PROPERTY_EXAMPLES", "150"))
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)


# ------------------------------------------------------------------------------------------------
# Running (a) and comparing it with (d)
# ------------------------------------------------------------------------------------------------
def compare_at(url: str, ns: str, log: Log, n: int, upto: dict[int, int], label: str) -> list[str]:
    want = harness.expected(log, n, upto)
    client = clients.redis_client(url)
    parts = range(log.partitions)
    problems = harness.diff_views(
        harness.spec_views(want, log.users), harness.redis_views(url, ns, log.users, n), label
    )
    problems += harness.diff_dispositions(
        want.dispositions, harness.redis_dispositions(client, ns, parts), label
    )
    problems += harness.diff_accounting(want.accounting(), harness.redis_accounting(client, ns, parts), label)
    problems += changelog_vs_timelines(client, ns, parts, log.users, label)
    return problems


def changelog_vs_timelines(client: redis.Redis, ns: str, parts, users, label: str) -> list[str]:
    """The changelog's rule (pipelines/speed/changelog.py): the last timeline change per (user,
    member) in (s, position in the entry) order, over every entry so far, is ``tl:<user>`` as Redis
    holds it, slack included (what the compaction archives and a restore loads back). Folded here
    in a few lines of its own, sharing no code with the compaction."""
    entries = []
    for p in parts:
        for _id, f in client.xrange(f"{ns}:changelog:{p}"):
            entries.append((int(f[b"s"]), f.get(b"t", b"").decode()))
    folded: dict[tuple[int, str], int | None] = {}
    for _s, t in sorted(entries):
        for item in filter(None, t.split(",")):
            if item[0] == "+":
                member, score, who = item[1:].split(":")
                for u in who.split(" "):
                    folded[int(u), member] = int(score)
            elif item[0] == "~":  # the user's timeline dropped every entry below (score, member)
                member, score, who = item[1:].split(":")
                bound, u = (int(score), member), int(who)
                for (v, m), sc in list(folded.items()):
                    if v == u and sc is not None and (sc, m) < bound:
                        folded[v, m] = None
            else:
                member, who = item[1:].split(":")
                for u in who.split(" "):
                    folded[int(u), member] = None
    out = []
    for u in sorted(users):
        want = {m: sc for (v, m), sc in folded.items() if v == u and sc is not None}
        got = {m.decode(): int(sc) for m, sc in client.zrange(f"{ns}:tl:{u}", 0, -1, withscores=True)}
        if want != got:
            out.append(
                f"{label}changelog folded for tl:{u} {sorted(want.items())} != Redis {sorted(got.items())}"
            )
    return out


class KeyedEngine:
    """(a) in the keyed layout: one ``social_apply`` call per group; nothing to deliver."""

    name = "keyed"

    def __init__(self, cfg, log: Log):
        from pipelines.speed.processor import Processor

        self.proc = Processor(cfg)
        self.url, self.ns = cfg.redis_url, cfg.namespace

    def process(self, p, recs):
        self.proc.process(p, recs)

    def deliver(self, source, target, limit, replay):
        pass

    def settle(self):
        pass

    def compare(self, log: Log, n: int, upto: dict[int, int], label: str) -> list[str]:
        return compare_at(self.url, self.ns, log, n, upto, label)


class PartitionedEngine:
    """(a) in the partitioned layout: ``p_apply`` per partition, and the deliveries between
    partitions as the schedule says (late, partial, applied again); a cut is compared once every
    delivery caused below it is applied (docs/architecture.md, "The partitioned layout")."""

    name = "partitioned"

    def __init__(self, cfg, log: Log):
        from pipelines.speed.partitioned import PartitionedProcessor

        self.proc = PartitionedProcessor(cfg, log.partitions)
        self.url, self.ns = cfg.redis_url, cfg.namespace
        self.part_of = user_partitions(log)

    def process(self, p, recs):
        self.proc.process(p, recs)

    def deliver(self, source, target, limit, replay):
        self.proc.deliver(source, target, limit, replay)

    def settle(self):
        self.proc.settle()

    def archive_at_the_newest_cut(
        self, log: Log, label: str, expect: dict[int, int] | None = None
    ) -> list[str]:
        """The archiver's cut (the newest position every partition's state was at) and what the
        archive holds there: the changelog entries caused below it, folded, against the spec."""
        from pipelines.speed.changelog import SettledCuts

        client = clients.redis_client(self.url)
        parts = range(log.partitions)
        cut = SettledCuts(client, self.ns, log.partitions)().fences
        if expect is not None and cut != {p: expect.get(p, 0) for p in parts}:
            return [f"{label}the newest settled cut is {cut}, not the settled fences {expect}"]
        got, unread = harness.partitioned_archive(client, self.ns, parts, cut)
        return harness.diff_archive(harness.expected(log, 0, cut), got, unread, f"{label}at the cut {cut}: ")

    def compare(self, log: Log, n: int, upto: dict[int, int], label: str) -> list[str]:
        problems = self.archive_at_the_newest_cut(log, label)
        self.settle()
        problems += self.archive_at_the_newest_cut(log, label, expect=upto)
        want = harness.expected(log, n, upto)
        client = clients.redis_client(self.url)
        parts = range(log.partitions)
        problems += harness.diff_views(
            harness.spec_views(want, log.users),
            harness.partitioned_views(self.url, self.ns, log.users, n, lambda u: self.part_of.get(u, 0)),
            label,
        )
        problems += harness.diff_dispositions(
            want.dispositions, harness.partitioned_dispositions(client, self.ns, parts), label
        )
        problems += harness.diff_accounting(
            want.accounting(), harness.partitioned_accounting(client, self.ns, parts), label
        )
        for p in parts:
            if client.xlen(f"{self.ns}:{{{p}}}:dlq"):
                problems.append(
                    f"{label}deliveries quarantined in partition {p}: {client.xrange(f'{self.ns}:{{{p}}}:dlq')}"
                )
        return problems


ENGINES = {"keyed": KeyedEngine, "partitioned": PartitionedEngine}


def user_partitions(log: Log) -> dict[int, int]:
    """The partition each user's records are in (the contract's partition key)."""
    return {int(r.key): r.partition for r in log.records if r.key.isdigit()}


def run_and_compare(
    url: str, log: Log, *, n: int, t: int, s: int, group: int, schedule, checks=None, engine: str = "keyed"
) -> None:
    """Apply ``log`` with ``schedule`` and compare with the specification after the cuts ``checks``
    says (a function of the step number; default: every step) and at the end. A step is
    ``(partition, records, rerun)``: the partition's next records, then (``rerun`` > 0) the batch
    again from ``rerun`` records before it, as after a crash (the fence skips them); or
    ``("d", source, target, limit, replay)``: at most ``limit`` of the source's deliveries the
    target has not applied, after ``replay`` it had applied already (the partitioned layout)."""
    from contract import functions
    from pipelines.speed.processor import ProcessorConfig

    ns = f"prop{uuid.uuid4().hex[:10]}"
    cfg = ProcessorConfig(
        redis_url=url,
        namespace=ns,
        timeline_length=n,
        fanout_threshold=t,
        timeline_slack=s,
        group_size=group,
        record_freshness=False,
        dedup_window_ms=WINDOW_MS,
        dedup_grace_ms=GRACE_MS,
        dedup_reorder=REORDER,
    )
    eng = ENGINES[engine](cfg, log)
    per_p = log.per_partition()
    pos = dict.fromkeys(per_p, 0)
    problems: list[str] = []
    try:
        for step, item in enumerate(schedule):
            if item[0] == "d":
                eng.deliver(*item[1:])
            else:
                p, k, rerun = item
                lo = pos[p]
                recs = list(enumerate(per_p[p]))[lo : lo + k]
                eng.process(p, recs)
                if rerun:  # a micro-batch run again after a crash: the fence skips it
                    eng.process(p, list(enumerate(per_p[p]))[max(0, lo - rerun) : lo + k])
                pos[p] = lo + len(recs)
            if checks is None or checks(step):
                problems = eng.compare(log, n, pos, f"after step {step} {pos}: ")
                if problems:
                    break
        if not problems:
            assert pos == {p: len(v) for p, v in per_p.items()}, "the schedule must cover the log"
            problems = eng.compare(log, n, pos, "at the end: ")
    finally:
        functions.drop_namespace(clients.redis_client(url), ns)
    assert not problems, "\n".join(
        [
            f"engine={engine} N={n} T={t} S={s} group={group} schedule={schedule}",
            log.describe(),
            *problems[:20],
        ]
    )


def sequential(log: Log) -> list[tuple[int, int, int]]:
    """One partition after the other, each whole."""
    return [(p, len(v), 0) for p, v in log.per_partition().items() if v]


def round_robin(log: Log, k: int = 1) -> list[tuple[int, int, int]]:
    per_p = log.per_partition()
    left = {p: len(v) for p, v in per_p.items()}
    out = []
    while any(left.values()):
        for p in sorted(left):
            if left[p]:
                step = min(k, left[p])
                out.append((p, step, 0))
                left[p] -= step
    return out


def check_log(url: str, log: Log, *, n: int = 3, t: int = 1, s: int = 1) -> None:
    """An explicit log, (a) against (d): sequentially, round robin record by record, and in
    reverse partition order, each compared at every cut."""
    for schedule in (sequential(log), round_robin(log), list(reversed(sequential(log)))):
        for group in (1, 200):
            for engine in ENGINES:
                run_and_compare(url, log, n=n, t=t, s=s, group=group, schedule=schedule, engine=engine)
    # the partitioned layout with its deliveries one at a time, each applied twice, after every step
    run_and_compare(
        url, log, n=n, t=t, s=s, group=1, schedule=one_by_one_deliveries(log), engine="partitioned"
    )


def one_by_one_deliveries(log: Log) -> list[tuple]:
    """Round robin record by record, each step followed by every pair's deliveries one at a time,
    each applied again once (a pump that crashed after the target's call, before it moved on)."""
    parts = sorted(log.per_partition())
    out: list[tuple] = []
    for step in round_robin(log):
        out.append(step)
        for s in parts:
            for q in parts:  # (a partition's own posts reach its own timelines as deliveries too)
                out += [("d", s, q, 1, 1), ("d", s, q, 1, 0)]
    return out


@st.composite
def schedules(draw, log: Log, deliveries: bool = False):
    """Random micro-batch boundaries and cross-partition interleavings (and crash re-runs); with
    ``deliveries``, random deliveries between them: any source to any target, partial (a limit),
    and some applied again (a replay the target's fence skips). What is not delivered by a checked
    cut or the end waits until then: a source's call and its deliveries apart, as after a crash."""
    left = {p: len(v) for p, v in log.per_partition().items()}
    parts = sorted(left)
    out: list[tuple] = []
    while any(left.values()):
        p = draw(st.sampled_from(sorted(q for q, n in left.items() if n)))
        k = draw(st.integers(1, left[p]))
        rerun = draw(st.sampled_from([0, 0, 0, 0, 1, 3]))
        out.append((p, k, rerun))
        left[p] -= k
        if deliveries:
            for _ in range(draw(st.integers(0, 3))):
                src = draw(st.sampled_from(parts))
                dst = draw(st.sampled_from(parts))
                out.append(
                    ("d", src, dst, draw(st.sampled_from([None, 1, 2])), draw(st.sampled_from([0, 0, 1, 3])))
                )
    return out


def property_run(url, data, log, label, engine="keyed"):
    n = data.draw(st.integers(2, 5), label="N")
    t = data.draw(st.integers(1, 3), label="T")
    s = data.draw(st.integers(0, 2), label="S")
    group = data.draw(st.sampled_from([1, 2, 5, 200]), label="group")
    schedule = data.draw(schedules(log, deliveries=engine == "partitioned"), label="schedule")
    checks = data.draw(st.sets(st.integers(0, len(schedule) - 1), max_size=4), label="checked cuts")
    run_and_compare(
        url, log, n=n, t=t, s=s, group=group, schedule=schedule, checks=checks.__contains__, engine=engine
    )


# ------------------------------------------------------------------------------------------------
# The properties
# ------------------------------------------------------------------------------------------------
@PROPERTY
@given(log=logs(cross_owner_ids=False, late=True), data=st.data())
def test_speed_layer_agrees_with_the_specification(redis_url, log, data):
    """Every hostile class but ids reused across owners (each owner has its own id space)."""
    property_run(redis_url, data, log, "own ids")


@PROPERTY
@given(log=logs(cross_owner_ids=True, late=True), data=st.data())
def test_partitioned_layout_agrees_with_the_specification(redis_url, log, data):
    """The partitioned layout: every hostile class, with deliveries late, partial, repeated and
    interleaved at random with the partitions' own calls."""
    property_run(redis_url, data, log, "partitioned", engine="partitioned")


@PROPERTY
@given(log=logs(cross_owner_ids=True, late=True), data=st.data())
def test_speed_layer_agrees_with_the_specification_ids_reused_across_owners(redis_url, log, data):
    """Every hostile class, post and message ids drawn from one small pool shared by all users."""
    property_run(redis_url, data, log, "shared ids")


@settings(max_examples=max(50, EXAMPLES), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log=logs(cross_owner_ids=True, late=True))
def test_the_grammar_and_the_specification_read_the_contract_as_the_contract_does(log):
    """The generator writes what it means to (its "valid" records are contract-valid, its
    quarantine shapes are not) and the specification's validity rule, read from the schema as
    data, gives the contract's reason for every record."""
    import contract

    for rec in log.records:
        raw = rec.raw()
        got = spec.contract_reason(raw)[1]
        want = "bad_json" if raw is None else contract.parse_and_validate(raw)[1]
        assert got == want, (rec, got, want)
        if got is None:  # and a valid record sits in the partition of its key
            assert rec.key == str(contract.partition_key(rec.value)), rec


# ------------------------------------------------------------------------------------------------
# One named test per hostile class: explicit small logs, (a) against (d)
# ------------------------------------------------------------------------------------------------
def E(type_, user, t_s=0.0, eid=None, **fields):
    """A valid event at T0 + t_s seconds (clocks in sync unless fields say otherwise)."""
    ms = T0 + int(t_s * 1000)
    e = {
        "event_id": eid or f"{type_}-{user}-{t_s}-{sorted(fields.items())}",
        "type": type_,
        "schema_version": 1,
        "user_id": user,
        "device_time": ms,
        "sent_time": ms,
        "received_time": ms,
    }
    e.update(fields)
    return e


def L(part_of: dict[int, int], *values) -> Log:
    """A log: each value goes to the partition of its key user (``(key_user, raw)`` for raw bytes)."""
    recs = []
    for v in values:
        if isinstance(v, tuple):
            key, raw = v
        else:
            key, raw = v["recipient_id"] if v["type"] == "message_sent" else v["user_id"], v
        recs.append(Rec(part_of[key], str(key), raw))
    return Log(max(part_of.values()) + 1, sorted(part_of), recs)


TWO = {1: 0, 2: 1, 3: 0, 4: 1}


def test_class_deletes_reads_and_unfollows_before_their_creates(redis_url):
    check_log(
        redis_url,
        L(
            TWO,
            E("post_deleted", 2, 0, post_id=20),  # before its create: not_own_post
            E("message_read", 3, 1, message_id=30),  # before it arrives: not_in_inbox
            E("unfollowed", 1, 2, followee_id=2),  # before the follow: applied, no effect
            E("post_created", 2, 3, post_id=20, text="a"),
            E("message_sent", 1, 4, message_id=30, recipient_id=3, text="m"),
            E("followed", 1, 5, followee_id=2),
            E("message_read", 3, 6, message_id=30),
            E("message_read", 3, 7, message_id=30),  # a second read: applied, changes nothing
            E("post_deleted", 2, 8, post_id=20),
            E("post_deleted", 2, 9, post_id=20),  # post_already_deleted
            E("post_deleted", 4, 10, post_id=20),  # not the author: not_own_post
        ),
    )


def test_class_same_owner_reuses_an_id(redis_url):
    check_log(
        redis_url,
        L(
            TWO,
            E("post_created", 2, 0, post_id=20, text="a"),
            E("post_deleted", 2, 1, post_id=20),
            E("post_created", 2, 2, post_id=20, text="again"),  # deleted, still used: reused_id
            E("post_created", 2, 3, post_id=21, text="b"),
            E("post_created", 2, 4, post_id=21, text="b again"),  # live: reused_id
            E("message_sent", 1, 5, message_id=30, recipient_id=3, text="m"),
            E("message_sent", 4, 6, message_id=30, recipient_id=3, text="same id, same inbox"),
        ),
    )


def test_class_duplicate_event_ids_within_and_across_partitions(redis_url):
    post = E("post_created", 2, 0, eid="dup", post_id=20, text="a")
    later = dict(
        post, received_time=post["received_time"] + WINDOW_MS, sent_time=post["sent_time"] + WINDOW_MS
    )
    past = dict(later, received_time=later["received_time"] + 1, sent_time=later["sent_time"] + 1)
    check_log(
        redis_url,
        L(
            TWO,
            post,
            post,  # a resend: duplicate
            E("followed", 1, 1, eid="dup", followee_id=2),  # same id, another partition: its own call
            E("followed", 3, 2, eid="dup", followee_id=4),  # ... and again in that partition: duplicate
            later,  # exactly the window later: still a duplicate
            past,  # a millisecond more: applied again, and a post already created: reused_id
        ),
    )


def test_class_dedup_memory_forgotten_behind_the_grace(redis_url):
    first = E("status_updated", 1, 0, eid="s", text="one")
    filler = E("status_updated", 1, 0, eid="f", text="two")
    filler.update(
        {
            k: first["received_time"] + WINDOW_MS + GRACE_MS + 2
            for k in ("device_time", "sent_time", "received_time")
        }
    )
    late = dict(first, text="three")
    late.update({k: first["received_time"] + WINDOW_MS for k in ("sent_time", "received_time")})
    # late is within the window of its first copy but received more than the grace behind the
    # partition's newest: its id is forgotten, so it is applied and the last status is "three"
    check_log(redis_url, L(TWO, first, filler, late))


def test_class_sequenced_ids_reordered_repeated_restarted_and_forgotten(redis_url):
    """Sequenced ids (docs/views.md, "Duplicates"), R = REORDER = 4, worked by hand: partition 0
    holds users 1 and 3, partition 1 users 2 and 4. The dispositions are asserted as worked out
    here, then every implementation is checked against the specification on the same log."""
    assert REORDER == 4
    far = WINDOW_MS + GRACE_MS + 2

    def st(user, t_s, eid, *, shift=0):
        e = E("status_updated", user, t_s, eid=eid, text=eid)
        e.update({k: e[k] + shift for k in ("device_time", "sent_time", "received_time")})
        return e

    values = [
        (st(1, 0, "sq:3:1"), "applied"),  # writer 3 starts in partition 0: hi 1
        (st(3, 1, "sq:3:2"), "applied"),  # hi 2
        (st(1, 2, "sq:3:8"), "applied"),  # 3..7 went elsewhere or are late: hi 8
        (st(3, 3, "sq:3:4"), "duplicate"),  # 4 = hi - R: behind the reorder window
        (st(3, 3.5, "sq:3:3"), "duplicate"),  # never seen, but behind the window: counted seen
        (st(1, 4, "sq:3:5"), "applied"),  # 5 = hi - R + 1: late but inside it
        (st(1, 5, "sq:3:5"), "duplicate"),  # ... and again: a duplicate
        (st(2, 6, "sq:3:4"), "applied"),  # partition 1 has never seen writer 3: its own run
        (st(3, 7, "sq:3:8"), "duplicate"),  # a resend of the highest
        (st(1, 8, "sq:03:9"), "applied"),  # not the canonical form: an opaque id
        (st(3, 9, "sq:03:9"), "duplicate"),  # ... decided as opaque ids are
        (st(1, 10, "sq:4:1"), "applied"),  # a restarted writer: a new writer id, counting from 1
        (st(3, 11, "sq:0:1"), "applied"),  # writer 0 is a writer
        (st(1, 11.5, "sq:999999999999999:999999999999999"), "applied"),  # the form's largest
        # a day and more later (window + grace) a record moves partition 0's newest on: writer 3
        # is forgotten there, so its old seq 2 starts a new run; writer 4 is forgotten too
        (st(3, 12, "filler", shift=far), "applied"),
        (st(1, 12, "sq:3:2", shift=far), "applied"),
        (st(3, 13, "sq:3:1", shift=far), "applied"),  # inside the new run's window: not seen in it
        (st(1, 14, "sq:3:2", shift=far), "duplicate"),
        (st(3, 15, "sq:4:1", shift=far), "applied"),
    ]
    log = L(TWO, *[v for v, _ in values])
    want = harness.expected(log, 3)
    parts = {0: 0, 1: 0}
    got = []
    for rec in log.records:
        got.append(want.dispositions[rec.partition, parts[rec.partition]][0])
        parts[rec.partition] += 1
    assert got == [d for _, d in values]
    check_log(redis_url, log)


def test_class_follow_unfollow_refollow_racing_the_followees_posts(redis_url):
    check_log(
        redis_url,
        L(
            TWO,
            E("post_created", 2, 0, post_id=20, text="before"),
            E("followed", 1, 1, followee_id=2),
            E("post_created", 2, 2, post_id=21, text="while following"),
            E("unfollowed", 1, 3, followee_id=2),
            E("post_created", 2, 4, post_id=22, text="while not"),
            E("followed", 1, 5, followee_id=2),
            E("post_created", 2, 6, post_id=23, text="after"),
        ),
        n=3,
    )


def test_class_timeline_at_the_cap_refilled_after_deletes_and_unfollows(redis_url):
    posts = [E("post_created", a, i, post_id=a * 10 + i, text=f"{a}/{i}") for i in range(4) for a in (2, 4)]
    check_log(
        redis_url,
        L(
            TWO,
            E("followed", 1, -2, followee_id=2),
            E("followed", 1, -1, followee_id=4),
            *posts,
            E("post_deleted", 2, 10, post_id=23),
            E("post_deleted", 4, 11, post_id=43),
            E("unfollowed", 1, 12, followee_id=4),
            E("post_deleted", 2, 13, post_id=22),
        ),
        n=3,
        s=1,
        t=3,
    )


def test_class_an_author_crosses_the_fan_out_threshold_both_ways(redis_url):
    check_log(
        redis_url,
        L(
            TWO,
            E("post_created", 2, 0, post_id=20, text="a"),
            E("followed", 1, 1, followee_id=2),
            E("followed", 3, 2, followee_id=2),  # 2 followers > T=1: merged at read time
            E("post_created", 2, 3, post_id=21, text="b"),
            E("followed", 4, 4, followee_id=2),
            E("unfollowed", 3, 5, followee_id=2),
            E("unfollowed", 4, 6, followee_id=2),  # back to 1: fanned out again
            E("post_created", 2, 7, post_id=22, text="c"),
            E("user_erased", 1, 8),  # and to 0 by an erasure
        ),
        n=2,
        t=1,
    )


def test_class_erasure_in_the_middle_of_a_log(redis_url):
    check_log(
        redis_url,
        L(
            TWO,
            E("user_registered", 2, 0, handle="bob", display_name="Bob"),
            E("status_updated", 2, 1, text="here"),
            E("post_created", 2, 2, post_id=20, text="a"),
            E("followed", 1, 3, followee_id=2),
            E("followed", 2, 4, followee_id=1),
            E("post_created", 1, 5, post_id=10, text="mine"),
            E("message_sent", 2, 6, message_id=30, recipient_id=1, text="to 1"),
            E("message_sent", 1, 7, message_id=31, recipient_id=2, text="to 2"),
            E("user_erased", 2, 8),
            E("post_created", 2, 9, post_id=21, text="after"),  # user_erased
            E("user_erased", 2, 10),  # a second erasure: user_erased
            E("message_sent", 3, 11, message_id=32, recipient_id=2, text="to the erased"),
            E("followed", 3, 12, followee_id=2),  # another partition names 2: no edge
            E("message_sent", 2, 13, message_id=33, recipient_id=1, text="from the erased, late"),
            E("message_read", 1, 14, message_id=30),
        ),
    )


def test_class_clock_skew_and_offline_devices_at_the_window_edges(redis_url):
    def at(e, dt, st):
        return dict(e, device_time=e["received_time"] + dt, sent_time=e["received_time"] + st)

    check_log(
        redis_url,
        L(
            TWO,
            E("followed", 1, 0, followee_id=2),
            at(E("post_created", 2, 1, post_id=20, text="ahead"), MAX_SKEW, MAX_SKEW),
            at(E("post_created", 2, 2, post_id=21, text="behind"), -MAX_SKEW, -MAX_SKEW),
            at(E("post_created", 2, 3, post_id=22, text="offline 30 d"), -MAX_OFFLINE, 0),
            at(E("post_created", 2, 4, post_id=23, text="skew over"), MAX_SKEW + 1, MAX_SKEW + 1),
            at(E("post_created", 2, 5, post_id=24, text="offline over"), -MAX_OFFLINE - 1, 0),
            at(E("post_created", 2, 6, post_id=25, text="after sent"), 1, 0),
            E("post_created", 4, 7, post_id=40, text="now"),
            E("followed", 1, 8, followee_id=4),
        ),
        n=4,
    )


def test_class_quarantined_records_between_valid_ones(redis_url):
    ok = E("post_created", 2, 0, post_id=20, text="a")
    check_log(
        redis_url,
        L(
            TWO,
            ok,
            (2, b'{"type": "post_created", '),
            (2, b"\xff\xfe"),
            (2, None),
            (2, b"[1]"),
            (2, {k: v for k, v in ok.items() if k != "type"}),
            (2, {**ok, "type": "post_liked"}),
            (2, {**ok, "colour": 1}),
            (2, {k: v for k, v in ok.items() if k != "post_id"}),
            (2, {**ok, "schema_version": 2}),
            (2, {**ok, "post_id": "20"}),
            (2, {**ok, "post_id": 0}),
            (2, {**ok, "text": "y" * 281}),
            (1, E("followed", 1, 1, followee_id=1)),
            E("post_created", 2, 2, post_id=21, text="b"),
        ),
    )


def test_class_ids_reused_across_owners(redis_url):
    check_log(
        redis_url,
        L(
            TWO,
            E("followed", 1, 0, followee_id=2),
            E("followed", 1, 1, followee_id=4),
            E("post_created", 2, 2, post_id=7, text="2's seven"),
            E("post_created", 4, 3, post_id=7, text="4's seven"),  # another post
            E("post_deleted", 4, 4, post_id=7),  # 4's own: 2's stays
            E("message_sent", 2, 5, message_id=9, recipient_id=1, text="to 1"),
            E("message_sent", 2, 6, message_id=9, recipient_id=3, text="to 3"),  # another message
            E("message_read", 3, 7, message_id=9),
        ),
    )


# ------------------------------------------------------------------------------------------------
# Minimal failing examples Hypothesis found, each a named regression test
# ------------------------------------------------------------------------------------------------
def test_regression_post_id_reused_by_two_authors(redis_url):
    """Found by the property at c9e5550 (posts keyed by post_id alone): author 2's post 1 replaced
    author 1's post 1 (``p:1``), so 1's own timeline showed 2's post. Two posts: (1, 1), (2, 1)."""
    log = Log(
        partitions=2,
        users=[1, 2, 3],
        records=[
            Rec(0, "1", E("post_created", 1, 0, eid="e1", post_id=1, text="")),
            Rec(0, "2", E("post_created", 2, 0, eid="e2", post_id=1, text="")),
        ],
    )
    for group in (1, 200):
        for engine in ENGINES:
            run_and_compare(redis_url, log, n=2, t=1, s=0, group=group, schedule=[(0, 2, 0)], engine=engine)


# ------------------------------------------------------------------------------------------------
# The partitioned layout on a Redis Cluster of 3 masters (docs/architecture.md, "On Redis Cluster")
# ------------------------------------------------------------------------------------------------
CLUSTER_EXAMPLES = int(os.environ.get("SOCIAL_PROPERTY_CLUSTER_EXAMPLES", "25"))


@pytest.mark.redis_cluster
@settings(PROPERTY, max_examples=CLUSTER_EXAMPLES)
@given(log=logs(cross_owner_ids=True, late=True), data=st.data())
def test_partitioned_layout_on_redis_cluster_agrees_with_the_specification(redis_cluster_url, log, data):
    """The partitioned property above with every call routed to the master that owns its
    partition's slot (3 masters), read back through the cluster client: the same views, dispositions,
    accounting and archive at the settled cuts as the specification's."""
    property_run(redis_cluster_url, data, log, "partitioned on a cluster", engine="partitioned")
