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
"""

from __future__ import annotations

import argparse
import base64
import errno
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from infra.jars import JarsError, kafka_classpath, require_java, spark_java_home
from infra.settings import REPO_ROOT, Settings, get_settings

KAFKA_MAIN = "kafka.Kafka"  # the broker (and, with process.roles=broker,controller, the KRaft controller)
KAFKA_STORAGE_TOOL = "kafka.tools.StorageTool"  # what bin/kafka-storage.sh runs: formats the log dirs
KAFKA_HEAP = ["-Xms256m", "-Xmx1g"]


COLLECTORS = {f"-XX:+Use{gc}GC" for gc in ("Serial", "Parallel", "G1", "Z", "Shenandoah", "Epsilon")}


def with_a_collector(options: list[str], default: str) -> list[str]:
    """JVM flags with one garbage collector: the given one's, else ``default`` (two are an error)."""
    return options if COLLECTORS & set(options) else [*options, default]


# The retained event log: the source of truth, so nothing may ever be deleted by time or size.
EVENTS_TOPIC_CONFIGS: dict[str, str] = {
    "retention.ms": "-1",
    "retention.bytes": "-1",
    "cleanup.policy": "delete",  # never compacted: every event, not the latest per key
    "min.insync.replicas": "1",  # one local broker; 2 with replication 3 when scaled
    "unclean.leader.election.enable": "false",  # never lose acknowledged events on failover
    # The broker stamps each record when it is appended: per partition monotonic, independent of
    # producer clocks, so offsets-for-times lookups (replay from a time) are exact. Device and
    # server times live in the event itself (docs/events.md).
    "message.timestamp.type": "LogAppendTime",
    "compression.type": "producer",
}


def events_topic_configs(settings: Settings) -> dict[str, str]:
    """The event topic's configs for this profile: in the cluster profile an acks=all write is on
    two of its three replicas before it is acknowledged (`min.insync.replicas=2`)."""
    return {**EVENTS_TOPIC_CONFIGS, "min.insync.replicas": str(settings.min_insync_replicas)}


def writers_topic(settings: Settings, events_topic: str | None = None) -> str:
    """The registry of snowflake worker ids of the log (contract/writers.py) for the log ``events_topic`` (default: the settings' event topic)."""
    return settings.writers_topic or f"{events_topic or settings.events_topic}.writers"


def writers_topic_configs(settings: Settings) -> dict[str, str]:
    """Compacted and kept forever: claims have unique keys, so the cleaner never removes one."""
    return {
        "cleanup.policy": "compact",
        "retention.ms": "-1",
        "retention.bytes": "-1",
        "min.insync.replicas": str(settings.min_insync_replicas),
        "unclean.leader.election.enable": "false",
    }


def ensure_writers_topic(settings: Settings, events_topic: str | None = None, timeout_s: float = 30.0) -> str:
    """Create the registry topic if it is missing (idempotent); returns its name."""
    name = writers_topic(settings, events_topic)
    create_topic(
        settings,
        name,
        1,
        writers_topic_configs(settings),
        replication_factor=settings.replication_factor,
        timeout_s=timeout_s,
    )
    return name


class StackError(RuntimeError):
    """Something the user must act on, reported as one line (no traceback)."""


# Process helpers -------------------------------------------------------------------------------

_children: dict[int, subprocess.Popen] = {}  # processes started by this Python process, to reap them


def _alive(pid: int) -> bool:
    child = _children.get(pid)
    if child is not None:
        return child.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purposes
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


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


