"""docker-compose.yml is a valid Compose file, starts services only after what they need is healthy,
resolves every command against the image, and is the same stack as `make up` (infra/stack.py).

No Docker engine runs in CI, so the file is checked against the Compose Specification JSON schema,
and each container command is resolved here: `-m module` imports, `module:attr` exists, files are
in the build context.
infra/compose-spec.json is compose/config/compose_spec.json from the PyPI package
docker-compose==1.29.2 (`pip download --no-deps docker-compose==1.29.2`, unpacked; the schema of
the Compose Specification that release implements, sha256 0dc04bd3...2bac).
"""

from __future__ import annotations

import fnmatch
import importlib
import json
import re

import jsonschema
import pytest
import yaml

from infra.settings import REPO_ROOT, get_settings, settings_table

COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
SCHEMA_FILE = REPO_ROOT / "infra" / "compose-spec.json"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def validator() -> jsonschema.Validator:
    schema = json.loads(SCHEMA_FILE.read_text())
    # the schema names its draft with a non-canonical URL ("http://.../draft/2019-09/schema#"), so say it here
    jsonschema.Draft201909Validator.check_schema(schema)
    return jsonschema.Draft201909Validator(schema)


def _errors(validator, document) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in validator.iter_errors(document)
    ]


def test_compose_file_matches_the_compose_specification(compose, validator):
    assert _errors(validator, compose) == []


def test_the_schema_really_rejects_a_broken_file(compose, validator):
    broken = json.loads(json.dumps(compose))
    broken["services"]["redis"]["depends_on"] = {"kafka": {"condition": "when_it_feels_like_it"}}
    broken["services"]["redis"]["healthcheck"]["interval"] = {"seconds": 2}
    assert len(_errors(validator, broken)) >= 2


def test_services_others_depend_on_have_a_healthcheck(compose):
    services = compose["services"]
    for name, service in services.items():
        for dependency, rule in (service.get("depends_on") or {}).items():
            assert dependency in services, f"{name} depends on unknown service {dependency}"
            condition = rule["condition"]
            assert condition in {"service_healthy", "service_completed_successfully"}, (name, dependency)
            if condition == "service_healthy":
                check = services[dependency].get("healthcheck")
                assert check and check.get("test") and not check.get("disable"), (
                    f"{dependency} has no healthcheck"
                )


def test_the_whole_stack_is_there(compose):
    services = compose["services"]
    assert {"kafka", "redis", "speed-layer", "api", "airflow"} <= services.keys()
    assert "127.0.0.1:8000:8000" in services["api"]["ports"]
    assert (
        services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    )  # KRaft, no ZooKeeper
    # the Python services are built from this repository's Dockerfile
    assert any("build" in s for s in services.values())
    assert (REPO_ROOT / "Dockerfile").exists()


def test_kafka_image_matches_the_broker_jars(compose):
    pom = (REPO_ROOT / "infra" / "jvm" / "kafka-pom.xml").read_text()
    version = pom.split("<kafka.version>", 1)[1].split("<", 1)[0]
    images = {
        s["image"] for s in compose["services"].values() if s.get("image", "").startswith("apache/kafka")
    }
    assert images == {f"apache/kafka:{version}"}


# --- every command resolves against the image; the containers are the local stack ---------------------

IMAGE_ROOT = "/app"  # WORKDIR of the Dockerfile: the repository, as COPY . . puts it
MODULE_ATTR = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def _built_services(compose: dict) -> dict[str, dict]:
    """The services that run this repository's image (built from the Dockerfile)."""
    images = {s["image"] for s in compose["services"].values() if "build" in s}
    return {n: s for n, s in compose["services"].items() if s.get("image") in images}


def _dockerignored() -> list[str]:
    lines = (REPO_ROOT / ".dockerignore").read_text().splitlines()
    return [ln.strip().strip("/") for ln in lines if ln.strip() and not ln.startswith("#")]


def _in_image(relative: str) -> bool:
    """Whether a repository path is in the image: tracked in git, not excluded from the build context."""
    path = REPO_ROOT / relative
    ignored = any(
        relative == pat or relative.startswith(pat + "/") or fnmatch.fnmatch(relative, pat)
        for pat in _dockerignored()
    )
    return path.exists() and not ignored


