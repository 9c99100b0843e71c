"""The Spark drivers' class archive (AppCDS, pipelines.spark.class_archive): named for the JDK and
the classpath it is valid for, dumped by `make setup`, and really mapped by a driver.

A driver started with ``-Xshare:on`` refuses to start unless it can map and validate its
archive (the default, ``-Xshare:auto``, would fall back silently to loading every class from the
jars): the second test would fail on an archive that is missing, stale or not passed at all.
The same driver checks that ``SOCIAL_SPARK_CONF`` reaches its session (and wins over the defaults).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from infra.settings import REPO_ROOT
from pipelines.spark import _jar_paths, class_archive


def test_the_archive_is_named_for_its_classpath():
    from infra.settings import get_settings

    jars = _jar_paths(get_settings())
    same = class_archive(list(jars))
    assert same == class_archive(list(jars)) and same.suffix == ".jsa"
    upgraded = [*jars[:-1], Path(str(jars[-1]).replace(".jar", "-next.jar"))]
    assert class_archive(upgraded) != same  # a jar upgrade names another archive
    assert class_archive(jars[:-1]) != same


def test_a_driver_maps_the_archive_setup_dumped(tmp_path):
    archive = class_archive()
    assert archive.exists(), (
        "no class archive: `make setup` dumps it (python -m pipelines.spark class-archive)"
    )
    script = (
        "from infra.settings import get_settings\n"
        "from pipelines.spark import build_spark\n"
        "spark = build_spark('cds-check', get_settings(), testing=True)\n"
        "jvm = spark.sparkContext._jvm\n"
        "args = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())\n"
        "print('ARGS', [a for a in args if 'Share' in a])\n"
        "print('ROWS', spark.range(5).count())\n"
        "print('CONF', spark.conf.get('spark.sql.codegen.factoryMode'), spark.conf.get('spark.sql.shuffle.partitions'))\n"
        "print('POLL', spark.conf.get('spark.sql.streaming.pollingDelay'))\n"
        "spark.stop()\n"
    )
    env = {
        **os.environ,
        "SOCIAL_VAR_DIR": str(tmp_path),
        "SOCIAL_SPARK_DRIVER_JAVA_OPTIONS": "-Xshare:on",  # no usable archive, no driver
        "SOCIAL_SPARK_CONF": "spark.sql.codegen.factoryMode=NO_CODEGEN spark.sql.shuffle.partitions=3",
        "SOCIAL_IDLE_POLL_MS": "75",
    }
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert f"-XX:SharedArchiveFile={archive}" in done.stdout and "ROWS 5" in done.stdout
    assert "CONF NO_CODEGEN 3" in done.stdout  # testing=True sets 2 partitions; the setting wins
    assert "POLL 75ms" in done.stdout  # an idle stream's wait before it asks the broker again


def test_the_dump_runs_with_the_cheapest_compiler_and_one_collector():
    import shlex

    from infra.settings import get_settings
    from pipelines.spark import dump_java_options

    flags = shlex.split(dump_java_options(get_settings(spark_driver_java_options="")))
    assert "-XX:TieredStopAtLevel=1" in flags and "-XX:+UseSerialGC" in flags
    # configured flags come last (they win); a collector they name replaces the serial one
    flags = shlex.split(dump_java_options(get_settings(spark_driver_java_options="-XX:+UseG1GC -Xss2m")))
    assert flags[-2:] == ["-XX:+UseG1GC", "-Xss2m"] and "-XX:+UseSerialGC" not in flags
