"""Faults on a real Redis Cluster of 3 masters, at the level of the processor the speed layer runs in
its tasks (issue 63, part 3; docs/architecture.md, "On Redis Cluster"): the generator's log (its
invalid records, duplicates and erasures included) goes through :class:`PartitionedProcessor`,
partition by partition with a pump after each round, as the stream's micro-batches do, while

- a partition's slot moves to another master (``LocalCluster.move_slot``, as ``redis-cli --cluster
  reshard`` does): the processor follows ASK and MOVED and keeps applying;
- a master is killed with ``kill -9`` and restarted from its append-only file: the processor stops
  loudly and a new one continues from the fences;
- a master comes back without its last second of writes (its append-only file cut back to a second
  before the kill, as an OS crash under ``appendfsync everysec`` leaves it): a processor that kept
  running refuses to go on past the rolled-back fences, and a new one re-applies from them;
- a master is down for ``SOCIAL_REDIS_FAULT_DOWN_S`` while events keep arriving (5 s here, 30 s in
  ``make test-faults``): the processor stops loudly, is restarted until the master is back, and
  catches up;
- the processor itself is killed with ``kill -9`` ``SOCIAL_REDIS_FAULT_KILLS`` times (3 here, 10 in
  ``make test-faults``) at random moments, its deliveries half applied across the masters.

Afterwards the views read back through the cluster client (``contract.serving.PartitionedReader``)
equal the specification's (:mod:`tests.spec.views`) over the same log, every record has the
disposition the specification gives it, no changelog holds an entry twice, and events read =
applied + duplicates + rejected + quarantined, each event counted once.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest
import redis

from app_sim.generator import GeneratorConfig, generate
from contract.functions import pkey
from infra import clients, redis_cluster
from pipelines.speed.partitioned import FenceBehind, PartitionedProcessor
from pipelines.speed.processor import ProcessorConfig
from tests.spec import harness

pytestmark = [pytest.mark.redis_cluster, pytest.mark.faults]

DOWN_S = float(os.environ.get("SOCIAL_REDIS_FAULT_DOWN_S", "5"))
KILLS = int(os.environ.get("SOCIAL_REDIS_FAULT_KILLS", "3"))
P = 8  # partitions: spread over the three masters
EVENTS = 4_000
GEN = GeneratorConfig(
    users=80, mean_followers=6, seed=63, invalid_share=0.01, duplicate_share=0.01, erasure_share=0.002
)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cluster(tmp_path):
    """A cluster of this test's own (the faults leave it changed): 3 masters, stopped by pid."""
    c = redis_cluster.start(tmp_path / "cluster", masters=3)
    try:
        yield c
    finally:
        c.stop()


@cache
def the_log() -> dict[int, list[bytes | None]]:
    """The generator's records in the partitions librdkafka's partitioner gives their keys."""
    per_p: dict[int, list[bytes | None]] = {p: [] for p in range(P)}
    for key, value, _injected in generate(EVENTS, GEN):
        raw = value if isinstance(value, bytes) else json.dumps(value).encode()
        per_p[zlib.crc32(key or b"") % P].append(raw)
    return per_p


def config(url: str, ns: str, group: int = 50) -> ProcessorConfig:
    # small N, slack and threshold: timelines at the cap, refills, authors merged at read time
    return ProcessorConfig(
        redis_url=url,
        namespace=ns,
        layout="partitioned",
        partitions=P,
        timeline_length=20,
        timeline_slack=5,
        fanout_threshold=4,
        group_size=group,
        record_freshness=False,
    )


class Feed:
    """The log as the stream hands it to its tasks: each round, each partition's next records, then
    the deliveries of the partitions that applied some (``pump``). ``pos`` is where the feed is, as
    the Kafka source's offsets are: a new processor starts from the fences (:meth:`from_fences`)."""

    def __init__(self, log: dict[int, list[bytes | None]]):
        self.log = log
        self.pos = dict.fromkeys(log, 0)
        self.arrived: Callable[[int], int] = lambda p: len(self.log[p])  # records in the log so far

    def from_fences(self, proc: PartitionedProcessor) -> None:
        proc.settle()  # what a crash left in the outboxes, before the first batch (the stream's start)
        self.pos = proc.fences()

    def step(self, proc: PartitionedProcessor, k: int) -> int:
        applied = set()
        for p, records in self.log.items():
            end = min(self.pos[p] + k, self.arrived(p))
            if end > self.pos[p]:
                proc.process(p, [(o, records[o]) for o in range(self.pos[p], end)])
                self.pos[p] = end
                applied.add(p)
        proc.pump(applied)
        return len(applied)

    def left(self) -> int:
        return sum(len(v) - self.pos[p] for p, v in self.log.items())

    def run_to_end(self, proc: PartitionedProcessor, k: int = 50) -> None:
        while self.left():
            self.step(proc, k)
        proc.settle()


