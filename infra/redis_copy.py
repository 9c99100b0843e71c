"""A point-in-time copy of a running Redis, for checks that must not race the writers.

``verify`` compares the live serving state with a replay of the log at the position the state
covers; read key by key from a Redis the stream keeps writing, the state moves on under the
comparison. :func:`frozen_copy` starts a local ``redis-server`` as a replica of the live one (the
replication protocol: a snapshot, then the command stream, every function call's effects applied
atomically), waits until it is in sync, and detaches it (``REPLICAOF NO ONE``): what it holds is
the live state at one moment, which no writer changes. The comparison runs there, and so does the
replay's scratch namespace, which no longer costs the live Redis memory or time.

A Redis that refuses replication (a managed service without ``SYNC``, TLS) raises
:class:`CopyError`; the caller compares in place instead.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from infra import processes
from infra.processes import StackError


class CopyError(StackError):
    """The live Redis could not be copied (it refused to be replicated, or the copy did not sync)."""


def _free_port() -> int:
    from infra.stack import free_port_block

    return free_port_block(1)


@contextmanager
def frozen_copy(source_url: str, work_dir: Path, timeout_s: float = 600.0) -> Iterator[str]:
    """The URL of a detached replica of ``source_url`` (same database number), stopped and removed
    on exit. ``work_dir``: its directory (its log stays there when the copy fails)."""
    import redis
    from redis.connection import parse_url

    from infra.clients import redis_client

    source = parse_url(source_url)
    if source_url.startswith(("rediss://", "unix://")):
        raise CopyError("a copy replicates over a plain TCP link: rediss:// and unix:// are not copied")
    server = shutil.which("redis-server")
    if not server:
        raise CopyError("`redis-server` not found on PATH (make setup installs it)")
    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)
    port = _free_port()
    command = [
        server,
        "--port", str(port), "--bind", "127.0.0.1", "--dir", str(work_dir),
        "--save", "", "--appendonly", "no",
        "--replicaof", source.get("host", "127.0.0.1"), str(source.get("port", 6379)),
    ]  # fmt: skip
    if source.get("password"):
        command += ["--masterauth", source["password"]]
    if source.get("username"):
        command += ["--masteruser", source["username"]]
    log = (work_dir / "redis.log").open("wb")
    proc = processes.spawn(command, log, os.environ)
    url = f"redis://127.0.0.1:{port}/{source.get('db', 0)}"
    ok = False
    try:
        client = redis_client(url, "job")
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise CopyError(
                    f"the copy's redis-server exited ({proc.returncode}); see {work_dir / 'redis.log'}"
                )
            try:
                info = client.info("replication")
            except redis.ConnectionError:
                info = {}
            if info.get("master_link_status") == "up" and not info.get("master_sync_in_progress"):
                break
            if time.monotonic() > deadline:
                raise CopyError(
                    f"the copy of {source.get('host')}:{source.get('port')} did not sync in {timeout_s:.0f} s "
                    f"(replication refused?); see {work_dir / 'redis.log'}"
                )
            time.sleep(0.2)
        client.replicaof("NO", "ONE")  # detached: from here on, the live writes stop reaching it
        client.close()
        ok = True
        yield url
    finally:
        if proc.poll() is None:
            processes.stop(proc.pid, timeout_s=30)
        processes.forget(proc.pid)
        log.close()
        if ok:
            shutil.rmtree(work_dir, ignore_errors=True)
