"""A local Redis Cluster on 127.0.0.1, for the tests, the benchmarks and a user who wants one to try:
N masters (no replicas), or one plain redis-server for a side-by-side (``masters=1``), started as
`make up` starts the stack's (docs/architecture.md, "On Redis Cluster").

:func:`start` gives settings of their own (a free block of ports, ``home`` as the var dir) to the
stack's own service, :class:`infra.services.RedisServer`: each node's config, its process (a
session of its own, its pid file and its log under ``home``), ``redis-cli --cluster create`` (the
16384 slots split evenly between the masters) and the wait until every node says
``cluster_state:ok``; :meth:`LocalCluster.stop` stops exactly those processes, by pid, as
`make down` does. A cluster's address is any node's URL (:attr:`LocalCluster.url`):
:func:`infra.clients.redis_client` gives a cluster-aware client for it.

    python -m infra.redis_cluster [--masters 3] [--dir DIR]   # runs one until Ctrl-C or SIGTERM
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from infra import processes
from infra.processes import StackError
from infra.services import RedisServer, join_cluster
from infra.settings import Settings

READY_TIMEOUT_S = 30.0


@dataclass
class LocalCluster:
    """The nodes this process started (the stack's :class:`RedisServer` services for ``settings``)."""

    settings: Settings

    @property
    def nodes(self) -> list[RedisServer]:
        return RedisServer.instances(self.settings)  # type: ignore[return-value]

    @property
    def ports(self) -> list[int]:
        return [port for port, _bus in self.settings.redis_ports()]

    @property
    def urls(self) -> list[str]:
        return [f"redis://127.0.0.1:{p}/0" for p in self.ports]

    @property
    def url(self) -> str:
        """The cluster's address as a user gives it (SOCIAL_REDIS_URL): one node's URL."""
        return self.urls[0]

    def _node(self, port: int) -> RedisServer:
        return self.nodes[self.ports.index(port)]

    def node_dir(self, port: int) -> Path:
        """The node's directory: its config, node file and append-only file."""
        return self._node(port).home

    def pid(self, port: int) -> int:
        pid = self._node(port).pid()
        if pid is None:
            raise StackError(f"no redis-server runs on port {port}")
        return pid

    def kill(self, port: int) -> None:
        """``kill -9`` the node on ``port`` (a fault: its append-only file is what it comes back with)."""
        pid = self.pid(port)
        os.kill(pid, signal.SIGKILL)
        processes.forget(pid)  # reaped: gone once this returns

    def restart(self, port: int) -> None:
        """Start the node on ``port`` again from its directory (its node file: the same node id and
        slots; its append-only file: its data) and wait until every node says ``cluster_state:ok``."""
        self._node(port).start()
        if self.settings.redis_cluster_masters:
            join_cluster(self.ports, time.monotonic() + READY_TIMEOUT_S, self.settings.log_dir)

    def move_slot(self, slot: int, to_port: int, pause_s: float = 0.0) -> int:
        """Move ``slot`` to the master on ``to_port`` while clients use it, with the steps of
        ``redis-cli --cluster reshard`` (``CLUSTER SETSLOT`` IMPORTING, MIGRATING, ``MIGRATE``,
        ``SETSLOT NODE`` on every master), ``pause_s`` between them; returns the keys moved.

        The slot goes MIGRATING and all its keys move in one atomic step on the source (a
        ``MULTI`` of the SETSLOT and a script that lists the slot's keys and MIGRATEs them), not
        redis-cli's batches of 10 (``--cluster-pipeline``): a function call names one key (its
        partition's fence) and reads and writes others of its slot, which Redis checks against a
        migration only as it reaches each of them. With the slot MIGRATING and its keys on the
        source, a call fails on a key it would create; with them split between two masters it fails
        on a moved key (on the source) or finds one missing (on the target, after an ASK) and
        applies events to a state without it. In one step, every call sees the whole slot on one
        master: the source before, the target after (ASK until SETSLOT NODE, then MOVED)."""
        import redis

        from infra.clients import redis_client

        nodes = {
            p: redis_client(url, "probe", cluster=False) for p, url in zip(self.ports, self.urls, strict=True)
        }
        try:
            ids = {p: _text(n.execute_command("CLUSTER MYID")) for p, n in nodes.items()}
            owner = [p for p, n in nodes.items() if _owns(n, slot)]
            if len(owner) != 1:
                raise StackError(f"slot {slot}: owned by {owner or 'no master'}")
            src = owner[0]
            if src == to_port:
                return 0
            nodes[to_port].execute_command("CLUSTER SETSLOT", slot, "IMPORTING", ids[src])
            time.sleep(pause_s)
            step = nodes[src].pipeline(transaction=True)
            step.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", ids[to_port])
            step.eval(_MIGRATE_SLOT, 0, slot, to_port, int(READY_TIMEOUT_S * 1000))
            moved = int(step.execute()[1])
            time.sleep(pause_s)
            # the new owner first, then the old one (its MOVED now points there), then the rest
            for p in [to_port, src] + [p for p in self.ports if p not in (src, to_port)]:
                nodes[p].execute_command("CLUSTER SETSLOT", slot, "NODE", ids[to_port])
            return moved
        except redis.RedisError as exc:
            raise StackError(f"moving slot {slot} to {to_port}: {exc}") from exc
        finally:
            for n in nodes.values():
                n.close()

    def stop(self) -> None:
        """Stop the nodes this cluster started (SIGTERM, SIGKILL after a timeout), by pid."""
        from infra.stack import Stack

        Stack(self.settings, service_types=(RedisServer,)).down()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *_exc) -> None:
        self.stop()


