"""Windows on corrected event time, late and out-of-order events, an offline device's day.

Expected rows are worked out by hand from the definitions (pipelines/analytics/windows.py), with
a lateness of 60 s: W_k = max event time of batches before k - 60 s; at the end of batch k the
windows ending at or before W_k are written; an event of batch k is late when its one-minute
window ended at or before W_(k-1); behind_ms = max event time before its batch - its event time.
"""

from __future__ import annotations

import pytest

from tests.integration.local.analytics_harness import Log, at, ev

pytestmark = pytest.mark.spark
DAY = 86_400


def rows(df, *cols):
    return sorted(tuple(r[c] for c in cols) for r in df.collect())


@pytest.fixture(scope="module")
def activity_log(spark, tmp_path_factory):
    log = Log(tmp_path_factory.mktemp("activity"))
    # batch 0: W_0 = none; max event time 3:30 -> W_1 = 2:30
    log.batch(
        ev("post_created", 1, 10),
        ev("post_created", 1, 50, skew_s=300),  # device clock 5 min ahead: corrected to 0:50
        ev("message_sent", 2, 65),
        ev("post_created", 3, 210),
    )
    # batch 1: nothing closed before it (W_0); at its end [0:00,0:01) and [0:01,0:02) close (W_1)
    log.batch(ev("post_created", 4, 160), ev("post_created", 3, 360))  # -> W_2 = 5:00
    # batch 2: 0:20 and 1:59 come for windows closed by batch 1 (end <= W_1 = 2:30): late;
    # 4:10 is out of order but its window [0:04,0:05) is open: counted. An offline device
    # flushes yesterday's events, received now: late, a day behind.
    log.batch(
        ev("post_created", 4, 20),
        ev("message_sent", 5, 119),
        ev("post_created", 6, 250),
        ev("post_created", 9, -DAY + 30, received=370),
        ev("post_created", 9, -DAY + 300, received=371),
        ev("status_updated", 9, -DAY + 310, received=372),
        ev("post_created", 3, 600),  # -> W_3 = 9:00
    )
    log.batch(ev("post_created", 3, 1200))  # -> W_4 = 19:00: closes every window before 0:19
    log.run(spark, ["activity_per_minute", "late_events"])
    return log


def test_tumbling_counts_closed_windows_without_late_events(spark, activity_log):
    got = rows(activity_log.table(spark, "activity_per_minute"), "window_start", "type", "events")
    assert got == [
        (at(0), "post_created", 2),  # 0:10 and 0:50 (skewed device, corrected); 0:20 came late
        (at(60), "message_sent", 1),  # 1:05; 1:59 came late
        (at(120), "post_created", 1),
        (at(180), "post_created", 1),
        (at(240), "post_created", 1),  # 4:10, out of order but in time
        (at(360), "post_created", 1),
        (at(600), "post_created", 1),
        # 0:20:00 is still open (its window ends after the last watermark)
    ]


def test_late_events_counted_per_window_with_how_late(spark, activity_log):
    got = rows(
        activity_log.table(spark, "late_events"),
        "window_start",
        "type",
        "late_events",
        "min_behind_ms",
        "max_behind_ms",
    )
    assert got == sorted(
        [
            (at(0), "post_created", 1, 340_000, 340_000),  # 6:00 - 0:20
            (at(60), "message_sent", 1, 241_000, 241_000),  # 6:00 - 1:59
            (at(-DAY), "post_created", 1, DAY * 1000 + 330_000, DAY * 1000 + 330_000),  # 6:00 + 1 d - 0:30
            (at(-DAY + 300), "post_created", 1, DAY * 1000 + 60_000, DAY * 1000 + 60_000),
            (at(-DAY + 300), "status_updated", 1, DAY * 1000 + 50_000, DAY * 1000 + 50_000),
        ]
    )


def test_nothing_lost(spark, activity_log):
    """Posts and messages: counted in a closed window + late + still open = all of them."""
    counted = sum(r["events"] for r in activity_log.table(spark, "activity_per_minute").collect())
    late = sum(
        r["late_events"]
        for r in activity_log.table(spark, "late_events").collect()
        if r["type"] in ("post_created", "message_sent")
    )
    assert (counted, late) == (8, 4)
    assert counted + late + 1 == 13  # 13 posts and messages in the log, one (0:20:00) still open


def test_hopping_active_users(spark, tmp_path):
    log = Log(tmp_path)
    log.batch(
        ev("post_created", 1, 30),
        ev("status_updated", 2, 330),
        ev("post_created", 1, 570),
        ev("followed", 3, 720, followee_id=1),
    )
    log.batch(ev("post_created", 4, 3600))  # W = 59:00
    log.run(spark, ["active_users"])
    got = {
        int((r["window_start"] - at(0)).total_seconds() // 60): (r["active_users_approx"], r["events"])
        for r in log.table(spark, "active_users").collect()
    }
    # windows [s, s+10 min) for s in minutes: u1@0:30 is in s=-9..0, u2@5:30 in s=-4..5,
    # u1@9:30 in s=0..9, u3@12:00 in s=3..12; the 1:00:00 event's windows are still open
    expected = {s: (1, 1) for s in range(-9, -4)}
    expected |= {s: (2, 2) for s in range(-4, 0)}
    expected |= {0: (2, 3), 1: (2, 2), 2: (2, 2)}
    expected |= {s: (3, 3) for s in range(3, 6)}
    expected |= {s: (2, 2) for s in range(6, 10)}
    expected |= {s: (1, 1) for s in range(10, 13)}
    assert got == expected


def test_session_windows(spark, tmp_path):
    log = Log(tmp_path)
    log.batch(
        ev("post_created", 1, 0),
        ev("post_created", 1, 180),
        ev("status_updated", 1, 420),  # gaps 3 and 4 min: one session 0:00-0:07
        ev("message_sent", 2, 60),
    )
    log.batch(ev("post_created", 1, 1200), ev("post_created", 3, 3600))  # 13 min later: a new one
    log.run(spark, ["sessions"])
    got = rows(log.table(spark, "sessions"), "user_id", "session_start", "session_end", "events", "length_ms")
    assert got == [
        (1, at(0), at(720), 3, 420_000),  # ends a gap (5 min) after its last event
        (1, at(1200), at(1500), 1, 0),
        (2, at(60), at(360), 1, 0),
        # user 3's session (1:00:00) is still open
    ]
