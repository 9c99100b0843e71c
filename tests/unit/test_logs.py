"""The one logging configuration (infra/logs.py): its format and level, and a log file that stays
bounded however much is written to it."""

from __future__ import annotations

import logging
from contextlib import contextmanager

import pytest

from infra import logs


@contextmanager
def bare_root():
    """The root logger as a fresh process has it (pytest's capture handlers, which it adds for
    each test phase, set aside for the block)."""
    root = logging.getLogger()
    handlers, level = root.handlers, root.level
    root.handlers = []
    try:
        yield root
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers, root.level = handlers, level


def test_rotation_bounds_the_file(tmp_path):
    path = tmp_path / "log" / "archiver.log"
    line = "x" * 99
    with bare_root():
        log = logs.configure("archiver", level="INFO", log_file=path, max_bytes=10_000, backups=3)
        for _ in range(1_000):  # ~130 kB of records, 13 times the limit
            log.info(line)
    files = sorted(path.parent.iterdir())
    assert [f.name for f in files] == ["archiver.log", "archiver.log.1", "archiver.log.2", "archiver.log.3"]
    assert all(f.stat().st_size <= 10_000 for f in files)
    assert sum(f.stat().st_size for f in files) > 3 * 9_000  # the older files are full ones
    first = path.read_text().splitlines()[0]
    assert first.split(" ", 3)[2:] == ["archiver", "INFO " + line]


def test_stderr_in_the_one_format_at_the_settings_level(monkeypatch, capsys):
    monkeypatch.setenv("SOCIAL_LOG_LEVEL", "warning")
    with bare_root() as root:
        log = logs.configure("verify")
        log.info("not shown")
        log.warning("shown")
        assert root.level == logging.WARNING
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].endswith(" verify WARNING shown")


def test_a_second_call_replaces_the_first(tmp_path):
    with bare_root() as root:
        logs.configure("rebuild", level="INFO")
        logs.configure("rebuild", level="DEBUG", log_file=tmp_path / "rebuild.log")
        assert len(root.handlers) == 1 and root.level == logging.DEBUG


def test_a_root_configured_elsewhere_is_left_alone():
    other = logging.NullHandler()
    with bare_root() as root:
        root.addHandler(other)
        logs.configure("quality", level="DEBUG")
        assert root.handlers == [other]


def test_an_unknown_level_names_the_variable(monkeypatch):
    from infra.settings import get_settings

    monkeypatch.setenv("SOCIAL_LOG_LEVEL", "verbose")
    with pytest.raises(ValueError, match="SOCIAL_LOG_LEVEL='verbose'"):
        get_settings()


def test_redirected_output_is_capped_in_place(tmp_path):
    """A service's redirected stdout (opened in append mode by the stack) over the limit is copied
    to <name>.1 and emptied; the writer's next write lands at the start of the emptied file."""
    from infra.logs import cap_redirected

    log_dir = tmp_path / "log"
    log_dir.mkdir()
    small = log_dir / "redis.log"
    small.write_bytes(b"x" * 100)
    big = log_dir / "kafka.log"
    with big.open("ab") as writer:  # as the stack opens it for the child
        writer.write(b"a" * 5000)
        writer.flush()
        assert cap_redirected(log_dir, max_bytes=1000) == {"kafka.log": 5000}
        writer.write(b"b" * 10)
        writer.flush()
    assert big.read_bytes() == b"b" * 10
    assert (log_dir / "kafka.log.1").read_bytes() == b"a" * 5000
    assert small.read_bytes() == b"x" * 100
    assert cap_redirected(log_dir, max_bytes=1000) == {}
