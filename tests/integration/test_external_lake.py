"""The Delta lake on an S3-compatible object store, for real: versitygw (infra/s3server.py, built
by ``make setup`` and before the integration tier) started here on a free port, with a root user of
a random secret, serving a folder of this test; the lake is ``s3a://lake/<prefix>``
(SOCIAL_LAKE_URI and the SOCIAL_LAKE_S3_* group, docs/running.md "Your own object store").

Tested: the start check passes and says each unfit store in one line (wrong secret, no bucket,
nothing listening); a commit of another writer that lands while the LogStore writes the same
version is refused to ours, not replaced (and replaced by Delta's own S3 LogStore, the contrast);
two Spark drivers racing to append to one table on the store lose no commit; and ``make demo``
against all three of a user's own components at once (an external SASL/SCRAM Kafka with ACLs, a
Redis with a password, the lake on this store): ``up`` starts only the project's processes, the
archiver and its compaction write the archive and the Delta views to the store, the project's
readers (delta-rs for the log, Spark for the rows) find them, verify passes (the demo's quality
step skipped), and no file the stack wrote holds a secret.

The file runs in CI within 5 minutes (docs/testing.md): one Spark session of this process serves
every test that drives the JVM itself (and is one of the two racing writers), the other writer
starts on a line once it is up (not at a fixed time), and the one stack is the demo's, smaller
than test_demo.py's and without the stream analytics.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from infra.external import ExternalUnfit, check_external, check_lake
from infra.processes import settings_env
from infra.settings import REPO_ROOT, Settings
from tests.integration.test_external_kafka import scram_kafka  # noqa: F401 - the SASL broker, a fixture

pytestmark = pytest.mark.integration

ACCESS_KEY = "social-lake"
BUCKET = "lake"


def _free_port() -> int:
    from infra.stack import free_port_block

    return free_port_block(1)


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A running versitygw with the bucket ``lake``; yields the server (endpoint, keys, root)."""
    from infra import s3server

    if not s3server.binary_path().exists():
        pytest.fail(
            f"{s3server.binary_path()} is missing: `make s3-server` builds it (as `make setup` and `make test` do; needs Go)",
            pytrace=False,
        )
    root = tmp_path_factory.mktemp("s3root")
    server = s3server.start(
        root, _free_port(), ACCESS_KEY, "s3cret-" + uuid.uuid4().hex[:12], root.parent / f"{root.name}.log"
    )
    server.bucket(BUCKET)
    try:
        yield server
    finally:
        server.stop()


def on_lake(settings: Settings, s3, prefix: str) -> Settings:
    """``settings`` with the lake at ``s3a://lake/<prefix>`` on the test's store."""
    return replace(
        settings,
        lake_uri=f"s3a://{BUCKET}/{prefix}",
        lake_s3_endpoint=s3.endpoint,
        lake_s3_access_key=s3.access_key,
        lake_s3_secret_key=s3.secret_key,
        lake_s3_path_style=1,
    )


@pytest.fixture(scope="module")
def spark(s3, tmp_path_factory):
    """One Spark session of this process with the store's S3A settings (its endpoint and keys: each
    test names its own prefix), for the tests that drive a LogStore or write and read the lake
    themselves: a driver's start costs ~10-20 s of the file's 5 minutes, once here, not per test."""
    from pyspark import SparkContext

    from pipelines.spark import build_spark
    from tests.conftest import isolated_settings

    if SparkContext._active_spark_context is not None:
        pytest.fail(
            "this process started a Spark session before this file's, whose driver then lacks S3A "
            "(its jars load at the JVM's start): run this file first in its process "
            "(tests/integration/conftest.py, FIRST)"
        )
    session = build_spark(
        "external-lake",
        on_lake(isolated_settings(tmp_path_factory.mktemp("var-spark")), s3, "spark"),
        testing=True,
    )
    try:
        yield session
    finally:
        session.stop()


def test_the_check_passes_and_each_unfit_store_is_one_line(s3, tmp_path, private_settings):
    settings = on_lake(private_settings(tmp_path / "var"), s3, "check")
    [line] = check_external(settings)
    assert "conditional writes honoured" in line and s3.secret_key not in line

    def problem(**changes) -> str:
        with pytest.raises(ExternalUnfit) as caught:
            check_lake(replace(settings, **changes))
        [line] = caught.value.problems
        assert "\n" not in line and s3.secret_key not in line
        return line

    assert "credentials refused" in problem(lake_s3_secret_key="wrong")
    assert "bucket nobucket does not exist" in problem(lake_uri="s3a://nobucket/check")
    assert "unreachable (connection refused)" in problem(lake_s3_endpoint=f"http://127.0.0.1:{_free_port()}")
    # the probe left nothing behind
    left = [p for p in (s3.root / BUCKET).rglob("*") if p.is_file() and ".sgwtmp" not in p.parts]
    assert not left, left


