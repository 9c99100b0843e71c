"""Settings precedence (keyword > environment > default) and the one documented list of variables."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from infra.settings import REPO_ROOT, Settings, get_settings, settings_table


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for env, _, _ in settings_table():
        monkeypatch.delenv(env, raising=False)


def test_default_when_nothing_is_set():
    assert get_settings().kafka_port == 9092
    assert get_settings().redis_url == "redis://127.0.0.1:6379/0"
    assert get_settings().var_dir == REPO_ROOT / "var"


def test_environment_beats_default(monkeypatch):
    monkeypatch.setenv("SOCIAL_KAFKA_PORT", "19092")
    monkeypatch.setenv("SOCIAL_VAR_DIR", "/tmp/elsewhere")
    settings = get_settings()
    assert settings.kafka_port == 19092
    assert settings.var_dir == Path("/tmp/elsewhere")
    assert settings.log_dir == Path("/tmp/elsewhere/log")


def test_keyword_beats_environment(monkeypatch):
    monkeypatch.setenv("SOCIAL_KAFKA_PORT", "19092")
    assert get_settings(kafka_port=29092).kafka_port == 29092


def test_empty_environment_variable_means_default(monkeypatch):
    monkeypatch.setenv("SOCIAL_REDIS_PORT", "")
    assert get_settings().redis_port == 6379


def test_plain_constructor_ignores_environment(monkeypatch):
    monkeypatch.setenv("SOCIAL_KAFKA_PORT", "19092")
    assert Settings().kafka_port == 9092


def test_bad_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("SOCIAL_EVENTS_PARTITIONS", "eight")
    with pytest.raises(ValueError, match="SOCIAL_EVENTS_PARTITIONS"):
        get_settings()


def test_unknown_setting_is_refused():
    with pytest.raises(TypeError, match="kafka_prot"):
        get_settings(kafka_prot=1)


def test_every_setting_has_a_distinct_documented_variable():
    rows = settings_table()
    envs = [env for env, _, _ in rows]
    assert len(envs) == len(set(envs))
    for env, _, doc in rows:
        assert re.fullmatch(r"SOCIAL_[A-Z0-9_]+", env), env
        assert doc.strip(), f"{env} has no documentation"


def test_every_variable_is_in_the_configuration_page():
    text = (REPO_ROOT / "docs" / "configuration.md").read_text()
    missing = [env for env, _, _ in settings_table() if env not in text]
    assert not missing, f"docs/configuration.md does not document: {', '.join(missing)}"


def test_the_readme_table_is_the_one_the_settings_generate():
    """`python -m infra.settings` writes the table between its markers; a hand edit drifts."""
    from infra.settings import README_END, README_START, readme_table

    text = (REPO_ROOT / "docs" / "configuration.md").read_text()
    table = text.split(README_START, 1)[1].split(README_END, 1)[0].strip()
    assert table == readme_table().strip(), (
        "docs/configuration.md's settings table is stale: python -m infra.settings"
    )


def test_secrets_are_never_in_the_printed_settings(monkeypatch):
    monkeypatch.setenv("SOCIAL_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("SOCIAL_KAFKA_SASL_USERNAME", "social")
    monkeypatch.setenv("SOCIAL_KAFKA_SASL_PASSWORD", "kafka-s3cret")
    monkeypatch.setenv("SOCIAL_REDIS_URL", "rediss://:redis-s3cret@cache.example:6380/0")
    settings = get_settings()
    assert settings.kafka_sasl_password.get_secret_value() == "kafka-s3cret"
    for shown in (repr(settings), str(settings), f"{settings}"):
        assert "kafka-s3cret" not in shown and "redis-s3cret" not in shown
        assert "rediss://:***@cache.example:6380/0" in shown
    # a child process is handed the secret itself (its settings come from the environment)
    from infra.processes import settings_env

    env = settings_env(settings)
    assert env["SOCIAL_KAFKA_SASL_PASSWORD"] == "kafka-s3cret"
    assert env["SOCIAL_REDIS_URL"] == "rediss://:redis-s3cret@cache.example:6380/0"


def test_a_password_given_as_an_argument_is_a_secret_too():
    settings = get_settings(kafka_sasl_password="arg-s3cret")
    assert settings.kafka_sasl_password.get_secret_value() == "arg-s3cret"
    assert "arg-s3cret" not in repr(settings)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
        ("redis://social:pw@h:6379/0", "redis://social:***@h:6379/0"),
        ("rediss://:p%40ss@h:6380/0?ssl_ca_certs=/ca.pem", "rediss://:***@h:6380/0?ssl_ca_certs=/ca.pem"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ],
)
def test_redact_url_masks_the_password_only(url, shown):
    from infra.settings import redact_url

    assert redact_url(url) == shown


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"kafka_security_protocol": "TLS"},
            "SOCIAL_KAFKA_SECURITY_PROTOCOL='TLS': expected one of PLAINTEXT",
        ),
        (
            {
                "kafka_security_protocol": "SASL_SSL",
                "kafka_sasl_mechanism": "GSSAPI",
                "kafka_sasl_username": "u",
            },
            "SOCIAL_KAFKA_SASL_MECHANISM='GSSAPI': expected one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512",
        ),
        ({"kafka_security_protocol": "SASL_PLAINTEXT"}, "needs SOCIAL_KAFKA_SASL_USERNAME"),
    ],
)
def test_inconsistent_kafka_security_is_one_line_naming_the_variable(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        get_settings(**overrides)