def free_port_block(width: int) -> int:
    """A port p with p..p+width-1 all free (a cluster's nodes side by side, beside a running stack)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + width < 65000 and all(port_free(base + i) for i in range(width)):
            return base
    raise StackError(f"no block of {width} free ports")


def _who_listens(port: int) -> str:
    """'pid 123 (redis-server)' for the process listening on port, best effort."""
    if not shutil.which("ss"):
        return "another process"
    out = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True).stdout
    if 'users:(("' in out:
        name, _, rest = out.split('users:(("', 1)[1].partition('"')
        pid = rest.split("pid=", 1)[1].split(",", 1)[0] if "pid=" in rest else "?"
        return f"pid {pid} ({name})"
    return "another process"


# Services --------------------------------------------------------------------------------------


class Service:
    """One long-running local process: config in var/<name>, pid in var/run, log in var/log.

    Subclasses give ``name``, ``marker`` (a string in the process's command line, so that a reused
    pid is never mistaken for ours), ``ports``, ``command`` and ``wait_ready``; optionally
    ``prepare`` (write configs, format storage) and ``after_ready`` (create topics, ...).
    """

    name: str = ""
    marker: str = ""
    stop_timeout_s: float = 30.0
    ready_timeout_s: float = 90.0

    def __init__(self, settings: Settings):
        self.settings = settings

    @classmethod
    def instances(cls, settings: Settings) -> list[Service]:
        """The processes of this kind the profile runs (most: one; a cluster's nodes: several)."""
        return [cls(settings)]

    # what a service must say about itself
    def ports(self) -> list[int]:
        raise NotImplementedError

    def command(self) -> list[str]:
        raise NotImplementedError

    def wait_ready(self, deadline: float) -> None:
        raise NotImplementedError

    def prepare(self) -> None:
        """Write config files, create directories (idempotent)."""

    def after_ready(self) -> None:
        """Work once the service answers (idempotent)."""

    def env(self) -> Mapping[str, str]:
        return os.environ

    # generic process management
    @property
    def pid_file(self) -> Path:
        return self.settings.run_dir / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.settings.log_dir / f"{self.name}.log"

    def _pid_record(self) -> tuple[int | None, list[int] | None]:
        """The pid file: ``<pid>`` then ``<port>,<port>`` (ports absent in older files)."""
        try:
            lines = self.pid_file.read_text().splitlines()
            pid = int(lines[0])
        except (OSError, ValueError, IndexError):
            return None, None
        try:
            ports = [int(p) for p in lines[1].split(",") if p] if len(lines) > 1 else None
        except ValueError:
            ports = None
        return pid, ports

    def pid(self) -> int | None:
        return self._pid_record()[0]

    def recorded_ports(self) -> list[int] | None:
        """The ports the process in the pid file was started with (None: not recorded)."""
        return self._pid_record()[1]

    def _ours(self, pid: int) -> bool:
        """pid is a live process of this service (not a reused pid of something else)."""
        child = _children.get(pid)
        if child is not None:  # started by this Python process: the Popen object knows for sure
            return child.poll() is None
        return _alive(pid) and self.marker in _cmdline(pid)

    def is_running(self) -> bool:
        """Our process (pid file + live process with our command line) is up."""
        pid = self.pid()
        return pid is not None and self._ours(pid)

    def taken_ports(self) -> list[int]:
        return [p for p in self.ports() if not port_free(p)]

    def check_ports(self) -> None:
        for port in self.taken_ports():
            raise StackError(
                f"{self.name}: port {port} on 127.0.0.1 is already in use by {_who_listens(port)}; "
                f"stop it or choose another port (see infra/settings.py)"
            )

    def start(self) -> str:
        """Start unless running; returns what happened ('started' or 'already running')."""
        if self.is_running():
            recorded = self.recorded_ports()
            if recorded is None or recorded == self.ports():
                self.wait_ready(time.monotonic() + self.ready_timeout_s)
                return "already running"
            # ours (its pid file, its command line) but started for other ports, e.g. by a
            # benchmark that was killed before it could stop it: waiting on the new ports would
            # only time out, so it is stopped and started again as configured now
            self.stop()
        self.pid_file.unlink(missing_ok=True)  # stale
        self.check_ports()
        for d in (self.settings.run_dir, self.settings.log_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.prepare()
        with self.log_file.open("ab") as log:
            log.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S%z')} starting {self.name}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(self.env()),
                start_new_session=True,  # a Ctrl-C in the terminal that ran `make up` does not reach it
            )
        _children[proc.pid] = proc
        self.pid_file.write_text(f"{proc.pid}\n{','.join(map(str, self.ports()))}\n")
        try:
            self.wait_ready(time.monotonic() + self.ready_timeout_s)
            self.after_ready()
        except BaseException:
            self.stop()
            raise
        return "started"

    def _died(self) -> StackError:
        return StackError(f"{self.name} exited during start-up; see {self.log_file}")

    def stop(self) -> str:
        """SIGTERM, wait, SIGKILL after stop_timeout_s; remove the pid file."""
        pid = self.pid()
        if pid is None:
            return "not running"
        outcome = "not running (stale pid file)"
        if self._ours(pid):
            os.kill(pid, signal.SIGTERM)
            outcome = "stopped"
            deadline = time.monotonic() + self.stop_timeout_s
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
                outcome = "killed after timeout"
                while _alive(pid):
                    time.sleep(0.05)
        child = _children.pop(pid, None)
        if child is not None and child.poll() is None:  # never block on a process we did not stop
            child.kill()
            child.wait()
        self.pid_file.unlink(missing_ok=True)
        return outcome

    def status_row(self) -> tuple[str, str, str, str, str]:
        running = self.is_running()
        state = "running" if running else ("stale pid file" if self.pid() else "stopped")
        ports = ",".join(f"{p}{'*' if port_listening(p) else ''}" for p in self.ports())
        return self.name, state, str(self.pid() if running else "-"), ports, str(self.log_file)


class KafkaBroker(Service):
    """A KRaft Kafka node: one JVM that is both broker and controller.

    Local profile: one node, ``kafka``, on kafka_port/kafka_controller_port. Cluster profile
    (``SOCIAL_PROFILE=cluster``): ``cluster_brokers`` nodes ``kafka-1``..``kafka-N``, node i on
    kafka_port + 2i / kafka_controller_port + 2i with its own data dir ``var/kafka-i``, and the N
    controllers form the KRaft quorum (combined mode: with three nodes the metadata survives the
    loss of one, as the replicated data does; a separate controller quorum would add three JVMs to
    a 2-core machine for no guarantee the fault runs test). Every node is formatted with the same
    cluster id (``var/kafka-cluster.id``).
    """

    name = "kafka"
    marker = KAFKA_MAIN

    def __init__(self, settings: Settings, index: int = 0):
        super().__init__(settings)
        self.index = index
        self.node_id = index + 1
        if settings.clustered:
            self.name = f"kafka-{self.node_id}"
        self.broker_port, self.controller_port = settings.broker_ports()[index]

    @classmethod
    def instances(cls, settings: Settings) -> list[Service]:
        return [cls(settings, i) for i in range(len(settings.broker_ports()))]

    @property
    def home(self) -> Path:
        return Path(self.settings.var_dir) / self.name

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def config_file(self) -> Path:
        return self.home / "server.properties"

    def ports(self) -> list[int]:
        return [self.broker_port, self.controller_port]

    def server_properties(self) -> dict[str, str]:
        s = self.settings
        voters = ",".join(f"{i + 1}@127.0.0.1:{c}" for i, (_b, c) in enumerate(s.broker_ports()))
        replicas, min_isr = str(s.replication_factor), str(s.min_insync_replicas)
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://127.0.0.1:{self.broker_port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.broker_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            # Topics are created explicitly (create_topic) with their configs: a typo in a topic
            # name must fail, not silently create a 1-partition topic with the broker's defaults.
            "auto.create.topics.enable": "false",
            "num.partitions": str(s.events_partitions),
            "default.replication.factor": replicas,
            "min.insync.replicas": min_isr,
            "offsets.topic.replication.factor": replicas,
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": min_isr,
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": min_isr,
            "group.initial.rebalance.delay.ms": "0",  # tests and demos join groups immediately
            "unclean.leader.election.enable": "false",
            "log.retention.hours": "-1",
            "log.retention.bytes": "-1",
            # the log cleaner (compacted topics) looks for dirty logs every second instead of
            # every 15 s: superseded values and expired tombstones go within seconds of being
            # cleanable, which the compacted-topics test and bench wait for; an idle check is cheap
            "log.cleaner.backoff.ms": "1000",
            # an idle controller appends a no-op record to the metadata log every 500 ms by default
            # (KIP-835: it keeps the quorum's high watermark moving, so a stale one shows); every
            # 5 s shows it as well and cuts an idle node's CPU by a third (1.1 -> 0.75 CPU-s/40 s)
            "metadata.max.idle.interval.ms": "5000",
        }
        return props

    @property
    def cluster_id_file(self) -> Path:
        return Path(self.settings.var_dir) / "kafka-cluster.id"

    def prepare(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        props = "".join(f"{k}={v}\n" for k, v in self.server_properties().items())
        self.config_file.write_text("# generated by infra/stack.py; edit Settings, not this file\n" + props)
        (self.home / "log4j2.properties").write_text(
            "# generated by infra/stack.py: everything to stdout, which `up` sends to var/log/kafka.log\n"
            "appender.out.type = Console\n"
            "appender.out.name = STDOUT\n"
            "appender.out.layout.type = PatternLayout\n"
            "appender.out.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = INFO\n"
            "rootLogger.appenderRef.out.ref = STDOUT\n"
            "logger.state.name = state.change.logger\n"
            "logger.state.level = WARN\n"
        )
        if not (self.data_dir / "meta.properties").exists():
            self._format()

    def _java(self) -> list[str]:
        try:
            java = require_java()
            classpath = kafka_classpath(self.settings)
        except JarsError as exc:
            raise StackError(str(exc)) from None
        return [
            java,
            *KAFKA_HEAP,
            *with_a_collector(shlex.split(self.settings.kafka_java_options), "-XX:+UseG1GC"),
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.settings.log_dir}",
            "-cp",
            classpath,
        ]

    def _format(self) -> None:
        """Format the KRaft storage once (a new cluster id, shared by a cluster's nodes); later
        starts reuse it."""
        if self.settings.clustered and self.cluster_id_file.exists():
            cluster_id = self.cluster_id_file.read_text().strip()
        else:
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            if self.settings.clustered:
                self.cluster_id_file.write_text(cluster_id + "\n")
        cmd = [
            *self._java(),
            KAFKA_STORAGE_TOOL,
            "format",
            f"--cluster-id={cluster_id}",
        ]  # ids may start with "-"
        cmd += ["--config", str(self.config_file), "--ignore-formatted"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        with self.log_file.open("a") as log:
            log.write(done.stdout + done.stderr)
        if done.returncode != 0:
            raise StackError(f"formatting Kafka storage failed; see {self.log_file}")

    def command(self) -> list[str]:
        return [*self._java(), KAFKA_MAIN, str(self.config_file)]

    @property
    def last_node(self) -> bool:
        return self.index == len(self.settings.broker_ports()) - 1

    def wait_ready(self, deadline: float) -> None:
        # A cluster node cannot serve before a majority of the controllers runs, so the nodes
        # before the last are ready once their controller listens; the last waits for them all.
        single = len(self.settings.broker_ports()) == 1
        admin = admin_client(self.settings)
        while True:
            if not self.is_running():
                raise self._died()
            try:
                if not single and not self.last_node:
                    if port_listening(self.controller_port):
                        return
                else:
                    metadata = admin.list_topics(timeout=2)
                    # one node leads every partition: after a restart it is ready once it does
                    # again (until then reads answer "not leader" or "unknown topic")
                    led = not single or all(
                        t.error is None and all(p.leader >= 0 for p in t.partitions.values())
                        for t in metadata.topics.values()
                    )
                    if len(metadata.brokers) >= len(self.settings.broker_ports()) and led:
                        return
            except Exception:  # noqa: BLE001 - librdkafka raises KafkaException until the broker answers
                pass
            if time.monotonic() > deadline:
                raise StackError(
                    f"kafka did not answer on {self.settings.kafka_bootstrap} in time; see {self.log_file}"
                )
            time.sleep(0.5)

    def after_ready(self) -> None:
        s = self.settings
        if self.last_node:
            create_topic(
                s,
                s.events_topic,
                s.events_partitions,
                events_topic_configs(s),
                replication_factor=s.replication_factor,
            )
            # the log's registry of snowflake worker ids (contract/writers.py): each writer claims one
            ensure_writers_topic(s)


class RedisServer(Service):
    """The serving store: redis-server with an append-only file, bound to 127.0.0.1."""

    name = "redis"
    marker = "redis-server"
    stop_timeout_s = 15.0

    @property
    def home(self) -> Path:
        return Path(self.settings.var_dir) / "redis"

    def ports(self) -> list[int]:
        return [self.settings.redis_port]

    def prepare(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "redis.conf").write_text(
            "# generated by infra/stack.py; edit Settings, not this file\n"
            f"port {self.settings.redis_port}\n"
            "bind 127.0.0.1\n"
            "protected-mode yes\n"
            "daemonize no\n"
            f'dir "{self.home}"\n'
            'logfile ""\n'  # stdout, which `up` sends to var/log/redis.log
            # Durability through the AOF (fsync each second); no RDB snapshots on top of it,
            # which would fork the whole dataset on a 2-core machine for no extra safety.
            "appendonly yes\n"
            "appendfsync everysec\n"
            'save ""\n'
        )

    def command(self) -> list[str]:
        server = shutil.which("redis-server")
        if not server:
            raise StackError(
                "`redis-server` not found on PATH: run `make setup` (python -m infra.stack ensure-redis)"
            )
        require_redis_version(server)
        return [server, str(self.home / "redis.conf")]

    def wait_ready(self, deadline: float) -> None:
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.settings.redis_port, socket_timeout=1)
        while True:
            if not self.is_running():
                raise self._died()
            try:
                if client.ping():
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise StackError(
                    f"redis did not answer PING on port {self.settings.redis_port}; see {self.log_file}"
                )
            time.sleep(0.1)
        client.close()