def _resolve(argv: list[str]) -> list[str]:
    """What does not resolve in one container command: modules, module:attr, files, executables."""
    problems = []
    exe = argv[0]
    if exe.startswith(".venv/bin/"):
        # the image's venv is built by the Dockerfile like the local one: the same entry points
        if not (REPO_ROOT / exe).exists():
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
                # an app server (uvicorn, gunicorn) wants a callable: a submodule of the same name
                # (app_sim.api.app) is an attribute of its package too, but not an application
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


def test_every_command_of_the_image_resolves(compose):
    """Each `-m module` imports, each `module:attr` exists, each referenced file is in the image."""
    problems = {}
    for name, service in _built_services(compose).items():
        argv = service["command"]
        assert isinstance(argv, list), f"{name}: exec form, no shell"
        checks = [argv]
        test = (service.get("healthcheck") or {}).get("test") or []
        if test[:1] == ["CMD"]:
            checks.append(test[1:])
        for check in checks:
            if found := _resolve(check):
                problems[name] = found
        for check in checks:
            if "-c" in check:  # inline Python must at least compile
                compile(check[check.index("-c") + 1], f"<{name} healthcheck>", "exec")
    assert problems == {}


def test_the_resolver_really_rejects_what_the_old_file_had():
    assert _resolve([".venv/bin/python", "-m", "pipelines.stream"])  # no such module
    assert _resolve([".venv/bin/python", "-m", "uvicorn", "app_sim.api:app"])  # no such attribute
    assert _resolve([".venv/bin/python", "-m", "uvicorn", "app_sim.api:create_app"]) == []
    assert _resolve([".venv/bin/python", "quality/nothing.json"])
    assert _resolve([".venv/bin/python", "/app/var/x.json"])  # var/ is .dockerignored
    assert _resolve([".venv/bin/nothing"])


def test_dockerfile_copies_only_what_exists():
    lines = (REPO_ROOT / "Dockerfile").read_text().splitlines()
    for line in lines:
        if line.startswith("COPY ") and "--from" not in line:
            *sources, _dest = line.split()[1:]
            for src in sources:
                assert src == "." or (REPO_ROOT / src).exists(), line


def test_environment_names_real_settings(compose):
    known = {env for env, _, _ in settings_table()}
    for name, service in _built_services(compose).items():
        for var in service.get("environment") or {}:
            if var.startswith("SOCIAL_"):
                assert var in known, f"{name}: {var} is no setting (infra/settings.py)"
    for var in compose["x-app-env"]:
        assert var in known, var


def test_the_containers_are_the_local_stack(compose):
    """Every process `make up` starts runs as a container with the same command, ports and topic."""
    from infra import stack

    settings = get_settings()
    modules = {}
    for name, service in _built_services(compose).items():
        argv = service["command"]
        if "-m" in argv:
            modules[argv[argv.index("-m") + 1]] = name
    for cls in stack.SERVICES:
        local = cls(settings)
        if cls in stack.BACKBONE:
            continue
        argv = local.command()
        module = argv[argv.index("-m") + 1]
        assert module in modules, f"`make up` runs {module}; docker-compose.yml does not"
        assert compose["services"][modules[module]]["command"][1:] == argv[1:], module
    services = compose["services"]
    # the same published ports as the local defaults
    assert f"127.0.0.1:{settings.api_port}:{settings.api_port}" in services["api"]["ports"]
    assert f"127.0.0.1:{settings.redis_port}:6379" in services["redis"]["ports"]
    assert f"127.0.0.1:{settings.kafka_port}:9092" in services["kafka"]["ports"]
    assert f"127.0.0.1:{settings.airflow_port}:{settings.airflow_port}" in services["airflow"]["ports"]
    assert "127.0.0.1:4040:4040" in services["speed-layer"]["ports"]  # the Spark UI
    assert "spark.ui.port=4040" in services["speed-layer"]["environment"]["PYSPARK_SUBMIT_ARGS"]
    # API workers: the setting's default in both (nothing overrides it in a container)
    assert "SOCIAL_API_WORKERS" not in services["api"].get("environment", {})
    # the event topic: same name, partitions and every explicit config as infra/stack.py
    argv = services["topics"]["command"]
    flags = dict(a.removeprefix("--").split("=", 1) for a in argv if "=" in a)
    configs = dict(a.removeprefix("--config=").split("=", 1) for a in argv if a.startswith("--config="))
    assert flags["topic"] == settings.events_topic
    assert int(flags["partitions"]) == settings.events_partitions
    assert configs == stack.EVENTS_TOPIC_CONFIGS


