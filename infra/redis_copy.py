"""A point-in-time copy of a running Redis, for checks that must not race the writers.

``verify`` compares the live serving state with a replay of the log at the position the state
covers; read key by key from a Redis the stream keeps writing, the state moves on under the
comparison. :func:`frozen_copy` starts a local ``redis-server`` as a replica of the live one (the
replication protocol: a snapshot, then the command stream, every function call's effects applied
atomically), waits until it is in sync, and detaches it (``REPLICAOF NO ONE``): what it holds is
the live state at one moment, which no writer changes. The comparison runs there, and so does the
replay's scratch namespace, which no longer costs the live Redis memory or time.

A Redis Cluster is copied at one instant across its masters (:func:`_cluster_copy`): a replica of
each master, brought in sync while the writers go on; then every master's writes are paused for
the moment it takes the replicas to reach the masters' offsets (``CLIENT PAUSE WRITE``: no call
starts on any master, a running one ends first), and the replicas are detached before the pause
ends. What they hold together is the whole cluster's state at the instant the last pause began:
a state a crash could have left (a run's deliveries half applied across masters), which is what
the partitioned layout's recovery completes. The copies are then merged into the first (``MIGRATE
COPY``): one plain Redis, which the comparison reads as it reads a single master's copy.

A Redis that refuses replication (a managed service without ``SYNC``, TLS) raises
:class:`CopyError`; the caller compares in place instead.
"""

from __future__ import annotations

