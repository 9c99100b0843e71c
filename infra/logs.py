"""One logging configuration for the Python services and jobs (speed layer, archiver, analytics,
verify, rebuild, restore, maintenance, quality).

``configure(service)`` at the top of a ``main``: one format, the level of ``SOCIAL_LOG_LEVEL``,
records to stderr. The services ``make up`` starts have their stdout and stderr sent to
``var/log/<service>.log`` by the stack (infra/stack.py); a process that keeps its own log file
passes ``log_file=`` instead and gets a size-bounded rotating file (10 MB and 3 older files by
default), so the file cannot fill the disk.
"""

from __future__ import annotations

import logging
import sys
from logging.handlers import RotatingFileHandler
from pathlib import Path

from infra.settings import get_settings

FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
MAX_BYTES = 10 * 1024 * 1024
BACKUPS = 3


class _Handler(logging.Handler):
    """Marks the handlers configure() installed, so that a second call replaces them."""


class _StreamHandler(logging.StreamHandler, _Handler):
    pass


class _RotatingFileHandler(RotatingFileHandler, _Handler):
    pass


def configure(
    service: str,
    *,
    level: str | int | None = None,
    log_file: Path | None = None,
    max_bytes: int = MAX_BYTES,
    backups: int = BACKUPS,
) -> logging.Logger:
    """Send the process's log records to stderr (or to ``log_file``, rotated at ``max_bytes`` with
    ``backups`` older files kept) in the one format; returns the service's logger.

    ``level`` defaults to the setting SOCIAL_LOG_LEVEL. Like ``logging.basicConfig``, it leaves a
    root logger alone that something else already configured (a test runner, an embedding
    program); a second call replaces what the first installed.
    """
    root = logging.getLogger()
    ours = [h for h in root.handlers if isinstance(h, _Handler)]
    if len(ours) < len(root.handlers):
        return logging.getLogger(service)
    for handler in ours:
        root.removeHandler(handler)
        handler.close()
    if log_file is not None:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        handler = _RotatingFileHandler(log_file, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
    else:
        handler = _StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level or get_settings().log_level.upper())
    return logging.getLogger(service)


def cap_redirected(log_dir: Path, *, max_bytes: int = MAX_BYTES, dry_run: bool = False) -> dict[str, int]:
    """Bound the files the stack redirects a service's stdout and stderr into (``var/log/*.log``:
    the JVMs', redis-server's and the Python services' own output), which no handler can rotate:
    the child holds the file open. The stack opens them in append mode (``O_APPEND``), so a copy
    then a truncate in place is safe: each write lands at the new end. A file over ``max_bytes``
    is copied to ``<name>.1`` (replacing the previous copy) and emptied, so a service's output
    takes at most twice ``max_bytes``. Returns ``{file name: bytes moved}`` for the files capped."""
    import shutil

    capped: dict[str, int] = {}
    if not log_dir.exists():
        return capped
    for path in sorted(log_dir.rglob("*.log")):
        if not path.is_file():
            continue
        size = path.stat().st_size
        if size <= max_bytes:
            continue
        capped[str(path.relative_to(log_dir))] = size
        if dry_run:
            continue
        shutil.copyfile(path, path.with_name(path.name + ".1"))
        with path.open("r+b") as f:
            f.truncate(0)
    return capped
