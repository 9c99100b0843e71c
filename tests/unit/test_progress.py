"""The progress bars follow what they read (pipelines/progress.py)."""

from __future__ import annotations

import io
import threading
import time

from tqdm import tqdm

from pipelines.progress import _follow


def test_bar_follows_done_and_total_until_stopped():
    out = io.StringIO()
    bar = tqdm(total=0, file=out, disable=False, mininterval=0)
    readings = iter([(0, 8), (3, 8), (8, 8)])
    last: list[tuple[int, int]] = []

    def read():
        try:
            last.append(next(readings))
        except StopIteration:
            pass
        return last[-1]

    stop = threading.Event()
    thread = threading.Thread(target=_follow, args=(bar, read, stop, 0.01))
    thread.start()
    deadline = time.monotonic() + 5
    while bar.n < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    thread.join(5)
    assert (bar.n, bar.total) == (8, 8)
    assert "8/8" in out.getvalue()
