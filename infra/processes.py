"""Process control for the stack's services: pid files, liveness, ports, starting and stopping by pid.

A service's pid file (``run/<service>.pid``) holds its pid, the ports it was started for and the
process's start time. A process is taken for ours only when it is alive, its command line holds
the service's marker and it began when the pid file says: a pid reused by another process (even
one of the same kind, such as another stack's broker) is not taken for ours, so never signalled. Process facts come from
psutil (https://psutil.readthedocs.io), not from parsing ``/proc`` or ``ss``.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, NamedTuple

import psutil

from infra.settings import Settings, setting_value


class StackError(RuntimeError):
    """Something the user must act on, reported as one line (no traceback)."""


_children: dict[int, subprocess.Popen] = {}  # processes started by this Python process, to reap them

# psutil's start time is boot time + the kernel's ticks since boot, so it moves with a step of the
# wall clock (psutil's docs: create_time "may be affected by ... NTP"); a reused pid began later than
# the process that died, so a few seconds of slack still tell them apart.
START_TIME_SLACK_S = 5.0


def _alive(pid: int) -> bool:
    """pid is a live process (a zombie counts as dead)."""
    child = _children.get(pid)
    if child is not None:
        return child.poll() is None
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, ValueError):  # ZombieProcess is a NoSuchProcess
        return False
    except psutil.AccessDenied:
        return True


def _cmdline(pid: int) -> str:
    """The process's command line, arguments joined by spaces ("" when unreadable)."""
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except (psutil.Error, ValueError):
        return ""


def start_time(pid: int) -> float | None:
    """When the process began (seconds since the epoch), None when it is gone or unreadable."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, ValueError):
        return None


def started_as(pid: int, marker: str, started: float | None) -> bool:
    """pid is a live process with ``marker`` in its command line that began at ``started``
    (not checked when None: a pid file written before start times were kept)."""
    if not (_alive(pid) and marker in _cmdline(pid)):
        return False
    if started is None:
        return True
    now = start_time(pid)
    return now is not None and abs(now - started) <= START_TIME_SLACK_S


# Pid files -------------------------------------------------------------------------------------


class PidRecord(NamedTuple):
    pid: int | None
    ports: list[int] | None  # None: not recorded
    started: float | None  # None: not recorded


def read_pid_file(path: Path) -> PidRecord:
    """``<pid>``, then ``<port>,<port>``, then the start time (the last two absent in older files)."""
    try:
        lines = path.read_text().splitlines()
        pid = int(lines[0])
    except (OSError, ValueError, IndexError):
        return PidRecord(None, None, None)
    try:
        ports = [int(p) for p in lines[1].split(",") if p] if len(lines) > 1 else None
    except ValueError:
        ports = None
    try:
        started = float(lines[2]) if len(lines) > 2 else None
    except ValueError:
        started = None
    return PidRecord(pid, ports, started)


def write_pid_file(path: Path, pid: int, ports: Sequence[int]) -> None:
    started = start_time(pid)
    path.write_text(f"{pid}\n{','.join(map(str, ports))}\n{'' if started is None else repr(started)}\n")


# Ports -----------------------------------------------------------------------------------------


def port_listening(port: int, host: str = "127.0.0.1") -> bool:
    """True when something accepts connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when a server could bind host:port (as Kafka and Redis do, with SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def _who_listens(port: int) -> str:
    """'pid 123 (redis-server)' for the process listening on port, best effort."""
    try:
        listeners = [
            c.pid
            for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
        ]
    except (psutil.Error, OSError):
        return "another process"
    for pid in listeners:
        if pid is None:  # another user's socket: the owner is not shown
            continue
        try:
            return f"pid {pid} ({psutil.Process(pid).name()})"
        except psutil.Error:
            return f"pid {pid} (?)"
    return "another process"


# Starting and stopping -------------------------------------------------------------------------


def spawn(command: list[str], log: IO[bytes], env: Mapping[str, str]) -> subprocess.Popen:
    """Start ``command`` in a session of its own, output to ``log``; kept to be reaped by :func:`stop`."""
    proc = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=dict(env),
        start_new_session=True,  # a Ctrl-C in the terminal that ran `make up` does not reach it
    )
    _children[proc.pid] = proc
    return proc


def stop(pid: int, timeout_s: float) -> str:
    """SIGTERM, wait, SIGKILL after ``timeout_s``: 'stopped' or 'killed after timeout'. Only for a
    pid the caller has checked is its own."""
    os.kill(pid, signal.SIGTERM)
    outcome = "stopped"
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
        outcome = "killed after timeout"
        while _alive(pid):
            time.sleep(0.05)
    return outcome


def forget(pid: int) -> None:
    """Reap pid if this process started it (killed first if still running: never block on it)."""
    child = _children.pop(pid, None)
    if child is not None and child.poll() is None:  # never block on a process we did not stop
        child.kill()
        child.wait()


def kill_group(pgid: int) -> None:
    """SIGKILL what is left of a process group (a child outliving its parent stays in the group it led)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def group_members(pgid: int) -> list[int]:
    """The live processes of a process group (zombies left out: an orphan's waits for init)."""
    members = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                members.append(proc.pid)
        except (ProcessLookupError, PermissionError):
            continue  # gone meanwhile
    return members


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that makes a child process build exactly these Settings."""
    from dataclasses import fields as dataclass_fields

    env = dict(os.environ)
    for f in dataclass_fields(settings):
        env[f.metadata["env"]] = setting_value(getattr(settings, f.name))
    return env