def test_a_rebuild_switch_in_containers_is_documented():
    # the switch cannot restart another container's process: the file says what to do instead
    assert "docker compose restart speed-layer" in COMPOSE_FILE.read_text()


def test_the_cluster_profile_is_the_local_cluster(compose):
    """`docker compose --profile cluster`: what `SOCIAL_PROFILE=cluster make up` starts (infra/stack.py)."""
    from infra import stack

    settings = get_settings(profile="cluster")
    services = compose["services"]
    nodes = {n: s for n, s in services.items() if n.startswith("kafka-")}
    assert len(nodes) == settings.cluster_brokers == 3
    voters = {s["environment"]["KAFKA_CONTROLLER_QUORUM_VOTERS"] for s in nodes.values()}
    assert voters == {"1@kafka-1:9093,2@kafka-2:9093,3@kafka-3:9093"}  # one quorum of three controllers
    assert sorted(s["environment"]["KAFKA_NODE_ID"] for s in nodes.values()) == ["1", "2", "3"]
    assert len({s["environment"]["CLUSTER_ID"] for s in nodes.values()}) == 1
    # the same host ports as the local nodes: SOCIAL_KAFKA_PORT + 2i
    published = sorted(int(s["ports"][0].split(":")[1]) for s in nodes.values())
    assert published == [b for b, _ in settings.broker_ports()]
    local_node = stack.KafkaBroker(settings, 0).server_properties()
    for key in (
        "min.insync.replicas",
        "default.replication.factor",
        "transaction.state.log.min.isr",
        "log.cleaner.backoff.ms",
    ):
        env = "KAFKA_" + key.upper().replace(".", "_")
        assert {s["environment"][env] for s in nodes.values()} == {local_node[key]}, key
    argv = services["topics-cluster"]["command"]
    flags = dict(a.removeprefix("--").split("=", 1) for a in argv if "=" in a)
    configs = dict(a.removeprefix("--config=").split("=", 1) for a in argv if a.startswith("--config="))
    assert int(flags["replication-factor"]) == settings.replication_factor == 3
    assert configs == stack.events_topic_configs(settings) and configs["min.insync.replicas"] == "2"
    workers = [n for n in services if n.startswith("spark-worker-")]
    assert len(workers) == settings.spark_workers
    for name in ("speed-layer-cluster", "archiver-cluster"):
        env = services[name]["environment"]
        assert (
            env["SOCIAL_SPARK_MASTER"] == "spark://spark-master:7077" and env["SOCIAL_PROFILE"] == "cluster"
        )
    cluster_only = [
        *nodes,
        "topics-cluster",
        "spark-master",
        *workers,
        "speed-layer-cluster",
        "archiver-cluster",
    ]
    assert all(services[n].get("profiles") == ["cluster"] for n in cluster_only)
    # the default `docker compose up` starts none of them
    assert not any(s.get("profiles") for n, s in services.items() if n not in cluster_only)


def test_the_dockerfiles_own_python_steps_resolve():
    """`RUN .venv/bin/python -m ...` at build time (the jars, the Spark class archive): modules
    that exist, as the image's commands are checked above."""
    steps = [
        line.removeprefix("RUN ").split("&&")[0].split()
        for line in (REPO_ROOT / "Dockerfile").read_text().splitlines()
        if line.startswith("RUN .venv/bin/python")
    ]
    assert [s[2] for s in steps] == ["infra.jars", "pipelines.spark"]
    for argv in steps:
        assert _resolve(argv) == [], argv