class SparkStandalone(Service):
    """A process of the Spark standalone cluster (cluster profile only), run from PySpark's own
    install: the pip package ships ``bin/spark-class`` and every jar, but not ``sbin/start-master.sh``
    / ``start-worker.sh`` (which only wrap ``spark-class`` as a daemon; here :class:`Service` is
    the daemon wrapper). Ready when the master's JSON status (``/json/``) says so."""

    stop_timeout_s = 20.0
    ready_timeout_s = 90.0
    main_class = ""

    @classmethod
    def instances(cls, settings: Settings) -> list[Service]:
        return [cls(settings)] if settings.clustered else []

    @staticmethod
    def spark_home() -> Path:
        import pyspark

        return Path(pyspark.__file__).parent

    def env(self) -> Mapping[str, str]:
        home = spark_java_home(self.settings)
        return {
            **os.environ,
            **({"JAVA_HOME": str(home)} if home else {}),  # the drivers' JDK: one JDK per cluster
            "SPARK_HOME": str(self.spark_home()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            # executors run the project's Python (the driver sends PYSPARK_PYTHON, the venv's)
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        }

    def spark_class(self, *args: str) -> list[str]:
        return [str(self.spark_home() / "bin" / "spark-class"), self.main_class, *args]

    def master_status(self) -> dict | None:
        import json
        import urllib.error
        import urllib.request

        url = f"http://127.0.0.1:{self.settings.spark_master_ui_port}/json/"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                return json.loads(answer.read())
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def ready(self, status: dict) -> bool:
        raise NotImplementedError

    def wait_ready(self, deadline: float) -> None:
        while True:
            if not self.is_running():
                raise self._died()
            status = self.master_status()
            if status is not None and self.ready(status):
                return
            if time.monotonic() > deadline:
                raise StackError(
                    f"{self.name} did not register with the Spark master in time; see {self.log_file}"
                )
            time.sleep(0.5)


class SparkMaster(SparkStandalone):
    """The Spark standalone master on 127.0.0.1:spark_master_port (web UI on spark_master_ui_port)."""

    name = "spark-master"
    marker = "org.apache.spark.deploy.master.Master"
    main_class = marker

    def ports(self) -> list[int]:
        return [self.settings.spark_master_port, self.settings.spark_master_ui_port]

    def command(self) -> list[str]:
        s = self.settings
        return self.spark_class(
            "--host",
            "127.0.0.1",
            "--port",
            str(s.spark_master_port),
            "--webui-port",
            str(s.spark_master_ui_port),
        )

    def ready(self, status: dict) -> bool:
        return status.get("status") == "ALIVE"


class SparkWorker(SparkStandalone):
    """A Spark standalone worker (``spark-worker-i``): offers spark_worker_cores task slots and
    spark_worker_memory to the applications; work dir ``var/spark-worker-i``, ports chosen free."""

    marker = "org.apache.spark.deploy.worker.Worker"
    main_class = marker

    def __init__(self, settings: Settings, index: int = 0):
        super().__init__(settings)
        self.index = index
        self.name = f"spark-worker-{index + 1}"

    @classmethod
    def instances(cls, settings: Settings) -> list[Service]:
        return [cls(settings, i) for i in range(settings.spark_workers)] if settings.clustered else []

    @property
    def work_dir(self) -> Path:
        return Path(self.settings.var_dir) / self.name

    def ports(self) -> list[int]:
        return []

    def prepare(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)

    def command(self) -> list[str]:
        s = self.settings
        return self.spark_class(
            "--host", "127.0.0.1",
            "--cores", str(s.spark_worker_cores),
            "--memory", s.spark_worker_memory,
            "--webui-port", "0",
            "--work-dir", str(self.work_dir),
            f"spark://127.0.0.1:{s.spark_master_port}",
        )  # fmt: skip

    def ready(self, status: dict) -> bool:
        # workers register one by one, in order: worker i is ready once i + 1 are alive
        alive = [w for w in status.get("workers", []) if w.get("state") == "ALIVE"]
        return len(alive) >= self.index + 1


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


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that makes a child process build exactly these Settings."""
    from dataclasses import fields as dataclass_fields

    env = dict(os.environ)
    for f in dataclass_fields(settings):
        env[f.metadata["env"]] = str(getattr(settings, f.name))
    return env


class SparkDriverService(Service):
    """A Spark Structured Streaming driver run as a service: ready means healthy, never a line in
    its log. The process is ours and alive, and its Spark driver answers on the Spark UI's REST
    API (``/api/v1/applications`` lists an application named ``<APP_PREFIX><namespace>``). The UI
    port is chosen free at each start and passed to Spark (``spark.ui.port``); it is kept in
    ``run/<name>.ui-port`` (Spark takes one of the next ports if that one is taken meanwhile, so
    the check looks there too)."""

    stop_timeout_s = 60.0
    ready_timeout_s = 180.0
    APP_PREFIX = ""
    PORT_RETRIES = 16  # spark.port.maxRetries' default

    def ports(self) -> list[int]:
        return []

    @property
    def ui_port_file(self) -> Path:
        return self.settings.run_dir / f"{self.name}.ui-port"

    def ui_port(self) -> int | None:
        try:
            return int(self.ui_port_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def prepare(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.ui_port_file.write_text(f"{port}\n")

    def env(self) -> Mapping[str, str]:
        env = settings_env(self.settings)
        port = self.ui_port()
        if port is not None:
            env["PYSPARK_SUBMIT_ARGS"] = f"--conf spark.ui.port={port} pyspark-shell"
        return env

    def application(self) -> str | None:
        """This service's Spark application name, if its driver answers on the UI REST API."""
        import http.client
        import json
        import urllib.error
        import urllib.request

        port = self.ui_port()
        if port is None:
            return None
        for p in range(port, port + self.PORT_RETRIES + 1):
            if not port_listening(p):
                continue
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{p}/api/v1/applications", timeout=2) as r:
                    apps = json.loads(r.read())
            except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError):
                continue  # not a Spark UI: another process's port (a Py4J gateway answers no HTTP)
            for app in apps if isinstance(apps, list) else []:
                if str(app.get("name", "")).startswith(self.APP_PREFIX):
                    return app["name"]
        return None

    def wait_ready(self, deadline: float) -> None:
        while True:
            if not self.is_running():
                raise self._died()
            if self.application() is not None:
                return
            if time.monotonic() > deadline:
                raise StackError(
                    f"{self.name} runs but its Spark driver did not answer on the Spark UI REST API "
                    f"(port {self.ui_port()}) in time; see {self.log_file}"
                )
            time.sleep(0.5)

    def status_row(self) -> tuple[str, str, str, str, str]:
        name, state, pid, _ports, log = super().status_row()
        ui = self.ui_port() if state == "running" else None
        return name, state, pid, f"ui {ui}" if ui else "", log


