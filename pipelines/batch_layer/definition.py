"""Every view of docs/views.md as a set function of the archived log prefix: Lambda's batch layer.

Where it sits: ``Delta archive (events_bronze, quarantine) up to P -> [this] -> Delta views at P``.
It is the second implementation of the view semantics, written on purpose without the speed
layer's code (the Redis functions decide event by event, in offset order; this module decides
over the whole prefix at once, with window functions, joins and aggregations), so the two check
each other (docs/architecture.md, "Verification").

It trusts nothing the speed layer decided: the ``disposition`` and ``reason`` columns of the
archive are ignored; dedup and the stateful rejections are recomputed from the event columns.
Every rule that depends on order is scoped to one Kafka partition, where log order is defined
(``offset``): dedup by ``(partition, event_id)``; a user's follows, posts, status and erasure,
and a recipient's inbox, share a partition by the contract's partition keys (docs/events.md).
Erasure (docs/views.md, "Erasure") is the set of applied ``user_erased`` events: an event keyed by
an erased user at a higher offset is rejected (``user_erased``), and every view leaves the erased
users out (their rows, the follow edges to them, messages from them anonymised).

All functions are pure ``DataFrame -> DataFrame``; :mod:`pipelines.batch_layer.job` reads and
writes storage.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from infra.settings import DEDUP_GRACE_MS, DEDUP_REORDER, DEDUP_WINDOW_MS, FANOUT_THRESHOLD, TIMELINE_LENGTH

APPLIED, DUPLICATE, REJECTED, QUARANTINED = "applied", "duplicate", "rejected", "quarantined"


@dataclass(frozen=True)
class BatchConfig:
    timeline_length: int = TIMELINE_LENGTH
    fanout_threshold: int = FANOUT_THRESHOLD
    dedup_window_ms: int = DEDUP_WINDOW_MS
    dedup_grace_ms: int = DEDUP_GRACE_MS
    dedup_reorder: int = DEDUP_REORDER


@dataclass
class BatchViews:
    """The batch layer's output at one log position: one DataFrame per Delta table."""

    users: DataFrame
    follows: DataFrame
    posts: DataFrame
    home_timeline: DataFrame
    inbox: DataFrame
    unread_counts: DataFrame
    user_status: DataFrame
    celebrities: DataFrame
    dispositions: DataFrame  # (partition, offset, event_id, type, disposition, reason): every record
    accounting: DataFrame  # per partition: end_offset, records, applied, duplicates, rejected, ...

    def tables(self) -> dict[str, DataFrame]:
        return dict(vars(self))


def below(df: DataFrame, position: dict[int, int]) -> DataFrame:
    """The rows at log positions below ``position`` (partition -> end offset, exclusive)."""
    cond = F.lit(False)
    for p, end in sorted(position.items()):
        cond = cond | ((F.col("partition") == int(p)) & (F.col("offset") < int(end)))
    return df.where(cond)


def _of_type(events: DataFrame, *types: str) -> DataFrame:
    return events.where(F.col("type").isin(*types))


def _last(value: Column) -> Column:
    """The value of the row with the highest offset in the group: "last in log order"."""
    return F.max_by(value, F.col("offset"))


# --------------------------------------------------------------------------------------------
# 1. Dedup (docs/views.md, "Duplicates"): a sequenced event_id by its writer's run in the
#    partition, any other by the same id seen before in the partition within the window.
# --------------------------------------------------------------------------------------------
# The canonical sequenced form, sq:<writer>:<seq> (docs/events.md), in Java's regex: \z, as `$`
# would also match before a final newline.
SEQUENCED = r"^sq:(0|[1-9][0-9]{0,14}):([1-9][0-9]{0,14})\z"


def duplicates(events: DataFrame, cfg: BatchConfig) -> DataFrame:
    """``(partition, offset)`` of every duplicate (both forms of event_id)."""
    narrow = events.select("partition", "offset", "event_id", "received_time")
    sequenced = F.col("event_id").rlike(SEQUENCED)
    return opaque_duplicates(narrow.where(~sequenced), cfg.dedup_window_ms).unionByName(
        sequenced_duplicates(narrow, cfg)
    )


