"""The sealing bench's CPU accounting (stories/bench_sealing.py), on this process and the machine."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time

from stories.bench_common import process_cpu_s
from stories.bench_sealing import CpuMeter


def test_the_simulating_thread_its_process_and_the_broker_are_counted_apart():
    # an idle child stands in for the broker; a thread hashing (GIL released) for librdkafka's
    broker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    data = b"x" * (1 << 20)

    def hash_for_a_second() -> None:
        end = time.thread_time() + 1.0  # this thread's own CPU clock
        while time.thread_time() < end:
            hashlib.sha256(data).digest()

    try:
        time.sleep(0.3)  # the child's interpreter started: it only sleeps from here
        with CpuMeter(broker.pid) as cpu:
            client = threading.Thread(target=hash_for_a_second)
            client.start()
            end = time.thread_time() + 0.3
            while time.thread_time() < end:  # 0.3 s of this thread's CPU
                pass
            client.join()
        out = cpu.per_event(1_000)
    finally:
        broker.kill()
        broker.wait()
    assert 290 <= out["main"] <= 400  # us per event: 0.3 s over 1,000 events, the hashing not in it
    assert out["client"] >= 700  # the other thread's second of SHA-256
    assert out["broker"] is not None and out["broker"] < 50  # the sleeping child, not this process
    assert 0 <= out["idle_cores"] <= os.cpu_count()


def test_no_broker_pid_no_broker_figure_and_a_gone_process_reads_as_none():
    with CpuMeter(None) as cpu:
        pass
    assert cpu.per_event(10)["broker"] is None
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert process_cpu_s(child.pid) is None  # reaped: no /proc entry
    assert process_cpu_s(os.getpid()) > 0
