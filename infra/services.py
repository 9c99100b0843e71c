"""The stack's services: one class per kind of long-running local process (a Kafka node, Redis,
the Spark standalone master and workers, the speed layer, the archiver, the analytics, the API,
Airflow) and the registry :data:`SERVICES` that :class:`infra.stack.Stack` starts in order.

Each service knows its ports, its command, when it is ready (health, never a line in its log),
and keeps its pid in ``run/<name>.pid`` and its output in ``log/<name>.log`` under the var dir;
starting and stopping by pid is :mod:`infra.processes`.
"""

from __future__ import annotations

import base64
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from infra import processes
from infra.jars import JarsError, kafka_classpath, require_java, spark_java_home
from infra.kafka_admin import admin_client, create_topic, ensure_writers_topic, events_topic_configs
from infra.processes import StackError, _who_listens, port_free, port_listening, settings_env
from infra.settings import REPO_ROOT, Settings

KAFKA_MAIN = "kafka.Kafka"  # the broker (and, with process.roles=broker,controller, the KRaft controller)
KAFKA_STORAGE_TOOL = "kafka.tools.StorageTool"  # what bin/kafka-storage.sh runs: formats the log dirs
KAFKA_HEAP = ["-Xms256m", "-Xmx1g"]


COLLECTORS = {f"-XX:+Use{gc}GC" for gc in ("Serial", "Parallel", "G1", "Z", "Shenandoah", "Epsilon")}


def with_a_collector(options: list[str], default: str) -> list[str]:
    """JVM flags with one garbage collector: the given one's, else ``default`` (two are an error)."""
    return options if COLLECTORS & set(options) else [*options, default]


# Services --------------------------------------------------------------------------------------