class _OtherWriterLandsMidway:
    """The actions of a commit, handed to the LogStore as a ``java.util.Iterator`` (through py4j's
    callback server): while the LogStore's output stream is open, a second writer's commit of the
    same version lands on the store (a plain PUT, as another JVM's would), so the race happens
    every time, not by chance."""

    def __init__(self, land):
        self.land, self.sent = land, False

    def hasNext(self):  # noqa: N802 - java.util.Iterator
        return not self.sent

    def next(self):
        self.sent = True
        self.land()
        return '{"commitInfo":{"writer":"mine"}}'

    class Java:
        implements = ["java.util.Iterator"]


@pytest.mark.parametrize(
    ("log_store", "kept"),
    [
        ("social.delta.S3ConditionalPutLogStore", "theirs"),
        # Delta's S3 default, for contrast: it checks, then PUTs unconditionally over the other's
        pytest.param("io.delta.storage.S3SingleDriverLogStore", "mine", id="delta-default"),
    ],
)
def test_a_commit_that_lands_while_ours_is_written_is_not_replaced(
    s3, spark, tmp_path, private_settings, log_store, kept
):
    import obstore
    from py4j.protocol import Py4JJavaError
    from pyspark.java_gateway import ensure_callback_server_started

    from infra.lake_store import object_store

    settings = on_lake(private_settings(tmp_path / "var"), s3, f"midway-{kept}")
    ensure_callback_server_started(spark.sparkContext._gateway)
    jvm, conf = spark._jvm, spark._jsc.hadoopConfiguration()
    key = f"midway-{kept}/t/_delta_log/00000000000000000000.json"
    store = object_store(settings, BUCKET)
    obstore.put(store, f"midway-{kept}/t/_delta_log/.keep", b"")  # the log folder exists, version 0 not
    path = jvm.org.apache.hadoop.fs.Path(f"s3a://{BUCKET}/{key}")
    package, _, name = log_store.rpartition(".")
    instance = getattr(jvm, package.split(".")[0])
    for part in [*package.split(".")[1:], name]:
        instance = getattr(instance, part)
    instance = instance(conf)
    actions = _OtherWriterLandsMidway(
        lambda: obstore.put(store, key, b'{"commitInfo":{"writer":"theirs"}}\n')
    )
    try:
        instance.write(path, actions, False, conf)
        refused = False
    except Py4JJavaError as exc:
        refused = "java.nio.file.FileAlreadyExistsException" in str(exc.java_exception.toString())
    content = bytes(obstore.get(store, key).bytes()).decode()
    assert f'"writer":"{kept}"' in content, content
    if kept == "theirs":  # the put-if-absent LogStore: refused, as Delta expects of a lost race
        assert refused


RACER = """
import sys
from pipelines.spark import build_spark
spark = build_spark("racer", testing=True)
table, writer, commits = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# warm, as the other writer's session is from creating the table: a Delta write of its own on the
# store (a cold first append took ~4 s, in which the other writer made 7 of its 8 commits), made
# while the other creates the table
spark.createDataFrame([(writer, -1)], "writer long, i long").write.format("delta").save(f"{table}-warm{writer}")
sys.stdin.readline()  # the table exists
spark.read.format("delta").load(table).count()
print("ready", flush=True)
sys.stdin.readline()  # the start line
for i in range(commits):
    spark.createDataFrame([(writer, i)], "writer long, i long").write.format("delta").mode("append").save(table)
print("done", writer)
"""


def writers_by_version(log_dir: Path) -> tuple[list[int], int]:
    """The writer of each commit of the racing table's log after version 0 (from its add action's
    statistics), and how many commits were made at a later version than the one they read (the
    loser of a race: refused by the store, retried at the next version)."""
    order, retried = [], 0
    for path in sorted(log_dir.glob("*.json"))[1:]:
        actions = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        [add] = [a["add"] for a in actions if "add" in a]
        [info] = [a["commitInfo"] for a in actions if "commitInfo" in a]
        order.append(json.loads(add["stats"])["minValues"]["writer"])
        retried += info.get("readVersion", 0) < int(path.stem) - 1
    return order, retried


