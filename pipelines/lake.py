"""The Delta Lake side of the speed layer: reading prior state and writing one batch, exactly once.

Layout: ``<lake_dir>/<namespace>/<table>`` (a namespace is one version of the views, for
blue/green rebuilds). Exactness (docs/architecture.md):

- Prior state for batch k is every table *at the version batch k-1 recorded* in ``batches``
  (time travel), never "whatever is there now": a re-run of batch k after a crash in the middle
  of its writes recomputes exactly the same output.
- Every write of batch k carries Delta's idempotent-write fence (``txnAppId`` = the writer,
  ``txnVersion`` = k): a table that already committed batch k skips the write on re-run.
- Every commit carries ``userMetadata`` with the batch id and the log position it covers; the
  ``batches`` row, written last, maps batch k to end offsets P and all table versions, so
  ``verify`` can time-travel to exactly P while the stream keeps running.
- Upserts write absolute values for the keys the batch touched (MERGE on the table's key).

What the Delta log says (a table's latest version, its commits' ``userMetadata``) is read with
delta-rs (``deltalake``), not Spark (a job per question) nor by listing ``_delta_log`` (a local
file system only): the same calls read a lake on an object store.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from infra.lake_store import ObjectPath, delta_storage_options, lake_path, remove_tree
from infra.settings import get_settings
from pipelines.tables import STORED, TABLES

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
# commits of a table's history read at a time, newest first, when looking for the latest with a
# field in its metadata: every commit of `batches` and `archives` has it, so one page is the rule
HISTORY_PAGE = 16


@dataclass
class BatchOutput:
    """What one batch writes to the views (a compaction, :mod:`pipelines.compaction`): upserts
    are absolute rows for the keys it touched, deletes the keys it removes."""

    users: DataFrame  # upserts
    follows_upserts: DataFrame
    follows_deletes: DataFrame  # keys to delete
    posts: DataFrame  # upserts
    inbox: DataFrame  # upserts
    unread_counts: DataFrame  # upserts (absolute counts)
    user_status: DataFrame  # upserts
    # view -> keys to delete (users, user_status, posts, inbox, unread_counts): erasures
    deletes: dict[str, DataFrame] = field(default_factory=dict)
    # the views with changes (None: every view may have some); the others are not written at all
    touched: frozenset[str] | None = None


@dataclass
class BatchRecord:
    batch_id: int
    end_offsets: dict[int, int]  # partition -> next offset (exclusive end)
    versions: dict[str, int]
    row: dict


def location(place: Path | ObjectPath | str) -> Path | ObjectPath:
    """A lake location (:func:`infra.lake_store.lake_path`); an ``s3a://`` string gets the
    environment's lake settings."""
    if isinstance(place, str) and place.startswith("s3a://"):
        return lake_path(place, get_settings())
    return lake_path(place)


def delta_log(table: Path | ObjectPath | str):
    """The table's Delta log as delta-rs reads it (its latest snapshot), or None when the table has
    no commit yet. A table on an object store (``s3a://...``) is read with the lake's settings
    (SOCIAL_LAKE_S3_*, :func:`infra.lake_store.delta_storage_options`)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    options = None
    if isinstance(table, ObjectPath):
        options = delta_storage_options(table.settings)
    elif str(table).startswith("s3a://"):
        options = delta_storage_options(get_settings())
    try:
        return DeltaTable(str(table), storage_options=options)
    except TableNotFoundError:
        return None


def has_commits(table: Path | ObjectPath | str) -> bool:
    """Whether the table has a committed version (a creation killed half-way left none)."""
    return delta_log(table) is not None


def latest_version(table: Path | ObjectPath | str) -> int | None:
    """The table's latest committed version, None when it has no commit yet."""
    log = delta_log(table)
    return None if log is None else log.version()


def commit_metadata_since(table: Path | ObjectPath | str, version: int) -> list[str | None]:
    """The ``userMetadata`` of every commit after ``version``, oldest first (None: a commit without)."""
    log = delta_log(table)
    latest = -1 if log is None else log.version()
    if latest <= version:
        return []
    commits = sorted(log.history(latest - version), key=lambda c: c["version"])
    return [c.get("userMetadata") for c in commits if c["version"] > version]


def last_commit_ms(table: Path | ObjectPath | str, *, newest_of_all: bool = False) -> int | None:
    """The timestamp (epoch ms) of the table's latest commit (``newest_of_all``: the largest of
    every commit's), None when it has none."""
    log = delta_log(table)
    if log is None:
        return None
    commits = log.history() if newest_of_all else log.history(1)
    stamps = [c["timestamp"] for c in commits if c.get("timestamp") is not None]
    return max(stamps) if stamps else None


def latest_metadata(table_dir: Path | ObjectPath | str, field: str) -> dict | None:
    """The ``userMetadata`` of the table's latest commit that has ``field``, from the Delta log alone."""
    log = delta_log(table_dir)
    if log is None:
        return None
    seen, limit = 0, HISTORY_PAGE
    while True:
        commits = log.history(limit)  # newest first
        for info in commits[seen:]:
            if not info.get("userMetadata"):
                continue
            try:
                meta = json.loads(info["userMetadata"])
            except ValueError:
                continue  # metadata someone else wrote
            if isinstance(meta, dict) and field in meta:
                return meta
        if len(commits) < limit:
            return None
        seen, limit = len(commits), limit * 4


