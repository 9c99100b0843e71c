"""infra.stack.Service: a process left running by an earlier run for other ports is not waited on.

A benchmark picks a free port for its API each run; when one is killed before it stops its API,
the pid file stays with a live process of ours. The next run must not take that process for the
one it wants (and time out waiting on a port nobody listens on): it stops it and starts its own.
"""

from __future__ import annotations

import socket
import sys
import time

from infra import stack
from infra.settings import get_settings


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Listener(stack.Service):
    """A stub service: a Python process listening on ``port`` (ready when it accepts)."""

    name = "listener"
    marker = "kappa-stub-listener"
    ready_timeout_s = 15.0
    stop_timeout_s = 5.0

    def __init__(self, settings, port: int):
        super().__init__(settings)
        self.port = port

    def ports(self) -> list[int]:
        return [self.port]

    def command(self) -> list[str]:
        code = (
            "import socket, sys, time; s = socket.socket(); "
            "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
            "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); time.sleep(600)"
        )
        return [sys.executable, "-c", code, str(self.port), self.marker]

    def wait_ready(self, deadline: float) -> None:
        while not stack.port_listening(self.port):
            if not self.is_running():
                raise self._died()
            if time.monotonic() > deadline:
                raise stack.StackError(f"listener: nothing on port {self.port}")
            time.sleep(0.05)


def test_a_process_left_for_other_ports_is_replaced_not_waited_on(tmp_path):
    settings = get_settings(var_dir=tmp_path)
    first = Listener(settings, _free_port())
    assert first.start() == "started"
    old_pid = first.pid()
    assert first.recorded_ports() == [first.port]
    orphan = stack._children.pop(old_pid)  # as if the run that started it was killed: not our child now
    again = Listener(settings, first.port)
    assert again.start() == "already running" and again.pid() == old_pid  # same ports: reused

    second = Listener(settings, _free_port())
    try:
        assert second.start() == "started"
        assert second.pid() != old_pid and stack.port_listening(second.port)
        assert not stack._alive(old_pid)  # the left-over process was stopped
        assert second.recorded_ports() == [second.port]
    finally:
        second.stop()
        orphan.kill()
        orphan.wait()
    assert not second.is_running()
