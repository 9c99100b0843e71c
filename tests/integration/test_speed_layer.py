"""The speed layer against the real stack: Kafka -> Spark -> Redis, the archiver -> Delta, checked
by verify (a separate process, as the DAG runs it).

- Stream == replay: generated events (sealed personal data, counted invalid records and
  duplicates) through the running stream into Redis; ``verify --keyed-only`` finds the keyed state
  equal, key by key, to the same processor replayed over the log in three rounds, and the
  accounting exact. No archiver: the Delta side (the archive, the compacted views against the
  batch layer's recomputation, Redis against Delta) is checked by the crash test below, with
  crashes, and by the rebuilds (tests/integration/test_dags_e2e.py, test_keyed_faults.py); an
  archiver and a whole verify here cost ~120 of this test's ~160 CPU-seconds and checked nothing
  those do not.
- Crash safety: the speed layer is killed with SIGKILL at random moments ten times, each while
  records are still to apply (half before the second half of the log is written), the archiver
  in two of those crashes (one in each half, in the middle of the next archive it begins), and
  both are restarted; the whole verify holds
  (the Delta views and archive, Redis, the keyed state, the accounting), the views come from more
  than one archive, and no table has a duplicate key. (The archiver is not killed every time:
  each restart of it is a second Spark session starting beside the speed layer's, and it redoes
  the archive or compaction it was in: ~20-35 CPU-seconds each.)
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import replace

import pytest

from app_sim.generator import GeneratorConfig, produce
from contract import is_sealed
from contract.keys import KeyStore, Sealer, open_fields
from tests.integration.verifying import assert_keyed_ok, assert_verified, run_verify, verify_keyed

pytestmark = pytest.mark.integration


def test_stream_equals_replay(kafka_stack, topic_factory, speed_layer_factory, tmp_path):
    topic = topic_factory(8)
    cfg = GeneratorConfig(users=500, seed=11, mean_followers=30, invalid_share=0.01, duplicate_share=0.01)
    # personal data sealed as the generator's CLI writes it (docs/erasure.md): replays stay exact
    store = KeyStore(tmp_path / "keys.sqlite3")
    summary = produce(
        30_000, cfg, topic=topic, bootstrap=kafka_stack.bootstrap, progress=False, sealer=Sealer(store)
    )
    assert summary.delivery_failures == 0
    # the keyed state only (its verify reads the log and Redis): no archiver (module docstring)
    sl = speed_layer_factory(topic=topic, namespace="stream", archive=False, max_offsets_per_trigger=100_000)
    sl.wait_caught_up(timeout=900)
    sl.stop()
    # the replay in three rounds (pipelines/replay.py): the state must not depend on the order
    # in which they interleave the partitions
    k = verify_keyed(replace(kafka_stack.settings, replay_round_events=10_000), topic, "stream")
    assert_keyed_ok(k, summary)
    assert k["replay"]["rounds"] == 3  # ceil(30,000 / 10,000)
    # the fan-out really happened (500 users following ~30 each: 14,986 timeline rows)
    timelines = sum(1 for _ in sl.store().dump_timelines(kafka_stack.settings.timeline_length))
    assert timelines > 10_000
    # the serving store holds sealed values only; they open with the user's key
    users = sl.store().dump_hash("users")
    profile = json.loads(users.get(b"7") or users["7"])
    assert is_sealed(profile["handle"]) and is_sealed(profile["display_name"])
    assert open_fields(store, [profile], "handle")[0]["handle"] == "u7"  # the generator's handle of user 7


@pytest.mark.slow
def test_crash_safety_kill9_and_restart(kafka_stack, topic_factory, speed_layer_factory):
    from infra.stack import end_offsets

    topic = topic_factory(4)
    cfg = GeneratorConfig(users=400, seed=5, mean_followers=12, invalid_share=0.02, duplicate_share=0.02)
    # small micro-batches (~30 per half of the log), so every kill lands in a running stream
    sl = speed_layer_factory(topic=topic, namespace="crashy", max_offsets_per_trigger=300)
    rng = random.Random(42)
    in_flight: list[int] = []  # records sent but not applied yet, at each kill

    def crash_five_times() -> None:
        archiver_crashes = {rng.randrange(5)}
        sent = sum(end_offsets(kafka_stack.settings, topic).values())
        for i in range(5):
            # once its query runs and has applied a random share of what is left, pull the plug
            # at a random moment of the micro-batch in flight; in one of the five, the archiver's
            # too, at a random moment of the next archive it begins: one that holds what the speed
            # layer applied last (the cut it archives is a second old, and that was moments ago)
            sl.wait_running()
            applied = sum(sl.redis_position().values())
            sl.wait_applied(applied + int(rng.uniform(0.05, 0.25) * (sent - applied)), timeout=300)
            time.sleep(rng.uniform(0, 0.3))
            begun = sl.archives_started()
            sl.kill9()
            in_flight.append(sent - sum(sl.redis_position().values()))
            if i in archiver_crashes:
                # within what the last archive took (Spark jobs, a Delta commit per table, the
                # trim of Redis): any of its steps
                sl.wait_archive_started(begun)
                time.sleep(rng.uniform(0, sl.last_archive_seconds() or 3.0))
                sl.kill9_archiver()
            sl.restart()  # both

    def first_half_archived() -> None:
        # the views must come from more than one archive whatever the machine's speed: the
        # second half of the run is sent only once the first is archived and compacted
        crash_five_times()
        sl.wait_for(end_offsets(kafka_stack.settings, topic), timeout=900)

    summary = produce(
        18_000,
        cfg,
        topic=topic,
        bootstrap=kafka_stack.bootstrap,
        progress=False,
        pause_at=9_000,
        on_pause=first_half_archived,
    )
    crash_five_times()
    sl.wait_caught_up(timeout=900)
    sl.stop()
    assert len(in_flight) == 10 and all(n > 0 for n in in_flight), in_flight  # none hit an idle stream
    report = run_verify(kafka_stack.settings, topic, "crashy")
    assert_verified(report, summary)
    assert report["position"]["batch_id"] >= 1  # the views came from more than one archive
    # No table holds a key twice: verify compares every table with its recomputation as multisets
    # of whole rows (assert_verified: equal row counts, no row in excess on either side), and the
    # recomputed tables hold one row per key (docs/views.md); a row archived or merged twice, or a
    # key with two rows, is a row in excess. The ``batches`` rows are summed by the accounting
    # (events read == the records below P), which a repeated row would break, and the Delta
    # changelog, which nothing recomputes, is checked for a record twice (verify's changelog_once).
    # The services write to files, not to a terminal: no Spark console progress bar in their logs
    # (pipelines/spark.py, ``console_progress``), whose carriage-return redraws came to a few lines
    # per job (the archivers' log of this test held 19 such lines, 2026-11-28).
    for log_file in (sl.log_path, sl.archiver_log):
        assert b"[Stage " not in log_file.read_bytes(), log_file
