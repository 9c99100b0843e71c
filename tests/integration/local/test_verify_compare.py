"""verify's row-for-row comparison (pipelines.verify.compare): multisets over every column, nulls
equal to nulls, a duplicated row counted as often as it occurs; expected counts worked out by hand."""

from __future__ import annotations

import pytest

from pipelines.verify import compare

pytestmark = pytest.mark.spark

SCHEMA = "user_id BIGINT, text STRING"
COLUMNS = ["user_id", "text"]


def test_equal_multisets_in_any_order_agree(spark):
    live = spark.createDataFrame([(1, "a"), (2, None), (2, None), (3, "c")], SCHEMA)
    again = spark.createDataFrame([(3, "c"), (2, None), (1, "a"), (2, None)], SCHEMA)
    result = compare(live, again, COLUMNS)
    assert result == {
        "live_rows": 4,
        "recomputed_rows": 4,
        "mismatches": 0,
        "only_live": 0,
        "only_recomputed": 0,
        "examples": [],
        "ok": True,
    }


def test_every_difference_is_counted_and_shown_on_its_side(spark):
    # live: (1, a) once too often, (3, None) where the replay has (3, c); the replay: (4, d) more
    live = spark.createDataFrame([(1, "a"), (1, "a"), (2, "b"), (3, None)], SCHEMA)
    replay = spark.createDataFrame([(1, "a"), (2, "b"), (3, "c"), (4, "d")], SCHEMA)
    result = compare(live, replay, COLUMNS)
    assert (result["live_rows"], result["recomputed_rows"]) == (4, 4)
    assert (result["only_live"], result["only_recomputed"], result["mismatches"]) == (2, 2, 4)
    assert result["ok"] is False
    by_side = {}
    for ex in result["examples"]:
        by_side.setdefault(ex.pop("side"), []).append(ex)
    assert by_side["only_live"] == [{"user_id": 1, "text": "a"}, {"user_id": 3, "text": None}]
    assert by_side["only_recomputed"] == [{"user_id": 3, "text": "c"}, {"user_id": 4, "text": "d"}]


def test_an_empty_side(spark):
    live = spark.createDataFrame([], SCHEMA)
    replay = spark.createDataFrame([(7, "x")], SCHEMA)
    result = compare(live, replay, COLUMNS)
    assert (result["live_rows"], result["recomputed_rows"], result["only_recomputed"]) == (0, 1, 1)
    assert result["examples"] == [{"side": "only_recomputed", "user_id": 7, "text": "x"}]


CHANGELOG = "partition INT, offset BIGINT, seq BIGINT, disposition STRING"


def test_the_changelog_holds_each_record_below_p_at_most_once(spark):
    from pipelines.verify import changelog_once

    P = {0: 3, 1: 2}  # records (0, 0..2) and (1, 0..1) are below P
    once = [(0, 0, 1, "a"), (0, 1, 2, "a"), (0, 2, 4, "d"), (1, 0, 3, "a"), (1, 1, 5, "q")]
    beyond = [(0, 3, 6, "a"), (0, 3, 6, "a"), (1, 2, 7, "a")]  # above P: not this check's business
    clean = changelog_once(spark.createDataFrame(once + beyond, CHANGELOG), P)
    assert clean == {"rows": 5, "records": 5, "duplicates": 0, "ok": True}
    # an archive appended twice for partition 1's first record (a re-run that did not skip)
    twice = changelog_once(spark.createDataFrame(once + [(1, 0, 3, "a")] + beyond, CHANGELOG), P)
    assert twice == {"rows": 6, "records": 5, "duplicates": 1, "ok": False}
    # a namespace seeded at P0 = {0: 2, 1: 1} archives only what came after it: fewer rows is fine
    seeded = changelog_once(spark.createDataFrame([once[2], once[4]], CHANGELOG), P)
    assert seeded == {"rows": 2, "records": 2, "duplicates": 0, "ok": True}