class SpeedLayer(SparkDriverService):
    """The Spark Structured Streaming speed layer (``python -m pipelines.speed_layer``)."""

    name = "speed_layer"
    marker = "pipelines.speed_layer"
    APP_PREFIX = "speed-layer-"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "pipelines.speed_layer"]


class Archiver(SparkDriverService):
    """The archiver (``python -m pipelines.archiver``): the speed layer's changelog and the raw log
    appended to Delta every few seconds, compacted into the Delta views every few minutes.

    Off the serving path, so it runs at a lower CPU priority (it sets ``nice 10`` on itself, and
    its JVM inherits it): when both want the cores, the speed layer gets them.
    """

    name = "archiver"
    marker = "pipelines.archiver"
    APP_PREFIX = "archiver-"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "pipelines.archiver"]  # it lowers its own priority


class Analytics(SparkDriverService):
    """The stream analytics (``python -m pipelines.analytics``): windows, joins, alert rules.

    Started by ``up`` unless ``SOCIAL_ANALYTICS=0`` (they cost about a core on a 2-core machine).
    Ready as the speed layer is: its driver (application ``analytics-<namespace>``) answers on
    the Spark UI REST API.
    """

    name = "analytics"
    marker = "pipelines.analytics"
    APP_PREFIX = "analytics-"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "pipelines.analytics"]

    def start(self) -> str:
        if not self.settings.analytics and not self.is_running():
            return "off (SOCIAL_ANALYTICS=0)"
        return super().start()


