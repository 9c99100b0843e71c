"""Typed settings for every part of the stack, in one place.

Use ``get_settings(**overrides)``: a keyword argument > an environment variable > the default.
The environment is read and validated by pydantic-settings (a model built from the fields below);
a value it cannot take is a one-line SettingsError (a ValueError) naming the variable.
``Settings(...)`` alone ignores the environment (handy in unit tests).
Every setting is documented here and in the table of docs/configuration.md (a unit test keeps the
two in sync).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any, get_type_hints

from pydantic import Field, SecretStr, ValidationError, create_model
from pydantic_settings import BaseSettings, SettingsConfigDict

REPO_ROOT = Path(__file__).resolve().parent.parent
PROFILES = ("local", "cluster")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
KAFKA_SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
KAFKA_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def _setting(env: str, default, doc: str):
    return field(default=default, metadata={"env": env, "doc": doc})


# What the views mean by default (docs/views.md), shared by the settings, the speed layer's
# ProcessorConfig and the batch layer's BatchConfig, so the three cannot drift apart.
TIMELINE_LENGTH = 800
# 10 meets the 5,000 events/s targets on 2 cores (docs/performance.md: The fan-out threshold)
FANOUT_THRESHOLD = 1_000
DEDUP_WINDOW_MS = 24 * 3600 * 1000
DEDUP_GRACE_MS = 3600 * 1000
DEDUP_REORDER = 256  # seqs of one writer a partition may receive out of order (docs/views.md)


class SettingsError(ValueError):
    """A setting given in the environment that is not valid: its variable, its value, what it wants."""


@dataclass(frozen=True)
class Settings:
    profile: str = _setting(
        "SOCIAL_PROFILE",
        "local",
        "`local`: one Kafka broker, one Redis, Spark `local[*]`; `cluster`: three KRaft brokers (replication "
        "3, `min.insync.replicas=2`), a Redis Cluster of three masters and a Spark standalone master with "
        "SOCIAL_SPARK_WORKERS workers (docs/cluster-and-faults.md)",
    )
    kafka_bootstrap: str = _setting(
        "SOCIAL_KAFKA_BOOTSTRAP",
        "127.0.0.1:9092",
        "Kafka bootstrap servers (cluster profile, when unset: every broker of the local cluster)",
    )
    # An existing Kafka (docs/running.md: Your own Kafka): how every client of the project reaches
    # it; infra/clients.py turns these into librdkafka's and the Java client's properties.
    kafka_external: int = _setting(
        "SOCIAL_KAFKA_EXTERNAL",
        0,
        "1: use the Kafka at SOCIAL_KAFKA_BOOTSTRAP instead of starting one: `make up` checks it "
        "(reachable with the settings below, the event topic's partitions and retention) and starts "
        "no broker",
    )
    kafka_security_protocol: str = _setting(
        "SOCIAL_KAFKA_SECURITY_PROTOCOL",
        "PLAINTEXT",
        "`security.protocol` of every Kafka client: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
    )
    kafka_sasl_mechanism: str = _setting(
        "SOCIAL_KAFKA_SASL_MECHANISM",
        "SCRAM-SHA-512",
        "`sasl.mechanism` with a SASL_* protocol: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512",
    )
    kafka_sasl_username: str = _setting(
        "SOCIAL_KAFKA_SASL_USERNAME", "", "SASL user name (required with a SASL_* protocol)"
    )
    kafka_sasl_password: SecretStr = _setting(
        "SOCIAL_KAFKA_SASL_PASSWORD", SecretStr(""), "SASL password (a secret: never printed)"
    )
    kafka_ssl_ca_location: str = _setting(
        "SOCIAL_KAFKA_SSL_CA_LOCATION",
        "",
        "SSL, SASL_SSL: PEM file of the CA that signed the brokers' certificates; empty = the system's",
    )
    kafka_ssl_certificate_location: str = _setting(
        "SOCIAL_KAFKA_SSL_CERTIFICATE_LOCATION",
        "",
        "SSL, SASL_SSL: PEM file of the client's certificate (mutual TLS)",
    )
    kafka_ssl_key_location: str = _setting(
        "SOCIAL_KAFKA_SSL_KEY_LOCATION",
        "",
        "SSL, SASL_SSL: PEM file of the client's private key (mutual TLS)",
    )
    kafka_port: int = _setting("SOCIAL_KAFKA_PORT", 9092, "port of the local broker started by `make up`")
    kafka_controller_port: int = _setting(
        "SOCIAL_KAFKA_CONTROLLER_PORT", 9093, "KRaft controller port of the local broker"
    )
    events_topic: str = _setting("SOCIAL_EVENTS_TOPIC", "social.events", "the retained event log topic")
    events_partitions: int = _setting("SOCIAL_EVENTS_PARTITIONS", 8, "partitions of the event topic")
    writers_topic: str = _setting(
        "SOCIAL_WRITERS_TOPIC",
        "",
        "the registry of snowflake worker ids, one claim per writer (API process, generator run) for the "
        "life of the log (contract/writers.py; compacted, 1 partition, kept forever); empty = "
        "`<events topic>.writers`",
    )
    redis_url: str = _setting(
        "SOCIAL_REDIS_URL",
        "redis://127.0.0.1:6379/0",
        "Redis serving store; may carry a password (`redis://:<password>@host:port/0`, or "
        "`redis://<user>:<password>@...` with an ACL user) and TLS (`rediss://`, "
        "`?ssl_ca_certs=<PEM file>`); printed with the password masked",
    )
    redis_external: int = _setting(
        "SOCIAL_REDIS_EXTERNAL",
        0,
        "1: use the Redis at SOCIAL_REDIS_URL instead of starting one: `make up` checks it (version >= 7.0, "
        "`maxmemory-policy noeviction`, `appendonly yes`) and starts no redis-server",
    )
    redis_port: int = _setting("SOCIAL_REDIS_PORT", 6379, "port of the local Redis started by `make up`")
    redis_masters: int = _setting(
        "SOCIAL_REDIS_MASTERS",
        0,
        "what `make up` starts as the serving store: 1 = one redis-server, 3 or more = a Redis Cluster of "
        "that many masters (node i on SOCIAL_REDIS_PORT + i, its cluster bus on SOCIAL_REDIS_PORT + N + i; "
        "the partitioned layout only); 0 = the profile's: 1 in `local`, 3 in `cluster`",
    )
    redis_replicas: int = _setting(
        "SOCIAL_REDIS_REPLICAS",
        0,
        "replicas of each master of the Redis Cluster `make up` starts (nodes N+1.. after the N masters): "
        "a master lost is replaced by its replica (failover), which may lack the master's last writes; "
        "the speed layer starts again from the fences the new master holds",
    )
    redis_node_timeout_ms: int = _setting(
        "SOCIAL_REDIS_NODE_TIMEOUT_MS",
        15_000,
        "`cluster-node-timeout` of the Redis Cluster `make up` starts: how long a master may not answer "
        "before the others take it for failed (its replica then takes over; without one, the cluster "
        "stops serving until it is back)",
    )
    api_host: str = _setting("SOCIAL_API_HOST", "127.0.0.1", "app API bind address")
    api_port: int = _setting("SOCIAL_API_PORT", 8000, "app API port")
    api_workers: int = _setting("SOCIAL_API_WORKERS", 2, "uvicorn worker processes of the app API")
    prometheus: int = _setting(
        "SOCIAL_PROMETHEUS",
        0,
        "1: `make setup` fetches Debian's `prometheus` package (unpacked under .tools/prometheus, unless "
        "`prometheus` is on PATH) and `make up` starts it, scraping the exporter and the API with the alert "
        "rules of infra/prometheus_rules/alerts.yml (docs/metrics.md); off by default",
    )
    prometheus_port: int = _setting(
        "SOCIAL_PROMETHEUS_PORT", 9090, "port of the Prometheus `make up` starts with SOCIAL_PROMETHEUS=1"
    )
    metrics_host: str = _setting(
        "SOCIAL_METRICS_HOST",
        "127.0.0.1",
        "bind address of the metrics exporter (docker-compose.yml: 0.0.0.0)",
    )
    metrics_port: int = _setting(
        "SOCIAL_METRICS_PORT",
        9464,
        "port of the metrics exporter `make up` starts (`python -m pipelines.metrics`: /metrics for Prometheus)",
    )
    dashboard_sample_s: float = _setting(
        "SOCIAL_DASHBOARD_SAMPLE_S",
        2.0,
        "seconds between two points of the exporter's dashboard (/dashboard: lag, freshness, archive, API, "
        "accounting over the last minutes; docs/metrics.md)",
    )
    dashboard_history_s: int = _setting(
        "SOCIAL_DASHBOARD_HISTORY_S",
        900,
        "seconds of history the exporter keeps for its dashboard (a ring buffer of "
        "SOCIAL_DASHBOARD_HISTORY_S / SOCIAL_DASHBOARD_SAMPLE_S points, in memory)",
    )
    dashboard_api_url: str = _setting(
        "SOCIAL_DASHBOARD_API_URL",
        "",
        "the app API whose /metrics the dashboard plots; empty: http://SOCIAL_API_HOST:SOCIAL_API_PORT "
        "(docker-compose.yml: http://api:8000)",
    )
    api_secret: str = _setting(
        "SOCIAL_API_SECRET", "", "token signing secret; empty = generated once under var/api/ and reused"
    )
    seal_personal_data: int = _setting(
        "SOCIAL_SEAL_PERSONAL_DATA",
        1,
        "1: the API and the generator seal handles, display names and texts with per-user keys kept "
        "under var/keys/ (crypto-shredding, docs/erasure.md); 0: they write plaintext",
    )
    api_produce_timeout_ms: int = _setting(
        "SOCIAL_API_PRODUCE_TIMEOUT_MS", 5000, "longest an API write waits for the broker before a 503"
    )
    # The dual-write experiment (`make dual-write`, app_sim/api/dual_write.py): the ANTI-PATTERN,
    # off by default. Fault rates are per mille of API writes, drawn from seeded generators.
    write_mode: str = _setting(
        "SOCIAL_WRITE_MODE",
        "log",
        "`log`: API writes only append to the log (the design); `dual`: the anti-pattern, the API also "
        "writes the serving store itself (app_sim/api/dual_write.py, for `make dual-write`)",
    )
    dual_namespace: str = _setting(
        "SOCIAL_DUAL_NAMESPACE", "dual", "Redis namespace the API writes directly in `dual` write mode"
    )
    fault_seed: int = _setting("SOCIAL_FAULT_SEED", 7, "seed of the injected faults' draws (per API worker)")
    fault_crash_permille: int = _setting(
        "SOCIAL_FAULT_CRASH_PERMILLE", 0, "writes after whose first write the API worker process exits"
    )
    fault_race_permille: int = _setting(
        "SOCIAL_FAULT_RACE_PERMILLE",
        0,
        "unread-counter read-modify-writes held open for up to SOCIAL_FAULT_RACE_MS (races between workers)",
    )
    fault_race_ms: int = _setting(
        "SOCIAL_FAULT_RACE_MS", 200, "longest a raced read-modify-write is held open"
    )
    fault_timeout_permille: int = _setting(
        "SOCIAL_FAULT_TIMEOUT_PERMILLE",
        0,
        "writes stalled SOCIAL_FAULT_STALL_MS just before their log append (dual: after the store write)",
    )
    fault_stall_ms: int = _setting("SOCIAL_FAULT_STALL_MS", 3000, "how long a timed-out write stalls")
    fault_store_fail_permille: int = _setting(
        "SOCIAL_FAULT_STORE_FAIL_PERMILLE",
        0,
        "dual mode: writes whose store update after the log append fails (logged, answered 202)",
    )
    var_dir: Path = _setting("SOCIAL_VAR_DIR", REPO_ROOT / "var", "all runtime state: logs, data, reports")
    # The Delta lake (docs/running.md: Your own object store): a local folder by default, or a
    # prefix on an S3-compatible store; infra/lake_store.py turns these into Spark's S3A confs,
    # delta-rs's storage options and the obstore client of the start check.
    lake_uri: str = _setting(
        "SOCIAL_LAKE_URI",
        "",
        "where the Delta lake lives: empty = `<SOCIAL_VAR_DIR>/lake`; a local folder; or "
        "`s3a://<bucket>/<prefix>` on an S3-compatible object store (the SOCIAL_LAKE_S3_* settings; "
        "`make up` and `social check-external` check it first)",
    )
    lake_s3_endpoint: str = _setting(
        "SOCIAL_LAKE_S3_ENDPOINT",
        "",
        "S3 lake: the store's URL (`http://host:port`, `https://...`); empty = AWS S3 in SOCIAL_LAKE_S3_REGION",
    )
    lake_s3_region: str = _setting("SOCIAL_LAKE_S3_REGION", "us-east-1", "S3 lake: the region of the bucket")
    lake_s3_access_key: str = _setting(
        "SOCIAL_LAKE_S3_ACCESS_KEY",
        "",
        "S3 lake: access key id; empty = each client's default AWS credential chain (environment, profile, role)",
    )
    lake_s3_secret_key: SecretStr = _setting(
        "SOCIAL_LAKE_S3_SECRET_KEY", SecretStr(""), "S3 lake: secret access key (a secret: never printed)"
    )
    lake_s3_path_style: int = _setting(
        "SOCIAL_LAKE_S3_PATH_STYLE",
        1,
        "S3 lake: 1 = path-style requests (`<endpoint>/<bucket>/<key>`, what most S3-compatible stores "
        "need); 0 = virtual-hosted style (`<bucket>.<endpoint>`)",
    )
    jars_dir: Path = _setting(
        "SOCIAL_JARS_DIR", REPO_ROOT / ".cache" / "jars", "fetched, checksum-verified JVM jars"
    )
    log_level: str = _setting(
        "SOCIAL_LOG_LEVEL",
        "INFO",
        "level of the Python services' and jobs' logs (infra/logs.py): DEBUG, INFO, WARNING, ERROR or CRITICAL",
    )
    spark_master: str = _setting(
        "SOCIAL_SPARK_MASTER",
        "local[*]",
        "Spark master URL (cluster profile, when unset: `spark://127.0.0.1:<SOCIAL_SPARK_MASTER_PORT>`)",
    )
    # The cluster profile (SOCIAL_PROFILE=cluster): what `make up` starts besides the local stack.
    cluster_brokers: int = _setting(
        "SOCIAL_CLUSTER_BROKERS",
        3,
        "cluster profile: KRaft nodes (each broker + controller); node i listens on SOCIAL_KAFKA_PORT + 2i "
        "and SOCIAL_KAFKA_CONTROLLER_PORT + 2i",
    )
    spark_master_port: int = _setting(
        "SOCIAL_SPARK_MASTER_PORT", 7077, "cluster profile: port of the Spark standalone master"
    )
    spark_master_ui_port: int = _setting(
        "SOCIAL_SPARK_MASTER_UI_PORT",
        8090,
        "cluster profile: the master's web UI and JSON status (`/json/`); not 8080, Airflow's",
    )
    spark_driver_host: str = _setting(
        "SOCIAL_SPARK_DRIVER_HOST",
        "127.0.0.1",
        "cluster profile: the address executors reach a driver on (a container's name in docker-compose.yml)",
    )
    spark_workers: int = _setting("SOCIAL_SPARK_WORKERS", 2, "cluster profile: Spark standalone workers")
    spark_worker_cores: int = _setting(
        "SOCIAL_SPARK_WORKER_CORES",
        4,
        "cluster profile: task slots each worker offers (not CPUs: the speed layer, archiver, analytics and a job each hold some)",
    )
    spark_worker_memory: str = _setting(
        "SOCIAL_SPARK_WORKER_MEMORY", "4g", "cluster profile: memory each worker offers its executors"
    )
    spark_app_cores: int = _setting(
        "SOCIAL_SPARK_APP_CORES",
        2,
        "cluster profile: `spark.cores.max` of each application, so the speed layer, the archiver "
        "and the analytics all get executors (standalone gives the first app every core otherwise)",
    )
    spark_executor_memory: str = _setting(
        "SOCIAL_SPARK_EXECUTOR_MEMORY", "1g", "cluster profile: `spark.executor.memory` of each application"
    )
    spark_shuffle_partitions: int = _setting(
        "SOCIAL_SPARK_SHUFFLE_PARTITIONS", 4, "spark.sql.shuffle.partitions for the pipeline jobs"
    )
    spark_driver_java_options: str = _setting(
        "SOCIAL_SPARK_DRIVER_JAVA_OPTIONS",
        "",
        "extra JVM flags of every Spark driver; `make test` sets `-XX:TieredStopAtLevel=1 "
        "-XX:ReservedCodeCacheSize=240m -XX:+UseSerialGC` for its integration run (no C2 compiler: its short "
        "jobs spend less CPU compiling than they would gain; the code cache at its usual size, not client "
        "emulation's 48 MiB; the serial collector: small heaps, cheaper than G1) and `-XX:+UseSerialGC` for its "
        "unit run",
    )
    kafka_java_options: str = _setting(
        "SOCIAL_KAFKA_JAVA_OPTIONS",
        "",
        "extra JVM flags of the local Kafka nodes; `make test` gives them the Spark drivers' (no C2: a test "
        "broker starts on ~2.3 instead of ~3.4 CPU-seconds and idles ~25% cheaper); a collector given here "
        "replaces the nodes' G1",
    )
    spark_conf: str = _setting(
        "SOCIAL_SPARK_CONF",
        "",
        "extra Spark confs of every session, `key=value` separated by spaces, applied last; `make test` "
        "turns adaptive execution and code generation off for its integration run (the Makefile says "
        "why; docs/testing.md)",
    )
    spark_java_home: str = _setting(
        "SOCIAL_SPARK_JAVA_HOME",
        "",
        "the JDK of the Spark drivers and the standalone cluster; empty = a JDK 25 under "
        "/usr/lib/jvm if one is installed (its ahead-of-time class cache: docs/performance.md, Spark driver start), "
        "else JAVA_HOME or the `java` on PATH (17 or 21; AppCDS archive)",
    )
    spark_class_archive: int = _setting(
        "SOCIAL_SPARK_CLASS_ARCHIVE",
        1,
        "Spark drivers map the class archive `make setup` dumps under .cache/cds (AppCDS: a driver "
        "starts without loading and verifying its ~25,000 classes again); 0 = load them from the jars",
    )
    views_namespace: str = _setting(
        "SOCIAL_VIEWS_NAMESPACE", "", "views version to serve; empty = the active one recorded under var/"
    )
    timeline_length: int = _setting(
        "SOCIAL_TIMELINE_LENGTH", TIMELINE_LENGTH, "N, posts kept per home timeline"
    )
    fanout_threshold: int = _setting(
        "SOCIAL_FANOUT_THRESHOLD",
        FANOUT_THRESHOLD,
        "authors with more followers are merged at read time (social_timeline), not fanned out on write; "
        "1,000: the cheapest for Redis once timelines are read more often than posts are written, and "
        "one post's fan-out stays under ~10 ms (docs/performance.md: The fan-out threshold)",
    )
    dedup_window_ms: int = _setting(
        "SOCIAL_DEDUP_WINDOW_MS",
        DEDUP_WINDOW_MS,
        "an event_id without a sequence seen again within this window is a duplicate (a sequenced one: "
        "SOCIAL_DEDUP_REORDER; docs/views.md, Duplicates)",
    )
    max_text_length: int = _setting("SOCIAL_MAX_TEXT_LENGTH", 280, "longest post, status or message text")
    trigger_interval: str = _setting(
        "SOCIAL_TRIGGER_INTERVAL",
        "0 seconds",
        "trigger of the keyed speed layer (Kafka -> Redis); 0: the next micro-batch starts when the last ends",
    )
    idle_poll_ms: int = _setting(
        "SOCIAL_IDLE_POLL_MS",
        50,
        "how long a stream with no new records waits before asking Kafka again (Spark's "
        "`spark.sql.streaming.pollingDelay`, 10 ms by default: an idle speed layer then costs 0.34 "
        "of a core, its JVM and the broker answering its offset requests; 50 ms: 0.15)",
    )
    kafka_fetch_max_wait_ms: int = _setting(
        "SOCIAL_KAFKA_FETCH_MAX_WAIT_MS",
        10,
        "the Kafka source's `fetch.max.wait.ms` (Kafka's default, 500, is a floor under every micro-batch)",
    )
    speed_tasks: int = _setting(
        "SOCIAL_SPEED_TASKS",
        0,
        "Spark tasks per keyed micro-batch: the Kafka partitions' ranges are coalesced into this many "
        "(0: Spark's default parallelism, one per core the query may use)",
    )
    async_progress: int = _setting(
        "SOCIAL_ASYNC_PROGRESS",
        1,
        "1: the keyed query writes Spark's offset and commit logs in the background, off every "
        "micro-batch's path (safe here: a re-applied batch changes nothing)",
    )
    processor_group_size: int = _setting(
        "SOCIAL_PROCESSOR_GROUP_SIZE", 200, "events per Redis function call (one atomic run, one round trip)"
    )
    serving_layout: str = _setting(
        "SOCIAL_SERVING_LAYOUT",
        "partitioned",
        "the keyed state's layout in Redis: `partitioned` (partitioned.lua: every key hash-tagged by its "
        "Kafka partition, posts and erasures delivered between partitions; docs/architecture.md, The "
        "partitioned layout) or `keyed` (social.lua, one keyspace, the layout before it). A namespace "
        "keeps the layout it was built in (the other is refused with one line naming the rebuild command)",
    )
    processor_group_posts: int = _setting(
        "SOCIAL_PROCESSOR_GROUP_POSTS",
        200,
        "posts per Redis function call at most: reads wait behind a call, and each post costs one timeline "
        "insert per follower (docs/performance.md: Catch-up at full fan-out)",
    )
    dedup_grace_ms: int = _setting(
        "SOCIAL_DEDUP_GRACE_MS",
        DEDUP_GRACE_MS,
        "event ids are forgotten once received more than window + grace before a partition's newest",
    )
    dedup_reorder: int = _setting(
        "SOCIAL_DEDUP_REORDER",
        DEDUP_REORDER,
        "R: of a writer's sequenced event ids (sq:<writer>:<seq>) a partition keeps which of the last R seqs "
        "arrived; a seq at or below its highest minus R counts as a duplicate (docs/views.md: Duplicates). "
        "Fixed for a namespace's life, as the window is",
    )
    archive_interval_s: float = _setting(
        "SOCIAL_ARCHIVE_INTERVAL_S",
        5.0,
        "the archiver appends the changelog and the raw log to Delta this often while records flow "
        "(off the serving path), and at once when the speed layer is idle at the log's end",
    )
    archive_durability_s: float = _setting(
        "SOCIAL_ARCHIVE_DURABILITY_S",
        2.0,
        "the archiver archives a cut of Redis only once it is this old (Redis fsyncs its AOF every second)",
    )
    off_path_nice: int = _setting(
        "SOCIAL_OFF_PATH_NICE",
        10,
        "CPU priority (nice, and the autogroup's) the jobs off the serving path give themselves: the "
        "archiver and the analytics; 0 keeps them level with the speed layer (the integration tests)",
    )
    compaction_interval_s: float = _setting(
        "SOCIAL_COMPACTION_INTERVAL_S",
        120.0,
        "the archiver compacts the archived changelog into the Delta views this often (a MERGE per view)",
    )
    max_offsets_per_trigger: int = _setting(
        "SOCIAL_MAX_OFFSETS_PER_TRIGGER", 200_000, "upper bound of events per micro-batch"
    )
    replay_round_events: int = _setting(
        "SOCIAL_REPLAY_ROUND_EVENTS",
        100_000,
        "a replay (verify, rebuild, bench) reads the log in rounds of at most this many records, every "
        "partition advanced alike, as the live stream does: the partitions stay close in log position",
    )
    # Compacted topics for bootstrapping (pipelines/speed/compacted.py, docs/compacted-topics.md)
    compacted_topics: int = _setting(
        "SOCIAL_COMPACTED_TOPICS",
        1,
        "1: the speed layer keeps `<events topic>.<ns>.profiles` and `.follows` (cleanup.policy=compact)",
    )
    compacted_partitions: int = _setting(
        "SOCIAL_COMPACTED_PARTITIONS",
        8,
        "partitions of each compacted topic (when the speed layer creates it)",
    )
    compacted_delete_retention_ms: int = _setting(
        "SOCIAL_COMPACTED_DELETE_RETENTION_MS",
        86_400_000,
        "compacted topics' `delete.retention.ms`: a tombstone (unfollow, erasure) stays readable this long",
    )
    compacted_min_cleanable_dirty_ratio: float = _setting(
        "SOCIAL_COMPACTED_MIN_CLEANABLE_DIRTY_RATIO",
        0.5,
        "compacted topics' `min.cleanable.dirty.ratio`: the cleaner runs once this share is superseded",
    )
    compacted_segment_ms: int = _setting(
        "SOCIAL_COMPACTED_SEGMENT_MS",
        3_600_000,
        "compacted topics' `segment.ms`: the active segment is never cleaned, so it rolls this often",
    )

    # Orchestration, data quality, maintenance (dags/, quality/, pipelines/maintenance.py) --------
    airflow_standalone: int = _setting(
        "SOCIAL_AIRFLOW_STANDALONE",
        0,
        "1: `make up` also starts `airflow standalone` (scheduler + UI); off by default",
    )
    airflow_port: int = _setting(
        "SOCIAL_AIRFLOW_PORT", 8080, "Airflow UI/API port (`make airflow`, SOCIAL_AIRFLOW_STANDALONE=1)"
    )
    airflow_spark_slots: int = _setting(
        "SOCIAL_AIRFLOW_SPARK_SLOTS",
        1,
        "slots of Airflow's `spark` pool, which every DAG task that starts a Spark driver uses: how many "
        "such jobs the DAGs run at once beside the stack (several DAGs are due at the same minute)",
    )
    quality_max_quarantine_pct: int = _setting(
        "SOCIAL_QUALITY_MAX_QUARANTINE_PCT",
        5,
        "data_quality fails when more than this % of events is quarantined",
    )
    quality_max_staleness_s: int = _setting(
        "SOCIAL_QUALITY_MAX_STALENESS_S",
        900,
        "data_quality fails when the views lag the log by more than this",
    )
    delta_retention_hours: int = _setting(
        "SOCIAL_DELTA_RETENTION_HOURS",
        168,
        "VACUUM keeps files needed for time travel this far back (>= 168)",
    )
    namespace_retention_days: int = _setting(
        "SOCIAL_NAMESPACE_RETENTION_DAYS", 7, "a replaced views namespace is kept this long for rollback"
    )
    report_retention_days: int = _setting(
        "SOCIAL_REPORT_RETENTION_DAYS", 30, "maintenance prunes reports and Airflow logs older than this"
    )

    # Stream analytics (pipelines/analytics/): windows, joins, alert rules on the event log -------
    analytics: int = _setting(
        "SOCIAL_ANALYTICS",
        1,
        "1: `make up` also starts the analytics queries (0 saves ~a core on small machines)",
    )
    analytics_trigger_interval: str = _setting(
        "SOCIAL_ANALYTICS_TRIGGER_INTERVAL",
        "30 seconds",
        "micro-batch trigger interval of each analytics query (a batch's fixed cost dominates: at "
        "2,000 events/s the ten queries took 1.75 cores at 10 s, 0.83 at 30 s)",
    )
    analytics_lateness_s: int = _setting(
        "SOCIAL_ANALYTICS_LATENESS_S",
        120,
        "allowed lateness (watermark delay) of the analytics; later events go to `late_events`",
    )
    alerts_topic: str = _setting("SOCIAL_ALERTS_TOPIC", "social.alerts", "topic of the derived alert stream")
    rule_burst_posts: int = _setting(
        "SOCIAL_RULE_BURST_POSTS", 10, "burst alert: a user with more than this many posts ..."
    )
    rule_burst_window_s: int = _setting(
        "SOCIAL_RULE_BURST_WINDOW_S", 10, "... in one window of this many seconds (windows slide by half)"
    )
    rule_churn_within_s: int = _setting(
        "SOCIAL_RULE_CHURN_WITHIN_S", 60, "follow churn: an unfollow this soon after the follow is one churn"
    )
    rule_churn_repeats: int = _setting(
        "SOCIAL_RULE_CHURN_REPEATS", 3, "follow churn alert: at least this many churns by one user ..."
    )
    rule_churn_window_s: int = _setting(
        "SOCIAL_RULE_CHURN_WINDOW_S", 600, "... in one window of this many seconds"
    )
    rule_flood_recipients: int = _setting(
        "SOCIAL_RULE_FLOOD_RECIPIENTS",
        20,
        "message flood alert: a sender messaging this many distinct users ...",
    )
    rule_flood_window_s: int = _setting(
        "SOCIAL_RULE_FLOOD_WINDOW_S", 60, "... in one window of this many seconds"
    )

    def __post_init__(self) -> None:
        for secret in ("kafka_sasl_password", "lake_s3_secret_key"):
            if not isinstance(getattr(self, secret), SecretStr):  # given as a plain keyword argument
                object.__setattr__(self, secret, SecretStr(str(getattr(self, secret))))
        if self.lake_uri and "://" in self.lake_uri and not self.lake_on_s3:
            raise SettingsError(
                f"SOCIAL_LAKE_URI={self.lake_uri!r}: expected a local folder or s3a://<bucket>/<prefix> "
                "(s3a: the scheme of Hadoop's S3A, which Spark writes through; delta-rs reads the same)"
            )
        if self.lake_on_s3 and not self.lake_uri[len("s3a://") :].split("/", 1)[0]:
            raise SettingsError(f"SOCIAL_LAKE_URI={self.lake_uri!r}: no bucket (s3a://<bucket>/<prefix>)")
        if self.profile not in PROFILES:
            raise SettingsError(f"SOCIAL_PROFILE={self.profile!r}: expected one of {', '.join(PROFILES)}")
        if self.log_level.upper() not in LOG_LEVELS:
            raise SettingsError(
                f"SOCIAL_LOG_LEVEL={self.log_level!r}: expected one of {', '.join(LOG_LEVELS)}"
            )
        if not 1 <= self.dedup_reorder <= 4096:
            raise SettingsError(f"SOCIAL_DEDUP_REORDER={self.dedup_reorder}: expected 1 to 4096")
        if self.redis_masters == 2 or self.redis_masters < 0:
            raise SettingsError(
                f"SOCIAL_REDIS_MASTERS={self.redis_masters}: expected 1 (one Redis), 3 or more (a Redis "
                "Cluster: a majority of masters must agree a master failed), or 0 (the profile's)"
            )
        if self.redis_replicas < 0 or (self.redis_replicas and not self.redis_cluster_masters):
            raise SettingsError(
                f"SOCIAL_REDIS_REPLICAS={self.redis_replicas}: replicas are a Redis Cluster's "
                "(SOCIAL_REDIS_MASTERS >= 3, or the cluster profile), 0 or more"
            )
        if self.redis_cluster_masters and self.serving_layout != "partitioned":
            raise SettingsError(
                f"SOCIAL_SERVING_LAYOUT={self.serving_layout} cannot run on a Redis Cluster of "
                f"{self.redis_cluster_masters} masters (its calls span slots): set "
                "SOCIAL_SERVING_LAYOUT=partitioned, or SOCIAL_REDIS_MASTERS=1 for one Redis"
            )
        if self.profile == "cluster" and self.cluster_brokers < 1:
            raise SettingsError(f"SOCIAL_CLUSTER_BROKERS={self.cluster_brokers}: expected at least 1")
        if self.kafka_security_protocol not in KAFKA_SECURITY_PROTOCOLS:
            raise SettingsError(
                f"SOCIAL_KAFKA_SECURITY_PROTOCOL={self.kafka_security_protocol!r}: expected one of "
                f"{', '.join(KAFKA_SECURITY_PROTOCOLS)}"
            )
        if self.kafka_sasl:
            if self.kafka_sasl_mechanism not in KAFKA_SASL_MECHANISMS:
                raise SettingsError(
                    f"SOCIAL_KAFKA_SASL_MECHANISM={self.kafka_sasl_mechanism!r}: expected one of "
                    f"{', '.join(KAFKA_SASL_MECHANISMS)}"
                )
            if not self.kafka_sasl_username:
                raise SettingsError(
                    f"SOCIAL_KAFKA_SECURITY_PROTOCOL={self.kafka_security_protocol} needs SOCIAL_KAFKA_SASL_USERNAME"
                )

    def __repr__(self) -> str:
        """Every setting, the secrets masked (a traceback or a log line never shows one)."""
        shown = {f.name: getattr(self, f.name) for f in fields(self)}
        shown["redis_url"] = redact_url(self.redis_url)
        return f"Settings({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    @property
    def kafka_sasl(self) -> bool:
        return self.kafka_security_protocol.startswith("SASL_")

    @property
    def kafka_tls(self) -> bool:
        return self.kafka_security_protocol.endswith("SSL")

    @property
    def clustered(self) -> bool:
        return self.profile == "cluster"

    @property
    def redis_cluster_masters(self) -> int:
        """The masters of the Redis Cluster `make up` starts (SOCIAL_REDIS_MASTERS, else the
        profile's: 3 in ``cluster``), or 0: one redis-server."""
        masters = self.redis_masters or (3 if self.clustered else 1)
        return 0 if masters == 1 else masters

    def redis_ports(self) -> list[tuple[int, int]]:
        """(client port, cluster bus port) of each Redis node `make up` starts, the masters first,
        then their replicas (bus 0: not a cluster)."""
        if not self.redis_cluster_masters:
            return [(self.redis_port, 0)]
        n = self.redis_cluster_masters * (1 + self.redis_replicas)
        return [(self.redis_port + i, self.redis_port + n + i) for i in range(n)]

    def broker_ports(self) -> list[tuple[int, int]]:
        """(broker port, controller port) of each Kafka node `make up` starts."""
        if not self.clustered:
            return [(self.kafka_port, self.kafka_controller_port)]
        return [
            (self.kafka_port + 2 * i, self.kafka_controller_port + 2 * i) for i in range(self.cluster_brokers)
        ]

    @property
    def replication_factor(self) -> int:
        """Replicas of the event topic (and Kafka's internal topics): 3 in the cluster profile."""
        return min(3, self.cluster_brokers) if self.clustered else 1

    @property
    def min_insync_replicas(self) -> int:
        """Replicas that must have a write before acks=all answers: one fewer than the replicas."""
        return max(1, self.replication_factor - 1)

    # Derived locations -------------------------------------------------------------------------
    @property
    def dashboard_url(self) -> str:
        """The metrics exporter's live page (pipelines/dashboard.py), as a browser on this machine opens it."""
        return f"http://127.0.0.1:{self.metrics_port}/dashboard"

    @property
    def log_dir(self) -> Path:
        return Path(self.var_dir) / "log"

    @property
    def run_dir(self) -> Path:
        return Path(self.var_dir) / "run"

    @property
    def lake_on_s3(self) -> bool:
        return self.lake_uri.startswith("s3a://")

    @property
    def lake_dir(self):
        """The lake's root: a :class:`~pathlib.Path`, or an :class:`infra.lake_store.ObjectPath` for
        an ``s3a://`` lake (which answers the same few calls: ``/``, ``exists``, ``read_text``, ...)."""
        if not self.lake_uri:
            return Path(self.var_dir) / "lake"
        if self.lake_on_s3:
            from infra.lake_store import ObjectPath

            return ObjectPath(self.lake_uri.rstrip("/"), self)
        return Path(self.lake_uri)

    @property
    def keys_dir(self) -> Path:
        """The data-key stores, one per event topic (``contract.keys``)."""
        return Path(self.var_dir) / "keys"

    @property
    def reports_dir(self) -> Path:
        return Path(self.var_dir) / "reports"

    @property
    def airflow_home(self) -> Path:
        return Path(self.var_dir) / "airflow"


def redact_url(url: str) -> str:
    """``url`` with the password of its user part masked, for printing (``redis://:***@host:6379/0``)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def setting_value(value) -> str:
    """A setting as its environment variable spells it (a secret revealed: for a child's environment only)."""
    return value.get_secret_value() if isinstance(value, SecretStr) else str(value)


def settings_table() -> list[tuple[str, str, str]]:
    """(environment variable, default, meaning) for every setting, for docs/configuration.md."""
    rows = []
    for f in fields(Settings):
        default = f.default
        if isinstance(default, Path):
            default = os.path.relpath(default, REPO_ROOT)
        elif isinstance(default, SecretStr):
            default = default.get_secret_value()
        rows.append((f.metadata["env"], str(default), f.metadata["doc"]))
    return rows


class _Environment(BaseSettings):
    """The environment is the one source besides the arguments (no .env file, no secrets directory);
    the names are case sensitive and an empty variable counts as unset (the default stays)."""

    model_config = SettingsConfigDict(case_sensitive=True, env_ignore_empty=True, extra="ignore")

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ):
        return (init_settings, env_settings)


@cache
def _environment_model() -> type[_Environment]:
    """A pydantic-settings model of the settings: one field per setting, read from its variable."""
    hints = get_type_hints(Settings)
    definitions: dict[str, Any] = {
        f.name: (hints[f.name], Field(f.default, alias=f.metadata["env"])) for f in fields(Settings)
    }
    return create_model("SettingsEnvironment", __base__=_Environment, **definitions)


def _from_environment(skip=()) -> dict:
    """The settings given by environment variables, validated; a bad value is a one-line ValueError.

    The settings named in ``skip`` (given as arguments) are not read: their defaults stand in.
    """
    model = _environment_model()
    try:
        read = model(**{f.metadata["env"]: f.default for f in fields(Settings) if f.name in skip})
    except ValidationError as exc:
        hints = get_type_hints(Settings)
        by_env = {f.metadata["env"]: f.name for f in fields(Settings)}
        problems = []
        for error in exc.errors():
            env = str(error["loc"][0])
            kind = getattr(hints.get(by_env.get(env, "")), "__name__", "a valid value")
            problems.append(f"{env}={error['input']!r}: expected {kind}")
        raise SettingsError("; ".join(problems)) from None
    return {name: getattr(read, name) for name in read.model_fields_set if name not in skip}


def get_settings(**overrides) -> Settings:
    """Settings with precedence: keyword argument > environment variable > default."""
    unknown = set(overrides) - {f.name for f in fields(Settings)}
    if unknown:
        raise TypeError(f"unknown settings: {sorted(unknown)}")
    values = {**_from_environment(skip=overrides), **overrides}
    if values.get("profile") == "cluster":
        # the cluster profile's own brokers and master, unless the bootstrap or master was given
        probe = Settings(**values)
        values.setdefault("kafka_bootstrap", ",".join(f"127.0.0.1:{b}" for b, _ in probe.broker_ports()))
        values.setdefault("spark_master", f"spark://127.0.0.1:{probe.spark_master_port}")
    return Settings(**values)


README_START, README_END = "<!-- settings:start -->", "<!-- settings:end -->"  # in CONFIGURATION_DOC
CONFIGURATION_DOC = REPO_ROOT / "docs" / "configuration.md"


def readme_table() -> str:
    lines = ["| environment variable | default | meaning |", "|---|---|---|"]
    lines += [f"| `{env}` | `{default}` | {doc} |" for env, default, doc in settings_table()]
    return "\n".join(lines)


def sync_readme(path: Path = CONFIGURATION_DOC) -> bool:
    """Rewrite the settings table of docs/configuration.md; True when it changed."""
    text = path.read_text()
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    new = f"{head}{README_START}\n{readme_table()}\n{README_END}{tail}"
    if new != text:
        path.write_text(new)
    return new != text


if __name__ == "__main__":
    print("docs/configuration.md settings table", "updated" if sync_readme() else "already up to date")
