"""The Delta log as pipelines/lake.py reads it (delta-rs, no JVM): a table's latest version and
the latest commit metadata carrying a field, on real Delta tables (written here with delta-rs; the
Spark-written ones: tests/integration/local/test_compaction.py and the stack's tests)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from deltalake import CommitProperties, write_deltalake

from pipelines import lake
from pipelines.lake import HISTORY_PAGE, Lake, committed_position, has_commits, latest_metadata


def commit(path, user_metadata: str | None = None) -> None:
    props = CommitProperties(custom_metadata={"userMetadata": user_metadata} if user_metadata else None)
    write_deltalake(str(path), pa.table({"n": [1]}), mode="append", commit_properties=props)


def test_the_newest_commit_with_the_field_wins_past_others_metadata(tmp_path):
    table = tmp_path / "batches"
    commit(table, json.dumps({"batch_id": 1, "end_offsets": {"0": 10}}))
    commit(table, json.dumps({"batch_id": 2, "end_offsets": {"0": 20, "1": 3}}))
    commit(table)  # no metadata (a maintenance commit)
    commit(table, "not json")  # someone else's
    commit(table, json.dumps({"other": 1}))
    assert latest_metadata(table, "batch_id") == {"batch_id": 2, "end_offsets": {"0": 20, "1": 3}}
    assert latest_metadata(table, "archive_id") is None
    assert committed_position(tmp_path, "") == (2, {0: 20, 1: 3})


def test_a_field_older_than_a_page_of_history_is_still_found(tmp_path):
    table = tmp_path / "t"
    commit(table, json.dumps({"position": {"0": 5}}))
    for _ in range(HISTORY_PAGE + 3):
        commit(table)
    assert latest_metadata(table, "position") == {"position": {"0": 5}}


def test_no_table_and_a_half_made_one_have_no_commits(tmp_path):
    assert latest_metadata(tmp_path / "nowhere", "batch_id") is None
    half = tmp_path / "ns" / "posts"
    (half / "_delta_log").mkdir(parents=True)  # a creation killed before its first commit
    assert not has_commits(half)
    assert lake.delta_log(half) is None
    with pytest.raises(FileNotFoundError, match="no Delta commits"):
        Lake(None, tmp_path, "ns").version("posts")


def test_the_version_is_the_latest_commits(tmp_path):
    for _ in range(3):
        commit(tmp_path / "ns" / "users")
    views = Lake(None, tmp_path, "ns")
    assert views.version("users") == 2
    assert not views.exists()  # no batches table yet
    commit(tmp_path / "ns" / "batches", json.dumps({"batch_id": 0, "end_offsets": {}}))
    assert views.exists()


def test_commit_metadata_since_a_version_oldest_first(tmp_path):
    table = tmp_path / "users"
    commit(table, "a")  # version 0
    commit(table)  # 1: none
    commit(table, "c")  # 2
    assert lake.commit_metadata_since(table, 0) == [None, "c"]
    assert lake.commit_metadata_since(table, 2) == []
    assert lake.commit_metadata_since(tmp_path / "nowhere", -1) == []
    assert lake.latest_version(table) == 2 and lake.latest_version(tmp_path / "nowhere") is None


def test_last_commit_time_and_files(tmp_path):
    from pipelines.batch_layer.job import table_files

    table = tmp_path / "accounting"
    assert lake.last_commit_ms(table) is None
    assert table_files(table) == {"files": 0, "version": -1}
    commit(table)
    commit(table)
    stamps = [c["timestamp"] for c in lake.delta_log(table).history()]
    assert lake.last_commit_ms(table) == stamps[0]
    assert lake.last_commit_ms(table, newest_of_all=True) == max(stamps)
    assert table_files(table) == {"files": 2, "version": 1}
    write_deltalake(str(table), pa.table({"n": [7]}), mode="overwrite")
    assert table_files(table) == {"files": 1, "version": 2}  # the overwritten files are gone