def a_third_applied(cluster) -> tuple[str, dict, PartitionedProcessor, Feed]:
    """A fresh namespace, the log, a processor on the cluster and its feed, a third of the way in."""
    ns = f"f{uuid.uuid4().hex[:8]}"
    log = the_log()
    proc = PartitionedProcessor(config(cluster.url, ns), P)
    feed = Feed(log)
    while feed.left() > 2 * EVENTS // 3:
        feed.step(proc, 20)
    return ns, log, proc, feed


def problems(url: str, ns: str, log: dict[int, list[bytes | None]]) -> list[str]:
    """Everything that differs from the specification over ``log`` (empty: exact)."""
    cfg = config(url, ns)
    want = harness.expected_under(cfg, log)
    users = sorted(users_of(log))
    client = clients.redis_client(url)
    parts = range(P)
    out = harness.diff_views(
        harness.spec_views(want, users),
        harness.partitioned_views(
            url, ns, users, cfg.timeline_length, lambda u: zlib.crc32(str(u).encode()) % P
        ),
    )
    out += harness.diff_dispositions(want.dispositions, harness.partitioned_dispositions(client, ns, parts))
    got = harness.partitioned_accounting(client, ns, parts)
    out += harness.diff_accounting(want.accounting(), got)
    if sum(got.values()) != sum(len(v) for v in log.values()):  # each record counted once
        out.append(
            f"accounting {got} counts {sum(got.values())} records of {sum(len(v) for v in log.values())}"
        )
    for p in parts:
        seen = Counter()
        for entry_id, f in client.xrange(pkey(ns, p, "changelog")):
            # one entry per record (<offset + 1>-0) and per delivery that changed the partition
            seen[("x", f[b"src"]) if f[b"d"] == b"x" else ("event", entry_id.split(b"-")[0])] += 1
        out += [f"partition {p}: changelog holds {what} {n} times" for what, n in seen.items() if n > 1]
        if client.xlen(pkey(ns, p, "dlq")):
            out.append(f"partition {p}: deliveries quarantined {client.xrange(pkey(ns, p, 'dlq'))}")
    proc = PartitionedProcessor(cfg, P)
    if proc.delivered() != proc.fences():
        out.append(f"deliveries {proc.delivered()} short of the fences {proc.fences()}")
    if proc.fences() != {p: len(v) for p, v in log.items()}:
        out.append(f"fences {proc.fences()} are not the log's ends")
    return out


def users_of(log: dict[int, list[bytes | None]]) -> set[int]:
    """Every user id a record of the log names."""
    out = set()
    for records in log.values():
        for raw in records:
            try:
                e = json.loads(raw or b"")
            except ValueError:
                continue
            if isinstance(e, dict):
                out |= {v for f in ("user_id", "followee_id", "recipient_id") if type(v := e.get(f)) is int}
    return out


def owner(client: redis.RedisCluster, p: int, ns: str) -> int:
    """The port of the master that owns partition p's slot."""
    return int(client.nodes_manager.get_node_from_slot(client.keyslot(pkey(ns, p, "fence"))).port)


def incr_aof(cluster: redis_cluster.LocalCluster, port: int) -> Path:
    """The node's newest incremental append-only file (Redis 7's multi-part AOF), the one it appends to."""
    files = sorted(
        (cluster.node_dir(port) / "appendonlydir").glob("*.incr.aof"),
        key=lambda f: int(f.name.split(".")[-3]),
    )
    return files[-1]