def writer_runs(events: DataFrame, window_ms: int, grace_ms: int) -> DataFrame:
    """The records with a sequenced event_id, with ``writer``, ``seq`` and ``run``: the writer's
    run in the partition (a new one starts at its first record there, and at a record before which
    the writer's newest received_time there is more than window + grace behind the partition's
    newest). ``events``: every contract-valid record (partition, offset, event_id, received_time)."""
    before = Window.unboundedPreceding, -1
    in_partition = Window.partitionBy("partition").orderBy("offset").rowsBetween(*before)
    by_writer = Window.partitionBy("partition", "writer").orderBy("offset")
    return (
        events.withColumn("newest", F.max("received_time").over(in_partition))
        .where(F.col("event_id").rlike(SEQUENCED))
        .withColumn("writer", F.regexp_extract("event_id", SEQUENCED, 1))
        .withColumn("seq", F.regexp_extract("event_id", SEQUENCED, 2).cast("bigint"))
        .withColumn("writer_newest", F.max("received_time").over(by_writer.rowsBetween(*before)))
        .withColumn(
            "starts",
            F.col("writer_newest").isNull()
            | (F.col("writer_newest") < F.col("newest") - F.lit(window_ms + grace_ms)),
        )
        .withColumn(
            "run",
            F.sum(F.col("starts").cast("int")).over(
                by_writer.rowsBetween(Window.unboundedPreceding, Window.currentRow)
            ),
        )
        .drop("newest", "writer_newest", "starts")
    )


def sequenced_duplicates(events: DataFrame, cfg: BatchConfig) -> DataFrame:
    """A sequenced id is a duplicate when its writer's run in the partition holds its seq already,
    or the seq is at or below the run's highest so far minus the reorder window R."""
    runs = writer_runs(events, cfg.dedup_window_ms, cfg.dedup_grace_ms)
    before = Window.unboundedPreceding, -1
    in_run = Window.partitionBy("partition", "writer", "run").orderBy("offset").rowsBetween(*before)
    same_seq = Window.partitionBy("partition", "writer", "run", "seq").orderBy("offset").rowsBetween(*before)
    return (
        runs.withColumn("high", F.max("seq").over(in_run))
        .withColumn("again", F.count("*").over(same_seq) > 0)
        .where(
            F.col("high").isNotNull()
            & ((F.col("seq") <= F.col("high") - F.lit(cfg.dedup_reorder)) | F.col("again"))
        )
        .select("partition", "offset")
    )