def covers(position: dict[int, int], ends: dict[int, int]) -> bool:
    """Whether ``position`` (partition -> next offset) reaches ``ends`` in every partition (a
    partition missing from it is at 0)."""
    return all(position.get(p, 0) >= end for p, end in ends.items())


def committed_position(lake_dir: Path, namespace: str) -> tuple[int, dict[int, int]] | None:
    """(batch id, end offsets) of the latest committed ``batches`` row, read from the Delta log alone.

    Every ``batches`` commit carries them in its ``userMetadata``; no Spark needed (for waiting
    in tests, the demo and health checks).
    """
    meta = latest_metadata(location(lake_dir) / namespace / "batches", "batch_id")
    if meta is None:
        return None
    return int(meta["batch_id"]), {int(p): int(o) for p, o in meta["end_offsets"].items()}


@dataclass(frozen=True)
class Archive:
    """One archive of the archiver (:mod:`pipelines.archiver`): per partition the log range
    [start, end) it covers, the changelog sequence number of its cut, its id; every commit of it
    carries these in its ``userMetadata``."""

    archive_id: int
    start_offsets: dict[int, int]
    end_offsets: dict[int, int]
    seq: int

    def metadata(self) -> dict:
        return {
            "archive_id": self.archive_id,
            "start_offsets": {str(p): o for p, o in self.start_offsets.items()},
            "end_offsets": {str(p): o for p, o in self.end_offsets.items()},
            "seq": self.seq,
        }

    @classmethod
    def from_metadata(cls, m: dict) -> Archive:
        return cls(
            archive_id=int(m["archive_id"]),
            start_offsets={int(p): int(o) for p, o in m["start_offsets"].items()},
            end_offsets={int(p): int(o) for p, o in m["end_offsets"].items()},
            seq=int(m["seq"]),
        )


def archived(lake_dir: Path, namespace: str) -> Archive | None:
    """The last complete archive (its ``archives`` row committed), from the Delta log alone."""
    m = latest_metadata(location(lake_dir) / namespace / "archives", "archive_id")
    return Archive.from_metadata(m) if m else None