def start(home: Path, masters: int = 3, base_port: int | None = None) -> LocalCluster:
    """Start ``masters`` nodes on ``base_port``.. (a free block when None; their cluster bus ports
    follow, ``base_port + masters``..) and join them into one cluster (``masters=1``: one plain
    redis-server, no cluster); on any failure the nodes are stopped again and a
    :class:`StackError` says why."""
    from infra.stack import Stack, free_port_block

    if masters == 2 or masters < 1:
        raise StackError(f"a Redis Cluster needs at least 3 masters, not {masters}")
    port = base_port if base_port is not None else free_port_block(2 * masters)
    settings = Settings(
        redis_port=port,
        redis_masters=masters,
        redis_url=f"redis://127.0.0.1:{port}/0",
        serving_layout="partitioned",
        var_dir=home,
    )
    Stack(settings, service_types=(RedisServer,)).up()  # stops what it started when it fails
    return LocalCluster(settings)


# Every key of slot ARGV[1] to the master on 127.0.0.1:ARGV[2], in one MIGRATE (timeout ARGV[3] ms)
_MIGRATE_SLOT = """
local keys = redis.call('CLUSTER', 'GETKEYSINSLOT', ARGV[1], 2147483647)
if #keys > 0 then redis.call('MIGRATE', '127.0.0.1', ARGV[2], '', 0, ARGV[3], 'KEYS', unpack(keys)) end
return #keys
"""


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else v


def _owns(node, slot: int) -> bool:
    """Whether ``node`` (a client of one master) serves ``slot`` by its own ``CLUSTER SLOTS``."""
    me = node.connection_pool.connection_kwargs["port"]
    for row in node.execute_command("CLUSTER SLOTS"):
        lo, hi, master = row[0], row[1], row[2]
        if lo <= slot <= hi and int(master[1]) == me:
            return True
    return False


def _interrupted(signum: int, _frame) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def main(argv: list[str] | None = None) -> int:
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(prog="python -m infra.redis_cluster", description=__doc__.split("\n\n")[0])
    ap.add_argument("--masters", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="the nodes' directories (default: a new temp dir)")
    args = ap.parse_args(argv)
    home = args.dir or Path(tempfile.mkdtemp(prefix="redis-cluster-"))
    # Ctrl-C, and a SIGTERM (`kill <pid>`) alike, stop the nodes: they run in sessions of their own,
    # out of reach of a signal to this process (and a background job starts with SIGINT ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        cluster = start(home, args.masters)
    except StackError as exc:
        print(exc)
        return 1
    print(
        f"Redis Cluster of {args.masters} masters at {cluster.url} (nodes: {', '.join(map(str, cluster.ports))}; {home})"
    )
    print("SOCIAL_REDIS_URL=" + cluster.url)
    try:
        while all(node.is_running() for node in cluster.nodes):
            time.sleep(1)
        print("a node exited: stopping the others")
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        cluster.stop()


if __name__ == "__main__":
    raise SystemExit(main())
