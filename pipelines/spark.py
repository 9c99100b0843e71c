"""The one SparkSession factory: jars, Delta extensions, local or cluster mode, test baseline.

Every Spark job (speed layer, replay, verify, benchmarks, tests) gets its session here, so the
jar set and the Delta settings cannot drift between stream and batch.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from infra.cli import command_name, run_main
from infra.settings import REPO_ROOT, Settings, get_settings

# The class archive: the classes a Spark driver with Delta loads at start (~25,000), parsed and
# verified once into a file that every later driver maps read-only instead of loading each class
# from its jar again. On JDK 25 an ahead-of-time cache (JEP 483), on older JDKs an AppCDS archive.
# See :func:`class_archive` and docs/performance.md (Spark driver start).
CLASS_ARCHIVE_DIR = REPO_ROOT / ".cache" / "cds"


def _jar_paths(settings: Settings) -> list[Path]:
    from infra import jars  # lazily: importing pipelines needs no jars, starting Spark does

    return jars.spark_jars(settings)


def parse_conf(text: str) -> dict[str, str]:
    """``SOCIAL_SPARK_CONF``: ``key=value`` pairs separated by whitespace, as a dict."""
    conf = {}
    for pair in text.split():
        key, sep, value = pair.partition("=")
        if not sep or not key.startswith("spark."):
            raise ValueError(f"SOCIAL_SPARK_CONF: {pair!r} is not spark.<key>=<value>")
        conf[key] = value
    return conf


def build_spark(
    app_name: str,
    settings: Settings | None = None,
    *,
    testing: bool = False,
    extra_conf: dict[str, str] | None = None,
    console_progress: bool | None = None,
):
    """Return a SparkSession with the Kafka source and Delta Lake on the classpath.

    ``testing=True`` is the baseline every Spark test uses: few shuffle partitions, no UI,
    small memory, so a test session starts in seconds on two cores.

    ``console_progress``: Spark's own stage bar on stderr. By default only on a terminal: a
    service's log file and an Airflow task's log get none (the bar redraws itself with carriage
    returns, a few lines of them per job). A command that draws its own bar
    (:mod:`pipelines.progress`) passes False.
    """
    from pyspark.sql import SparkSession

    settings = settings or get_settings()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    jar_paths = _jar_paths(settings)
    jar_list = ",".join(str(p) for p in jar_paths)
    java_options = settings.spark_driver_java_options
    from infra.jars import spark_java_home

    chosen = spark_java_home(settings)
    if chosen:  # the JDK the gateway launches (Spark's launcher reads JAVA_HOME)
        os.environ["JAVA_HOME"] = str(chosen)
    archive = class_archive(jar_paths, settings)
    if settings.spark_class_archive and archive.exists() and not _names_an_archive(java_options):
        java_options = f"{java_options} {archive_option(archive)}"
    show_progress = sys.stderr.isatty() if console_progress is None else console_progress
    builder = (
        SparkSession.builder.appName(app_name)
        .master(settings.spark_master)
        .config("spark.jars", jar_list)
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", str(show_progress).lower())
        .config("spark.sql.shuffle.partitions", str(settings.spark_shuffle_partitions))
        .config("spark.sql.adaptive.enabled", "true")
        # The fold joins small per-batch frames with state; broadcasting them avoids shuffles.
        .config("spark.sql.autoBroadcastJoinThreshold", str(64 * 1024 * 1024))
        .config("spark.driver.memory", "3g")
        .config("spark.local.dir", str(Path(settings.var_dir) / "spark-tmp"))
        .config("spark.sql.warehouse.dir", str(Path(settings.var_dir) / "spark-warehouse"))
        .config(
            "spark.driver.extraJavaOptions",
            f"-Dderby.system.home={Path(settings.var_dir) / 'derby'} {java_options}".strip(),
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
        # A stream whose last look found nothing new sleeps this long before looking again (each
        # look asks the broker for the latest offsets): the idle cost against the added latency
        # of the first record after a quiet spell (SOCIAL_IDLE_POLL_MS)
        .config("spark.sql.streaming.pollingDelay", f"{settings.idle_poll_ms}ms")
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
        # Server after the application ended: `make history` (docs/reports.md).
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
        # A standalone cluster (the cluster profile, docs/cluster-and-faults.md): executors in
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
    # a lake on an object store: S3A's endpoint, credentials and conditional create, Delta's LogStore
    # (infra/lake_store.py; nothing for a local lake)
    from infra.lake_store import spark_conf as lake_conf

    for key, value in {
        **lake_conf(settings),
        **(extra_conf or {}),
        **parse_conf(settings.spark_conf),
    }.items():
        builder = builder.config(key, value)
    spark = _get_or_create(builder)
    spark.sparkContext.setLogLevel("WARN")
    return spark


# Two drivers started in the same millisecond (a speed layer and its archiver, spawned together)
# get the same application id, ``local-<ms>``, and the second one's SparkContext fails on its event
# log: "Target log directory already exists" (seen on a private stack, 2026-11-27). The id is
# Spark's own (not a setting); an attempt a moment later gets another one, and the JVM is up by
# then, so a retry costs well under a second.
APP_ID_TAKEN = re.compile(r".*Target log directory already exists", re.DOTALL)
APP_ID_RETRY_S = 10.0


def _get_or_create(builder):
    import logging

    from tenacity import Retrying, before_sleep_log, retry_if_exception_message, stop_after_delay, wait_random

    retrying = Retrying(
        retry=retry_if_exception_message(match=APP_ID_TAKEN),
        stop=stop_after_delay(APP_ID_RETRY_S),
        wait=wait_random(0.01, 0.25),
        before_sleep=before_sleep_log(logging.getLogger("spark"), logging.WARNING),
        reraise=True,
    )
    return retrying(builder.getOrCreate)


def java_home(settings: Settings) -> Path | None:
    """The JDK of the Spark drivers (:func:`infra.jars.spark_java_home`), else the one Spark finds
    itself (JAVA_HOME, the `java` on PATH)."""
    from infra.jars import spark_java_home

    home = spark_java_home(settings)
    if home:
        return home
    env_home = os.environ.get("JAVA_HOME")
    in_env = Path(env_home) / "bin" / "java" if env_home else None
    java = in_env if in_env and in_env.exists() else shutil.which("java")
    return Path(java).resolve().parent.parent if java else None


def ahead_of_time(home: Path | None) -> bool:
    """Whether this JDK takes an ahead-of-time cache (JDK 25+) rather than an AppCDS archive."""
    from infra.jars import SPARK_JDK, java_major

    return home is not None and (java_major(home) or 0) >= SPARK_JDK


def archive_option(archive: Path) -> str:
    """The JVM flag that maps ``archive`` (its suffix says which kind it is)."""
    return f"-XX:AOTCache={archive}" if archive.suffix == ".aot" else f"-XX:SharedArchiveFile={archive}"


def _names_an_archive(java_options: str) -> bool:
    return any(flag in java_options for flag in ("SharedArchiveFile", "AOTCache"))


def class_archive(jar_paths: list[Path] | None = None, settings: Settings | None = None) -> Path:
    """Where the class archive for this JDK and this classpath lives (it may not exist yet).

    An archive is only valid for the JDK build and the classpath it was dumped with, so its
    name is a hash of both: the JDK's ``release`` file, the paths of PySpark's jars and of the
    project's Spark jars; its suffix is its kind (``.aot``: JDK 25's ahead-of-time cache, ``.jsa``:
    AppCDS). A JDK or jar upgrade names a new archive, and drivers run without one until
    ``make setup`` dumps it. (The JVM checks too: an archive that does not match is ignored, never
    misused.)
    """
    import pyspark

    settings = settings or get_settings()
    h = hashlib.sha256()
    home = java_home(settings)
    release = home / "release" if home else None
    h.update(release.read_bytes() if release and release.exists() else str(home).encode())
    for jar in sorted((Path(pyspark.__file__).parent / "jars").glob("*.jar")):
        h.update(str(jar).encode())  # the paths: the JVM checks the classpath, not only the names
    for jar in jar_paths if jar_paths is not None else _jar_paths(settings):
        h.update(str(jar).encode())
    suffix = ".aot" if ahead_of_time(home) else ".jsa"
    return CLASS_ARCHIVE_DIR / f"spark-{h.hexdigest()[:16]}{suffix}"


def _warm_up(spark, scratch: Path) -> None:
    """The work whose classes go into the archive: what the pipeline's drivers do at start."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    t = str(scratch / "t")
    df = spark.range(2000).select("id", (F.col("id") % 7).alias("k"), F.lit("x").alias("s"))
    df.write.format("delta").save(t)
    spark.sql(
        f"MERGE INTO delta.`{t}` a USING (SELECT 3L AS id, 1L AS k) b ON a.id = b.id "
        "WHEN MATCHED THEN UPDATE SET k = b.k WHEN NOT MATCHED THEN INSERT (id, k) VALUES (b.id, b.k)"
    )
    spark.sql(f"DELETE FROM delta.`{t}` WHERE id = 5")
    read = spark.read.format("delta").option("versionAsOf", 1).load(t)
    w = Window.partitionBy("k").orderBy(F.col("id").desc())
    read.withColumn("rn", F.row_number().over(w)).where("rn <= 3").groupBy("k").count().collect()
    read.exceptAll(spark.read.format("delta").load(t)).localCheckpoint().count()
    spark.read.json(spark.sparkContext.parallelize(['{"a": 1}'])).collect()

    def arrow(batches):
        yield from batches

    df.mapInArrow(arrow, df.schema).count()
    q = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 10)
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(scratch / "ck"))
        .start()
    )
    q.processAllAvailable()
    q.stop()


