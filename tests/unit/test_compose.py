"""docker-compose.yml is a valid Compose file and starts services only after what they need is healthy.

No Docker engine runs in CI, so the file is checked against the Compose Specification JSON schema.
infra/compose-spec.json is compose/config/compose_spec.json from the PyPI package
docker-compose==1.29.2 (`pip download --no-deps docker-compose==1.29.2`, unpacked; the schema of
the Compose Specification that release implements, sha256 0dc04bd3...2bac).
"""

from __future__ import annotations

import json

import jsonschema
import pytest
import yaml

from infra.settings import REPO_ROOT

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
