"""Start and stop the real local stack: a single-node Kafka (KRaft) broker and Redis, on 127.0.0.1.

``python -m infra.stack up|down|status|ensure-redis`` (``make up`` / ``make down`` / ``make status``).
Everything is parameterised by a :class:`~infra.settings.Settings`, so tests run a second stack on
other ports and another var dir. Layout under ``settings.var_dir``::

    kafka/server.properties, kafka/log4j2.properties, kafka/data/   broker config and log segments
    redis/redis.conf, redis/appendonlydir/                          Redis config and AOF
    run/<service>.pid                                               what `up` started, for `down`
    log/<service>.log                                               stdout/stderr of each service

Services form a small registry (:data:`SERVICES`): each knows its ports, how to start, whether it
is running, how to stop. ``up`` starts them in order, ``down`` stops them in reverse order.

This module is the stack and its CLI; the parts live beside it and are re-exported here:
:mod:`infra.processes` (pid files, liveness, ports, starting and stopping by pid),
:mod:`infra.services` (the service classes and the registry), :mod:`infra.kafka_admin` (topics,
offsets, retriable broker errors), :mod:`infra.clients` (the Kafka and Redis client configs).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from infra.cli import command_name, run_main
from infra.external import check_external
from infra.jars import JarsError
from infra.kafka_admin import (
    EVENTS_TOPIC_CONFIGS,
    admin_client,
    create_topic,
    delete_topic,
    end_offsets,
    ensure_writers_topic,
    events_topic_configs,
    kafka_retriable,
    watermarks,
    writers_topic,
    writers_topic_configs,
)
from infra.processes import (
    StackError,
    _alive,
    _children,
    _cmdline,
    _who_listens,
    port_free,
    port_listening,
    settings_env,
)
from infra.services import (
    BACKBONE,
    COLLECTORS,
    KAFKA_HEAP,
    KAFKA_MAIN,
    KAFKA_STORAGE_TOOL,
    REDIS_MIN_VERSION,
    SERVICES,
    AirflowService,
    Analytics,
    ApiServer,
    Archiver,
    HttpService,
    KafkaBroker,
    MetricsExporter,
    PrometheusServer,
    RedisServer,
    Service,
    SparkDriverService,
    SparkMaster,
    SparkStandalone,
    SparkWorker,
    SpeedLayer,
    require_redis_version,
    with_a_collector,
)
from infra.settings import Settings, get_settings, redact_url

__all__ = [
    "BACKBONE",
    "COLLECTORS",
    "EVENTS_TOPIC_CONFIGS",
    "KAFKA_HEAP",
    "KAFKA_MAIN",
    "KAFKA_STORAGE_TOOL",
    "REDIS_MIN_VERSION",
    "SERVICES",
    "AirflowService",
    "Analytics",
    "ApiServer",
    "Archiver",
    "HttpService",
    "KafkaBroker",
    "MetricsExporter",
    "PrometheusServer",
    "RedisServer",
    "Service",
    "SparkDriverService",
    "SparkMaster",
    "SparkStandalone",
    "SparkWorker",
    "SpeedLayer",
    "Stack",
    "StackError",
    "_alive",
    "_children",
    "_cmdline",
    "_who_listens",
    "admin_client",
    "create_topic",
    "delete_topic",
    "end_offsets",
    "ensure_redis",
    "ensure_writers_topic",
    "events_topic_configs",
    "format_table",
    "free_port_block",
    "kafka_retriable",
    "main",
    "port_free",
    "port_listening",
    "require_redis_version",
    "settings_env",
    "standalone_spark_settings",
    "watermarks",
    "with_a_collector",
    "writers_topic",
    "writers_topic_configs",
]


def _ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of local ports for outgoing connections (and for a bind to port 0)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port_block(width: int) -> int:
    """A port p with p..p+width-1 all free (a cluster's nodes side by side, beside a running stack).

    Drawn below the kernel's ephemeral range: a port from that range (a bind to port 0) can be
    taken as the local port of any outgoing connection between this check and the service's bind,
    or while a killed node is down before its restart (2026-11-28: a cluster node's controller port
    53794 was "already in use" when it started, beside a busy test run)."""
    import random

    low = 20000
    high = min(_ephemeral_ports()[0], 65000) - width
    rng = random.Random()
    for _ in range(500):
        base = rng.randrange(low, high)
        if all(port_free(base + i) for i in range(width)):
            return base
    raise StackError(f"no block of {width} free ports in {low}-{high + width}")


def standalone_spark_settings(base: Settings, var_dir: Path, workers: int, worker_cores: int = 1) -> Settings:
    """A Spark standalone master and ``workers`` workers of ``worker_cores`` slots each, on free
    ports with their own ``var_dir``, beside the base's one Kafka broker and Redis (which stay as
    they are): for a fault run or a benchmark that adds a Spark cluster to a running local stack.
    The application may use every worker's slots, one speed layer task per slot."""
    port = free_port_block(2)
    return replace(
        base,
        profile="cluster",
        cluster_brokers=1,  # the base's one broker: the event topic's replication stays 1
        kafka_bootstrap=base.kafka_bootstrap,
        spark_master_port=port,
        spark_master_ui_port=port + 1,
        spark_master=f"spark://127.0.0.1:{port}",
        spark_workers=workers,
        spark_worker_cores=worker_cores,
        spark_app_cores=workers * worker_cores,
        speed_tasks=workers * worker_cores,
        var_dir=var_dir,
    )