@pytest.mark.timeout(300)
def test_two_writers_racing_on_one_table_lose_no_commit(s3, spark, tmp_path, private_settings):
    """Two drivers (two JVMs, as the archiver and a maintenance job are: this process's session and
    a driver of its own) append to one table at the same moments: every append is a commit of its
    own, none replaced by the other's (the loser of a race is refused by the store and retries at
    the next version). A race is a matter of timing: with Delta's S3SingleDriverLogStore and S3A's
    ``fs.s3a.performance.flags=create`` (which turns its create(path, overwrite=false) into an
    unchecked PUT) 40 racing appends kept 39 here (2026-12-06); with the LogStore alone (a HEAD,
    then an unconditional PUT: a window of milliseconds) they kept 40 of 40, which is luck, not a
    guarantee."""
    from deltalake import DeltaTable

    from infra.lake_store import delta_storage_options

    settings = on_lake(private_settings(tmp_path / "var"), s3, "race")
    table = f"{settings.lake_uri}/t"
    commits = 5
    # the other driver starts (and warms) while this session creates the table
    racer = subprocess.Popen(
        [sys.executable, "-c", RACER, table, "2", str(commits)],
        cwd=REPO_ROOT,
        env=settings_env(settings),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    spark.createDataFrame([(0, 0)], "writer long, i long").write.format("delta").save(table)
    racer.stdin.write("created\n")
    racer.stdin.flush()
    # both writers start on one line once the other driver is up: a fixed start time idled when it
    # was up sooner, and on a loaded machine could pass before its JVM was up, leaving no race
    before = []
    while (line := racer.stdout.readline()) and line.strip() != "ready":
        before.append(line)
    assert line, f"the racer exited {racer.wait()} before it was ready:\n" + "".join(before)[-3000:]
    racer.stdin.write("go\n")
    racer.stdin.flush()
    for i in range(commits):
        spark.createDataFrame([(1, i)], "writer long, i long").write.format("delta").mode("append").save(
            table
        )
    out = racer.communicate(timeout=240)[0]
    assert racer.returncode == 0, out[-3000:]
    log = DeltaTable(table, storage_options=delta_storage_options(settings))
    assert log.version() == 2 * commits, f"{2 * commits + 1 - (log.version() + 1)} commits lost"
    rows = spark.read.format("delta").load(table).groupBy("writer").count().collect()
    assert {r["writer"]: r["count"] for r in rows} == {0: 1, 1: commits, 2: commits}
    # the commits are objects on the store, not files of this machine's var/
    log_dir = s3.root / BUCKET / "race" / "t" / "_delta_log"
    assert (log_dir / f"{2 * commits:020d}.json").exists()
    # and they raced: each writer committed between two commits of the other
    order, retried = writers_by_version(log_dir)
    assert order.index(1) < max(i for i, w in enumerate(order) if w == 2), order
    assert order.index(2) < max(i for i, w in enumerate(order) if w == 1), order
    print(f"racing writers: commits by version {order}, {retried} made after a lost race")
    assert not (Path(settings.var_dir) / "lake").exists()


# The demo's size here, through its documented knobs (`make demo DEMO_EVENTS=... DEMO_ARGS=...`):
# smaller than test_demo.py's 6,000 events of 50 users, verify called as a command (`--no-airflow`;
# the DAGs around it are test_demo.py's and test_dags_e2e.py's), without the quality step
# (`--no-quality`: its JVM and Great Expectations, 55 s alone; the suites run in test_demo.py,
# tests/integration/local/test_quality_suites.py, on a local lake) and without the stream analytics
# (SOCIAL_ANALYTICS=0: their JVM, their alerts and their page; test_demo.py and test_analytics.py run
# them on a local lake), so the file keeps to CI's 5 minutes: what this test is about is the three
# external components under one stack, not the demo's size. At 6,000 events through Airflow, with
# the analytics, it took 428 s alone (2026-12-06); at this size with them, 189-215 s alone and 340 s
# beside two other integration files; with the quality step, 219 s alone (its demo 178 s, 55 s of it
# quality), 406 s in CI; without it, 160 s alone (2026-12-06 20:07; docs/testing.md).
DEMO_ENV = {"DEMO_EVENTS": "2000", "DEMO_USERS": "30", "DEMO_LIVE_SECONDS": "5"}
DEMO_ARGS = ("--no-airflow", "--no-quality")


@pytest.mark.timeout(600)
def test_demo_passes_on_external_kafka_redis_and_s3_lake(s3, spark, tmp_path, request):
    """``make demo`` small with all three of the user's own: the SASL/SCRAM Kafka with ACLs of
    test_external_kafka.py, a Redis with a password, and the lake on the store. ``up`` starts only
    the project's processes (the lake's row says the store); the archiver's archive and its
    compaction's Delta views land on the store, where the readers the demo waits with (delta-rs:
    ``archived``, ``committed_position``) and verify's (Spark) find them; the demo exits 0 with
    verify ok (its quality step skipped, ``--no-quality``); the rows read back with Spark cover the
    log; no file the stack wrote holds any of the three secrets."""
    from contract import namespaces
    from infra.kafka_admin import end_offsets
    from infra.stack import Stack
    from pipelines.lake import Lake
    from tests.integration.test_demo import ARCHIVER

    _admin_settings, user_settings = request.getfixturevalue("scram_kafka")
    redis_port, api_port, metrics_port = _free_port(), _free_port(), _free_port()
    redis_password = "redis-" + uuid.uuid4().hex[:8]
    suffix = uuid.uuid4().hex[:6]
    redis = subprocess.Popen(
        ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--requirepass", redis_password,
         "--appendonly", "yes", "--save", "", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    settings = on_lake(
        replace(
            user_settings,
            var_dir=tmp_path / "var",
            events_topic=f"ext.demo-{suffix}",
            alerts_topic=f"ext.alerts-{suffix}",  # the ACLs allow the project's user topics under ext. only
            redis_external=1,
            redis_url=f"redis://:{redis_password}@127.0.0.1:{redis_port}/0",
            redis_port=redis_port,
            api_port=api_port,
            metrics_port=metrics_port,
            analytics=0,
            off_path_nice=0,
            **ARCHIVER,
        ),
        s3,
        "demo",
    )
    log = tmp_path / "demo.log"
    started = time.monotonic()
    rc = None
    try:
        with log.open("w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "stories.demo", *DEMO_ARGS],
                cwd=REPO_ROOT,
                env={**settings_env(settings), **DEMO_ENV},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                rc = proc.wait(timeout=540)
            except subprocess.TimeoutExpired:
                pass
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(timeout=60)
    finally:
        Stack(settings).down()
        redis.kill()
        redis.wait(10)
    took = time.monotonic() - started
    text = log.read_text()
    tail = "\n".join(line for line in text.replace("\r", "\n").splitlines() if line.strip())[-5000:]
    print(f"demo on external Kafka, Redis and S3 lake: exit {rc} after {took:.0f} s")
    assert rc == 0, f"the demo exited {rc} after {took:.0f}s:\n{tail}"
    result = json.loads((tmp_path / "var" / "reports" / "demo" / "summary.json").read_text())
    assert result["verify_ok"] and result["duplicates_as_injected"] is True, tail
    assert result["quality_ok"] is None and result["summary"]["data quality"] == "skipped (--no-quality)"
    assert all(n == 0 for n in result["mismatches"].values()), result["mismatches"]
    # `up` started none of the three: the external rows name the user's Kafka, Redis and store
    up_lines = text.split("==> appending", 1)[0]
    for name in ("kafka", "redis", "lake"):
        assert f"  {name} (external) " in up_lines and f"  {name:<12} started" not in up_lines, up_lines
    assert f"lake {settings.lake_uri} at {s3.endpoint}" in up_lines, up_lines

    # the archive and the views are objects on the store, and nothing of the lake is on this disk
    namespace = namespaces.active(settings)
    store = s3.root / BUCKET / "demo"
    assert (store / "ACTIVE").exists() or namespaces.DEFAULT == namespace
    for table in (
        "events_bronze",
        "quarantine",
        "changelog",
        "archives",
        "batches",
        "users",
        "posts",
        "inbox",
    ):
        assert (store / namespace / table / "_delta_log").is_dir(), table
    assert not (tmp_path / "var" / "lake").exists()
    # read back with Spark: every record of the log is in bronze or quarantine, the views hold rows
    lake = Lake(spark, settings.lake_dir, namespace)
    positions = (
        lake.read("events_bronze").select("partition", "offset")
        .union(lake.read("quarantine").select("partition", "offset"))
        .distinct().count()
    )  # fmt: skip
    assert positions == sum(end_offsets(user_settings, settings.events_topic).values())
    assert lake.read("users").count() > 0 and lake.read("posts").count() > 0

    # no file the stack wrote holds a secret: logs, Spark's event logs (Hadoop's properties are
    # redacted there), checkpoints, reports (read once the drivers' JVMs closed their files)
    events = Path(settings.var_dir) / "spark-events"
    deadline = time.monotonic() + 30
    while any(p.suffix == ".inprogress" for p in events.rglob("*")) and time.monotonic() < deadline:
        time.sleep(0.5)
    written = [Path(d) / f for d, _dirs, files in os.walk(settings.var_dir) for f in files]
    assert any("spark-events" in p.parts for p in written)
    secrets = [
        s3.secret_key.encode(),
        redis_password.encode(),
        user_settings.kafka_sasl_password.get_secret_value().encode(),
    ]

    def holds_a_secret(path: Path) -> bool:
        try:
            content = path.read_bytes()
        except FileNotFoundError:  # a driver's temporary file, removed as its JVM exits
            return False
        return any(secret in content for secret in secrets)

    leaks = [p for p in written if holds_a_secret(p)]
    assert not leaks, leaks
