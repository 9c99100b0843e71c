"""docker-compose.yml, checked the way Docker Compose v2 reads it, for every command documented.

No Docker engine runs here or in CI, so nothing is started: the file is loaded by compose-go (the
library `docker compose` itself loads files with: parsed, validated against the Compose
Specification schema, interpolated, normalized), pinned in tests/compose/compose_check/go.sum and
built from the Go module proxy once per session (tests/compose/compose_check/main.go). For each
`docker compose ... up` docs/compose.md and the file's header document, the services that command
starts are checked: every image is built by the project's one `build:` section or is a public
image, no two services bind one host port, and they are the services `make up` starts for the
same profile (infra/stack.py), with the same commands and health checks on the same endpoints.
Then the image's side: every container command resolves against the project, the Dockerfile's
base is pinned to the Debian release this machine runs and apt-cache here finds each package it
installs, and Redis refuses to start below 7.0 in both stacks.

COMPOSE_CHECK_FILE=path runs the same checks on another Compose file (the project directory stays
this repository), e.g. on an older docker-compose.yml to see them fail.
"""

from __future__ import annotations

import fnmatch
import glob
import importlib
import json
import os
import re
import shlex
import shutil
import subprocess
import time
from functools import cache
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from infra import stack
from infra.settings import REPO_ROOT, get_settings, settings_table

COMPOSE_FILE = Path(os.environ.get("COMPOSE_CHECK_FILE") or REPO_ROOT / "docker-compose.yml").resolve()
CHECKER = REPO_ROOT / "tests" / "compose" / "compose_check"
GO_CACHE = REPO_ROOT / ".tools" / "go"  # module and build caches: a second session builds in ~1 s
PROJECT = "kappa-social"
PROJECT_IMAGE = "kappa-social:local"

# What docs/compose.md and the file's header document, one `up` per profile, and the `make up` each is.
UP_COMMANDS = {
    "docker compose --profile local up --build": {"profile": "local", "airflow": False},
    "docker compose --profile local --profile airflow up --build": {"profile": "local", "airflow": True},
    "docker compose --profile cluster up --build": {"profile": "cluster", "airflow": False},
    "docker compose --profile local --profile monitoring up --build": {
        "profile": "local",
        "airflow": False,
        "prometheus": True,
    },
}
# In compose only: Grafana (profile monitoring), which `make up` has no counterpart of (no Debian
# package of it; the local page is the exporter's own /dashboard, with the same panels).
COMPOSE_ONLY = {"grafana"}
PROFILES = ["local", "airflow", "cluster", "monitoring"]
# Documented as what not to do: every service has a profile, so it starts nothing.
BARE_UP = "docker compose up"
# A public image: a Docker Hub repository with a version tag (not `latest`, not a local tag).
# (`v2.53.0`: Prometheus's tags start with a v)
PUBLIC_IMAGE = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)?:v?\d[\w.-]*$")


