"""Housekeeping of everything the pipeline accumulates under ``var/`` (the ``maintenance`` DAG).

Steps, each idempotent and safe while the speed layer runs:

- ``optimize``: Delta OPTIMIZE (bin-packing small files). In the *live* namespace only the
  append-only tables (``events_bronze``, ``quarantine``, ``batches``): blind appends never
  conflict with a compaction, whereas a compaction racing a MERGE makes one of them fail, and that
  one could be the speed layer's micro-batch. ``--all-tables`` compacts everything (run it with the
  speed layer stopped). Other namespaces are frozen: all their tables are compacted.
- ``vacuum``: Delta VACUUM keeping ``SOCIAL_DELTA_RETENTION_HOURS`` (default 168 = 7 days) of
  history: verify and the speed layer time-travel to the versions the last micro-batch recorded,
  which are minutes old; a week leaves room for a stopped stream and for investigation. Below 168 h
  Delta's own safety check is switched off for the call, with a warning.
- ``purge`` (only when asked for, before a short ``vacuum``: the erasure of plaintext rows,
  docs/erasure.md): ``REORG TABLE ... APPLY (PURGE)`` on every table, so rows a DELETE or MERGE
  only marked in a deletion vector leave the data files; the next VACUUM removes the old files.
  Like ``--all-tables``, run it with the speed layer idle: it rewrites the files a MERGE reads.
- ``namespaces``: views namespaces other than the live one and the rollback target, replaced (or,
  never switched to, built) more than ``SOCIAL_NAMESPACE_RETENTION_DAYS`` ago, are removed: Delta
  tables, Spark checkpoint, Redis keys ``<ns>:*``.
- ``reports``: verify/quality/bench JSON copies, GX validation results and Airflow task logs
  older than ``SOCIAL_REPORT_RETENTION_DAYS`` (``latest.*`` and Data Docs' index are kept).
- ``checkpoints``: Spark checkpoints whose namespace no longer exists, and temporary files that
  crashed writers leave in checkpoints.
- ``logs``: every service's redirected output under ``var/log/`` bounded: a file over 10 MB is
  copied to ``<name>.1`` and emptied in place (:func:`infra.logs.cap_redirected`).

``python -m pipelines.maintenance [--step NAME ...] [--dry-run]``; prints what it did as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

from contract import namespaces
from infra import logs
from infra.cli import command_name, run_main
from infra.lake_store import remove_tree
from infra.settings import Settings, get_settings

log = logging.getLogger("maintenance")

STEPS = ("optimize", "vacuum", "namespaces", "reports", "checkpoints", "logs")
ON_REQUEST = ("purge",)  # not in the daily run: it races the speed layer's MERGEs
APPEND_ONLY = ("events_bronze", "quarantine", "changelog", "archives", "batches")
SAFE_RETENTION_HOURS = 168
DAY_S = 24 * 3600


def _tables(settings: Settings, namespace: str) -> list[str]:
    root = settings.lake_dir / namespace
    return sorted(p.name for p in root.iterdir() if (p / "_delta_log").exists()) if root.exists() else []


def optimize(spark, settings: Settings, *, all_tables: bool = False, dry_run: bool = False) -> dict:
    from delta.tables import DeltaTable

    from pipelines.rebuild import existing_namespaces

    live = namespaces.active(settings)
    done: dict[str, str | dict] = {}  # per table or namespace: what was (or would be) done
    for ns in existing_namespaces(settings):
        for table in _tables(settings, ns):
            if ns == live and not all_tables and table not in APPEND_ONLY:
                continue
            path = str(settings.lake_dir / ns / table)
            if dry_run:
                done[f"{ns}/{table}"] = "would optimize"
                continue
            metrics = DeltaTable.forPath(spark, path).optimize().executeCompaction().collect()[0]["metrics"]
            done[f"{ns}/{table}"] = {
                "files_added": metrics["numFilesAdded"],
                "files_removed": metrics["numFilesRemoved"],
            }
    return done


def purge(spark, settings: Settings, *, dry_run: bool = False) -> dict:
    """Rows deleted through deletion vectors leave the data files (rewritten without them)."""
    from pipelines.rebuild import existing_namespaces

    done: dict[str, str | dict] = {}  # per table or namespace: what was (or would be) done
    for ns in existing_namespaces(settings):
        for table in _tables(settings, ns):
            path = str(settings.lake_dir / ns / table)
            if dry_run:
                done[f"{ns}/{table}"] = "would purge"
                continue
            metrics = spark.sql(f"REORG TABLE delta.`{path}` APPLY (PURGE)").collect()[0]["metrics"]
            done[f"{ns}/{table}"] = {
                "files_added": metrics["numFilesAdded"],
                "files_removed": metrics["numFilesRemoved"],
            }
    return done


def vacuum(spark, settings: Settings, *, retention_hours: int | None = None, dry_run: bool = False) -> dict:
    from delta.tables import DeltaTable

    from pipelines.rebuild import existing_namespaces

    hours = settings.delta_retention_hours if retention_hours is None else retention_hours
    targets = [(ns, t) for ns in existing_namespaces(settings) for t in _tables(settings, ns)]
    if dry_run:
        return {f"{ns}/{t}": f"would vacuum, keeping {hours}h" for ns, t in targets}
    check = "spark.databricks.delta.retentionDurationCheck.enabled"
    if hours < SAFE_RETENTION_HOURS:
        log.warning("VACUUM retention %dh is below Delta's safe minimum of %dh", hours, SAFE_RETENTION_HOURS)
        spark.conf.set(check, "false")

    def one(target: tuple[str, str]) -> str:
        path = str(settings.lake_dir / target[0] / target[1])
        table = DeltaTable.forPath(spark, path)
        _ensure_retention_property(spark, table, path, hours)
        table.vacuum(float(hours))
        return f"kept {hours}h"

    try:
        # a VACUUM is mostly file listing and small jobs: several tables side by side keep the cores busy
        with ThreadPoolExecutor(max_workers=4) as pool:
            return {f"{ns}/{t}": r for (ns, t), r in zip(targets, pool.map(one, targets), strict=True)}
    finally:
        spark.conf.unset(check)


def _ensure_retention_property(spark, table, path: str, hours: int) -> None:
    """Delta 4 VACUUM honours the table property ``delta.deletedFileRetentionDuration`` (default
    7 days) over its argument: keep the property equal to the setting. Changed only when it
    differs, since a metadata commit conflicts with a concurrent micro-batch."""
    wanted = f"interval {hours} hours"
    current = table.detail().collect()[0]["properties"].get("delta.deletedFileRetentionDuration")
    if current is None and hours == SAFE_RETENTION_HOURS:
        return  # Delta's default is already 7 days
    if current != wanted:
        spark.sql(
            f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.deletedFileRetentionDuration' = '{wanted}')"
        )


def _age_s(path: Path, now: float) -> float:
    return now - path.stat().st_mtime


def _retired_at(settings: Settings, namespace: str) -> float | None:
    """When ``namespace`` stopped being live (epoch s), from the switch history."""
    from pipelines.rebuild import load_history

    for entry in reversed(load_history(settings)):
        if entry.get("previous") == namespace:
            return datetime.fromisoformat(entry["switched_at"]).timestamp()
    return None


def drop_namespace(settings: Settings, namespace: str) -> dict:
    """Remove a namespace everywhere: Delta tables, its batch layer's views, Spark checkpoint, Redis keys."""
    from pipelines.batch_layer.job import SUFFIX

    if namespace == namespaces.active(settings):
        raise ValueError(f"{namespace!r} is live")
    remove_tree(settings.lake_dir / namespace)
    remove_tree(settings.lake_dir / (namespace + SUFFIX))
    shutil.rmtree(Path(settings.var_dir) / "checkpoints" / namespace, ignore_errors=True)
    removed_keys = 0
    try:
        from contract.functions import drop_namespace as drop_keys
        from contract.serving import connect

        removed_keys = drop_keys(connect(settings.redis_url), namespace)
    except Exception as exc:  # noqa: BLE001 - Redis down: the files are gone; keys go next time
        log.warning("redis keys of %s not removed: %s", namespace, exc)
    return {"redis_keys": removed_keys}


