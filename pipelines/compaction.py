"""Compaction: the archived changelog folded into the analysts' Delta views, a MERGE every few minutes.

The changelog holds absolute values (:mod:`pipelines.speed.changelog`), so a view's row after the
events of an archive (a consistent cut, :mod:`pipelines.archiver`) is the last change of its key
in ``(seq, position)`` order: no prior state is read and nothing is recomputed. Each compaction
takes the archives not compacted yet, up to the newest one, and writes

- one MERGE per view of the last change per touched key (``users``, ``follows``, ``posts``,
  ``inbox``, ``unread_counts``, ``user_status``); a key whose last change is a removal (``F-``, and
  the erasure's ``U-``, ``S-``, ``P-``, ``I-``, ``N-``) is deleted;
- a ``batches`` row, last, with the log position the views now cover and the table versions.

``home_timeline`` is not written: it is derived from ``posts`` and ``follows`` when it is read
(:mod:`pipelines.derived`), so a compaction reads and writes the primary facts of its records
(one row per post, per follow, per message), never the fan-out's timeline entries. Each MERGE
reads the target's files, and writes only the rows of the keys it touched.

Every write is a Delta idempotent write (``txnAppId`` = ``compaction:<ns>``, ``txnVersion`` = the
archive id it reaches), so a compaction killed half-way re-runs and changes nothing twice. The
live state at a position P the archive covers is the views at the last compaction below P plus
the changelog tail up to P (:func:`views_at`).
"""

from __future__ import annotations

import json
import logging
import time

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from infra.settings import Settings
from pipelines.lake import BatchOutput, Lake, archived, committed_position

log = logging.getLogger("compaction")


def _last(df: DataFrame, keys: list[str], order: list[str]) -> DataFrame:
    w = Window.partitionBy(*keys).orderBy(*[F.col(c).desc() for c in order])
    return df.withColumn("_rn", F.row_number().over(w)).where("_rn = 1").drop("_rn")


def _g(i: int, typ: str = "bigint"):
    return F.get(F.col("ch"), i).cast(typ)


class Changes:
    """The view changes of a set of changelog rows, as upserts and deletes per table."""

    def __init__(self, changelog: DataFrame):
        ch = changelog.where(F.col("changes").isNotNull()).select(
            "seq", F.posexplode(F.from_json("changes", "array<array<string>>")).alias("idx", "ch")
        )
        # computed once (every view filters it): the changelog is read and exploded one time
        self.ch = ch.withColumn("kind", F.get(F.col("ch"), 0)).localCheckpoint()

    def views(self) -> frozenset[str]:
        """The views these changes touch (one Spark job: the kinds present), so a compaction
        writes no view that has nothing to write (a Delta MERGE costs ~2 s however small)."""
        present = {r["kind"] for r in self.ch.select("kind").distinct().collect()}
        return frozenset(view for view, kinds in _KINDS.items() if present & kinds)

    def _of(self, *kinds: str) -> DataFrame:
        return self.ch.where(F.col("kind").isin(*kinds))

    def _last_upserts(self, kind: str, keys: list[str], *cols) -> DataFrame:
        """The keys whose last change is ``kind`` (an absolute row), with their values."""
        rows = self._of(kind, kind + "-").select("seq", "idx", "kind", *cols)
        return _last(rows, keys, ["seq", "idx"]).where(F.col("kind") == kind).drop("seq", "idx", "kind")

    def deletes(self, view: str) -> DataFrame:
        """Keys of ``view`` whose last change is a removal (an erasure: ``U-``, ``S-``, ``P-``,
        ``I-``, ``N-``), to delete."""
        kind, keys = _REMOVALS[view]
        rows = self._of(kind, kind + "-").select(
            "seq", "idx", "kind", *[_g(i + 1).alias(k) for i, k in enumerate(keys)]
        )
        return _last(rows, keys, ["seq", "idx"]).where(F.col("kind") == kind + "-").select(*keys)

    def users(self) -> DataFrame:
        return self._last_upserts(
            "U", ["user_id"], _g(1).alias("user_id"), _g(2, "string").alias("handle"),
            _g(3, "string").alias("display_name"), _g(4).alias("registered_time"),
        )  # fmt: skip

    def user_status(self) -> DataFrame:
        return self._last_upserts(
            "S", ["user_id"], _g(1).alias("user_id"), _g(2, "string").alias("text"), _g(3).alias("event_time")
        )

    def follows(self) -> tuple[DataFrame, DataFrame]:
        rows = self._of("F+", "F-").select(
            "seq",
            "idx",
            "kind",
            _g(1).alias("user_id"),
            _g(2).alias("followee_id"),
            _g(3).alias("since_time"),
        )
        last = _last(rows, ["user_id", "followee_id"], ["seq", "idx"])
        upserts = last.where("kind = 'F+'").select("user_id", "followee_id", "since_time")
        return upserts, last.where("kind = 'F-'").select("user_id", "followee_id")

    def posts(self) -> DataFrame:
        return self._last_upserts(
            "P", ["author_id", "post_id"], _g(1).alias("author_id"), _g(2).alias("post_id"),
            _g(3).alias("event_time"), _g(4, "string").alias("text"), (_g(5, "int") == 1).alias("deleted"),
            _g(6).alias("deleted_time"),
        )  # fmt: skip

    def inbox(self) -> DataFrame:
        return self._last_upserts(
            "I", ["recipient_id", "message_id"], _g(1).alias("recipient_id"), _g(2).alias("message_id"),
            _g(3).alias("sender_id"), _g(4, "string").alias("text"), _g(5).alias("event_time"),
            (_g(6, "int") == 1).alias("read"),
        )  # fmt: skip

    def unread_counts(self) -> DataFrame:
        return self._last_upserts("N", ["user_id"], _g(1).alias("user_id"), _g(2).alias("unread"))


