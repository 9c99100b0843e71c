"""Jobs off the serving path run behind the speed layer even where the kernel schedules by
autogroup (a process in a session of its own is then weighed by its autogroup's nice, not by its
own): ``run_behind_serving_path`` lowers both, and never the autogroup of a caller's terminal."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = (
    "import os, sys; from pipelines.spark import run_behind_serving_path; run_behind_serving_path(); "
    "print(os.getpriority(os.PRIO_PROCESS, 0)); sys.stdout.flush(); sys.stdin.read()"
)
AUTOGROUP = Path("/proc/self/autogroup")


def _autogroup_applies() -> bool:
    """The kernel schedules this process by autogroup. The file exists whenever the kernel has
    autogroup scheduling, but reads empty for a process in a cgroup of its own (a container, a
    systemd slice with CPU accounting): the cgroup then weighs it, and no autogroup is shown."""
    try:
        return bool(AUTOGROUP.read_text().strip())
    except OSError:
        return False


NO_AUTOGROUP = "this process is not scheduled by autogroup (no autogroup in the kernel, or a cgroup)"


def _autogroup(pid: int) -> tuple[str, int]:
    name, _, nice = Path(f"/proc/{pid}/autogroup").read_text().split()
    return name, int(nice)


@contextlib.contextmanager
def _child(new_session: bool, off_path_nice: int = 10):
    """A child that ran ``run_behind_serving_path`` with ``SOCIAL_OFF_PATH_NICE`` (whatever the
    caller's environment sets) and waits; its own nice is checked here."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=new_session,
        env={**os.environ, "SOCIAL_OFF_PATH_NICE": str(off_path_nice)},
    )
    try:
        assert int(child.stdout.readline()) == os.getpriority(os.PRIO_PROCESS, 0) + off_path_nice
        yield child
    finally:
        child.communicate("")


@pytest.mark.skipif(not _autogroup_applies(), reason=NO_AUTOGROUP)
def test_a_service_in_its_own_session_lowers_its_autogroup_too():
    mine = _autogroup(os.getpid())
    with _child(new_session=True) as child:
        name, group_nice = _autogroup(child.pid)
        assert name != mine[0]  # its own session, its own autogroup
        assert group_nice == 10
    assert _autogroup(os.getpid()) == mine


@pytest.mark.skipif(not _autogroup_applies(), reason=NO_AUTOGROUP)
def test_a_job_started_inside_a_terminal_session_leaves_that_session_alone():
    mine = _autogroup(os.getpid())
    with _child(new_session=False) as child:
        assert _autogroup(child.pid) == mine  # the caller's group, its nice untouched


def test_an_off_path_nice_of_zero_leaves_the_priority_and_the_autogroup_alone():
    """SOCIAL_OFF_PATH_NICE=0 (the integration tests' setting, Makefile: SHORT_JOBS): level with
    the speed layer, in a session of its own too."""
    with _child(new_session=True, off_path_nice=0) as child:
        if _autogroup_applies():
            assert _autogroup(child.pid)[1] == 0
