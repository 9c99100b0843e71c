"""A long-running job's stop request: SIGTERM or SIGINT sets an event the job's loop watches.

The job then stops between micro-batches (or archives), not in the middle of one. The handlers
are the process's only while the job runs: its caller's are back when it returns, so a job run
in-process (a rebuild's steps, a test's worker) leaves the caller's own handling of signals (a
pytest-xdist worker's SIGTERM, Ctrl-C) as it found it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def stop_requested() -> Iterator[threading.Event]:
    """An event set by SIGTERM or SIGINT while the block runs (only the main thread can take
    signals; elsewhere the event is only ever set by the caller)."""
    stopping = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stopping
        return
    previous = {s: signal.signal(s, lambda *_: stopping.set()) for s in SIGNALS}
    try:
        yield stopping
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
