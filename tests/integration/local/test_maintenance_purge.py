"""The erasure's Delta step (docs/erasure.md): a DELETE on a table with deletion vectors only marks
the row; ``purge`` (REORG ... APPLY (PURGE)) and a VACUUM without retention remove its bytes.
The bytes are looked for with the erasure audit's own search (Parquet values decoded), in the data
files: the commits in ``_delta_log`` keep min/max statistics (32 characters of a value) until
Delta's log cleanup (``delta.logRetentionDuration``, 30 days), which docs/erasure.md says."""

from __future__ import annotations

import pytest

from infra.settings import get_settings
from pipelines import erasure_audit, maintenance

pytestmark = pytest.mark.spark

CANARY = "purge-canary-5d1f0c"


def test_deleted_rows_leave_the_files_only_after_purge_and_vacuum(spark, tmp_path):
    settings = get_settings(var_dir=tmp_path)
    ns = tmp_path / "lake" / "v1"
    assert str(ns.parent) == str(settings.lake_dir)
    rows = [(1, "alice"), (2, CANARY), (3, "carol")]
    for table in ("batches", "users"):  # a namespace is a lake dir with a batches table
        spark.createDataFrame(rows, "user_id long, handle string").coalesce(1).write.format("delta").option(
            "delta.enableDeletionVectors", "true"
        ).save(str(ns / table))
    users = str(ns / "users")
    spark.sql(f"DELETE FROM delta.`{users}` WHERE user_id = 2")

    def hits() -> int:  # in the data files; the _delta_log's min/max stats are another matter
        found = erasure_audit.scan(ns / "users", [CANARY])
        return found["."].plaintext if "." in found else 0

    assert hits() == 1  # a deletion vector: the row is gone from reads, not from the file
    out = maintenance.run(settings, ["purge", "vacuum"], retention_hours=0, spark=spark)
    assert out["purge"]["v1/users"]["files_removed"] == 1
    assert hits() == 0
    assert sorted(r["handle"] for r in spark.read.format("delta").load(users).collect()) == ["alice", "carol"]
