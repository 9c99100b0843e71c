"""When the archiver calls the log quiet and compacts at once (pipelines/archiver.py): nothing new
to archive *and* the speed layer's fences at the log's end. A speed layer restarting (or crashed)
with records still to read leaves a pause, which used to trigger a compaction redone moments
later (the crash test compacted four times where two covered what it waits for)."""

from __future__ import annotations

import time

from infra.settings import get_settings
from pipelines.archiver import applied_all
from pipelines.lake import covers
from tests.conftest import _free_port


def test_fences_cover_the_log_end_only_in_every_partition():
    assert covers({0: 5, 1: 3}, {0: 5, 1: 3})
    assert covers({0: 6, 1: 3}, {0: 5, 1: 3})  # a fence past an end seen a moment earlier
    assert not covers({0: 5, 1: 2}, {0: 5, 1: 3})  # one record left in partition 1
    assert not covers({0: 5}, {0: 5, 1: 1})  # a partition the speed layer never read from
    assert covers({0: 5}, {0: 5, 1: 0})  # an empty partition needs no fence
    assert covers({}, {})


def test_no_broker_answering_means_not_quiet_and_returns_soon(tmp_path):
    port = _free_port(29092, set())  # nothing listens there
    settings = get_settings(var_dir=tmp_path, kafka_bootstrap=f"127.0.0.1:{port}")
    t0 = time.monotonic()
    assert applied_all(settings, "social.events", {0: 10}) is False
    assert time.monotonic() - t0 < 15  # the archiver's loop is held up seconds at most
