"""The JVM flags `make test` gives its integration run's Spark drivers (Makefile: SHORT_JOBS).

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


def short_jobs_flags() -> list[str]:
    makefile = (REPO_ROOT / "Makefile").read_text()
    line = next(x for x in makefile.splitlines() if x.startswith("SHORT_JOBS :="))
    # SOCIAL_SPARK_DRIVER_JAVA_OPTIONS="$${SOCIAL_SPARK_DRIVER_JAVA_OPTIONS-<default>}"
    default = re.search(r"\$\$\{SOCIAL_SPARK_DRIVER_JAVA_OPTIONS-(.*)\}\"", line)
    assert default, line
    return shlex.split(default.group(1))


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
    flags = short_jobs_flags()
    assert "-XX:TieredStopAtLevel=1" in flags
    final = final_flags(flags)
    assert int(final["ReservedCodeCacheSize"]) >= 240 * MiB
    assert final["TieredStopAtLevel"] == "1"
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


def test_the_makefile_spark_conf_names_real_spark_settings():
    from pipelines.spark import parse_conf

    makefile = (REPO_ROOT / "Makefile").read_text()
    default = re.search(r"\$\$\{SOCIAL_SPARK_CONF-(.*?)\}\"", makefile)
    assert default, "SOCIAL_SPARK_CONF's default for the integration run"
    conf = parse_conf(default.group(1))
    assert conf["spark.sql.adaptive.enabled"] == "false"
    assert conf["spark.sql.codegen.factoryMode"] == "NO_CODEGEN"