# The stack -------------------------------------------------------------------------------------


@dataclass
class Stack:
    """The local stack for one Settings: ``Stack(settings).up()`` / ``.down()`` / ``.status()``."""

    settings: Settings
    service_types: tuple[type[Service], ...] | None = None

    @property
    def services(self) -> list[Service]:
        return [s for cls in (self.service_types or tuple(SERVICES)) for s in cls.instances(self.settings)]

    def other_profile_services(self) -> list[Service]:
        """What the other profile would run, where it is not one of ours: `down` and `status`
        see a cluster started with SOCIAL_PROFILE=cluster even when the variable is not set now."""
        # (the layout only decides what runs on Redis: a keyed one here is no reason to refuse `down`)
        other = replace(
            self.settings,
            profile="local" if self.settings.clustered else "cluster",
            serving_layout="partitioned",
        )
        mine = {s.name for s in self.services}
        types = self.service_types or tuple(SERVICES)
        return [s for cls in types for s in cls.instances(other) if s.name not in mine]

    def up(self) -> dict[str, str]:
        """Start what is not running, in order; check what is (health, not log text).

        On a failure, roll back only what this call started and nothing a running service needs:
        a service that was already running keeps every service before it in the order (its stores),
        even one this call had to restart (a broker that had died).
        """
        services = self.services
        # The user's own Kafka and Redis (SOCIAL_KAFKA_EXTERNAL, SOCIAL_REDIS_EXTERNAL) are checked
        # first: one that is unreachable or unfit stops `up` before it starts anything.
        outcome = {f"{line.split(' ', 1)[0]} (external)": line for line in check_external(self.settings)}
        # Refuse before starting anything if a port is taken by a process that is not ours.
        for service in services:
            if not service.is_running():
                service.check_ports()
        was_running = {service.name for service in services if service.is_running()}
        try:
            for service in services:
                outcome[service.name] = service.start()
        except BaseException:
            needed = max((i for i, service in enumerate(services) if service.name in was_running), default=-1)
            for i in reversed(range(needed + 1, len(services))):
                if outcome.get(services[i].name) == "started":
                    services[i].stop()
            raise
        return outcome

    def down(self, port_timeout_s: float = 10.0) -> dict[str, str]:
        services = self.services
        outcome = _stop_all(reversed(services))
        outcome.update(_stop_all(s for s in reversed(self.other_profile_services()) if s.pid() is not None))
        ports = [p for service in services for p in service.ports()]
        deadline = time.monotonic() + port_timeout_s
        while (busy := [p for p in ports if port_listening(p)]) and time.monotonic() < deadline:
            time.sleep(0.2)
        if busy:
            raise StackError(
                "stopped what `up` started, but something still listens on port(s) "
                + ", ".join(f"{p} ({_who_listens(p)})" for p in busy)
            )
        return outcome

    def status(self) -> list[tuple[str, str, str, str, str]]:
        others = [s for s in self.other_profile_services() if s.is_running()]
        rows = [service.status_row() for service in [*self.services, *others]]
        s = self.settings
        if s.redis_external:
            rows.insert(0, ("redis", "external", "-", redact_url(s.redis_url), "-"))
        if s.kafka_external:
            rows.insert(0, ("kafka", "external", "-", s.kafka_bootstrap, "-"))
        if s.lake_on_s3:
            rows.insert(
                0, ("lake", "external", "-", f"{s.lake_uri} at {s.lake_s3_endpoint or 'AWS S3'}", "-")
            )
        return rows


