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