def prune_namespaces(settings: Settings, *, now: float | None = None, dry_run: bool = False) -> dict:
    from pipelines.rebuild import existing_namespaces, previous_namespace

    now = now or time.time()
    keep = {namespaces.active(settings), previous_namespace(settings)}
    limit = settings.namespace_retention_days * DAY_S
    done: dict[str, str | dict] = {}  # per table or namespace: what was (or would be) done
    for ns in existing_namespaces(settings):
        if ns in keep:
            continue
        since = _retired_at(settings, ns) or (settings.lake_dir / ns / "batches").stat().st_mtime
        if now - since <= limit:
            done[ns] = f"kept ({(now - since) / DAY_S:.1f} of {settings.namespace_retention_days} days)"
            continue
        done[ns] = "would remove" if dry_run else {"removed": drop_namespace(settings, ns)}
    return done


def prune_reports(settings: Settings, *, now: float | None = None, dry_run: bool = False) -> dict:
    now = now or time.time()
    limit = settings.report_retention_days * DAY_S
    var = Path(settings.var_dir)
    globs = [
        (Path(settings.reports_dir) / "verify", "verify-*.json"),
        (Path(settings.reports_dir) / "bench", "*-*.json"),
        (var / "quality" / "gx" / "uncommitted" / "validations", "**/*.json"),
        (Path(settings.reports_dir) / "quality" / "validations", "**/*.html"),
        (settings.airflow_home / "logs", "**/*.log"),
    ]
    removed = 0
    for root, pattern in globs:
        if not root.exists():
            continue
        for f in root.glob(pattern):
            if f.is_file() and not f.name.startswith("latest") and _age_s(f, now) > limit:
                removed += 1
                if not dry_run:
                    f.unlink(missing_ok=True)
    return {"files": removed, "older_than_days": settings.report_retention_days}