# ------------------------------------------------------------------------------------------------
# 1. A slot moved to another master mid-run
# ------------------------------------------------------------------------------------------------
def test_a_partitions_slot_moves_to_another_master_while_the_processor_applies(cluster):
    ns = f"f{uuid.uuid4().hex[:8]}"
    log = the_log()
    proc = PartitionedProcessor(config(cluster.url, ns), P)
    feed = Feed(log)
    for _ in range(3):
        feed.step(proc, 20)  # the partition's keys exist before its slot moves
    mover = max(log, key=lambda p: len(log[p]))
    slot = proc.r.keyslot(pkey(ns, mover, "fence"))
    src = owner(proc.r, mover, ns)
    dst = next(p for p in cluster.ports if p != src)
    target = redis.Redis(port=dst)
    target.config_resetstat()
    moved: dict = {}

    def move() -> None:
        try:
            moved["keys"] = cluster.move_slot(slot, dst, pause_s=0.3)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            moved["error"] = exc

    thread = threading.Thread(target=move)
    thread.start()
    rounds = 0
    while thread.is_alive():  # the processor keeps applying (3 records a partition a round)
        assert feed.left(), "the log ran out before the slot had moved: the test saw no move"
        feed.step(proc, 3)
        rounds += 1
    thread.join()
    assert "error" not in moved, moved.get("error")
    feed.run_to_end(proc)
    assert moved["keys"] > 50 and rounds > 10, (moved, rounds)
    assert owner(proc.r, mover, ns) == dst  # the client's slot table followed the move (MOVED)
    assert redis.Redis(port=src).execute_command("CLUSTER COUNTKEYSINSLOT", slot) == 0
    # calls sent while the keys were on the target and the slot not yet its own went there by ASK
    assert target.info("commandstats").get("cmdstat_asking", {}).get("calls", 0) > 0
    assert not (found := problems(cluster.url, ns, log)), "\n".join(found[:20])


# ------------------------------------------------------------------------------------------------
# 2. kill -9 of one master mid-run, restarted from its append-only file
# ------------------------------------------------------------------------------------------------
def test_a_master_killed_and_restarted_from_its_aof_the_processor_stops_loudly_and_a_new_one_continues(
    cluster,
):
    ns, log, proc, feed = a_third_applied(cluster)
    victim = cluster.ports[1]
    assert any(owner(proc.r, p, ns) == victim for p in log)
    cluster.kill(victim)
    with pytest.raises(redis.ConnectionError):  # loudly, not resent to whatever answers next
        while feed.left():
            feed.step(proc, 20)
    cluster.restart(victim)
    fresh = PartitionedProcessor(config(cluster.url, ns), P)
    feed.from_fences(fresh)
    feed.run_to_end(fresh)
    assert not (found := problems(cluster.url, ns, log)), "\n".join(found[:20])


def test_a_master_that_lost_its_last_second_rolls_back_and_the_processor_reapplies_from_the_fences(cluster):
    """``appendfsync everysec``: an OS crash loses what was not yet fsynced. Emulated by cutting the
    master's append-only file back to where it was a second before the kill (Redis loads a cut
    file up to its last whole command and drops an unfinished MULTI)."""
    ns, log, proc, feed = a_third_applied(cluster)
    victim = cluster.ports[1]
    mine = [p for p in log if owner(proc.r, p, ns) == victim]
    assert mine
    aof = incr_aof(cluster, victim)
    size = aof.stat().st_size
    before = proc.fences()
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline and feed.left() > EVENTS // 3:  # the second that is lost
        feed.step(proc, 5)
    held = dict(feed.pos)
    cluster.kill(victim)
    with aof.open("r+b") as f:
        f.truncate(size)
    cluster.restart(victim)
    after = proc.fences()
    assert all(after[p] == before[p] < held[p] for p in mine), (before, after, held)  # rolled back
    # the processor that kept running (as a stream's next micro-batch starts where the last ended)
    # refuses the records above a rolled-back fence: those below were lost, never applied
    with pytest.raises(FenceBehind):
        for _ in range(3):
            try:
                feed.step(proc, 20)
            except redis.ConnectionError:  # its first call on a connection the kill broke
                continue
    fresh = PartitionedProcessor(config(cluster.url, ns), P)
    feed.from_fences(fresh)
    assert {p: feed.pos[p] for p in mine} == {p: before[p] for p in mine}
    feed.run_to_end(fresh)
    assert not (found := problems(cluster.url, ns, log)), "\n".join(found[:20])