class HttpService(Service):
    """A server of process trees (uvicorn's workers; Airflow's scheduler, DAG processor, API
    server): ready when ``health_url`` answers 200, and stopped with its whole session, which only
    our processes are in (a child outliving its parent is still in the process group it led)."""

    health_url: str = ""
    poll_s: float = 0.2

    def wait_ready(self, deadline: float) -> None:
        import urllib.error
        import urllib.request

        while True:
            if not self.is_running():
                raise self._died()
            try:
                with urllib.request.urlopen(self.health_url, timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise StackError(f"{self.name} did not answer {self.health_url} in time; see {self.log_file}")
            time.sleep(self.poll_s)

    def stop(self) -> str:
        pid = self.pid()
        outcome = super().stop()
        if pid is not None and outcome in ("stopped", "killed after timeout"):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return outcome


class ApiServer(HttpService):
    """The app API (``python -m app_sim.api``: uvicorn, ``api_workers`` processes) on api_host:api_port."""

    name = "api"
    marker = "app_sim.api"
    stop_timeout_s = 20.0
    ready_timeout_s = 60.0

    def ports(self) -> list[int]:
        return [self.settings.api_port]

    def command(self) -> list[str]:
        return [sys.executable, "-m", "app_sim.api"]

    def env(self) -> Mapping[str, str]:
        # the API builds its Settings from the environment: hand it exactly this stack's settings
        return settings_env(self.settings)

    @property
    def health_url(self) -> str:
        return f"http://{self.settings.api_host}:{self.settings.api_port}/v1/health"


class AirflowService(HttpService):
    """``airflow standalone`` (scheduler, DAG processor, API server + UI) on 127.0.0.1:airflow_port.

    Opt-in: started by ``up`` only with ``SOCIAL_AIRFLOW_STANDALONE=1`` (``make airflow`` runs it
    in the foreground). The environment is :func:`infra.airflow.airflow_env`: metadata in SQLite
    under ``var/airflow``, DAGs from ``dags/`` (paused at creation), no login. Ready when the API
    server answers its health endpoint.
    """

    name = "airflow"
    marker = "airflow"
    poll_s = 1.0
    ready_timeout_s = 300.0
    stop_timeout_s = 60.0

    def ports(self) -> list[int]:
        return [self.settings.airflow_port] if self.settings.airflow_standalone else []

    def start(self) -> str:
        if not self.settings.airflow_standalone and not self.is_running():
            return "off (SOCIAL_AIRFLOW_STANDALONE=1 starts it)"
        return super().start()

    def env(self) -> Mapping[str, str]:
        from infra.airflow import airflow_env

        return airflow_env(self.settings, base=settings_env(self.settings))

    def prepare(self) -> None:
        from infra.airflow import ensure_db

        ensure_db(self.settings)

    def command(self) -> list[str]:
        return [sys.executable, "-m", "infra.airflow", "standalone"]  # execs `airflow standalone`

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.settings.airflow_port}/api/v2/monitor/health"


