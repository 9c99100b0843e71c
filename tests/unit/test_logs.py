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