def side_by_side(writes, workers: int = 4) -> None:
    """Writes of different tables, side by side: each commits independently, and a Delta commit
    is mostly driver-side latency (snapshot, log write, post-commit), which overlaps well."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for f in [pool.submit(w) for w in writes]:
            f.result()


class Lake:
    """The Delta tables of one views namespace."""

    def __init__(self, spark: SparkSession, root: Path, namespace: str, writer: str = "speed_layer"):
        self.spark = spark
        self.root = location(root) / namespace
        self.namespace = namespace
        self.app_id = f"{writer}:{namespace}"
        self._fence: dict[str, str] = {}  # writer options of the batch being written (none outside one)

    def path(self, table: str) -> str:
        return str(self.root / table)

    def exists(self) -> bool:
        return has_commits(self.root / "batches")

    # -- creation ------------------------------------------------------------------------------
    def ensure_tables(self) -> None:
        """Create the tables that have no commit yet, side by side (a namespace's first start).

        Whether a table exists is read from its Delta log with delta-rs: asking Spark's Delta
        (``isDeltaTable``) builds a snapshot of each, a Spark job per table at every start.
        """
        missing = [TABLES[t] for t in STORED if not has_commits(self.root / t)]
        side_by_side([lambda t=t: self._create(t) for t in missing])

    def _create(self, t) -> None:
        from delta.tables import DeltaTable

        leftover = self.root / t.name
        if leftover.exists():
            # a creation killed half-way (kill -9 of the archiver at start): no commit was ever
            # made, so nothing was ever in it; start the table again
            remove_tree(leftover)
        builder = DeltaTable.createIfNotExists(self.spark).location(self.path(t.name))
        for col in t.ddl.split(","):
            name, typ = col.strip().split(" ", 1)
            builder = builder.addColumn(name, typ)
        if t.partition_by:
            builder = builder.partitionedBy(*t.partition_by)
        builder = builder.property("delta.enableDeletionVectors", "true")
        builder.execute()

    # -- reading ---------------------------------------------------------------------------------
    def read(self, table: str, version: int | None = None) -> DataFrame:
        reader = self.spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return reader.load(self.path(table))

    def last_batch(self) -> BatchRecord | None:
        rows = self.read("batches").orderBy(F.col("batch_id").desc()).limit(1).collect()
        if not rows:
            return None
        r = rows[0].asDict()
        return BatchRecord(
            batch_id=r["batch_id"],
            end_offsets={int(k): v for k, v in json.loads(r["end_offsets"]).items()},
            versions=json.loads(r["versions"]),
            row=r,
        )

    def version(self, table: str) -> int:
        """The table's latest committed version, read from its Delta log with delta-rs, not with
        ``DESCRIBE HISTORY`` (a Spark job per table per batch)."""
        log = delta_log(self.root / table)
        if log is None:
            raise FileNotFoundError(f"{self.path(table)}/_delta_log: no Delta commits")
        return log.version()

    # -- writing ----------------------------------------------------------------------------------
    @contextmanager
    def fenced(self, version: int, metadata: dict):
        """Writes inside are Delta idempotent writes of (this writer, ``version``) with ``metadata``.

        MERGE takes the fence from the session conf; appends get it as writer options: an append
        from a worker thread does not see the session conf (found by the kill -9 test).
        """
        conf = self.spark.conf
        user_metadata = json.dumps(metadata)
        self._fence = {"txnAppId": self.app_id, "txnVersion": str(version), "userMetadata": user_metadata}
        conf.set(TXN_APP_ID, self.app_id)
        conf.set(TXN_VERSION, str(version))
        conf.set(USER_METADATA, user_metadata)
        try:
            yield
        finally:
            self._fence = {}
            for k in (TXN_APP_ID, TXN_VERSION, USER_METADATA):
                conf.unset(k)

    def write_batch(self, batch_id: int, out: BatchOutput, meta: dict, extra=()) -> dict[str, int]:
        """Write every view for batch ``batch_id``; returns the table versions after it.

        ``extra``: more writes (callables) of the same batch, fenced the same way, run first.
        """
        views = {
            "users": lambda: self.upsert("users", out.users, deletes=out.deletes.get("users")),
            "follows": lambda: self.upsert("follows", out.follows_upserts, deletes=out.follows_deletes),
            "posts": lambda: self.upsert("posts", out.posts, deletes=out.deletes.get("posts")),
            "inbox": lambda: self.upsert("inbox", out.inbox, deletes=out.deletes.get("inbox")),
            "unread_counts": lambda: self.upsert(
                "unread_counts", out.unread_counts, deletes=out.deletes.get("unread_counts")
            ),
            "user_status": lambda: self.upsert(
                "user_status", out.user_status, deletes=out.deletes.get("user_status")
            ),
        }
        writes = [w for name, w in views.items() if out.touched is None or name in out.touched]
        started = time.time()
        with self.fenced(batch_id, {"batch_id": batch_id, "end_offsets": meta["end_offsets"]}):
            for w in extra:
                w()
            side_by_side(writes)
            phases = {**meta.get("phases", {}), "delta": round(time.time() - started, 2)}
            return self.commit_batch(batch_id, {**meta, "phases": phases})

    def commit_batch(self, batch_id: int, meta: dict) -> dict[str, int]:
        """The ``batches`` row of ``batch_id``, last (inside :meth:`fenced`): the position the
        views now cover and every table's version; returns the versions."""
        versions = {t: self.version(t) for t in STORED if t != "batches"}
        row = {
            **meta,
            "phases": json.dumps(meta.get("phases", {})),
            "batch_id": batch_id,
            "versions": json.dumps(versions),
            "end_offsets": json.dumps(meta["end_offsets"]),
            "committed_at": int(time.time() * 1000),
        }
        self.append("batches", self.spark.createDataFrame([row], TABLES["batches"].ddl))
        return versions

    def append(self, table: str, df: DataFrame) -> None:
        if table not in ("batches", "archives") and df.isEmpty():
            return  # nothing to fence: a re-run finds nothing to write either
        t = TABLES[table]
        writer = df.select(*t.columns).write.format("delta").mode("append").options(**self._fence)
        if t.partition_by:
            writer = writer.partitionBy(*t.partition_by)
        writer.save(self.path(table))

    def upsert(self, table: str, rows: DataFrame, deletes: DataFrame | None = None) -> None:
        """MERGE absolute rows for the touched keys (and delete the given keys)."""
        from delta.tables import DeltaTable

        if rows.isEmpty() and (deletes is None or deletes.isEmpty()):
            return
        if self.version(table) == 0:
            # still as created, empty: nothing to match or delete, so the MERGE is an insert of
            # the rows (one per key), and an append writes the same commit without the join (a
            # new namespace's first compaction; the fence makes a re-run skip it the same way)
            self.append(table, rows)
            return
        t = TABLES[table]
        source = rows.select(*t.columns).withColumn("_delete", F.lit(False))
        if deletes is not None:
            dels = deletes.select(*t.keys)
            for col in t.columns:
                if col not in t.keys:
                    dels = dels.withColumn(col, F.lit(None).cast(rows.schema[col].dataType))
            source = source.unionByName(dels.select(*t.columns).withColumn("_delete", F.lit(True)))
        on = " AND ".join(f"t.{k} = s.{k}" for k in t.keys)
        values: dict[str, str | Column] = {c: f"s.{c}" for c in t.columns}
        (
            DeltaTable.forPath(self.spark, self.path(table))
            .alias("t")
            .merge(source.alias("s"), on)
            .whenMatchedDelete(condition="s._delete")
            .whenMatchedUpdate(condition="NOT s._delete", set=values)
            .whenNotMatchedInsert(condition="NOT s._delete", values=values)
            .execute()
        )