# ------------------------------------------------------------------------------------------------
# 3. A master down for SOCIAL_REDIS_FAULT_DOWN_S while events flow
# ------------------------------------------------------------------------------------------------
def test_a_master_down_while_events_flow_the_processor_is_restarted_until_it_is_back(cluster):
    ns = f"f{uuid.uuid4().hex[:8]}"
    log = the_log()
    feed = Feed(log)
    start = time.monotonic()
    spread_s = DOWN_S + 4  # the log arrives over the outage and beyond it
    feed.arrived = lambda p: min(len(log[p]), int(len(log[p]) * (time.monotonic() - start) / spread_s))
    victim = cluster.ports[2]  # not the node the URL names (a processor starts from that one)
    back = threading.Timer(1.0 + DOWN_S, cluster.restart, [victim])
    threading.Timer(1.0, cluster.kill, [victim]).start()
    back.start()
    proc: PartitionedProcessor | None = None
    stops: list[str] = []
    down_at = up_at = None
    try:
        while feed.left() or proc is None:
            try:
                if proc is None:  # the supervisor's restart: from the fences, once Redis answers
                    proc = PartitionedProcessor(config(cluster.url, ns), P)
                    feed.from_fences(proc)
                    up_at = time.monotonic()
                feed.step(proc, 20)
            except (redis.RedisError, FenceBehind) as exc:
                if proc is not None:
                    stops.append(f"{type(exc).__name__}: {exc}")
                    down_at = down_at or time.monotonic()
                proc = None
                time.sleep(0.2)
            assert time.monotonic() - start < spread_s + 60, "the processor never caught up"
        proc.settle()
    finally:
        back.join()
    assert stops and down_at is not None and up_at is not None and up_at - down_at >= DOWN_S - 1.5, (
        stops[:3],
        down_at,
        up_at,
    )
    assert not (found := problems(cluster.url, ns, log)), "\n".join(found[:20])


# ------------------------------------------------------------------------------------------------
# 4. kill -9 of the processor while its deliveries are half applied across the masters
# ------------------------------------------------------------------------------------------------
def run_a_processor(url: str, ns: str) -> None:
    """The child process of the test below: a processor from the fences to the log's end, slowly
    (a few records a partition a round, each round's deliveries to every partition on 3 masters)."""
    proc = PartitionedProcessor(config(url, ns, group=1), P)
    feed = Feed(the_log())
    feed.from_fences(proc)
    print("started", flush=True)
    while feed.left():
        feed.step(proc, 2)
        time.sleep(0.005)  # ~5 s for the whole log: ten kills fit in it
    print("done", flush=True)


def test_the_processor_killed_mid_delivery_several_times_a_new_one_settles_and_continues(cluster):
    ns = f"f{uuid.uuid4().hex[:8]}"
    log = the_log()
    rng = random.Random(63)
    child = (
        "import sys; from tests.unit.test_redis_cluster_faults import run_a_processor as r; r(*sys.argv[1:])"
    )
    observer = PartitionedProcessor(config(cluster.url, ns), P)  # reads only
    pending = half = kills = 0
    for _ in range(KILLS):
        proc = subprocess.Popen(
            [sys.executable, "-c", child, cluster.url, ns], cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        try:
            assert proc.stdout is not None and proc.stdout.readline() == "started\n"
            time.sleep(rng.uniform(0.1, 0.5))
            if proc.poll() is not None:  # it reached the log's end first: no more kills
                break
            os.kill(proc.pid, signal.SIGKILL)
            kills += 1
        finally:
            proc.kill()
            proc.wait()
        fences, dfence = observer.fences(), {}
        pipe = observer.r.pipeline(transaction=False)
        for q in range(P):
            pipe.hgetall(pkey(ns, q, "dfence"))
        for q, raw in enumerate(pipe.execute()):
            dfence[q] = {int(s): int(o) for s, o in raw.items()}
        behind = {s for s in range(P) if any(dfence[q].get(s, 0) < fences[s] for q in range(P))}
        pending += bool(behind)  # applied, not yet delivered everywhere
        # some targets have a source's deliveries that others do not: a pump cut in the middle
        half += any(len({dfence[q].get(s, 0) for q in range(P)}) > 1 for s in behind)
    assert kills >= min(KILLS, 3), f"only {kills} kills: the processor ran out of log first"
    assert pending, "no kill left deliveries to make: the test did not test them"
    fresh = PartitionedProcessor(config(cluster.url, ns), P)
    feed = Feed(log)
    feed.from_fences(fresh)
    assert 0 < sum(feed.pos.values()) < EVENTS
    feed.run_to_end(fresh)
    print(f"{kills} kills: {pending} left deliveries pending, {half} with them half applied")
    assert not (found := problems(cluster.url, ns, log)), "\n".join(found[:20])
