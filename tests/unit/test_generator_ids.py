"""Snowflake post/message ids and UUID event ids (shared by the API and the generator)."""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from contract import ids


def test_snowflake_unique_and_sortable_across_instances_and_threads():
    workers = [ids.Snowflake(w) for w in (0, 1, 2, ids.MAX_WORKER_ID)]
    out: list[list[int]] = [[] for _ in range(8)]

    def work(i: int) -> None:
        flake = workers[i % len(workers)]
        out[i] = [flake.next_id() for _ in range(5000)]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [x for part in out for x in part]
    assert len(set(every)) == len(every)
    for part in out:  # per caller: strictly increasing
        assert part == sorted(part) and len(set(part)) == len(part)
    assert all(0 < x < 2**63 for x in every)


def test_snowflake_layout_and_time_order():
    flake = ids.Snowflake(5)
    t0 = ids.EPOCH_MS + 1_000
    a = flake.next_id(t0)
    b = flake.next_id(t0)  # same ms: sequence
    c = flake.next_id(t0 + 1)
    assert a < b < c
    assert ids.snowflake_time_ms(a) == t0 and ids.snowflake_worker(a) == 5
    # ids from another instance at a later ms sort after
    assert ids.Snowflake(9).next_id(t0 + 2) > c


def test_snowflake_survives_sequence_overflow_and_clock_steps_back():
    flake = ids.Snowflake(1)
    t0 = ids.EPOCH_MS + 10_000
    got = [flake.next_id(t0) for _ in range(5000)]  # > 4096 in one ms
    got.append(flake.next_id(t0 - 500))  # clock stepped back
    assert got == sorted(got) and len(set(got)) == len(got)


def test_snowflake_rejects_bad_worker():
    with pytest.raises(ValueError):
        ids.Snowflake(ids.MAX_WORKER_ID + 1)


UUID4 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def test_sequenced_event_ids_count_from_one_across_threads_in_the_canonical_form():
    source = ids.EventIds(7)
    assert source.next_id() == "sq:7:1" and source.take(3) == ["sq:7:2", "sq:7:3", "sq:7:4"]
    many = ids.EventIds(0)
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda _: many.next_id(), range(4_000)))
    assert sorted(got, key=lambda x: int(x.rsplit(":", 1)[1])) == [f"sq:0:{n}" for n in range(1, 4_001)]
    # the canonical form, as docs/events.md states it, and its limits (15 digits: exact in Lua)
    canonical = re.compile(r"sq:(0|[1-9][0-9]{0,14}):([1-9][0-9]{0,14})")
    assert canonical.fullmatch(ids.sequenced_id(999_999_999_999_999, 999_999_999_999_999))
    assert ids.SEQUENCED == "^" + canonical.pattern + "$"
    for writer, seq in ((-1, 1), (0, 0), (10**15, 1), (1, 10**15)):
        with pytest.raises(ValueError):
            ids.sequenced_id(writer, seq)
    assert UUID4.match(ids.new_event_id())  # keyed API requests and social-erase keep UUIDs


def _post_and_message_ids(cfg) -> list[int]:
    from app_sim.generator import generate

    out = []
    for _key, value, _injected in generate(3_000, cfg):
        if type(value) is dict:
            out += [value[f] for f in ("post_id", "message_id") if f in value]
    return out


def test_two_runs_of_one_seed_differ_only_in_the_worker_bits():
    """The generator's ids are reproducible from the seed apart from the worker bits: a run's worker
    id comes from the log's registry (contract.writers), so two runs of one seed never collide."""
    from app_sim.generator import GeneratorConfig

    cfg = GeneratorConfig(users=100, mean_followers=5, seed=11)
    a = _post_and_message_ids(GeneratorConfig(**{**cfg.__dict__, "worker_id": 3}))
    b = _post_and_message_ids(GeneratorConfig(**{**cfg.__dict__, "worker_id": 700}))
    assert len(a) == len(b) > 500
    assert {ids.snowflake_worker(x) for x in a} == {3} and {ids.snowflake_worker(x) for x in b} == {700}
    assert [ids.snowflake_without_worker(x) for x in a] == [ids.snowflake_without_worker(x) for x in b]
    assert not set(a) & set(b)
    # the same worker id: the very same ids (--worker-id, the reproducibility check)
    assert _post_and_message_ids(GeneratorConfig(**{**cfg.__dict__, "worker_id": 3})) == a


def test_snowflake_without_worker_clears_exactly_the_worker_bits():
    t = ids.EPOCH_MS + 123_456
    x, y = ids.Snowflake(1).next_id(t), ids.Snowflake(ids.MAX_WORKER_ID).next_id(t)
    assert x != y and ids.snowflake_without_worker(x) == ids.snowflake_without_worker(y)
    assert ids.snowflake_worker(ids.snowflake_without_worker(y)) == 0
    assert ids.snowflake_time_ms(ids.snowflake_without_worker(y)) == t
