"""The logic behind the rebuild and maintenance DAG tasks, without Spark or a broker:
namespace naming, switch history and rollback target, retention of namespaces, reports and
checkpoints, and what a build from the batch layer refuses."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime, timedelta

import pytest

from contract import namespaces
from infra.settings import get_settings
from pipelines import maintenance, rebuild

DAY = 24 * 3600


@pytest.fixture
def settings(tmp_path, monkeypatch):
    monkeypatch.delenv("SOCIAL_VIEWS_NAMESPACE", raising=False)
    return get_settings(var_dir=tmp_path, redis_url="redis://127.0.0.1:1/0", views_namespace="")


def make_namespace(settings, name, age_days=0.0):
    batches = settings.lake_dir / name / "batches" / "_delta_log"
    batches.mkdir(parents=True)
    (settings.var_dir / "checkpoints" / name / "speed_layer").mkdir(parents=True)
    t = time.time() - age_days * DAY
    os.utime(settings.lake_dir / name / "batches", (t, t))


def record_switch(settings, namespace, previous, days_ago):
    at = (datetime.now(UTC) - timedelta(days=days_ago)).isoformat(timespec="seconds")
    namespaces.switch(settings, namespace)
    rebuild._record(
        settings, {"namespace": namespace, "previous": previous, "switched_at": at, "reason": "test"}
    )


def test_next_namespace_counts_up(settings):
    assert rebuild.next_namespace(settings) == "v2"  # v1 is the default live one
    make_namespace(settings, "v1")
    make_namespace(settings, "v7")
    assert rebuild.next_namespace(settings) == "v8"


def test_rollback_target_is_the_previous_live_namespace(settings):
    for ns in ("v1", "v2", "v3"):
        make_namespace(settings, ns)
    assert rebuild.previous_namespace(settings) is None
    record_switch(settings, "v2", "v1", 2)
    record_switch(settings, "v3", "v2", 1)
    assert namespaces.active(settings) == "v3"
    assert rebuild.previous_namespace(settings) == "v2"


def test_switch_refuses_a_namespace_that_was_never_built(settings):
    with pytest.raises(rebuild.RebuildError, match="build it first"):
        rebuild.switch(settings, "v9", restart=False)


def test_build_refuses_the_live_namespace(settings):
    with pytest.raises(rebuild.RebuildError, match="live"):
        rebuild.build(settings, "v1")


def test_build_refuses_an_unknown_source(settings):
    with pytest.raises(rebuild.RebuildError, match="unknown source 'lambda'; one of kappa, batch"):
        rebuild.build(settings, "v2", source="lambda")


def test_seeding_from_batch_views_refuses_what_is_missing_or_already_there(settings):
    from pipelines.restore import RestoreError, seed_from_batch

    with pytest.raises(RestoreError, match="no batch views under .*v1-batch: run the batch layer first"):
        seed_from_batch(None, settings, "v2", "v1-batch")
    # a Delta table whose commit carries the batch layer's metadata (written with delta-rs: the
    # lake reads the Delta log through it, as Spark's Delta writes it)
    import pyarrow as pa
    from deltalake import CommitProperties, write_deltalake

    meta = {"userMetadata": json.dumps({"position": {"0": 5}, "source": "v1"})}
    write_deltalake(
        str(settings.lake_dir / "v1-batch" / "accounting"),
        pa.table({"records": [5]}),
        commit_properties=CommitProperties(custom_metadata=meta),
    )
    make_namespace(settings, "v2")
    with pytest.raises(RestoreError, match="v2 already exists: seed a new namespace"):
        seed_from_batch(None, settings, "v2", "v1-batch")


def test_rollback_without_history_says_so(settings):
    with pytest.raises(rebuild.RebuildError, match="nothing to roll back"):
        rebuild.rollback(settings, restart=False)


def test_namespaces_past_retention_are_removed_but_never_live_or_rollback_target(settings):
    for ns in ("v1", "v2", "v3", "v4"):
        make_namespace(settings, ns, age_days=30)
        (settings.lake_dir / f"{ns}-batch" / "accounting").mkdir(parents=True)  # its batch views
    record_switch(settings, "v2", "v1", 20)  # v1 replaced 20 days ago: past the 7-day retention
    record_switch(settings, "v3", "v2", 1)  # v2 replaced yesterday: rollback target, kept
    out = maintenance.prune_namespaces(settings)
    assert set(out) == {"v1", "v4"}  # v4: built 30 days ago, never live
    assert not (settings.lake_dir / "v1").exists() and not (settings.var_dir / "checkpoints" / "v1").exists()
    assert not (settings.lake_dir / "v4").exists()
    assert {p.name for p in settings.lake_dir.iterdir() if p.is_dir()} == {"v2", "v3", "v2-batch", "v3-batch"}


def test_recently_replaced_namespace_is_kept(settings):
    for ns in ("v1", "v2", "v3"):
        make_namespace(settings, ns, age_days=30)
    record_switch(settings, "v2", "v1", 3)
    record_switch(settings, "v3", "v2", 2)
    out = maintenance.prune_namespaces(settings)
    assert out["v1"].startswith("kept")


def test_old_reports_pruned_latest_kept(settings):
    d = settings.reports_dir / "verify"
    d.mkdir(parents=True)
    old, new, latest = d / "verify-20250101T000000Z.json", d / "verify-now.json", d / "latest.json"
    for f in (old, new, latest):
        f.write_text("{}")
    t = time.time() - 40 * DAY
    os.utime(old, (t, t))
    os.utime(latest, (t, t))
    assert maintenance.prune_reports(settings)["files"] == 1
    assert not old.exists() and new.exists() and latest.exists()


def test_orphan_checkpoints_removed(settings):
    make_namespace(settings, "v1")
    (settings.var_dir / "checkpoints" / "gone" / "speed_layer").mkdir(parents=True)
    out = maintenance.checkpoint_hygiene(settings)
    assert out["orphan_checkpoints"] == ["gone"]
    assert (settings.var_dir / "checkpoints" / "v1").exists()


def test_dry_run_changes_nothing(settings):
    make_namespace(settings, "v1")
    make_namespace(settings, "v5", age_days=30)
    out = maintenance.run(settings, ["namespaces", "reports", "checkpoints"], dry_run=True)
    assert out["namespaces"]["v5"] == "would remove"
    assert (settings.lake_dir / "v5").exists()
    assert json.loads(json.dumps(out)) == out  # the task's return value is JSON (an XCom) as it is
