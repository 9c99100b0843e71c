"""The lake's location and the options each client gets from the one group of settings
(infra/lake_store.py); the store itself is exercised in tests/integration/test_external_lake.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.lake_store import (
    S3_LOG_STORE,
    ObjectPath,
    delta_storage_options,
    lake_path,
    spark_conf,
    write_atomically,
)
from infra.settings import Settings, SettingsError

SECRET = "very-s3cret-value"


def s3_settings(**more) -> Settings:
    return Settings(
        lake_uri="s3a://lake/social",
        lake_s3_endpoint="http://127.0.0.1:27100",
        lake_s3_access_key="social",
        lake_s3_secret_key=SECRET,
        **more,
    )


def test_the_default_lake_is_var_lake_and_a_folder_stays_a_path(tmp_path):
    assert Settings(var_dir=tmp_path).lake_dir == tmp_path / "lake"
    assert Settings(var_dir=tmp_path, lake_uri=str(tmp_path / "elsewhere")).lake_dir == tmp_path / "elsewhere"
    assert not Settings().lake_on_s3 and spark_conf(Settings()) == {}
    assert delta_storage_options(Settings()) is None


def test_an_s3a_lake_is_an_object_path_that_joins_like_a_path():
    root = s3_settings().lake_dir
    assert isinstance(root, ObjectPath) and str(root) == "s3a://lake/social"
    table = root / "v1" / "batches"
    assert str(table) == "s3a://lake/social/v1/batches" and table.name == "batches"
    assert table.parent == root / "v1" and str(root.parent) == "s3a://lake"
    assert str((root / "namespaces.json").with_suffix(".tmp")) == "s3a://lake/social/namespaces.tmp"
    settings = s3_settings()
    assert lake_path("s3a://lake/x", settings) == ObjectPath("s3a://lake/x", settings)
    assert lake_path("/a/b") == Path("/a/b")
    with pytest.raises(TypeError, match="needs the settings of its store"):
        lake_path("s3a://lake/x")
    with pytest.raises(TypeError):  # never folded into "s3a:/lake/..." by pathlib
        Path(root)


def test_only_s3a_uris_with_a_bucket_are_taken():
    for bad in ("s3://lake/x", "gs://lake/x", "s3a:///x"):
        with pytest.raises(SettingsError, match="SOCIAL_LAKE_URI"):
            Settings(lake_uri=bad)


def test_the_secret_is_never_printed_but_reaches_each_client():
    settings = s3_settings()
    assert SECRET not in repr(settings) and SECRET not in str(settings.lake_dir)
    conf = spark_conf(settings)
    assert conf["spark.hadoop.fs.s3a.secret.key"] == SECRET
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:27100"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.delta.logStore.s3a.impl"] == S3_LOG_STORE
    # a performance flag that would turn create(path, false) into an unchecked PUT is never set
    assert "spark.hadoop.fs.s3a.performance.flags" not in conf
    options = delta_storage_options(settings)
    assert options["AWS_SECRET_ACCESS_KEY"] == SECRET and options["AWS_ALLOW_HTTP"] == "true"
    assert options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] == "false"


def test_no_keys_leave_the_credentials_to_each_clients_default_chain():
    settings = Settings(lake_uri="s3a://lake/social", lake_s3_path_style=0)
    conf = spark_conf(settings)
    assert not any("key" in k or "credentials" in k for k in conf)
    assert (
        "spark.hadoop.fs.s3a.endpoint" not in conf
        and conf["spark.hadoop.fs.s3a.path.style.access"] == "false"
    )
    assert "AWS_ACCESS_KEY_ID" not in delta_storage_options(settings)


def test_the_logstore_is_compiled_from_its_committed_source():
    from infra.jars import LOGSTORE_SOURCES, logstore_jar

    sources = list(LOGSTORE_SOURCES.rglob("*.java"))
    assert [p.name for p in sources] == ["S3ConditionalPutLogStore.java"]
    assert S3_LOG_STORE == "social.delta." + sources[0].stem
    assert logstore_jar().name.startswith("social-delta-logstore-")


def test_a_local_pointer_is_replaced_whole(tmp_path):
    target = tmp_path / "lake" / "ACTIVE"
    write_atomically(target, "v1\n")
    write_atomically(target, "v2\n")
    assert target.read_text() == "v2\n" and sorted(p.name for p in target.parent.iterdir()) == ["ACTIVE"]