# --- compose-go -------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def compose_check(tmp_path_factory) -> Path:
    """tests/compose/compose_check built with the Go toolchain on PATH (modules from go.sum)."""
    go = shutil.which("go")
    if go is None:
        pytest.fail(
            "`go` is not on PATH: tests/integration/local/test_compose.py loads docker-compose.yml with compose-go "
            "(tests/compose/compose_check), built with Go 1.24 or later; install Go",
            pytrace=False,
        )
    binary = tmp_path_factory.mktemp("compose_check") / "compose_check"
    env = {
        **os.environ,
        "GOMODCACHE": str(GO_CACHE / "mod"),
        "GOCACHE": str(GO_CACHE / "cache"),
        # the versions go.sum pins, the toolchain on PATH, no cgo; a module cache `rm -rf` can remove
        "GOFLAGS": "-mod=readonly -modcacherw",
        "GOTOOLCHAIN": "local",
        "GOWORK": "off",
        "CGO_ENABLED": "0",
    }
    started = time.monotonic()
    done = subprocess.run(
        [go, "build", "-trimpath", "-o", str(binary), "."],
        cwd=CHECKER,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"building {CHECKER} failed:\n{done.stdout}{done.stderr}"
    print(f"compose_check built in {time.monotonic() - started:.1f} s")
    return binary


def load(binary: Path, profiles=(), services=(), compose_file: Path = COMPOSE_FILE) -> dict:
    """What compose-go makes of the file for `docker compose [--profile P]... up [SERVICE]...`."""
    argv = [str(binary), "-f", str(compose_file), "-project-directory", str(REPO_ROOT), "-p", PROJECT]
    for profile in profiles:
        argv += ["-profile", profile]
    done = subprocess.run([*argv, *services], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"compose-go refuses {compose_file.name}: {done.stderr.strip()}"
    return json.loads(done.stdout)


def parse_command(command: str) -> tuple[list[str], str, list[str]]:
    """`docker compose [--profile P]... SUBCOMMAND [-flags] [SERVICE]...` -> profiles, subcommand, services."""
    words = shlex.split(command)
    assert words[:2] == ["docker", "compose"], command
    profiles, rest = [], words[2:]
    while rest and rest[0].startswith("-"):
        flag = rest.pop(0)
        assert flag == "--profile", f"{command}: the check knows only --profile before the subcommand"
        profiles.append(rest.pop(0))
    subcommand, *args = rest
    return profiles, subcommand, [a for a in args if not a.startswith("-")]


@cache
def documented() -> dict[str, set[str]]:
    """Every `docker compose ...` command docs/compose.md and the compose file's header comments show."""
    page = (REPO_ROOT / "docs" / "compose.md").read_text()
    header = []
    for line in COMPOSE_FILE.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line.lstrip("# "))
    found = {"docs/compose.md": set(), COMPOSE_FILE.name: set()}
    for where, text in (("docs/compose.md", page), (COMPOSE_FILE.name, "\n".join(header))):
        for match in re.finditer(r"docker compose [^`#\n]+", text):
            found[where].add(re.sub(r"\s+", " ", match.group(0)).strip().rstrip(".,;:)"))
    return found


@pytest.fixture(scope="session", params=list(UP_COMMANDS), ids=lambda c: c.removeprefix("docker compose "))
def up(request, compose_check) -> tuple[str, dict]:
    """One documented `up` command and the services it starts, as compose-go resolves them."""
    profiles, subcommand, services = parse_command(request.param)
    assert subcommand == "up"
    return request.param, load(compose_check, profiles, services)["services"]


def _is_project_service(service: dict) -> bool:
    return service.get("image") == PROJECT_IMAGE or service.get("build") is not None


def _key(name: str, service: dict) -> str:
    """A container as `make up` names it: the module a Python service runs, else the service's name."""
    argv = service.get("command") or []
    return argv[argv.index("-m") + 1] if "-m" in argv else name


def _make_up(profile: str, airflow: bool, prometheus: bool = False) -> dict[str, stack.Service]:
    """What `make up` starts for a profile (SOCIAL_AIRFLOW_STANDALONE=1 with airflow, SOCIAL_PROMETHEUS=1
    with prometheus), keyed as _key."""
    settings = get_settings(
        profile=profile, airflow_standalone=int(airflow), analytics=1, prometheus=int(prometheus)
    )
    started = {}
    for service in stack.Stack(settings).services:
        if isinstance(service, stack.AirflowService) and not settings.airflow_standalone:
            continue
        if isinstance(service, stack.PrometheusServer) and not settings.prometheus:
            continue  # opt-in (SOCIAL_PROMETHEUS=1), in compose's monitoring profile
        argv = [] if isinstance(service, stack.BACKBONE) else service.command()
        # a Python module by its name (as _key names its container), another program by the service's
        started[argv[argv.index("-m") + 1] if "-m" in argv else service.name] = service
    return started


def _long_running(services: dict) -> dict:
    return {n: s for n, s in services.items() if s.get("restart") != "no"}  # not the one-shot topics


# --- what each documented command starts ---------------------------------------------------------------


def test_every_image_is_built_here_or_public(up):
    command, services = up
    problems = []
    for name, service in services.items():
        build, image = service.get("build"), service.get("image", "")
        if build is not None:
            if (build.get("context"), build.get("dockerfile")) != (str(REPO_ROOT), "Dockerfile"):
                problems.append(f"{name}: builds {build}, not this repository's Dockerfile")
            if image != PROJECT_IMAGE:
                problems.append(f"{name}: builds {image!r}, not the project's one image {PROJECT_IMAGE}")
        elif image == PROJECT_IMAGE or not PUBLIC_IMAGE.match(image):
            problems.append(
                f"{name}: runs {image!r}, which no `build:` section builds and is no public image"
            )
    assert problems == [], f"`{command}`"


def test_no_two_services_bind_one_host_port(up):
    command, services = up
    bound: dict[tuple[str, str], list[str]] = {}
    for name, service in services.items():
        for port in service.get("ports") or []:
            published = port.get("published")
            if published:  # 127.0.0.1 and 0.0.0.0 overlap: the port alone decides
                bound.setdefault((published, port.get("protocol", "tcp")), []).append(name)
    clashes = {f"{port}/{proto}": sorted(names) for (port, proto), names in bound.items() if len(names) > 1}
    assert clashes == {}, f"`{command}` starts services that bind the same host port"


def test_the_same_services_as_make_up(up):
    """The containers are the processes `make up` starts for the same profile, with the same commands."""
    command, services = up
    local = _make_up(**UP_COMMANDS[command])
    containers = {_key(name, s): s for name, s in _long_running(services).items() if name not in COMPOSE_ONLY}
    differences = {
        "only in compose": sorted(containers.keys() - local.keys()),
        "only under make up": sorted(local.keys() - containers.keys()),
    }
    assert differences == {"only in compose": [], "only under make up": []}, (
        f"`{command}` is not its `make up`"
    )
    for key, service in containers.items():
        if key != local[key].name:  # a Python module: the same argv after the interpreter
            assert service["command"][1:] == local[key].command()[1:], key


def test_health_checks_on_the_endpoints_make_up_waits_for(up):
    command, services = up
    local = _make_up(**UP_COMMANDS[command])
    problems = []
    for name, service in _long_running(services).items():
        check = service.get("healthcheck") or {}
        test = " ".join(check.get("test") or [])
        if not test or check.get("disable"):
            problems.append(f"{name}: no healthcheck")
            continue
        process = local.get(_key(name, service))
        if process is None:
            continue  # not a `make up` service: test_the_same_services_as_make_up says so
        if isinstance(process, stack.SparkDriverService):
            wanted = ["/api/v1/applications", f"'{process.APP_PREFIX}'"]
        elif isinstance(process, stack.HttpService):
            wanted = [urlsplit(process.health_url).path]
        elif isinstance(process, stack.RedisServer):
            wanted = ["redis-cli", "ping"]
        elif isinstance(process, stack.SparkMaster):
            wanted = ["/json/", "ALIVE"]
        elif isinstance(process, stack.SparkWorker):
            wanted = ["/json/"]
        else:
            wanted = ["kafka-broker-api-versions"]
        problems += [f"{name}: its healthcheck does not ask {w}" for w in wanted if w not in test]
        if test.startswith("CMD ") and "curl" in test.split():
            problems.append(f"{name}: the slim image has no curl")
    assert problems == [], f"`{command}`"


def test_dependencies_are_started_and_healthy_first(up):
    command, services = up
    for name, service in services.items():
        for dependency, rule in (service.get("depends_on") or {}).items():
            assert dependency in services, f"`{command}`: {name} needs {dependency}, which it does not start"
            assert rule["condition"] in {"service_healthy", "service_completed_successfully"}, (
                name,
                dependency,
            )
            if rule["condition"] == "service_healthy":
                assert (services[dependency].get("healthcheck") or {}).get("test"), (
                    f"{dependency}: no healthcheck"
                )


# --- the commands documented are the commands checked ------------------------------------------------


def test_the_documented_commands_are_the_checked_ones():
    for where, commands in documented().items():
        ups = {c for c in commands if parse_command(c)[1] == "up"} - {BARE_UP}
        assert ups == set(UP_COMMANDS), (
            f"{where} documents other `docker compose up` commands than the checked ones"
        )


def test_every_documented_command_loads(compose_check):
    """The other commands (restart after a rebuild switch, ...) name services the file has."""
    for command in set().union(*documented().values()):
        profiles, _subcommand, names = parse_command(command)
        services = load(compose_check, profiles, names)["services"]
        assert set(names) <= services.keys(), command


def test_every_service_has_a_profile(compose_check):
    """A service without one starts under every `--profile` (the local broker beside the cluster's)."""
    everything = load(compose_check, PROFILES)["services"]
    assert [n for n, s in everything.items() if not s.get("profiles")] == []
    assert load(compose_check)["services"] == {}  # BARE_UP starts nothing, as documented
    assert {p for s in everything.values() for p in s["profiles"]} == set(PROFILES)


def test_the_project_image_is_one_build(compose_check):
    everything = load(compose_check, PROFILES)["services"]
    builds = {
        json.dumps(s.get("build"), sort_keys=True) for s in everything.values() if _is_project_service(s)
    }
    assert len(builds) == 1 and "null" not in builds, (
        "each service of the project image builds it the same way"
    )


def test_the_checker_really_rejects(compose_check, tmp_path):
    """compose-go refuses what Compose refuses: a schema error, an unset required variable."""
    broken = tmp_path / "compose.yml"
    broken.write_text(
        "services:\n  a:\n    image: redis:7.4\n    healthcheck:\n      interval: {seconds: 2}\n"
    )
    with pytest.raises(AssertionError, match="refuses"):
        load(compose_check, compose_file=broken)
    broken.write_text("services:\n  a:\n    image: redis:${TAG:?set TAG}\n")
    with pytest.raises(AssertionError, match="set TAG"):
        load(compose_check, compose_file=broken)


# --- every command resolves against the image --------------------------------------------------------

IMAGE_ROOT = "/app"  # WORKDIR of the Dockerfile: the repository, as COPY . . puts it
MODULE_ATTR = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


@pytest.fixture(scope="module")
def everything(compose_check) -> dict:
    return load(compose_check, PROFILES)["services"]


def _dockerignored() -> list[str]:
    lines = (REPO_ROOT / ".dockerignore").read_text().splitlines()
    return [ln.strip().strip("/") for ln in lines if ln.strip() and not ln.startswith("#")]


def _in_image(relative: str) -> bool:
    """Whether a repository path is in the image: present, not excluded from the build context."""
    ignored = any(
        relative == pat or relative.startswith(pat + "/") or fnmatch.fnmatch(relative, pat)
        for pat in _dockerignored()
    )
    return (REPO_ROOT / relative).exists() and not ignored


def _resolve(argv: list[str]) -> list[str]:
    """What does not resolve in one container command: modules, module:attr, files, executables."""
    problems = []
    exe = argv[0]
    if exe.startswith(".venv/bin/") and not (REPO_ROOT / exe).exists():
        # the image's venv is built by the Dockerfile like the local one: the same entry points
        problems.append(f"{exe}: no such executable in the project's venv")
    args = argv[1:]
    for i, arg in enumerate(args):
        if arg == "-m":
            module = args[i + 1]
            try:
                importlib.import_module(module)
            except ImportError as exc:
                problems.append(f"-m {module}: {exc}")
        elif MODULE_ATTR.match(arg):
            module, attr = arg.split(":")
            try:
                target = getattr(importlib.import_module(module), attr, None)
                if not callable(target):
                    problems.append(f"{arg}: {module}.{attr} is {type(target).__name__}, not callable")
            except ImportError as exc:
                problems.append(f"{arg}: {exc}")
        elif arg.startswith(f"{IMAGE_ROOT}/") and not _in_image(arg[len(IMAGE_ROOT) + 1 :]):
            problems.append(f"{arg}: not in the image")
        elif re.fullmatch(r"[\w./-]+\.(py|json|xml|lua|cfg|conf|toml|ya?ml)", arg) and not _in_image(arg):
            problems.append(f"{arg}: not in the image")
    return problems


def test_every_command_of_the_image_resolves(everything):
    """Each `-m module` imports, each `module:attr` exists, each referenced file is in the image."""
    problems = {}
    for name, service in everything.items():
        if not _is_project_service(service):
            continue
        test = (service.get("healthcheck") or {}).get("test") or []
        checks = [service["command"], *([test[1:]] if test[:1] == ["CMD"] else [])]
        for check in checks:
            if found := _resolve(check):
                problems[name] = found
            if "-c" in check:  # inline Python must at least compile
                compile(check[check.index("-c") + 1], f"<{name} healthcheck>", "exec")
    assert problems == {}


def test_the_resolver_really_rejects_what_an_old_file_had():
    assert _resolve([".venv/bin/python", "-m", "pipelines.stream"])  # no such module
    assert _resolve([".venv/bin/python", "-m", "uvicorn", "app_sim.api:app"])  # no such attribute
    assert _resolve([".venv/bin/python", "-m", "uvicorn", "app_sim.api:create_app"]) == []
    assert _resolve([".venv/bin/python", "quality/nothing.json"])
    assert _resolve([".venv/bin/python", "/app/var/x.json"])  # var/ is .dockerignored
    assert _resolve([".venv/bin/nothing"])


def test_environment_names_real_settings(everything):
    known = {env for env, _, _ in settings_table()}
    for name, service in everything.items():
        for var in service.get("environment") or {}:
            if var.startswith("SOCIAL_"):
                assert var in known, f"{name}: {var} is no setting (infra/settings.py)"


def test_ports_and_topics_are_the_local_stacks(everything):
    settings = get_settings()
    published = {
        n: {f"{p['host_ip']}:{p['published']}:{p['target']}" for p in s.get("ports") or []}
        for n, s in everything.items()
    }
    assert f"127.0.0.1:{settings.api_port}:{settings.api_port}" in published["api"]
    assert f"127.0.0.1:{settings.redis_port}:6379" in published["redis"]
    assert f"127.0.0.1:{settings.kafka_port}:9092" in published["kafka"]
    assert f"127.0.0.1:{settings.airflow_port}:{settings.airflow_port}" in published["airflow"]
    assert "127.0.0.1:4040:4040" in published["speed-layer"]  # the Spark UI
    assert "spark.ui.port=4040" in everything["speed-layer"]["environment"]["PYSPARK_SUBMIT_ARGS"]
    # API workers: the setting's default in both (nothing overrides it in a container)
    assert "SOCIAL_API_WORKERS" not in (everything["api"].get("environment") or {})
    # the event topic: same name, partitions and every explicit config as infra/stack.py
    argv = everything["topics"]["command"]
    flags = dict(a.removeprefix("--").split("=", 1) for a in argv if "=" in a)
    configs = dict(a.removeprefix("--config=").split("=", 1) for a in argv if a.startswith("--config="))
    assert flags["topic"] == settings.events_topic
    assert int(flags["partitions"]) == settings.events_partitions
    assert configs == stack.EVENTS_TOPIC_CONFIGS
    assert everything["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft


def test_kafka_image_matches_the_broker_jars(everything):
    pom = (REPO_ROOT / "infra" / "jvm" / "kafka-pom.xml").read_text()
    version = pom.split("<kafka.version>", 1)[1].split("<", 1)[0]
    images = {s["image"] for s in everything.values() if s.get("image", "").startswith("apache/kafka")}
    assert images == {f"apache/kafka:{version}"}


def test_a_rebuild_switch_in_containers_is_documented():
    # the switch cannot restart another container's process: the file says what to do instead
    assert "docker compose restart speed-layer" in COMPOSE_FILE.read_text()


def test_the_cluster_profile_is_the_local_cluster(everything):
    """`docker compose --profile cluster`: the nodes, topic and drivers of `SOCIAL_PROFILE=cluster make up`."""
    settings = get_settings(profile="cluster")
    nodes = {n: s for n, s in everything.items() if re.fullmatch(r"kafka-\d+", n)}
    assert len(nodes) == settings.cluster_brokers == 3
    voters = {s["environment"]["KAFKA_CONTROLLER_QUORUM_VOTERS"] for s in nodes.values()}
    assert voters == {"1@kafka-1:9093,2@kafka-2:9093,3@kafka-3:9093"}  # one quorum of three controllers
    assert sorted(s["environment"]["KAFKA_NODE_ID"] for s in nodes.values()) == ["1", "2", "3"]
    assert len({s["environment"]["CLUSTER_ID"] for s in nodes.values()}) == 1
    # the same host ports as the local nodes: SOCIAL_KAFKA_PORT + 2i
    assert sorted(int(s["ports"][0]["published"]) for s in nodes.values()) == [
        b for b, _ in settings.broker_ports()
    ]
    local_node = stack.KafkaBroker(settings, 0).server_properties()
    for key in (
        "min.insync.replicas",
        "default.replication.factor",
        "transaction.state.log.min.isr",
        "log.cleaner.backoff.ms",
    ):
        env = "KAFKA_" + key.upper().replace(".", "_")
        assert {s["environment"][env] for s in nodes.values()} == {local_node[key]}, key
    argv = everything["topics-cluster"]["command"]
    flags = dict(a.removeprefix("--").split("=", 1) for a in argv if "=" in a)
    configs = dict(a.removeprefix("--config=").split("=", 1) for a in argv if a.startswith("--config="))
    assert int(flags["replication-factor"]) == settings.replication_factor == 3
    assert configs == stack.events_topic_configs(settings) and configs["min.insync.replicas"] == "2"
    # the serving store: a Redis Cluster of the same masters on the same host ports as `make up`'s
    masters = {n: s for n, s in everything.items() if re.fullmatch(r"redis-\d+", n)}
    assert sorted(masters) == [s.name for s in stack.RedisServer.instances(settings)]
    assert sorted(int(s["ports"][0]["published"]) for s in masters.values()) == [
        p for p, _bus in settings.redis_ports()
    ]
    for name, node in masters.items():
        argv = " ".join(node["command"])
        assert "--cluster-enabled yes" in argv and "--appendonly yes" in argv, name
        assert f"--cluster-announce-hostname {name}" in argv, name
    joining = everything["redis-cluster"]
    assert joining["restart"] == "no" and set(joining["depends_on"]) == set(masters)
    assert "--cluster create" in " ".join(joining["command"]) and "--cluster-replicas 0" in " ".join(
        joining["command"]
    )
    for name, service in everything.items():
        if (
            "cluster" in (service.get("profiles") or [])
            and _is_project_service(service)
            and "-m" in service["command"]
        ):
            env = service["environment"]
            assert env["SOCIAL_SPARK_MASTER"] == "spark://spark-master:7077", name
            assert env["SOCIAL_PROFILE"] == "cluster", name
            assert env["SOCIAL_REDIS_URL"] == "redis://redis-1:6379/0", name
            if "redis" in str(service.get("depends_on")):
                assert "redis" not in service["depends_on"], name  # the cluster's, not the local one


# --- the image: the Dockerfile ---------------------------------------------------------------------------

DOCKERFILE = (REPO_ROOT / "Dockerfile").read_text()


def _apt_packages() -> list[str]:
    packages = []
    for match in re.finditer(r"apt-get install ([^&\n\\]+(?:\\\n[^&\n\\]+)*)", DOCKERFILE):
        packages += [w for w in match.group(1).replace("\\\n", " ").split() if not w.startswith("-")]
    return packages


def test_the_base_is_pinned_to_a_debian_release_and_this_projects_python():
    base = re.search(r"^FROM (\S+)", DOCKERFILE, re.M).group(1)
    found = re.fullmatch(r"python:(\d+\.\d+)-slim-([a-z]+)", base)
    assert found, f"FROM {base}: pin the Debian release (python:X.Y-slim-RELEASE), or apt's packages drift"
    assert found.group(1) == (REPO_ROOT / ".python-version").read_text().strip()
    uv = re.search(r"ghcr\.io/astral-sh/uv:(\S+) ", DOCKERFILE).group(1)
    assert f"UV_VERSION := {uv}" in (REPO_ROOT / "Makefile").read_text(), "the image's uv is the Makefile's"


def test_every_package_the_dockerfile_installs_is_in_its_debian_release():
    """apt-cache on this machine, which runs the release the base is pinned to."""
    pinned = re.search(r"^FROM python:\S+-slim-([a-z]+)$", DOCKERFILE, re.M)
    assert pinned, "the Dockerfile's base names no Debian release: apt-cache cannot check its packages"
    release = pinned.group(1)
    os_release = dict(
        line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line
    )
    here = os_release.get("VERSION_CODENAME", "").strip('"')
    assert here == release, (
        f"this machine runs Debian {here or '(unknown)'}, the Dockerfile's base {release}: apt-cache here "
        "cannot vouch for the base's packages; pin the base to this machine's release"
    )
    assert shutil.which("apt-cache"), "no apt-cache on this Debian machine"
    if not glob.glob("/var/lib/apt/lists/*_Packages*") and os.geteuid() == 0:
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, timeout=300)  # no lists yet
    packages = _apt_packages()
    assert {"openjdk-17-jre-headless", "redis-tools"} <= set(packages), packages
    policy = subprocess.run(["apt-cache", "policy", *packages], capture_output=True, text=True).stdout
    candidates = dict(re.findall(r"^(\S+):\n(?:  .*\n)*?  Candidate: (.+)$", policy, re.M))
    missing = [p for p in packages if candidates.get(p, "(none)") == "(none)"]
    assert missing == [], (
        f"Debian {release} has no {missing} (apt-cache policy; run `apt-get update` if it never ran)"
    )


def test_dockerfile_copies_only_what_exists():
    for line in DOCKERFILE.splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            *sources, _dest = line.split()[1:]
            for src in sources:
                assert src == "." or (REPO_ROOT / src).exists(), line


def test_the_dockerfiles_own_python_steps_resolve():
    """`RUN .venv/bin/python -m ...` at build time (the jars, the Spark class archive)."""
    steps = [
        line.removeprefix("RUN ").split("&&")[0].split()
        for line in DOCKERFILE.splitlines()
        if line.startswith("RUN .venv/bin/python")
    ]
    assert [s[2] for s in steps] == ["infra.jars", "pipelines.spark"]
    for argv in steps:
        assert _resolve(argv) == [], argv


# --- Redis 7.0 or later, in both stacks ------------------------------------------------------------------


def _fake_redis(bin_dir: Path, version: str) -> Path:
    bin_dir.mkdir(exist_ok=True)
    server = bin_dir / "redis-server"
    server.write_text(
        f'#!/bin/sh\necho "Redis server v={version} sha=00000000:0 malloc=libc bits=64 build=0"\n'
    )
    entrypoint = bin_dir / "docker-entrypoint.sh"  # the redis image's own entrypoint
    entrypoint.write_text("#!/bin/sh\necho started\nprintf '%s\\n' \"$@\"\n")
    for path in (server, entrypoint):
        path.chmod(0o755)
    return server


@pytest.mark.parametrize(
    ("version", "starts"), [("6.2.14", False), ("7.0.15", True), ("7.4.1", True), ("10.0.0", True)]
)
def test_the_compose_redis_refuses_below_7(everything, tmp_path, version, starts):
    """The redis container's entrypoint, as compose-go interpolated it, run with a fake redis-server."""
    redis = everything["redis"]
    assert int(redis["image"].split(":")[1].split(".")[0]) >= 7
    assert redis.get("entrypoint"), "the redis service starts without a version check"
    _fake_redis(tmp_path / "bin", version)
    done = subprocess.run(
        [*redis["entrypoint"], *redis["command"]],
        capture_output=True,
        text=True,
        env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"},
        timeout=30,
    )
    if starts:
        assert done.returncode == 0 and done.stdout.split("\n")[:-1] == ["started", *redis["command"]]
    else:
        assert done.returncode != 0 and done.stdout == ""
        assert f"redis-server {version} is too old" in done.stderr and "7.0 or later" in done.stderr


def test_make_up_refuses_a_redis_below_7(tmp_path):
    with pytest.raises(stack.StackError, match=r"6\.2\.14 is too old: .*7\.0 or later"):
        stack.require_redis_version(str(_fake_redis(tmp_path / "old", "6.2.14")))
    assert stack.require_redis_version(str(_fake_redis(tmp_path / "new", "7.0.15"))) == (7, 0, 15)


# --- the monitoring profile: the project's Prometheus and Grafana files ----------------------------------


def test_monitoring_mounts_the_projects_prometheus_and_grafana_files(everything):
    from infra.prometheus import COMPOSE_CONFIG, COMPOSE_RULES, RULES
    from pipelines.dashboard import GRAFANA_DASHBOARD

    def binds(name: str) -> dict[str, str]:
        return {v["target"]: v["source"] for v in everything[name]["volumes"] if v["type"] == "bind"}

    prometheus, grafana = binds("prometheus"), binds("grafana")
    assert prometheus["/etc/prometheus/prometheus.yml"] == str(COMPOSE_CONFIG)
    assert prometheus[COMPOSE_RULES] == str(RULES)
    assert "--config.file=/etc/prometheus/prometheus.yml" in everything["prometheus"]["command"]
    assert grafana["/etc/grafana/provisioning"] == str(REPO_ROOT / "infra" / "grafana" / "provisioning")
    assert grafana["/var/lib/grafana/dashboards"] == str(GRAFANA_DASHBOARD.parent)
    home = everything["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"/var/lib/grafana/dashboards/{GRAFANA_DASHBOARD.name}"
    # Prometheus scrapes the services by their compose names and container ports
    text = COMPOSE_CONFIG.read_text()
    for service, port in (("metrics", 9464), ("api", 8000)):
        assert f"'{service}:{port}'" in text and any(
            p["target"] == port for p in everything[service]["ports"]
        ), service
    # the exporter's page plots the API of its own profile
    assert everything["metrics"]["environment"]["SOCIAL_DASHBOARD_API_URL"] == "http://api:8000"
    assert (
        everything["metrics-cluster"]["environment"]["SOCIAL_DASHBOARD_API_URL"] == "http://api-cluster:8000"
    )
