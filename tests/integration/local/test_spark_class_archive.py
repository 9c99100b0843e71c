"""The Spark drivers' class archive (pipelines.spark.class_archive: JDK 25's ahead-of-time cache, or
AppCDS on an older JDK): named for the JDK and the classpath it is valid for, dumped by `make
setup`, and really mapped by a driver; and the JDK the drivers run on (infra.jars.spark_java_home).

A driver started with ``-XX:AOTMode=on`` (AppCDS: ``-Xshare:on``) refuses to start unless it can map
and validate its archive (the default would fall back silently to loading every class from the
jars): the second test would fail on an archive that is missing, stale or not passed at all.
The same driver checks that ``SOCIAL_SPARK_CONF`` reaches its session (and wins over the defaults).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.jars import JarsError, java_major, spark_java_home
from infra.settings import REPO_ROOT, get_settings
from pipelines.spark import _jar_paths, ahead_of_time, class_archive, java_home


def test_the_archive_is_named_for_its_classpath_and_its_kind_for_the_jdk():
    jars = _jar_paths(get_settings())
    same = class_archive(list(jars))
    kind = ".aot" if java_major(java_home(get_settings())) >= 25 else ".jsa"
    assert same == class_archive(list(jars)) and same.suffix == kind
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
        "print('ARGS', [a for a in args if 'Share' in a or 'AOT' in a])\n"
        "print('ROWS', spark.range(5).count())\n"
        "print('CONF', spark.conf.get('spark.sql.codegen.factoryMode'), spark.conf.get('spark.sql.shuffle.partitions'))\n"
        "print('POLL', spark.conf.get('spark.sql.streaming.pollingDelay'))\n"
        "spark.stop()\n"
    )
    env = {
        **os.environ,
        "SOCIAL_VAR_DIR": str(tmp_path),
        # no usable archive, no driver
        "SOCIAL_SPARK_DRIVER_JAVA_OPTIONS": "-XX:AOTMode=on" if archive.suffix == ".aot" else "-Xshare:on",
        "SOCIAL_SPARK_CONF": "spark.sql.codegen.factoryMode=NO_CODEGEN spark.sql.shuffle.partitions=3",
        "SOCIAL_IDLE_POLL_MS": "75",
    }
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    flag = f"-XX:AOTCache={archive}" if archive.suffix == ".aot" else f"-XX:SharedArchiveFile={archive}"
    assert flag in done.stdout and "ROWS 5" in done.stdout
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


def _jdk(root, name: str, version: str):
    home = root / name
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "java").write_text("")
    (home / "release").write_text(f'IMPLEMENTOR="x"\nJAVA_VERSION="{version}"\n')
    return home


def test_the_drivers_run_on_a_jdk_25_if_one_is_installed(tmp_path, monkeypatch):
    import infra.jars

    _jdk(tmp_path, "java-17-openjdk-amd64", "17.0.15")
    monkeypatch.setattr(infra.jars, "JVM_HOMES", tmp_path)
    settings = get_settings(spark_java_home="")
    assert spark_java_home(settings) is None  # 17 only: Spark finds its java itself, AppCDS
    jdk25 = _jdk(tmp_path, "temurin-25-jdk-amd64", "25.0.3")
    _jdk(tmp_path, "temurin-26-jdk-amd64", "26.0.1")  # newer than Spark 4.2 supports: not by default
    assert spark_java_home(settings) == jdk25 and ahead_of_time(jdk25)
    assert java_major(tmp_path / "java-17-openjdk-amd64") == 17 and not ahead_of_time(
        tmp_path / "java-17-openjdk-amd64"
    )
    # the setting wins, and a home without bin/java is an error that names it
    assert spark_java_home(
        get_settings(spark_java_home=str(tmp_path / "temurin-26-jdk-amd64"))
    ).name.startswith("temurin-26")
    with pytest.raises(JarsError, match="SOCIAL_SPARK_JAVA_HOME"):
        spark_java_home(get_settings(spark_java_home=str(tmp_path / "nowhere")))