import contextlib
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
    on exit; of a Redis Cluster, one server holding every master's keys at one instant
    (:func:`_cluster_copy`). ``work_dir``: its directory (its log stays there when the copy fails)."""
    from redis.connection import parse_url

    from infra.clients import is_cluster

    source = parse_url(source_url)
    if source_url.startswith(("rediss://", "unix://")):
        raise CopyError("a copy replicates over a plain TCP link: rediss:// and unix:// are not copied")
    if not shutil.which("redis-server"):
        raise CopyError("`redis-server` not found on PATH (make setup installs it)")
    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)
    replicas: list[_Replica] = []
    ok = False
    try:
        if is_cluster(source_url):
            url = _cluster_copy(source_url, source, work_dir, timeout_s, replicas)
        else:
            replica = _Replica.start(
                source, source.get("host", "127.0.0.1"), source.get("port", 6379), work_dir
            )
            replicas.append(replica)
            replica.wait_synced(time.monotonic() + timeout_s)
            replica.detach()  # from here on, the live writes stop reaching it
            url = replica.url
        ok = True
        yield url
    finally:
        for replica in replicas:
            replica.stop()
        if ok:
            shutil.rmtree(work_dir, ignore_errors=True)


class _Replica:
    """A local ``redis-server`` replicating one server (``--replicaof``), in a directory of its own."""

    def __init__(self, proc, port: int, db: int, home: Path, log, what: str):
        from infra.clients import redis_client

        self.proc, self.port, self.home, self.log, self.what = proc, port, home, log, what
        self.url = f"redis://127.0.0.1:{port}/{db}"
        self.client = redis_client(self.url, "job", cluster=False)

    @classmethod
    def start(cls, source: dict, host: str, port: int, home: Path) -> _Replica:
        home.mkdir(parents=True, exist_ok=True)
        mine = _free_port()
        command = [
            str(shutil.which("redis-server")),
            "--port", str(mine), "--bind", "127.0.0.1", "--dir", str(home),
            "--save", "", "--appendonly", "no",
            "--replicaof", host, str(port),
        ]  # fmt: skip
        if source.get("password"):
            command += ["--masterauth", source["password"]]
        if source.get("username"):
            command += ["--masteruser", source["username"]]
        log = (home / "redis.log").open("wb")
        proc = processes.spawn(command, log, os.environ)
        return cls(proc, mine, source.get("db", 0), home, log, f"{host}:{port}")

    def info(self) -> dict:
        import redis

        if self.proc.poll() is not None:
            raise CopyError(
                f"the copy's redis-server exited ({self.proc.returncode}); see {self.home / 'redis.log'}"
            )
        try:
            return self.client.info("replication")
        except redis.ConnectionError:
            return {}

    def wait_synced(self, deadline: float, offset: int | None = None) -> None:
        """Until the link is up and the first sync done (and, given ``offset``, applied up to it);
        by ``deadline`` (a monotonic time), else a CopyError."""
        within = deadline - time.monotonic()
        while True:
            info = self.info()
            if info.get("master_link_status") == "up" and not info.get("master_sync_in_progress"):
                if offset is None or int(info.get("slave_repl_offset", -1)) >= offset:
                    return
            if time.monotonic() > deadline:
                raise CopyError(
                    f"the copy of {self.what} did not sync in {within:.0f} s (replication refused?); "
                    f"see {self.home / 'redis.log'}"
                )
            time.sleep(0.2 if offset is None else 0.005)

    def detach(self) -> None:
        self.client.replicaof("NO", "ONE")

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            processes.stop(self.proc.pid, timeout_s=30)
        processes.forget(self.proc.pid)
        self.log.close()


PAUSE_MS = 10_000  # the longest a cluster copy may hold the masters' writes (Redis ends it then)


def _cluster_copy(source_url: str, source: dict, work_dir: Path, timeout_s: float, replicas: list) -> str:
    """Every master of the cluster at ``source_url`` copied at one instant, merged into one server
    (the module's docstring says how and why); returns its URL. ``replicas`` collects what was
    started, for the caller to stop. A cluster that refuses to be paused is a CopyError (the caller
    compares in place)."""
    import redis

    from infra.clients import redis_client

    cluster = redis_client(source_url, "job", cluster=True)
    try:
        primaries = [(node.host, int(node.port)) for node in cluster.get_primaries()]
    finally:
        cluster.close()
    deadline = time.monotonic() + timeout_s
    for i, (host, port) in enumerate(primaries):
        replicas.append(_Replica.start(source, host, port, work_dir / str(i)))
    for replica in replicas:
        replica.wait_synced(deadline)
    masters = [
        redis_client(_node_url(source_url, host, port), "job", cluster=False) for host, port in primaries
    ]
    try:
        try:
            for master in masters:  # no call starts on any master from the last of these on
                master.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")
        except redis.ResponseError as exc:  # a managed cluster may not let this user pause it
            for master in masters:
                with contextlib.suppress(redis.RedisError):
                    master.execute_command("CLIENT", "UNPAUSE")
            raise CopyError(f"the cluster refused CLIENT PAUSE ({exc}): no copy at one instant") from None
        try:
            offsets = [int(m.info("replication")["master_repl_offset"]) for m in masters]
            pause_ends = time.monotonic() + PAUSE_MS / 1000 / 2
            for replica, offset in zip(replicas, offsets, strict=True):
                replica.wait_synced(pause_ends, offset)
            for replica in replicas:
                replica.detach()
        finally:
            for master in masters:
                master.execute_command("CLIENT", "UNPAUSE")
    finally:
        for master in masters:
            master.close()
    into = replicas[0]
    for replica in replicas[1:]:
        _merge(replica, into)
    return into.url


def _node_url(url: str, host: str, port: int) -> str:
    """``url`` (its credentials, database, options) pointed at another node of its cluster."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=(f"{userinfo}@" if userinfo else "") + f"{host}:{port}"))


def _merge(source: _Replica, into: _Replica, batch: int = 500) -> None:
    """Every key of ``source`` copied into ``into`` (``MIGRATE ... COPY``: each key's value as it is,
    TTLs kept); a cluster's masters hold disjoint slots, so no key is written twice."""
    keys: list = []
    for key in source.client.scan_iter(count=2000):
        keys.append(key)
        if len(keys) >= batch:
            _migrate(source, into, keys)
            keys = []
    if keys:
        _migrate(source, into, keys)


def _migrate(source: _Replica, into: _Replica, keys: list) -> None:
    db = int(into.url.rsplit("/", 1)[1])
    source.client.execute_command("MIGRATE", "127.0.0.1", into.port, "", db, 60_000, "COPY", "KEYS", *keys)