def opaque_duplicates(narrow: DataFrame, window_ms: int) -> DataFrame:
    """``(partition, offset)`` of every duplicate among ids without a sequence: the same event_id
    at a lower offset of the same partition (any earlier copy, itself a duplicate or not) with a
    received_time at most the window before this one. Only ids that occur more than once are
    sorted. (The speed layer also forgets an id more than window + grace behind the partition's
    newest; this layer does not, a documented difference: docs/views.md.)"""
    repeated = narrow.groupBy("partition", "event_id").count().where("count > 1").drop("count")
    earlier = (
        Window.partitionBy("partition", "event_id")
        .orderBy("offset")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    return (
        narrow.join(repeated, ["partition", "event_id"], "left_semi")
        .withColumn("last_seen", F.max("received_time").over(earlier))
        .where(F.col("last_seen") >= F.col("received_time") - F.lit(window_ms))
        .select("partition", "offset")
    )


# --------------------------------------------------------------------------------------------
# 2. Erasure: an event keyed by a user erased at a lower offset of its partition has no effect.
# --------------------------------------------------------------------------------------------
def key_user(events: DataFrame) -> Column:
    """The user an event is keyed by (its partition key): the recipient of a message, else user_id."""
    return F.when(F.col("type") == "message_sent", F.col("recipient_id")).otherwise(F.col("user_id"))


def after_erasure(fresh: DataFrame) -> DataFrame:
    """``(partition, offset, reason)`` of the non-duplicate events after their key user's first
    ``user_erased`` in log order (a second erasure included): ``user_erased``."""
    first = (
        _of_type(fresh, "user_erased")
        .groupBy("partition", F.col("user_id").alias("key_user"))
        .agg(F.min("offset").alias("erased_at"))
    )
    return (
        fresh.select("partition", "offset", key_user(fresh).alias("key_user"))
        .join(F.broadcast(first), ["partition", "key_user"])
        .where(F.col("offset") > F.col("erased_at"))
        .select("partition", "offset", F.lit("user_erased").alias("reason"))
    )


# --------------------------------------------------------------------------------------------
# 3. Stateful validity: creates and uses of keyed things (posts by their author, messages in
#    their recipient's inbox), in log order per key.
# --------------------------------------------------------------------------------------------
def rejections(fresh: DataFrame) -> DataFrame:
    """``(partition, offset, reason)`` of the non-duplicate events that have no effect.

    - a ``post_created`` / ``message_sent`` whose key was created before: ``reused_id``;
    - a ``post_deleted`` with no earlier create of (author = the deleter, post): ``not_own_post``;
      after the key's first delete: ``post_already_deleted``;
    - a ``message_read`` with no earlier send of (recipient = the reader, message):
      ``not_in_inbox`` (a second read of a message is applied and changes nothing).
    """
    cols = ["partition", "offset", "kind", "owner", "id", "create"]
    uses = (
        _of_type(fresh, "post_created", "post_deleted")
        .select(
            "partition",
            "offset",
            F.lit("post").alias("kind"),
            F.col("user_id").alias("owner"),
            F.col("post_id").alias("id"),
            (F.col("type") == "post_created").alias("create"),
        )
        .unionByName(
            _of_type(fresh, "message_sent", "message_read").select(
                "partition",
                "offset",
                F.lit("message").alias("kind"),
                F.when(F.col("type") == "message_sent", F.col("recipient_id"))
                .otherwise(F.col("user_id"))
                .alias("owner"),
                F.col("message_id").alias("id"),
                (F.col("type") == "message_sent").alias("create"),
            )
        )
        .select(*cols)
    )
    key = Window.partitionBy("kind", "owner", "id")
    in_order = key.orderBy("partition", "offset")
    before = in_order.rowsBetween(Window.unboundedPreceding, -1)
    created = F.col("first_create") < F.col("offset")
    marked = (
        uses.withColumn("first_create", F.min(F.when(F.col("create"), F.col("offset"))).over(key))
        .withColumn(
            "deletes_before",
            F.sum(F.when(~F.col("create") & created, 1).otherwise(0)).over(before),
        )
        .withColumn(
            "reason",
            F.when(F.col("create"), F.when(F.col("offset") != F.col("first_create"), "reused_id"))
            .when(F.col("kind") == "message", F.when(~F.coalesce(created, F.lit(False)), "not_in_inbox"))
            .when(~F.coalesce(created, F.lit(False)), "not_own_post")
            .when(F.col("deletes_before") > 0, "post_already_deleted"),
        )
    )
    return marked.where(F.col("reason").isNotNull()).select("partition", "offset", "reason")


# --------------------------------------------------------------------------------------------
# 4. The views, each a set function of the applied events (``erased``: the erased user ids).
# --------------------------------------------------------------------------------------------
def erased_users(applied: DataFrame) -> DataFrame:
    return _of_type(applied, "user_erased").select("user_id").distinct()


def _not_erased(df: DataFrame, erased: DataFrame, col: str) -> DataFrame:
    return df.join(F.broadcast(erased.select(F.col("user_id").alias(col))), col, "left_anti")


def users_view(applied: DataFrame, erased: DataFrame) -> DataFrame:
    return (
        _not_erased(_of_type(applied, "user_registered"), erased, "user_id")
        .groupBy("user_id")
        .agg(_last(F.struct("handle", "display_name", "event_time")).alias("r"))
        .select("user_id", "r.handle", "r.display_name", F.col("r.event_time").alias("registered_time"))
    )


def user_status_view(applied: DataFrame, erased: DataFrame) -> DataFrame:
    return (
        _not_erased(_of_type(applied, "status_updated"), erased, "user_id")
        .groupBy("user_id")
        .agg(_last(F.struct("text", "event_time")).alias("s"))
        .select("user_id", "s.text", "s.event_time")
    )


def follows_view(applied: DataFrame, erased: DataFrame) -> DataFrame:
    """follows(u): the pairs whose last follow action in log order is ``followed``, neither of
    them erased."""
    actions = _not_erased(_of_type(applied, "followed", "unfollowed"), erased, "user_id")
    return (
        _not_erased(actions, erased, "followee_id")
        .groupBy("user_id", "followee_id")
        .agg(_last(F.struct("type", "event_time")).alias("a"))
        .where(F.col("a.type") == "followed")
        .select("user_id", "followee_id", F.col("a.event_time").alias("since_time"))
    )


def posts_view(applied: DataFrame, erased: DataFrame) -> DataFrame:
    """Every post created, with its delete (a deleted post never comes back); none of an erased
    author."""
    key = ["author_id", "post_id"]
    applied = _not_erased(applied, erased, "user_id")
    created = _of_type(applied, "post_created").select(
        F.col("user_id").alias("author_id"), "post_id", "event_time", "text"
    )
    deleted = _of_type(applied, "post_deleted").select(
        F.col("user_id").alias("author_id"), "post_id", F.col("event_time").alias("deleted_time")
    )
    return created.join(deleted, key, "left").select(
        *key, "event_time", "text", F.col("deleted_time").isNotNull().alias("deleted"), "deleted_time"
    )


def inbox_view(applied: DataFrame, erased: DataFrame) -> DataFrame:
    """inbox(r) of every recipient not erased; a message from an erased sender keeps its place
    with sender 0 and no text."""
    key = ["recipient_id", "message_id"]
    gone = F.broadcast(erased.select(F.col("user_id").alias("sender_id"), F.lit(True).alias("sender_erased")))
    sent = (
        _not_erased(_of_type(applied, "message_sent"), erased, "recipient_id")
        .select(*key, F.col("user_id").alias("sender_id"), "text", "event_time")
        .join(gone, "sender_id", "left")
        .select(
            *key,
            F.when(F.col("sender_erased"), F.lit(0).cast("bigint"))
            .otherwise(F.col("sender_id"))
            .alias("sender_id"),
            F.when(F.col("sender_erased"), F.lit(None).cast("string")).otherwise(F.col("text")).alias("text"),
            "event_time",
        )
    )
    read = (
        _of_type(applied, "message_read")
        .select(F.col("user_id").alias("recipient_id"), "message_id", F.lit(True).alias("read"))
        .dropDuplicates(key)
    )
    return sent.join(read, key, "left").select(
        *key, "sender_id", "text", "event_time", F.coalesce(F.col("read"), F.lit(False)).alias("read")
    )


def unread_view(inbox: DataFrame) -> DataFrame:
    """unread(u) = the count over inbox(u) of messages not read (users with an inbox)."""
    return inbox.groupBy(F.col("recipient_id").alias("user_id")).agg(
        F.sum(F.when(F.col("read"), 0).otherwise(1)).cast("bigint").alias("unread")
    )


def celebrities_view(follows: DataFrame, cfg: BatchConfig) -> DataFrame:
    """Authors with more followers than the fan-out threshold: merged into timelines at read time."""
    return (
        follows.groupBy(F.col("followee_id").alias("author_id"))
        .agg(F.count("*").alias("followers"))
        .where(F.col("followers") > cfg.fanout_threshold)
    )


def _latest(rows: DataFrame, by: str, n: int) -> DataFrame:
    """The ``n`` newest rows per ``by``: by corrected event time, ties by post_id, then author_id,
    descending (a post is (author_id, post_id): two authors may use one post id)."""
    w = Window.partitionBy(by).orderBy(
        F.col("event_time").desc(), F.col("post_id").desc(), F.col("author_id").desc()
    )
    return rows.withColumn("_rank", F.row_number().over(w)).where(F.col("_rank") <= n).drop("_rank")


def home_timeline_view(
    follows: DataFrame, posts: DataFrame, celebrities: DataFrame, cfg: BatchConfig
) -> DataFrame:
    """The fanned-out home timeline of every user: the latest N live posts by u or by the authors
    u follows that are not celebrities (those are merged at read time: the hybrid rule).

    Only an author's own latest N posts can be among anyone's latest N, so each author's posts
    are cut to N before the join with the follow graph.
    """
    n = cfg.timeline_length
    live = _latest(
        posts.where(~F.col("deleted")).select("author_id", "post_id", "event_time"), "author_id", n
    )
    followed = follows.join(
        F.broadcast(celebrities.select(F.col("author_id").alias("followee_id"))), "followee_id", "left_anti"
    ).select("user_id", F.col("followee_id").alias("author_id"))
    own = live.select(F.col("author_id").alias("user_id"), "author_id").distinct()
    candidates = followed.unionByName(own).join(live, "author_id")
    return _latest(candidates, "user_id", n).select("user_id", "post_id", "author_id", "event_time")


# --------------------------------------------------------------------------------------------
# The batch layer: every view at P.
# --------------------------------------------------------------------------------------------
def _as_is(df: DataFrame) -> DataFrame:
    return df


def compute(
    bronze: DataFrame,
    quarantine: DataFrame,
    position: dict[int, int],
    cfg: BatchConfig,
    keep: Callable[[DataFrame], DataFrame] = _as_is,
) -> BatchViews:
    """Every view from the archive (``events_bronze`` and ``quarantine``) up to ``position``.

    ``quarantine`` rows at positions also in ``events_bronze`` are the speed layer's stateful
    rejections (decided again here); the others are records that failed the event contract.
    ``keep`` is applied to the intermediate results several views share (the duplicates, the
    rejections, follows, posts): the job and the tests compute each once (``job.computed_once``).
    """
    events = below(bronze, position)
    contract = below(quarantine, position).join(
        events.select("partition", "offset"), ["partition", "offset"], "left_anti"
    )
    dups = keep(duplicates(events, cfg))
    fresh = events.join(F.broadcast(dups), ["partition", "offset"], "left_anti")
    erasure = after_erasure(fresh)
    live = fresh.join(
        F.broadcast(erasure.select("partition", "offset")), ["partition", "offset"], "left_anti"
    )
    rejected = keep(erasure.unionByName(rejections(live)))
    applied = fresh.join(F.broadcast(rejected), ["partition", "offset"], "left_anti")
    erased = keep(erased_users(applied))

    follows = keep(follows_view(applied, erased))
    posts = keep(posts_view(applied, erased))
    inbox = inbox_view(applied, erased)
    celebrities = celebrities_view(follows, cfg)

    dispositions = (
        events.select("partition", "offset", "event_id", "type")
        .join(F.broadcast(dups.withColumn("dup", F.lit(True))), ["partition", "offset"], "left")
        .join(F.broadcast(rejected), ["partition", "offset"], "left")
        .select(
            "partition",
            "offset",
            "event_id",
            "type",
            F.when(F.col("dup"), DUPLICATE)
            .when(F.col("reason").isNotNull(), REJECTED)
            .otherwise(APPLIED)
            .alias("disposition"),
            "reason",
        )
        .unionByName(
            contract.select(
                "partition", "offset", "event_id", "type", F.lit(QUARANTINED).alias("disposition"), "reason"
            )
        )
    )
    return BatchViews(
        users=users_view(applied, erased),
        follows=follows,
        posts=posts,
        home_timeline=home_timeline_view(follows, posts, celebrities, cfg),
        inbox=inbox,
        unread_counts=unread_view(inbox),
        user_status=user_status_view(applied, erased),
        celebrities=celebrities,
        dispositions=dispositions,
        accounting=accounting(dispositions, position),
    )


def accounting(dispositions: DataFrame, position: dict[int, int]) -> DataFrame:
    """Per partition: records archived below P and their dispositions; ``missing`` = positions
    below P the archive does not hold (must be 0: read = applied + duplicates + rejected +
    quarantined)."""
    spark = dispositions.sparkSession
    ends = spark.createDataFrame(
        [(int(p), int(o)) for p, o in sorted(position.items())], "partition INT, end_offset BIGINT"
    )
    counts = dispositions.groupBy("partition").agg(
        F.count("*").alias("records"),
        *[
            F.sum(F.when(F.col("disposition") == d, 1).otherwise(0)).alias(name)
            for d, name in (
                (APPLIED, "applied"),
                (DUPLICATE, "duplicates"),
                (REJECTED, "rejected"),
                (QUARANTINED, "quarantined"),
            )
        ],
    )
    return (
        ends.join(counts, "partition", "left")
        .fillna(0)
        .select(
            "partition",
            "end_offset",
            *[
                F.col(c).cast("bigint").alias(c)
                for c in ("records", "applied", "duplicates", "rejected", "quarantined")
            ],
            (F.col("end_offset") - F.col("records")).cast("bigint").alias("missing"),
        )
    )