class Service:
    """One long-running local process: config in var/<name>, pid in var/run, log in var/log.

    Subclasses give ``name``, ``marker`` (a string in the process's command line: with the start
    time in the pid file, a reused pid is never mistaken for ours), ``ports``, ``command`` and
    ``wait_ready``; optionally
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

    def _pid_record(self) -> processes.PidRecord:
        return processes.read_pid_file(self.pid_file)

    def pid(self) -> int | None:
        return self._pid_record().pid

    def recorded_ports(self) -> list[int] | None:
        """The ports the process in the pid file was started with (None: not recorded)."""
        return self._pid_record().ports

    def _ours(self, pid: int) -> bool:
        """pid is a live process of this service (not a reused pid of something else)."""
        child = processes._children.get(pid)
        if child is not None:  # started by this Python process: the Popen object knows for sure
            return child.poll() is None
        return processes.started_as(pid, self.marker, self._pid_record().started)

    def is_running(self) -> bool:
        """Our process (pid file + live process with our command line, begun when recorded) is up."""
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
            proc = processes.spawn(self.command(), log, self.env())
        processes.write_pid_file(self.pid_file, proc.pid, self.ports())
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
            outcome = processes.stop(pid, self.stop_timeout_s)
        processes.forget(pid)
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
        if settings.kafka_external:  # the user's Kafka: checked by infra.external, never started
            return []
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
        self.config_file.write_text(
            "# generated by infra/services.py; edit Settings, not this file\n" + props
        )
        (self.home / "log4j2.properties").write_text(
            "# generated by infra/services.py: everything to stdout, which `up` sends to var/log/kafka.log\n"
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
        cmd += ["--config", str(self.config_file), "--ignore-formatted", *self.format_args()]
        done = subprocess.run(cmd, capture_output=True, text=True)
        with self.log_file.open("a") as log:
            log.write(done.stdout + done.stderr)
        if done.returncode != 0:
            raise StackError(f"formatting Kafka storage failed; see {self.log_file}")

    def format_args(self) -> list[str]:
        """More arguments of the storage format (a test's SASL broker: its SCRAM users, ``--add-scram``)."""
        return []

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
    """The serving store: redis-server with an append-only file, bound to 127.0.0.1.

    One server (``redis``), or with a cluster (SOCIAL_REDIS_MASTERS >= 3; the cluster profile's
    default) one node per instance, ``redis-1``..``redis-N`` the masters and then their replicas
    (SOCIAL_REDIS_REPLICAS each), node i on SOCIAL_REDIS_PORT + i with its cluster bus on
    SOCIAL_REDIS_PORT + nodes + i (explicit: Redis's default, port + 10000, may be taken or in the
    kernel's ephemeral range), each with its own directory, node file and append-only file. The
    last node's readiness is the cluster's: the first start joins the nodes (``redis-cli --cluster
    create``, the slots spread evenly over the masters); a restart finds them in its node files (a
    master that lost its slots to its replica while it was down comes back as that one's replica).
    docs/architecture.md, "On Redis Cluster"."""

    name = "redis"
    marker = "redis-server"
    stop_timeout_s = 15.0

    def __init__(self, settings: Settings, index: int = 0):
        super().__init__(settings)
        self.index = index
        self.port, self.bus_port = settings.redis_ports()[index]
        self.masters = settings.redis_cluster_masters
        self.nodes = len(settings.redis_ports()) if self.masters else 1
        if self.masters:
            self.name = f"redis-{index + 1}"

    @classmethod
    def instances(cls, settings: Settings) -> list[Service]:
        if settings.redis_external:  # the user's Redis (or Redis Cluster): infra.external
            return []
        return [cls(settings, i) for i in range(len(settings.redis_ports()))]

    @property
    def home(self) -> Path:
        return Path(self.settings.var_dir) / self.name

    def ports(self) -> list[int]:
        return [self.port, self.bus_port] if self.masters else [self.port]

    def prepare(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        cluster = (
            "cluster-enabled yes\n"
            f"cluster-port {self.bus_port}\n"
            f'cluster-config-file "{self.home / "nodes.conf"}"\n'
            f"cluster-node-timeout {self.settings.redis_node_timeout_ms}\n"
            if self.masters
            else ""
        )
        (self.home / "redis.conf").write_text(
            "# generated by infra/services.py; edit Settings, not this file\n"
            f"port {self.port}\n"
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
            # a replica's first sync (verify's frozen copy: infra/redis_copy.py) starts at once, not
            # after Redis's default 5 s wait for more replicas to share one diskless transfer
            "repl-diskless-sync-delay 0\n" + cluster
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

        from infra.clients import redis_client

        # a readiness probe polled every 0.1 s, not a client of the data
        client = redis_client(f"redis://127.0.0.1:{self.port}/0", "probe", cluster=False)
        try:
            while True:
                if not self.is_running():
                    raise self._died()
                try:
                    if client.ping():
                        break
                except redis.RedisError:
                    pass
                if time.monotonic() > deadline:
                    raise StackError(
                        f"{self.name} did not answer PING on port {self.port}; see {self.log_file}"
                    )
                time.sleep(0.1)
        finally:
            client.close()
        if self.masters and self.index == self.nodes - 1:  # every node answers: the cluster
            ports = [p for p, _ in self.settings.redis_ports()]
            join_cluster(ports, deadline, self.settings.log_dir, self.settings.redis_replicas)


def join_cluster(ports: list[int], deadline: float, logs: Path, replicas: int = 0) -> None:
    """The Redis Cluster of the nodes on ``ports`` (127.0.0.1), each answering: created with
    ``redis-cli --cluster create`` (``replicas`` per master, the slots spread evenly over the
    masters) when no node holds a slot yet, then waited for until every node says
    ``cluster_state:ok`` (a restarted node rejoins by its node file). A StackError says why not,
    in one line."""
    import redis

    from infra.clients import redis_client

    nodes = [redis_client(f"redis://127.0.0.1:{p}/0", "probe", cluster=False) for p in ports]
    try:

        def infos() -> list[dict]:
            out = []
            for node in nodes:
                try:
                    out.append(node.execute_command("CLUSTER INFO"))
                except redis.RedisError:
                    out.append({})
            return out

        if all(int(i.get("cluster_slots_assigned", 0)) == 0 for i in infos()):
            cli = shutil.which("redis-cli")
            if not cli:
                raise StackError("`redis-cli` not found on PATH (it comes with redis-server: `make setup`)")
            created = subprocess.run(
                [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports)]
                + ["--cluster-replicas", str(replicas), "--cluster-yes"],
                capture_output=True,
                text=True,
                timeout=max(1.0, deadline - time.monotonic()),
            )
            if created.returncode != 0:
                said = (created.stdout + created.stderr).strip().splitlines()[-1:] or ["(no output)"]
                raise StackError(f"redis-cli --cluster create failed ({created.returncode}): {said[0]}")

        def replicated() -> bool:  # every master's replicas attached (a failover needs one in sync)
            if not replicas:
                return True
            try:
                roles = [node.info("replication") for node in nodes]
            except redis.RedisError:
                return False
            masters = [r for r in roles if r.get("role") == "master"]
            return all(int(r.get("connected_slaves", 0)) >= replicas for r in masters)

        while True:
            states = [i.get("cluster_state") for i in infos()]
            if all(state == "ok" for state in states) and replicated():
                return
            if time.monotonic() > deadline:
                shown = ", ".join(
                    f"{p}: {state or 'no answer'}" for p, state in zip(ports, states, strict=True)
                )
                raise StackError(
                    f"the Redis Cluster did not reach cluster_state:ok ({shown}); see {logs}/redis-*.log"
                )
            time.sleep(0.1)
    finally:
        for node in nodes:
            node.close()


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

    poll_s: float = 0.2

    @property
    def health_url(self) -> str:
        """What answers 200 once the service is ready (each service's own)."""
        raise NotImplementedError

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
            processes.kill_group(pid)
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


class MetricsExporter(HttpService):
    """The metrics exporter (``python -m pipelines.metrics``) on 127.0.0.1:metrics_port: stateless,
    it reads Kafka, Redis, the Delta log and the queries' progress files on every scrape, so it
    starts in a second and answers (``social_exporter_up 0``) even while a store is away. Ready
    when ``/metrics`` answers."""

    name = "metrics"
    marker = "pipelines.metrics"
    stop_timeout_s = 10.0
    ready_timeout_s = 30.0

    def ports(self) -> list[int]:
        return [self.settings.metrics_port]

    def command(self) -> list[str]:
        return [sys.executable, "-m", "pipelines.metrics"]  # its port and address: the settings in env()

    def env(self) -> Mapping[str, str]:
        return settings_env(self.settings)  # exactly this stack's settings

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.settings.metrics_port}/metrics"


class PrometheusServer(HttpService):
    """Prometheus (Debian's package, infra/prometheus.py) on 127.0.0.1:prometheus_port, scraping the
    metrics exporter and the API, with the alert rules of infra/prometheus_rules/alerts.yml; data under
    ``var/prometheus``. Opt-in: started by ``up`` only with ``SOCIAL_PROMETHEUS=1``. Ready when
    ``/-/ready`` answers."""

    name = "prometheus"
    marker = "social-prometheus"  # its --web.page-title: in the command line, never another's
    stop_timeout_s = 20.0
    ready_timeout_s = 60.0

    def ports(self) -> list[int]:
        return [self.settings.prometheus_port] if self.settings.prometheus else []

    def start(self) -> str:
        if not self.settings.prometheus and not self.is_running():
            return "off (SOCIAL_PROMETHEUS=1 starts it)"
        return super().start()

    def prepare(self) -> None:
        from infra.prometheus import data_dir, ensure_prometheus, write_config

        ensure_prometheus()
        write_config(self.settings)
        (data_dir(self.settings) / "data").mkdir(parents=True, exist_ok=True)

    def command(self) -> list[str]:
        from infra.prometheus import binary, data_dir

        home = data_dir(self.settings)
        return [
            str(binary()),
            f"--config.file={home / 'prometheus.yml'}",
            f"--storage.tsdb.path={home / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.settings.prometheus_port}",
            f"--web.page-title={self.marker}",
        ]

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.settings.prometheus_port}/-/ready"


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
    MetricsExporter,
    PrometheusServer,
    AirflowService,
]
# what the other parts need first (the Spark cluster only in the cluster profile)
BACKBONE: tuple[type[Service], ...] = (KafkaBroker, RedisServer, SparkMaster, SparkWorker)


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