# The registry. `up` starts these in order, `down` stops them in reverse order.
SERVICES: list[type[Service]] = [
    KafkaBroker,
    RedisServer,
    SparkMaster,
    SparkWorker,
    SpeedLayer,
    Archiver,
    Analytics,
    ApiServer,
    AirflowService,
]
# what the other parts need first (the Spark cluster only in the cluster profile)
BACKBONE: tuple[type[Service], ...] = (KafkaBroker, RedisServer, SparkMaster, SparkWorker)


# Kafka administration --------------------------------------------------------------------------

_quiet = logging.getLogger("infra.stack.librdkafka")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False


def admin_client(settings: Settings):
    from confluent_kafka.admin import AdminClient

    # librdkafka logs every refused connection while the broker starts; keep that out of the terminal
    return AdminClient({"bootstrap.servers": settings.kafka_bootstrap, "logger": _quiet})


def create_topic(
    settings: Settings,
    name: str,
    partitions: int,
    configs: Mapping[str, str] | None = None,
    replication_factor: int = 1,
    timeout_s: float = 30.0,
) -> bool:
    """Create a topic with explicit configs; True if created, False if it already existed."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    topic = NewTopic(
        name, num_partitions=partitions, replication_factor=replication_factor, config=dict(configs or {})
    )
    admin = admin_client(settings)  # must outlive the future, or librdkafka cancels the request
    future = admin.create_topics([topic], operation_timeout=timeout_s)[name]
    try:
        future.result(timeout=timeout_s)
    except KafkaException as exc:
        if exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False
        raise StackError(f"creating topic {name!r} failed: {exc.args[0].str()}") from None
    return True


def kafka_retriable(exc: BaseException) -> bool:
    """A broker error worth asking again. librdkafka marks most; not OFFSET_NOT_AVAILABLE, which
    a new leader answers until its high watermark caught up after an election (retriable in
    Kafka's protocol; a fault test met it right after killing a leader)."""
    from confluent_kafka import KafkaError, KafkaException

    if not isinstance(exc, KafkaException):
        return False
    err = exc.args[0]
    return err.retriable() or err.code() == KafkaError.OFFSET_NOT_AVAILABLE


def end_offsets(settings: Settings, topic: str, timeout_s: float = 10.0) -> dict[int, int]:
    """The current end (high watermark) of every partition of ``topic``.

    Retriable broker errors are retried for up to ``timeout_s``: a broker that has just
    restarted answers "not leader for partition" until its partitions have leaders again.
    """
    return {p: high for p, (_low, high) in watermarks(settings, topic, timeout_s).items()}


def watermarks(settings: Settings, topic: str, timeout_s: float = 10.0) -> dict[int, tuple[int, int]]:
    """``(first retained offset, end)`` of every partition of ``topic`` (retried as :func:`end_offsets`)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition
    from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": "end-offsets",
            "enable.auto.commit": False,
        }
    )

    def lookup() -> dict[int, tuple[int, int]]:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
        if meta.error is not None:
            error = KafkaException(meta.error)
            if kafka_retriable(error):  # e.g. LEADER_NOT_AVAILABLE while the broker starts
                raise error
            raise StackError(f"topic {topic}: {meta.error}")
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)
            for p in sorted(meta.partitions)
        }

    try:
        return Retrying(
            retry=retry_if_exception(kafka_retriable),
            wait=wait_exponential(multiplier=0.1, max=2),
            stop=stop_after_delay(timeout_s),
            reraise=True,
        )(lookup)
    finally:
        consumer.close()


def delete_topic(settings: Settings, name: str, timeout_s: float = 30.0) -> None:
    admin = admin_client(settings)
    admin.delete_topics([name], operation_timeout=timeout_s)[name].result(timeout=timeout_s)


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
        other = replace(self.settings, profile="local" if self.settings.clustered else "cluster")
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
        # Refuse before starting anything if a port is taken by a process that is not ours.
        for service in services:
            if not service.is_running():
                service.check_ports()
        outcome = {}
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
        return [service.status_row() for service in [*self.services, *others]]


def _stop_all(services) -> dict[str, str]:
    """Stop services in order, the peers of one kind (a cluster's nodes) together: a KRaft node
    stopped last on its own would wait for a controller quorum that is gone."""
    from concurrent.futures import ThreadPoolExecutor
    from itertools import groupby

    outcome = {}
    for _kind, group in groupby(services, key=type):
        peers = list(group)
        with ThreadPoolExecutor(max_workers=len(peers)) as pool:
            outcome.update(zip((s.name for s in peers), pool.map(lambda s: s.stop(), peers), strict=True))
    return outcome


def format_table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    return "\n".join(lines)


REDIS_MIN_VERSION = (7, 0)  # the serving store's Redis functions (FUNCTION LOAD) came with 7.0


def require_redis_version(server: str) -> tuple[int, ...]:
    """The version `server --version` reports; a StackError below :data:`REDIS_MIN_VERSION`.
    docker-compose.yml's redis service makes the same check before it starts."""
    import re

    try:
        said = subprocess.run([server, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise StackError(f"`{server} --version` failed: {exc}") from exc
    found = re.search(r"\bv=(\d+)\.(\d+)(?:\.(\d+))?", said)  # "Redis server v=7.0.15 sha=..."
    version = tuple(int(n) for n in found.groups() if n is not None) if found else ()
    if version < REDIS_MIN_VERSION:
        shown = ".".join(map(str, version)) or f"of unknown version ({said.strip()[:60]!r})"
        raise StackError(
            f"{server} {shown} is too old: the serving store needs Redis "
            f"{'.'.join(map(str, REDIS_MIN_VERSION))} or later (Redis functions); install Redis 7"
        )
    return version


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
    parser = argparse.ArgumentParser(prog="python -m infra.stack", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "status", "ensure-redis"])
    args = parser.parse_args(argv)
    settings = get_settings()
    stack = Stack(settings)
    try:
        if args.command == "ensure-redis":
            print(f"redis-server: {ensure_redis()}")
        elif args.command == "up":
            for name, what in stack.up().items():
                print(f"{name}: {what}")
            print(
                f"kafka {settings.kafka_bootstrap}  redis {settings.redis_url}  state under {settings.var_dir}"
            )
        elif args.command == "down":
            for name, what in stack.down().items():
                print(f"{name}: {what}")
        else:
            print(format_table(stack.status(), ("service", "state", "pid", "ports (*=listening)", "log")))
    except (StackError, JarsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
