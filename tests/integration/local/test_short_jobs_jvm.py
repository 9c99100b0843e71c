"""The JVM flags `make test` gives its integration run's Spark drivers (Makefile: SHORT_JOBS) and
its local run's (LOCAL_JVM).

`-XX:TieredStopAtLevel=1` alone switches the JVM to client emulation, whose code cache is 48 MiB:
a long rebuild filled it and died of "Out of space in CodeCache for method handle intrinsic".
This checks, on the machine's own JVM, that the flags as written keep the code cache at the
usual 240 MiB and still leave C2 out.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess

import pytest

from infra.settings import REPO_ROOT

MiB = 1024 * 1024


def makefile_default(variable: str) -> str:
    """The default the Makefile's SHORT_JOBS gives ``variable``: ``VAR="$${VAR-<default>}"``."""
    makefile = (REPO_ROOT / "Makefile").read_text()
    default = re.search(r"\$\$\{" + variable + r"-(.*?)\}\"", makefile)
    assert default, f"no default for {variable} in the Makefile"
    return expand(default.group(1), makefile)


def expand(value: str, makefile: str) -> str:
    """``value`` with each `$(NAME)` in it replaced by the Makefile's `NAME := ...`, recursively."""
    return re.sub(
        r"\$\((\w+)\)",
        lambda m: expand(re.search(rf"^{m.group(1)} := (.*)$", makefile, re.M).group(1).strip(), makefile),
        value,
    )


def final_flags(flags: list[str]) -> dict[str, str]:
    out = subprocess.run(
        ["java", *flags, "-XX:+PrintFlagsFinal", "-version"], capture_output=True, text=True, check=True
    ).stdout
    found = {}
    for row in out.splitlines():
        parts = row.split()
        if len(parts) >= 4 and parts[2] == "=":
            found[parts[1]] = parts[3]
    return found


@pytest.mark.skipif(shutil.which("java") is None, reason="no JVM on PATH")
def test_short_jobs_keep_the_usual_code_cache_without_c2():
    flags = shlex.split(makefile_default("SOCIAL_SPARK_DRIVER_JAVA_OPTIONS"))
    assert "-XX:TieredStopAtLevel=1" in flags
    final = final_flags(flags)
    assert int(final["ReservedCodeCacheSize"]) >= 240 * MiB
    assert final["TieredStopAtLevel"] == "1"
    assert final["UseSerialGC"] == "true" and final["UseG1GC"] == "false"
    # and the trap itself, so the test explains why the size flag is there
    assert int(final_flags(["-XX:TieredStopAtLevel=1"])["ReservedCodeCacheSize"]) < 240 * MiB


def test_spark_conf_setting_is_parsed_strictly():
    from pipelines.spark import parse_conf

    assert parse_conf("") == {}
    assert parse_conf(" spark.a=1  spark.b.c=x=y ") == {"spark.a": "1", "spark.b.c": "x=y"}
    with pytest.raises(ValueError, match="not spark"):
        parse_conf("spark.a=1 adaptive=false")
    with pytest.raises(ValueError, match="not spark"):
        parse_conf("spark.sql.adaptive.enabled")


def test_the_integration_run_turns_adaptive_execution_and_codegen_off():
    from pipelines.spark import parse_conf

    conf = parse_conf(makefile_default("SOCIAL_SPARK_CONF"))
    assert conf["spark.sql.adaptive.enabled"] == "false"
    assert conf["spark.sql.codegen.wholeStage"] == "false"
    assert conf["spark.sql.codegen.factoryMode"] == "NO_CODEGEN"
    assert conf["spark.databricks.delta.snapshotPartitions"] == "1"  # the stack's 4, the testing session's 2


def test_test_brokers_get_the_same_flags_and_idle_streams_poll_less(tmp_path):
    from infra.settings import Settings, get_settings
    from infra.stack import KAFKA_MAIN, KafkaBroker

    flags = makefile_default("SOCIAL_KAFKA_JAVA_OPTIONS")
    assert shlex.split(flags) == shlex.split(makefile_default("SOCIAL_SPARK_DRIVER_JAVA_OPTIONS"))
    cmd = KafkaBroker(get_settings(var_dir=tmp_path, kafka_java_options=flags)).command()
    # JVM flags, so before the main class
    assert all(cmd.index(f) < cmd.index(KAFKA_MAIN) for f in shlex.split(flags))
    # one collector: the flags' serial one instead of the broker's G1 (a JVM given two refuses to start)
    assert "-XX:+UseSerialGC" in cmd and "-XX:+UseG1GC" not in cmd
    assert "-XX:+UseG1GC" in KafkaBroker(get_settings(var_dir=tmp_path)).command()
    assert (
        int(makefile_default("SOCIAL_IDLE_POLL_MS")) > Settings.__dataclass_fields__["idle_poll_ms"].default
    )
    # the archiver and the analytics level with the rest (the tests wait on them), not niced
    assert makefile_default("SOCIAL_OFF_PATH_NICE") == "0"
    assert Settings.__dataclass_fields__["off_path_nice"].default == 10
    # and the tiny shuffles of the test runs one partition per core, not the stack's default
    fields = Settings.__dataclass_fields__
    assert (
        int(makefile_default("SOCIAL_SPARK_SHUFFLE_PARTITIONS")) < fields["spark_shuffle_partitions"].default
    )


def test_the_local_run_keeps_c2_with_the_serial_collector():
    makefile = (REPO_ROOT / "Makefile").read_text()
    unit = re.search(r"^LOCAL_JVM := .*\$\$\{SOCIAL_SPARK_DRIVER_JAVA_OPTIONS-(.*?)\}\"$", makefile, re.M)
    assert unit, "no LOCAL_JVM in the Makefile"
    flags = shlex.split(expand(unit.group(1), makefile))
    assert flags == ["-XX:+UseSerialGC"]
    assert re.search(r"\$\(LOCAL_JVM\) \$\(SMALL_DATA\) \$\(PY\) -m pytest tests/integration/local", makefile)
