"""A job's stop request (pipelines/stopping.py): SIGTERM and SIGINT set its event while it runs,
and the caller's own handlers are back once it returns (a job run in a test worker's process)."""

from __future__ import annotations

import os
import signal
import threading

from pipelines.stopping import stop_requested


def test_a_signal_inside_sets_the_event_and_the_callers_handlers_come_back():
    seen = []
    mine = lambda signum, frame: seen.append(signum)  # noqa: E731 - the caller's own handler
    previous = {s: signal.signal(s, mine) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        with stop_requested() as stopping:
            assert not stopping.is_set()
            os.kill(os.getpid(), signal.SIGTERM)
            assert stopping.wait(5)
            assert seen == []  # the job's handler took it, not the caller's
        with stop_requested() as stopping:
            os.kill(os.getpid(), signal.SIGINT)
            assert stopping.wait(5)
        assert signal.getsignal(signal.SIGTERM) is mine and signal.getsignal(signal.SIGINT) is mine
        os.kill(os.getpid(), signal.SIGTERM)  # after the job: the caller's handler again
        assert seen == [signal.SIGTERM]
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def test_outside_the_main_thread_nothing_is_installed():
    before = signal.getsignal(signal.SIGTERM)
    got = {}

    def job():
        with stop_requested() as stopping:
            got["handler"] = signal.getsignal(signal.SIGTERM)
            got["set"] = stopping.is_set()

    t = threading.Thread(target=job)
    t.start()
    t.join(10)
    assert got == {"handler": before, "set": False}
