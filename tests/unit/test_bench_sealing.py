"""The sealing bench's CPU accounting (infra/bench_sealing.py), on this process and the machine."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from infra.bench_sealing import _CpuMeter, _process_cpu_s


def test_a_busy_thread_is_counted_as_main_and_a_child_process_as_the_broker():
    # a child burning CPU stands in for the broker: its CPU is counted, this thread's is not mixed in
    child = subprocess.Popen(
        [sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 3: pass"]
    )
    try:
        time.sleep(0.2)  # the interpreter started
        with _CpuMeter(child.pid) as cpu:
            end = time.thread_time() + 0.3
            while time.thread_time() < end:  # 0.3 s of this thread's CPU
                pass
        out = cpu.per_event(1_000)
    finally:
        child.kill()
        child.wait()
    assert 290 <= out["main"] <= 400  # us per event: 0.3 s over 1,000 events
    assert out["client"] >= 0  # the rest of this process (no other busy thread here)
    assert out["broker"] is not None and out["broker"] > 0
    assert 0 <= out["idle_cores"] <= os.cpu_count()


def test_no_broker_pid_no_broker_figure_and_a_gone_process_reads_as_none():
    with _CpuMeter(None) as cpu:
        pass
    assert cpu.per_event(10)["broker"] is None
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert _process_cpu_s(child.pid) is None  # reaped: no /proc entry
    assert _process_cpu_s(os.getpid()) > 0