# The dump run only has to load the classes the drivers load. The archive holds class metadata, no
# compiled code and no heap, so the run's compiler and collector are not in it: it runs with the
# cheapest ones, C1 alone and the serial collector (a fresh clone's `make setup`, side by side:
# 57.6 -> 36.0 CPU-s). A driver with C2 and G1 maps the archive all the same
# (tests/integration/local/test_spark_class_archive.py starts one with -Xshare:on, which refuses an unusable one).
DUMP_JVM = ("-XX:TieredStopAtLevel=1", "-XX:ReservedCodeCacheSize=240m")


def dump_java_options(settings: Settings) -> str:
    """The dump run's JVM flags: :data:`DUMP_JVM`, the configured driver flags (they win), and the
    serial collector unless those name one (a JVM given two collectors refuses to start)."""
    import shlex

    from infra.stack import with_a_collector

    options = shlex.split(settings.spark_driver_java_options)
    return shlex.join([*DUMP_JVM, *with_a_collector(options, "-XX:+UseSerialGC")])


def build_class_archive(settings: Settings | None = None, *, force: bool = False) -> Path:
    """Dump the class archive (``make setup``; ``make test`` beside its first tests) from one
    warm-up driver run with :func:`dump_java_options`, ~40-60 s once per JDK and jar set: on JDK 25
    its AOT cache (``-XX:AOTCacheOutput``: the driver records, then assembles the cache as it
    exits), on older JDKs an AppCDS archive (``-XX:ArchiveClassesAtExit``). Returns its path."""
    settings = settings or get_settings()
    target = class_archive(_jar_paths(settings), settings)
    if target.exists() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    for stale in [*target.parent.glob("spark-*.jsa"), *target.parent.glob("spark-*.aot")]:
        stale.unlink()  # another JDK's or jar set's: never used again
    with tempfile.TemporaryDirectory(prefix="spark-cds-") as scratch:
        partial = Path(scratch) / target.name
        dump = (
            # its warnings (classes it skips: Janino's generated ones, JFR's, ...) are many and
            # expected; its errors are not
            f"-XX:AOTCacheOutput={partial} -Xlog:cds*=error,aot*=error"
            if target.suffix == ".aot"
            else f"-XX:ArchiveClassesAtExit={partial} -Xlog:cds=off"
        )
        env = dict(os.environ)
        env["SOCIAL_SPARK_DRIVER_JAVA_OPTIONS"] = f"{dump_java_options(settings)} {dump}"
        env["SOCIAL_VAR_DIR"] = str(Path(scratch) / "var")
        env["SOCIAL_SPARK_CLASS_ARCHIVE"] = "0"
        done = subprocess.run(
            [sys.executable, "-m", "pipelines.spark", "warm-up", scratch],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0 or not partial.exists():
            raise RuntimeError(f"class archive not written (exit {done.returncode}):\n{done.stderr[-3000:]}")
        shutil.move(partial, target)  # whole or not at all: a driver never maps a half-written one
    return target


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(
        prog=command_name("pipelines.spark"), description="the Spark drivers' class archive"
    )
    sub = p.add_subparsers(dest="command", required=True)
    archive = sub.add_parser("class-archive", help="dump the class archive unless it exists (make setup)")
    archive.add_argument("--force", action="store_true", help="dump it again")
    warm = sub.add_parser("warm-up", help="(internal) the driver run the archive is dumped from")
    warm.add_argument("scratch")
    args = p.parse_args(argv)
    if args.command == "warm-up":
        settings = get_settings()
        spark = build_spark("class-archive", settings, testing=True)
        jvm_process = spark.sparkContext._gateway.proc
        _warm_up(spark, Path(args.scratch))
        spark.stop()
        # The JVM writes the archive as it exits, which it does when its stdin closes. Left to
        # this process's exit, nobody would wait for it: close it, and wait.
        jvm_process.stdin.close()
        jvm_process.wait(timeout=600)
        return 0
    path = build_class_archive(force=args.force)
    print(f"spark class archive: {path} ({path.stat().st_size / 2**20:.0f} MiB)")
    return 0


def run_behind_serving_path(nice: int | None = None) -> None:
    """Lower this process's CPU priority, before it starts its JVM (which inherits it), by
    ``nice`` (default: ``SOCIAL_OFF_PATH_NICE``, 10).

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
    if nice is None:
        nice = get_settings().off_path_nice
    if nice == 0:
        return
    os.nice(nice)
    if os.getsid(0) != os.getpid():
        return
    try:
        Path("/proc/self/autogroup").write_text(f"{nice}\n")
    except OSError:  # no autogroup scheduling in this kernel: plain nice is what counts
        pass


if __name__ == "__main__":
    sys.exit(run_main(main, "pipelines.spark"))