# view -> (its upsert kind, the key columns of its removal kind ``<kind>-``)
_REMOVALS = {
    "users": ("U", ["user_id"]),
    "user_status": ("S", ["user_id"]),
    "posts": ("P", ["author_id", "post_id"]),
    "inbox": ("I", ["recipient_id", "message_id"]),
    "unread_counts": ("N", ["user_id"]),
}
# view -> the change kinds that write it: its upsert and its removal, and a follow's two
_KINDS = {view: {kind, kind + "-"} for view, (kind, _) in _REMOVALS.items()} | {"follows": {"F+", "F-"}}


def _merge_hist(rows) -> dict[str, int]:
    hist: dict[str, int] = {}
    for r in rows:
        for b, n in json.loads(r["received_hist"] or "{}").items():
            hist[b] = hist.get(b, 0) + n
    return hist


def compact_once(spark, lake: Lake, settings: Settings) -> int | None:
    """Fold the archives not compacted yet into the views; returns the archive id reached (or None)."""
    target = archived(settings.lake_dir, lake.namespace)
    done = committed_position(settings.lake_dir, lake.namespace)
    lo = done[0] if done else -1
    if target is None or target.archive_id <= lo:
        return None
    t0 = time.time()
    a_id = target.archive_id
    in_range = (F.col("archive_id") > lo) & (F.col("archive_id") <= a_id)
    changes = Changes(lake.read("changelog").where(in_range).select("seq", "changes"))
    archives = lake.read("archives").where(in_range).collect()
    end_offsets = {str(p): o for p, o in target.end_offsets.items()}
    follows_upserts, follows_deletes = changes.follows()
    out = BatchOutput(
        users=changes.users(),
        follows_upserts=follows_upserts,
        follows_deletes=follows_deletes,
        posts=changes.posts(),
        inbox=changes.inbox(),
        unread_counts=changes.unread_counts(),
        user_status=changes.user_status(),
        deletes={view: changes.deletes(view) for view in _REMOVALS},
        touched=changes.views(),
    )
    hist = _merge_hist(archives)
    meta = {
        "end_offsets": end_offsets,
        "events_read": sum(r["records"] for r in archives),
        "applied": sum(r["applied"] for r in archives),
        "duplicates": sum(r["duplicates"] for r in archives),
        "quarantined": sum(r["quarantined"] + r["rejected"] for r in archives),
        "min_received": min((int(b) * 100 for b in hist), default=None),
        "max_received": max((int(b) * 100 for b in hist), default=None),
        "received_hist": json.dumps(hist),
        "visible_at": int(time.time() * 1000),
        "phases": {"archives": len(archives)},
    }
    lake.write_batch(a_id, out, meta)
    log.info("compaction up to archive %d (%d archives) in %.1fs", a_id, len(archives), time.time() - t0)
    return a_id