def _stop_all(services) -> dict[str, str]:
    """Stop services in order, the peers of one kind (a cluster's nodes) together: a KRaft node
    stopped last on its own would wait for a controller quorum that is gone."""
    from concurrent.futures import ThreadPoolExecutor
    from itertools import groupby

    outcome: dict[str, str] = {}
    for _kind, group in groupby(services, key=type):
        peers = list(group)
        with ThreadPoolExecutor(max_workers=len(peers)) as pool:
            outcome.update(zip((s.name for s in peers), pool.map(lambda s: s.stop(), peers), strict=True))
    return outcome


def format_table(rows: Sequence[tuple[str, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    return "\n".join(lines)


def ensure_redis() -> str:
    """Path of redis-server (7.0 or later), installing it with apt-get when missing (needs root)."""
    found = shutil.which("redis-server")
    if found:
        require_redis_version(found)
        return found
    if not shutil.which("apt-get"):
        raise StackError(
            "`redis-server` not found and no apt-get here: install Redis 7 so that redis-server is on PATH"
        )
    if os.geteuid() != 0:
        raise StackError("`redis-server` not found: run `sudo apt-get install -y redis-server` (needs root)")
    # Debian starts a freshly installed daemon on 6379; a policy-rc.d answering 101 ("action not
    # allowed") keeps it from doing so, so the only Redis that runs is the one `up` starts.
    policy = Path("/usr/sbin/policy-rc.d")
    added_policy = not policy.exists()
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        if added_policy:
            policy.write_text("#!/bin/sh\nexit 101\n")
            policy.chmod(0o755)
        for cmd in (
            ["apt-get", "update", "-q"],
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", "redis-server"],
        ):
            done = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if done.returncode != 0:
                last = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["(no output)"]
                raise StackError(f"`{' '.join(cmd)}` failed: {last[0]}")
    finally:
        if added_policy:
            policy.unlink(missing_ok=True)
    found = shutil.which("redis-server")
    if not found:
        raise StackError("apt-get installed redis-server but it is not on PATH")
    require_redis_version(found)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=command_name("infra.stack"), description=__doc__.splitlines()[0])
    parser.add_argument(
        "command", choices=["up", "down", "status", "ensure-redis", "ensure-prometheus", "ensure-chromium"]
    )
    args = parser.parse_args(argv)
    settings = get_settings()
    stack = Stack(settings)
    try:
        if args.command == "ensure-redis":
            print(f"redis-server: {ensure_redis()}")
        elif args.command == "ensure-chromium":
            from infra.browser import ensure_chromium

            print(f"chromium: {ensure_chromium()}")
        elif args.command == "ensure-prometheus":
            if settings.prometheus:
                from infra.prometheus import ensure_prometheus

                print(f"prometheus: {ensure_prometheus()}")
            else:
                print(
                    "prometheus: skipped (SOCIAL_PROMETHEUS=1 fetches Debian's package and `make up` starts it)"
                )
        elif args.command == "up":
            for name, what in stack.up().items():
                print(f"{name}: {what}")
            print(
                f"kafka {settings.kafka_bootstrap}  redis {redact_url(settings.redis_url)}  state under {settings.var_dir}"
            )
            print(f"metrics http://127.0.0.1:{settings.metrics_port}/metrics (docs/metrics.md)")
            print(f"dashboard {settings.dashboard_url} (live plots of the last minutes: docs/metrics.md)")
        elif args.command == "down":
            for name, what in stack.down().items():
                print(f"{name}: {what}")
        else:
            print(format_table(stack.status(), ("service", "state", "pid", "ports (*=listening)", "log")))
    except (StackError, JarsError) as exc:
        for line in str(exc).splitlines():  # an external component's problems: one line each
            print(f"error: {line}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "infra.stack"))
