"""The replay's rounds: every partition advanced alike, the whole range read once, in order."""

from __future__ import annotations

from pipelines.replay import rounds


def test_rounds_cut_every_partition_at_the_same_fractions():
    # 10 + 0 + 20 records, at most 12 per round: ceil(30 / 12) = 3 rounds; partition 0 is cut at
    # 10 * 1/3 = 3 and 10 * 2/3 = 6, partition 2 (from 4 to 24) at 4 + 20/3 = 10 and 4 + 40/3 = 17
    got = rounds({0: 0, 1: 7, 2: 4}, {0: 10, 1: 7, 2: 24}, 12)
    assert got == [
        ({0: 0, 1: 7, 2: 4}, {0: 3, 1: 7, 2: 10}),
        ({0: 3, 1: 7, 2: 10}, {0: 6, 1: 7, 2: 17}),
        ({0: 6, 1: 7, 2: 17}, {0: 10, 1: 7, 2: 24}),
    ]


def test_one_round_when_the_log_fits_and_none_when_it_is_empty():
    assert rounds({0: 0, 1: 0}, {0: 100, 1: 50}, 1_000) == [({0: 0, 1: 0}, {0: 100, 1: 50})]
    assert rounds({0: 5, 1: 0}, {0: 5, 1: 0}, 1_000) == []


def test_rounds_cover_each_offset_exactly_once():
    starts, ends = {0: 3, 1: 0, 2: 9}, {0: 1_003, 1: 17, 2: 260}
    seen = {p: [] for p in ends}
    got = rounds(starts, ends, 97)
    for lo, hi in got:
        assert sum(hi[p] - lo[p] for p in ends) <= 97 + len(ends)  # at most a record more per partition
        for p in ends:
            seen[p] += range(lo[p], hi[p])
    assert all(seen[p] == list(range(starts[p], ends[p])) for p in ends)
    assert len(got) == -(-(1_000 + 17 + 251) // 97)
