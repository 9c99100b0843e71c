"""The one SparkSession factory: jars, Delta extensions, local or cluster mode, test baseline.

Every Spark job (speed layer, replay, verify, benchmarks, tests) gets its session here, so the
jar set and the Delta settings cannot drift between stream and batch.
"""

from __future__ import annotations

import os
from pathlib import Path

from infra.settings import Settings, get_settings


def _jar_paths(settings: Settings) -> list[Path]:
    from infra import jars  # lazily: importing pipelines needs no jars, starting Spark does

    return jars.spark_jars(settings)


def build_spark(
    app_name: str,
    settings: Settings | None = None,
    *,
    testing: bool = False,
    extra_conf: dict[str, str] | None = None,
):
    """Return a SparkSession with the Kafka source and Delta Lake on the classpath.

    ``testing=True`` is the baseline every Spark test uses: few shuffle partitions, no UI,
    small memory, so a test session starts in seconds on two cores.
    """
    from pyspark.sql import SparkSession

    settings = settings or get_settings()
    os.environ.setdefault("PYSPARK_PYTHON", os.sys.executable)
    jar_list = ",".join(str(p) for p in _jar_paths(settings))
    builder = (
        SparkSession.builder.appName(app_name)
        .master(settings.spark_master)
        .config("spark.jars", jar_list)
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(settings.spark_shuffle_partitions))
        .config("spark.sql.adaptive.enabled", "true")
        # The fold joins small per-batch frames with state; broadcasting them avoids shuffles.
        .config("spark.sql.autoBroadcastJoinThreshold", str(64 * 1024 * 1024))
        .config("spark.driver.memory", "3g")
        .config("spark.local.dir", str(Path(settings.var_dir) / "spark-tmp"))
        .config("spark.sql.warehouse.dir", str(Path(settings.var_dir) / "spark-warehouse"))
        .config(
            "spark.driver.extraJavaOptions",
            f"-Dderby.system.home={Path(settings.var_dir) / 'derby'} {settings.spark_driver_java_options}".strip(),
        )
        # Delta: deletion vectors make per-key MERGE/DELETE cheap (no file rewrite per batch);
        # idempotent-DML confs are set per micro-batch by the sink.
        .config("spark.databricks.delta.properties.defaults.enableDeletionVectors", "true")
        .config("spark.databricks.delta.schema.autoMerge.enabled", "false")
        .config("spark.scheduler.mode", "FAIR")
        .config("spark.scheduler.allocation.file", str(Path(__file__).with_name("fairscheduler.xml")))
        # Constraint propagation infers filters from every projection and filter; over the parse
        # step's generated contract checks (one CASE with hundreds of branches) it cost ~3 s per
        # localCheckpoint (LogicalRDD.fromDataset computes the origin plan's constraints), more
        # than the batch itself. The fold's joins carry their filters explicitly.
        .config("spark.sql.constraintPropagation.enabled", "false")
        # A micro-batch runs a few dozen small SQL queries with large plans; the status store
        # keeps up to 1000 of them by default (UI or not): in a long-running stream that is a
        # heap leak. Keep the recent ones only.
        .config("spark.sql.ui.retainedExecutions", "50")
        .config("spark.ui.retainedJobs", "100")
        .config("spark.ui.retainedStages", "100")
        .config("spark.ui.retainedTasks", "2000")
        .config("spark.sql.streaming.ui.retainedProgressUpdates", "50")
        .config("spark.sql.streaming.numRecentProgressUpdates", "50")
        # Delta rebuilds a table snapshot with this many tasks (default 50): far too many for
        # the small logs of a micro-batch pipeline on a few cores.
        .config("spark.databricks.delta.snapshotPartitions", "4")
        # Delta's VACUUM lists and deletes files in a job of this many tasks (Spark's default,
        # 10,000): 25-35 s for a table of three files on two cores. A few tasks per core list a
        # table of this pipeline's size in well under a second.
        .config("spark.sql.sources.parallelPartitionDiscovery.parallelism", "8")
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
    )
    if not testing:
        # Event logs of every job (the speed layer, verify, replays, ...) for the Spark History
        # Server after the application ended: `make history` (README: Reading the reports).
        events = Path(settings.var_dir) / "spark-events"
        events.mkdir(parents=True, exist_ok=True)
        builder = (
            builder.config("spark.eventLog.enabled", "true")
            .config("spark.eventLog.dir", events.resolve().as_uri())
            .config("spark.eventLog.compress", "true")
            .config("spark.eventLog.rolling.enabled", "true")  # a long-running stream: bounded files
            .config("spark.eventLog.rolling.maxFileSize", "64m")
        )
    if testing:
        builder = (
            builder.config("spark.sql.shuffle.partitions", "2")
            .config("spark.ui.enabled", "false")
            .config("spark.driver.memory", "6g")
            .config("spark.sql.adaptive.enabled", "false")
            .config("spark.default.parallelism", "2")
            .config("spark.databricks.delta.snapshotPartitions", "2")
        )
    if settings.spark_master.startswith("spark://"):
        # A standalone cluster (the cluster profile, README: The cluster profile): executors in
        # the workers' JVMs reach the driver on 127.0.0.1, and each application takes at most
        # spark_app_cores slots, or the first one started would hold every core of the cluster.
        builder = (
            builder.config("spark.driver.host", settings.spark_driver_host)
            .config(
                "spark.driver.bindAddress",
                "127.0.0.1" if settings.spark_driver_host == "127.0.0.1" else "0.0.0.0",
            )
            .config("spark.cores.max", str(settings.spark_app_cores))
            .config("spark.executor.memory", settings.spark_executor_memory)
        )
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


OFF_SERVING_PATH_NICE = 10


def run_behind_serving_path(nice: int = OFF_SERVING_PATH_NICE) -> None:
    """Lower this process's CPU priority, before it starts its JVM (which inherits it).

    For the jobs off the serving path (the archiver, the analytics): when they and the speed
    layer both want the cores, the speed layer gets them. ``nice`` alone is not enough where the
    kernel schedules by autogroup (``/proc/sys/kernel/sched_autogroup_enabled`` = 1, the default
    of many distributions): nice then orders threads only inside one session, and a process
    started in a session of its own (as ``make up``, the tests and the benchmarks start every
    service) competes with the speed layer's session at equal weight whatever its nice. So a
    session leader also lowers its autogroup's nice. A process started by hand inside a
    terminal's session leaves the terminal's autogroup alone. Inside a cgroup of its own (a
    container) the kernel does not group by session, and the plain nice is what counts.
    """
    os.nice(nice)
    if os.getsid(0) != os.getpid():
        return
    try:
        Path("/proc/self/autogroup").write_text(f"{nice}\n")
    except OSError:  # no autogroup scheduling in this kernel: plain nice is what counts
        pass
