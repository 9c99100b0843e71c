"""When the archiver archives and compacts (pipelines/archiver.py, ``Schedule``), tick by tick.

The rule (docs/architecture.md, "Where state lives"): archive the newest cut at least the
durability lag old, every interval while the speed layer applies records and at once when it is
idle at the log's end; compact every compaction interval, and at once when the log is quiet (at
its end, nothing new to archive). The expected steps below are worked out from that rule, one
tick a second, interval 30 s, durability 1 s, compaction 300 s.
"""

from __future__ import annotations

from pipelines.archiver import Archive, Schedule
from pipelines.speed.changelog import Cut


class Log:
    """The log's end as the broker would answer, counting how often the archiver asks."""

    def __init__(self, end: int) -> None:
        self.end, self.asked = end, 0

    def __call__(self, fences: dict[int, int]) -> bool:
        self.asked += 1
        return fences.get(0, 0) >= self.end


def cut(offset: int) -> Cut:
    return Cut(seq=offset, fences={0: offset})


def wrote(start: int, end: int, archive_id: int = 0) -> Archive:
    return Archive(archive_id=archive_id, start_offsets={0: start}, end_offsets={0: end}, seq=end)


def schedule() -> Schedule:
    return Schedule(interval_s=30.0, durability_s=1.0, compaction_interval_s=300.0, last_compaction=0.0)


def test_catching_up_then_idle_at_the_end_archives_at_once_then_compacts_then_rests():
    s, log = schedule(), Log(end=30)
    assert s.tick(0, cut(10), log).archive is None  # nothing a second old yet
    step = s.tick(1, cut(20), log)
    assert step.archive == cut(10) and not step.at_end  # the first due cut, at once (no archive yet)
    assert log.asked == 0  # the speed layer moved: the broker is not asked
    s.archived(1, step.archive, wrote(0, 10))
    assert s.tick(2, cut(30), log).archive is None  # applying, and the interval has not passed
    step = s.tick(3, cut(30), log)  # idle since the durable cut, which is at the log's end
    assert step.archive == cut(30) and step.at_end and log.asked == 1
    assert not s.compaction_due(3, step)  # what it is about to archive first
    s.archived(3, step.archive, wrote(10, 30, 1))
    step = s.tick(4, cut(30), log)
    assert step.archive is None and step.at_end and s.compaction_due(4, step)  # quiet: compact
    s.compacted(4)
    asked = log.asked
    for t in range(5, 100):  # idle and compacted: no archive, no compaction, no broker
        step = s.tick(t, cut(30), log)
        assert step.archive is None and not s.compaction_due(t, step)
    assert log.asked == asked


def test_a_speed_layer_stopped_short_of_the_end_waits_for_the_interval():
    s, log = schedule(), Log(end=100)
    s.tick(0, cut(10), log)
    step = s.tick(1, cut(15), log)
    s.archived(1, step.archive, wrote(0, 10))
    for t in range(2, 31):  # crashed at 15, the log's end at 100: a pause, not the end
        step = s.tick(t, cut(15), log)
        assert step.archive is None and not step.at_end and not s.compaction_due(t, step)
    step = s.tick(31, cut(15), log)  # 30 s after the last archive
    assert step.archive == cut(15) and not step.at_end


def test_a_cut_is_archived_only_once_it_is_the_durability_lag_old():
    s, log = Schedule(30.0, 2.0, 300.0, last_compaction=0.0), Log(end=10)
    assert s.tick(0, cut(10), log).archive is None
    assert s.tick(1, cut(10), log).archive is None  # one second old: Redis may still lose it
    assert s.tick(2, cut(10), log).archive == cut(10)


def test_an_unfinished_archive_rerun_short_of_the_cut_is_followed_by_the_rest():
    s, log = schedule(), Log(end=40)
    s.tick(0, cut(40), log)
    step = s.tick(1, cut(40), log)
    assert step.archive == cut(40)
    s.archived(1, step.archive, wrote(0, 25))  # a crashed run's range, re-run first
    step = s.tick(2, cut(40), log)
    assert step.archive == cut(40)  # the rest at once: the speed layer is at the end


def test_under_steady_load_archives_every_interval_and_compacts_every_compaction_interval():
    s, log = schedule(), Log(end=10**9)
    archives, compactions = [], []
    for t in range(0, 601):
        step = s.tick(t, cut(10 * (t + 1)), log)
        if step.archive is not None:
            s.archived(t, step.archive, wrote(0, step.archive.fences[0]))
            archives.append(t)
        if s.compaction_due(t, step):
            s.compacted(t)
            compactions.append(t)
    assert archives == list(range(1, 601, 30))
    assert compactions == [300, 600]
    assert log.asked == 0  # never idle: the broker is never asked
