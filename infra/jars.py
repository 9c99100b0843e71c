"""JVM jars for the local stack: fetched once from Maven Central, pinned, checksum-verified.

Three manifests in ``infra/jvm/`` describe classpaths; the broker's and Spark's must never mix:

- ``kafka``: the broker (KRaft) and its tools, run by ``infra.stack`` as ``java -cp ...``;
- ``spark``: what the speed layer adds to PySpark (Kafka source, Delta Lake), passed as ``spark.jars``.
  It carries Spark's own kafka-clients 3.9.x, not the broker's 4.x.
- ``s3``: Hadoop's S3A file system and the AWS SDK v2 modules it calls (not the 686 MB SDK bundle:
  ``infra/jvm/s3-pom.xml`` says why), added to ``spark.jars`` only when the lake is an ``s3a://``
  URI (SOCIAL_LAKE_URI), with the project's S3 LogStore (``infra/jvm/logstore/``), compiled here by
  ``javac`` from its committed source.

``python -m infra.jars fetch`` copies each manifest's runtime closure into ``<jars_dir>/<name>/``
with Maven (local repository ``.cache/m2``) and checks every jar against the committed lock file
``infra/jvm/<name>.sha256``. When the jars are already there and verified it does nothing, offline.
``lock`` rewrites the lock files after a deliberate manifest change; ``verify`` only checks.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

from infra.cli import command_name, run_main
from infra.settings import REPO_ROOT, Settings, get_settings

JVM_DIR = REPO_ROOT / "infra" / "jvm"
MAVEN_SETTINGS = JVM_DIR / "maven-settings.xml"
MAVEN_REPO = REPO_ROOT / ".cache" / "m2"
MANIFESTS = {
    "kafka": JVM_DIR / "kafka-pom.xml",
    "spark": JVM_DIR / "spark-pom.xml",
    "s3": JVM_DIR / "s3-pom.xml",
}
# what Spark drivers add to PySpark's own jars (the s3 set only for a lake on an object store)
SPARK_EXTRAS = ("spark", "s3")

# name-version.jar -> name; versions start with a digit (kafka_2.13-4.3.1.jar -> kafka_2.13)
_JAR_NAME = re.compile(r"^(?P<name>.+)-\d[\w.]*(?:-[A-Za-z][\w.-]*)?\.jar$")


class JarsError(RuntimeError):
    """A problem the user must fix (missing tool, checksum mismatch, missing jars): one line."""


def require_java() -> str:
    """Path of `java`, or a one-line error saying how to get it."""
    java = shutil.which("java")
    if not java:
        raise JarsError(
            "`java` not found on PATH: install a JDK 17 (e.g. `apt-get install -y openjdk-17-jdk-headless`)"
        )
    return java


# The JDK of the Spark JVMs. 25 is the first LTS with an ahead-of-time cache (JEP 483/514), which a
# driver maps with every class its training run loaded, the JDK's and the application's alike. A
# cold verify on 12,000 events, side by side, three runs each: 116.7-123.5 CPU-s on 17 with its
# AppCDS archive, 98.4-103.7 on 25 with its cache (docs/performance.md: Spark driver start).
SPARK_JDK = 25
JVM_HOMES = Path("/usr/lib/jvm")


def java_major(home: Path) -> int | None:
    """The feature release of the JDK in ``home`` (``release``: JAVA_VERSION="25.0.3" -> 25)."""
    try:
        text = (home / "release").read_text()
    except OSError:
        return None
    found = re.search(r'^JAVA_VERSION="(\d+)', text, re.MULTILINE)
    return int(found[1]) if found else None


def spark_java_home(settings: Settings) -> Path | None:
    """The JDK the Spark drivers and the standalone cluster run on:
    ``SOCIAL_SPARK_JAVA_HOME`` if set, else a JDK :data:`SPARK_JDK` under /usr/lib/jvm if one is
    installed, else None: JAVA_HOME or the `java` on PATH, as Spark finds them itself."""
    if settings.spark_java_home:
        home = Path(settings.spark_java_home)
        if not (home / "bin" / "java").exists():
            raise JarsError(f"SOCIAL_SPARK_JAVA_HOME={home}: no bin/java there")
        return home
    found = sorted(
        p for p in JVM_HOMES.glob("*") if (p / "bin" / "java").exists() and java_major(p) == SPARK_JDK
    )
    return found[0] if found else None


def lock_path(name: str) -> Path:
    return JVM_DIR / f"{name}.sha256"


def jar_dir(name: str, settings: Settings | None = None) -> Path:
    return Path((settings or get_settings()).jars_dir) / name


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_lock(name: str) -> dict[str, str]:
    """{jar file name: sha256} from the committed lock file (sha256sum format)."""
    entries = {}
    for line in lock_path(name).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            digest, filename = line.split(maxsplit=1)
            entries[filename.strip()] = digest
    return entries


def _hashes(directory: Path) -> dict[str, str]:
    return {p.name: _sha256(p) for p in sorted(directory.glob("*.jar"))}


def problems(name: str, directory: Path) -> list[str]:
    """What is wrong with the jars in `directory` compared with the lock file (empty: all good)."""
    if not lock_path(name).exists():
        return [f"no lock file {lock_path(name).relative_to(REPO_ROOT)}; run `python -m infra.jars lock`"]
    if not directory.is_dir():
        return [f"{directory} does not exist"]
    expected, actual = read_lock(name), _hashes(directory)
    found = []
    found += [f"missing {f}" for f in sorted(expected.keys() - actual.keys())]
    found += [f"unexpected {f}" for f in sorted(actual.keys() - expected.keys())]
    found += [
        f"checksum mismatch {f}" for f in sorted(expected.keys() & actual.keys()) if expected[f] != actual[f]
    ]
    return found


def _pyspark_jar_names() -> set[str]:
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    return {m["name"] for p in jars.glob("*.jar") if (m := _JAR_NAME.match(p.name))}


def shadowed_pyspark_jars(directory: Path) -> list[str]:
    """Fetched Spark extras that PySpark already ships (a second copy on the classpath)."""
    shipped = _pyspark_jar_names()
    return sorted(
        p.name for p in directory.glob("*.jar") if (m := _JAR_NAME.match(p.name)) and m["name"] in shipped
    )


def _maven_copy(name: str, target: Path) -> None:
    require_java()
    if not shutil.which("mvn"):
        raise JarsError("`mvn` not found on PATH: install Maven 3.8+ (e.g. `apt-get install -y maven`)")
    cmd = [
        "mvn", "-q", "-B", "-C",
        "-s", str(MAVEN_SETTINGS),
        "-f", str(MANIFESTS[name]),
        f"-Dmaven.repo.local={MAVEN_REPO}",
        f"-DoutputDirectory={target}",
        "dependency:copy-dependencies",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        raise JarsError(f"maven could not fetch the {name} jars: " + " | ".join(tail))


def _download(name: str, directory: Path) -> Path:
    """Copy the manifest's closure into a fresh sibling folder (so stale jars never linger)."""
    staging = directory.with_name(directory.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    _maven_copy(name, staging)
    if name in SPARK_EXTRAS and (dupes := shadowed_pyspark_jars(staging)):
        raise JarsError(
            f"spark extras would duplicate jars PySpark ships: {', '.join(dupes)}; exclude them in the pom"
        )
    return staging


def _install(staging: Path, directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    staging.rename(directory)


def fetch(settings: Settings | None = None, names: tuple[str, ...] = tuple(MANIFESTS)) -> dict[str, int]:
    """Make every classpath present and verified; offline no-op when it already is. Returns jar counts."""
    counts = {}
    for name in names:
        directory = jar_dir(name, settings)
        if problems(name, directory):
            staging = _download(name, directory)
            if found := problems(name, staging):
                raise JarsError(f"{name} jars do not match {lock_path(name).name}: {'; '.join(found[:5])}")
            _install(staging, directory)
        counts[name] = len(read_lock(name))
    if "s3" in names and shutil.which("javac"):
        # a JRE alone (the compose image) has no javac: its drivers then refuse an s3a:// lake
        # with one line (spark_jars), while a local lake needs no LogStore
        build_logstore(settings)
    return counts


# The LogStore an s3a:// lake's commits go through (infra/jvm/logstore/: why it is the project's own),
# compiled from its committed source against the jars it links (PySpark's Hadoop, hadoop-aws,
# delta-storage) into a jar named by the source's hash: a changed source builds a new jar.
LOGSTORE_SOURCES = JVM_DIR / "logstore"


def logstore_jar(settings: Settings | None = None) -> Path:
    h = hashlib.sha256()
    for source in sorted(LOGSTORE_SOURCES.rglob("*.java")):
        h.update(source.relative_to(LOGSTORE_SOURCES).as_posix().encode() + b"\0" + source.read_bytes())
    return jar_dir("logstore", settings) / f"social-delta-logstore-{h.hexdigest()[:12]}.jar"


def build_logstore(settings: Settings | None = None) -> Path:
    """The LogStore's jar, compiled with `javac` if it is not there yet (~2 s)."""
    import pyspark

    target = logstore_jar(settings)
    if target.exists():
        return target
    javac, jar = shutil.which("javac"), shutil.which("jar")
    if not javac or not jar:
        raise JarsError(
            "`javac` not found on PATH: install a JDK 17 (e.g. `apt-get install -y openjdk-17-jdk-headless`)"
        )
    pyspark_jars = Path(pyspark.__file__).parent / "jars"
    classpath = [
        *pyspark_jars.glob("hadoop-client-api-*.jar"),
        *_jars("s3", settings),
        *_jars("spark", settings),
    ]
    staging = target.parent / (target.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    sources = [str(p) for p in sorted(LOGSTORE_SOURCES.rglob("*.java"))]
    cmd = [
        javac,
        "--release",
        "17",
        "-nowarn",
        "-d",
        str(staging),
        "-cp",
        ":".join(map(str, classpath)),
        *sources,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise JarsError(
            "javac could not build the S3 LogStore: " + " | ".join(done.stderr.strip().splitlines()[:3])
        )
    built = target.parent / (target.name + ".part")
    done = subprocess.run(
        [jar, "--create", "--file", str(built), "-C", str(staging), "."], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise JarsError(f"jar could not pack the S3 LogStore: {done.stderr.strip()[:200]}")
    shutil.rmtree(staging)
    for old in target.parent.glob("social-delta-logstore-*.jar"):
        old.unlink()
    built.rename(target)
    return target


def lock(settings: Settings | None = None) -> dict[str, int]:
    """Resolve the manifests afresh and write the lock files (after a deliberate manifest change)."""
    counts = {}
    for name in MANIFESTS:
        directory = jar_dir(name, settings)
        staging = _download(name, directory)
        hashes = _hashes(staging)
        header = f"# sha256 of every jar in {MANIFESTS[name].name}'s runtime closure; written by `python -m infra.jars lock`\n"
        lock_path(name).write_text(header + "".join(f"{d}  {f}\n" for f, d in hashes.items()))
        _install(staging, directory)
        counts[name] = len(hashes)
    return counts


def verify(settings: Settings | None = None) -> dict[str, list[str]]:
    return {name: problems(name, jar_dir(name, settings)) for name in MANIFESTS}


def _jars(name: str, settings: Settings | None) -> list[Path]:
    directory = jar_dir(name, settings)
    jars = sorted(directory.glob("*.jar"))
    if not jars:
        raise JarsError(f"no {name} jars under {directory}: run `make setup` (python -m infra.jars fetch)")
    return jars


def kafka_classpath(settings: Settings | None = None) -> str:
    """`java -cp` value for the broker and the Kafka tools."""
    return ":".join(str(p) for p in _jars("kafka", settings))


def spark_jars(settings: Settings | None = None) -> list[Path]:
    """Jars to add to PySpark (spark.jars): the Kafka source/sink and Delta Lake, and S3A with the
    AWS SDK when the lake is on an object store."""
    settings = settings or get_settings()
    if not settings.lake_on_s3:
        return _jars("spark", settings)
    store = logstore_jar(settings)
    if not store.exists():
        raise JarsError(
            f"no S3 LogStore jar {store.name}: run `make setup` with a JDK's `javac` on PATH (python -m infra.jars fetch)"
        )
    return [*_jars("spark", settings), *_jars("s3", settings), store]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=command_name("infra.jars"), description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["fetch", "verify", "lock"])
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            counts = fetch()
            print("jars ok: " + ", ".join(f"{n} {c}" for n, c in counts.items()))
        elif args.command == "lock":
            counts = lock()
            print("locked: " + ", ".join(f"{n} {c}" for n, c in counts.items()))
        else:
            bad = {n: p for n, p in verify().items() if p}
            for name, found in bad.items():
                print(f"{name}: {'; '.join(found)}", file=sys.stderr)
            if bad:
                return 1
            print("jars verified")
    except JarsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "infra.jars"))