def checkpoint_hygiene(settings: Settings, *, now: float | None = None, dry_run: bool = False) -> dict:
    from pipelines.rebuild import existing_namespaces

    now = now or time.time()
    root = Path(settings.var_dir) / "checkpoints"
    live = set(existing_namespaces(settings)) | {namespaces.active(settings)}
    orphans, temp_files = [], 0
    if root.exists():
        for d in root.iterdir():
            if d.is_dir() and d.name not in live:
                orphans.append(d.name)
                if not dry_run:
                    shutil.rmtree(d, ignore_errors=True)
        for f in root.glob("**/.*.tmp"):
            if f.is_file() and _age_s(f, now) > DAY_S:  # a day-old temp file has no writer left
                temp_files += 1
                if not dry_run:
                    f.unlink(missing_ok=True)
    return {"orphan_checkpoints": orphans, "temp_files": temp_files}


def run(
    settings: Settings,
    steps=STEPS,
    *,
    all_tables: bool = False,
    retention_hours: int | None = None,
    dry_run: bool = False,
    spark=None,
) -> dict:
    out: dict = {}
    if spark is None and {"optimize", "purge", "vacuum"} & set(steps):
        from pipelines.spark import build_spark

        spark = build_spark("maintenance", settings)
    for step in steps:
        started = time.monotonic()
        if step == "optimize":
            out[step] = optimize(spark, settings, all_tables=all_tables, dry_run=dry_run)
        elif step == "purge":
            out[step] = purge(spark, settings, dry_run=dry_run)
        elif step == "vacuum":
            out[step] = vacuum(spark, settings, retention_hours=retention_hours, dry_run=dry_run)
        elif step == "namespaces":
            out[step] = prune_namespaces(settings, dry_run=dry_run)
        elif step == "reports":
            out[step] = prune_reports(settings, dry_run=dry_run)
        elif step == "checkpoints":
            out[step] = checkpoint_hygiene(settings, dry_run=dry_run)
        elif step == "logs":
            out[step] = {"capped": logs.cap_redirected(settings.log_dir, dry_run=dry_run)}
        log.info("%s done in %.1fs", step, time.monotonic() - started)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog=command_name("pipelines.maintenance"), description=__doc__.splitlines()[0]
    )
    p.add_argument(
        "--step",
        action="append",
        choices=STEPS + ON_REQUEST,
        help="run only this step (repeatable; purge only when named)",
    )
    p.add_argument("--all-tables", action="store_true", help="also compact the live namespace's MERGE tables")
    p.add_argument(
        "--retention-hours", type=int, help="VACUUM retention (default SOCIAL_DELTA_RETENTION_HOURS)"
    )
    p.add_argument("--dry-run", action="store_true", help="say what would be done")
    args = p.parse_args(argv)
    logs.configure("maintenance")
    out = run(
        get_settings(),
        args.step or STEPS,
        all_tables=args.all_tables,
        retention_hours=args.retention_hours,
        dry_run=args.dry_run,
    )
    print(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "pipelines.maintenance"))
