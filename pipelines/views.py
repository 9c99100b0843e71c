"""How every derived Delta view is computed: one fold step, ``state@k-1 + events of batch k -> state@k``.

This is the set-wise implementation of the views (docs/views.md); the keyed speed layer's Redis
functions are the other, event by event, and verify compares the two. The
streaming job calls :func:`apply_batch` once per micro-batch with the prior state read from
Delta at the versions the previous batch committed; the replay calls it once, with empty prior
state and the whole log prefix as one batch. Same function, so stream and batch agree by
construction, and a re-run of a micro-batch after a crash recomputes exactly the same output.

Every rule that depends on order is scoped to one Kafka partition, where log order is defined:
dedup by ``(partition, event_id)``; posts keyed ``(author_id, post_id)`` and deleted by their
author (same partition key); inbox keyed ``(recipient_id, message_id)`` and read by the recipient
(same partition key). Cross-partition results (timelines) are set functions of the final state.

All functions are pure ``DataFrame -> DataFrame``; nothing here reads or writes storage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from pipelines.tables import TABLES

APPLIED, DUPLICATE, REJECTED = "applied", "duplicate", "rejected"


@dataclass(frozen=True)
class ViewConfig:
    timeline_length: int = 800
    fanout_threshold: int = 2000
    dedup_window_ms: int = 24 * 3600 * 1000


def view_config(settings) -> ViewConfig:
    """The view parameters from the project's settings (infra/settings.py)."""
    return ViewConfig(
        timeline_length=settings.timeline_length,
        fanout_threshold=settings.fanout_threshold,
        dedup_window_ms=settings.dedup_window_ms,
    )


@dataclass
class State:
    """Prior state: one DataFrame per table (the tables' current rows, or empty)."""

    events_bronze: DataFrame
    users: DataFrame
    follows: DataFrame
    posts: DataFrame
    home_timeline: DataFrame
    inbox: DataFrame
    unread_counts: DataFrame
    user_status: DataFrame

    @classmethod
    def empty(cls, spark: SparkSession) -> State:
        return cls(**{name: empty_table(spark, name) for name in cls.__dataclass_fields__})


@dataclass
class BatchOutput:
    """What one fold step produces. Upserts are absolute rows for the keys the batch touched."""

    bronze: DataFrame  # every contract-valid event with its disposition (append)
    rejected: DataFrame  # quarantine rows for rejected (stateful-invalid) events (append)
    users: DataFrame  # upserts
    follows_upserts: DataFrame
    follows_deletes: DataFrame  # keys to delete
    posts: DataFrame  # upserts
    timeline_inserts: DataFrame
    timeline_deletes: DataFrame  # keys to delete
    inbox: DataFrame  # upserts
    unread_counts: DataFrame  # upserts (absolute counts)
    user_status: DataFrame  # upserts
    celebrities: DataFrame  # (author_id, followers, celebrity) for authors whose count changed
    # view -> keys to delete (users, user_status, posts, inbox, unread_counts): the compaction's
    # erasures; the whole-prefix fold below leaves the erased out instead and has none
    deletes: dict[str, DataFrame] = field(default_factory=dict)


def empty_table(spark: SparkSession, name: str) -> DataFrame:
    return spark.createDataFrame([], TABLES[name].ddl)


def materialize(df: DataFrame) -> DataFrame:
    """Compute ``df`` now and cut its lineage.

    The fold joins its intermediate results with each other many times; without cutting the
    lineage at these stage boundaries, the analysed plan grows with every join (and the
    optimiser runs out of memory). Each is computed once per batch either way.
    """
    return df.localCheckpoint(eager=True, storageLevel=StorageLevel.DISK_ONLY)


def _of_type(events: DataFrame, *types: str) -> DataFrame:
    return events.where(F.col("type").isin(*types))


# --------------------------------------------------------------------------------------------
# 1. Dedup: an event_id seen before in the same partition within the window has no effect.
# --------------------------------------------------------------------------------------------
def mark_duplicates(events: DataFrame, prior_bronze: DataFrame, window_ms: int) -> DataFrame:
    """Add ``duplicate``: the event_id was seen before in the same partition (a lower offset,
    in this batch or any earlier one) at a ``received_time`` at most ``window_ms`` before this one.

    Only archived events received within the window of the batch's earliest event can match, so
    the archive is read from there on: partitions pruned by ``received_date``, files skipped by
    their ``received_time`` statistics. The dedup cost is bounded by the window, not by the
    length of the log.
    """
    earliest = events.agg(F.min("received_time")).first()[0]
    if earliest is None:
        return events.withColumn("duplicate", F.lit(False))
    since = max(earliest - window_ms, 0)
    since_date = datetime.fromtimestamp(since / 1000, UTC).strftime("%Y-%m-%d")
    keys = events.select("partition", "event_id").distinct()
    prior = (
        prior_bronze.where((F.col("received_date") >= since_date) & (F.col("received_time") >= since))
        .select("partition", "event_id", "received_time")
        .join(F.broadcast(keys), ["partition", "event_id"], "left_semi")
        .groupBy("partition", "event_id")
        .agg(F.max("received_time").alias("prior_received"))
    )
    earlier = (
        Window.partitionBy("partition", "event_id")
        .orderBy("offset")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    last_seen = F.greatest(F.max("received_time").over(earlier), F.col("prior_received"))
    return (
        events.join(prior, ["partition", "event_id"], "left")
        .withColumn(
            "duplicate", F.coalesce(last_seen >= F.col("received_time") - F.lit(window_ms), F.lit(False))
        )
        .drop("prior_received")
    )


# --------------------------------------------------------------------------------------------
# 2. Stateful validity: deletes of one's own existing posts, reads of messages in one's inbox.
# --------------------------------------------------------------------------------------------
def _sequence_rules(
    creates: DataFrame, uses: DataFrame, prior: DataFrame, key: list[str], prior_flag: str
) -> tuple[DataFrame, DataFrame]:
    """Validity of creates and uses of keyed things (posts, messages) in log order.

    A create is valid if the key does not exist yet (else a reused id); a use is valid if a
    valid create precedes it (in prior state or earlier in this batch). Returns
    (creates, uses) with ``reason`` (null when valid) and, for uses, ``first_use`` (the first
    valid use after which ``prior_flag``-like state flips) and ``prior_flag`` of the prior row.
    """
    prior_keys = prior.select(*key, F.lit(True).alias("prior_exists"), F.col(prior_flag).alias("prior_flag"))
    first_create = creates.groupBy(*key).agg(F.min("offset").alias("first_create"))
    creates = (
        creates.join(prior_keys.select(*key, "prior_exists"), key, "left")
        .join(first_create, key, "left")
        .withColumn(
            "reason",
            F.when(
                F.col("prior_exists").isNotNull() | (F.col("offset") != F.col("first_create")), "reused_id"
            ),
        )
        .drop("prior_exists", "first_create")
    )
    uses = (
        uses.join(prior_keys, key, "left")
        .join(first_create, key, "left")
        .withColumn(
            "exists_at",
            F.col("prior_exists").isNotNull()
            | (F.col("first_create").isNotNull() & (F.col("first_create") < F.col("offset"))),
        )
    )
    return creates, uses


def validate_stateful(events: DataFrame, state: State) -> DataFrame:
    """Add ``reason`` to non-duplicate events that have no effect in the current state."""
    posts_key = ["author_id", "post_id"]
    creates = _of_type(events, "post_created").select(
        "partition", "offset", F.col("user_id").alias("author_id"), "post_id"
    )
    deletes = _of_type(events, "post_deleted").select(
        "partition", "offset", F.col("user_id").alias("author_id"), "post_id"
    )
    prior_posts = state.posts.join(
        F.broadcast(creates.union(deletes).select(*posts_key).distinct()), posts_key, "left_semi"
    )
    creates, deletes = _sequence_rules(creates, deletes, prior_posts, posts_key, "deleted")
    w = Window.partitionBy(*posts_key).orderBy("offset")
    deletes = deletes.withColumn("n", F.sum(F.col("exists_at").cast("int")).over(w)).withColumn(
        "reason",
        F.when(~F.col("exists_at"), "not_own_post").when(
            F.coalesce(F.col("prior_flag"), F.lit(False)) | (F.col("n") > 1), "post_already_deleted"
        ),
    )

    inbox_key = ["recipient_id", "message_id"]
    sends = _of_type(events, "message_sent").select("partition", "offset", "recipient_id", "message_id")
    reads = _of_type(events, "message_read").select(
        "partition", "offset", F.col("user_id").alias("recipient_id"), "message_id"
    )
    prior_inbox = state.inbox.join(
        F.broadcast(sends.union(reads).select(*inbox_key).distinct()), inbox_key, "left_semi"
    )
    sends, reads = _sequence_rules(sends, reads, prior_inbox, inbox_key, "read")
    reads = reads.withColumn("reason", F.when(~F.col("exists_at"), "not_in_inbox"))

    reasons = (
        creates.select("partition", "offset", "reason")
        .unionByName(deletes.select("partition", "offset", "reason"))
        .unionByName(sends.select("partition", "offset", "reason"))
        .unionByName(reads.select("partition", "offset", "reason"))
        .where(F.col("reason").isNotNull())
    )
    # after its key user's erasure (earlier in the batch, or in the prior state): user_erased,
    # whatever else it would be
    erasures = (
        _of_type(events, "user_erased")
        .groupBy(F.col("user_id").alias("key_user"))
        .agg(F.min("offset").alias("erased_at"))
    )
    gone = (
        events.select("partition", "offset", _key_user().alias("key_user"))
        .join(F.broadcast(erasures), "key_user", "left")
        .join(
            F.broadcast(_erased(state.events_bronze).withColumnRenamed("user_id", "key_user")),
            "key_user",
            "left",
        )
        .where(F.col("prior_erased") | (F.col("offset") > F.col("erased_at")))
        .select("partition", "offset", F.lit("user_erased").alias("erased_reason"))
    )
    return (
        events.join(reasons, ["partition", "offset"], "left")
        .join(gone, ["partition", "offset"], "left")
        .withColumn("reason", F.coalesce("erased_reason", "reason"))
        .drop("erased_reason")
    )


def _key_user() -> Column:
    """The user an event is keyed by (its partition key): a message's recipient, else user_id."""
    return F.when(F.col("type") == "message_sent", F.col("recipient_id")).otherwise(F.col("user_id"))


def _erased(events: DataFrame) -> DataFrame:
    """The users with an applied ``user_erased`` among ``events`` (user_id, prior_erased = true)."""
    applied = events.where(F.col("disposition") == APPLIED) if "disposition" in events.columns else events
    return (
        _of_type(applied, "user_erased").select("user_id").distinct().withColumn("prior_erased", F.lit(True))
    )


def without_erased(applied: DataFrame, erased: DataFrame) -> DataFrame:
    """The applied events as the views see them after the erasures (docs/views.md, "Erasure"):
    nothing keyed by an erased user, no follow of one, and messages from one anonymised (sender
    0, no text)."""
    e = F.broadcast(erased.select("user_id"))
    kept = applied.join(e.withColumnRenamed("user_id", "_k"), _key_user() == F.col("_k"), "left_anti")
    kept = kept.join(
        e.withColumnRenamed("user_id", "_f"),
        F.col("type").isin("followed", "unfollowed") & (F.col("followee_id") == F.col("_f")),
        "left_anti",
    )
    from_erased = F.col("_s").isNotNull() & (F.col("type") == "message_sent")
    return (
        kept.join(e.withColumnRenamed("user_id", "_s"), F.col("user_id") == F.col("_s"), "left")
        .withColumn("text", F.when(from_erased, F.lit(None).cast("string")).otherwise(F.col("text")))
        .withColumn("user_id", F.when(from_erased, F.lit(0).cast("bigint")).otherwise(F.col("user_id")))
        .drop("_s")
    )


# --------------------------------------------------------------------------------------------
# 3. The views, from applied events and prior state.
# --------------------------------------------------------------------------------------------
def _last_per(events: DataFrame, key: list[str]) -> DataFrame:
    w = Window.partitionBy(*key).orderBy(F.col("offset").desc())
    return events.withColumn("_rn", F.row_number().over(w)).where("_rn = 1").drop("_rn")


def users_view(applied: DataFrame) -> DataFrame:
    reg = _last_per(_of_type(applied, "user_registered"), ["user_id"])
    return reg.select("user_id", "handle", "display_name", F.col("event_time").alias("registered_time"))


def user_status_view(applied: DataFrame) -> DataFrame:
    st = _last_per(_of_type(applied, "status_updated"), ["user_id"])
    return st.select("user_id", "text", "event_time")


def follow_changes(applied: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Last follow action per (user, followee): (rows to upsert, keys to delete)."""
    last = _last_per(_of_type(applied, "followed", "unfollowed"), ["user_id", "followee_id"])
    upserts = last.where(F.col("type") == "followed").select(
        "user_id", "followee_id", F.col("event_time").alias("since_time")
    )
    deletes = last.where(F.col("type") == "unfollowed").select("user_id", "followee_id")
    return upserts, deletes


def posts_view(applied: DataFrame, prior_posts: DataFrame) -> DataFrame:
    """Upserts of posts created or deleted in the batch (tombstones keep deleted posts away)."""
    created = _of_type(applied, "post_created").select(
        F.col("user_id").alias("author_id"), "post_id", "event_time", "text"
    )
    deleted = _of_type(applied, "post_deleted").select(
        F.col("user_id").alias("author_id"), "post_id", F.col("event_time").alias("deleted_time")
    )
    key = ["author_id", "post_id"]
    before = prior_posts.join(F.broadcast(deleted.select(*key)), key, "left_semi").select(
        *key, "event_time", "text"
    )
    return (
        created.unionByName(before)
        .join(deleted, key, "left")
        .select(
            *key, "event_time", "text", F.col("deleted_time").isNotNull().alias("deleted"), "deleted_time"
        )
    )


def inbox_view(applied: DataFrame, prior_inbox: DataFrame) -> DataFrame:
    """Upserts of inbox rows that arrived or were read in the batch."""
    key = ["recipient_id", "message_id"]
    sent = _of_type(applied, "message_sent").select(
        *key, F.col("user_id").alias("sender_id"), "text", "event_time", F.lit(False).alias("read")
    )
    read_keys = (
        _of_type(applied, "message_read")
        .select(F.col("user_id").alias("recipient_id"), "message_id")
        .distinct()
    )
    prior_read = prior_inbox.join(F.broadcast(read_keys), key, "left_semi").select(*sent.columns)
    return (
        sent.unionByName(prior_read)
        .join(read_keys.withColumn("now_read", F.lit(True)), key, "left")
        .withColumn("read", F.col("read") | F.coalesce(F.col("now_read"), F.lit(False)))
        .drop("now_read")
    )


def unread_view(inbox_upserts: DataFrame, prior_inbox: DataFrame, prior_unread: DataFrame) -> DataFrame:
    """Absolute unread count for every recipient touched: prior count + the change of its rows."""
    key = ["recipient_id", "message_id"]
    before = prior_inbox.join(F.broadcast(inbox_upserts.select(*key)), key, "left_semi").select(
        *key, F.col("read").alias("read_before")
    )
    change = (
        inbox_upserts.join(before, key, "left")
        .withColumn(
            "delta",
            F.when(F.col("read_before").isNull(), F.when(F.col("read"), 0).otherwise(1))
            .when(~F.col("read_before") & F.col("read"), -1)
            .otherwise(0),
        )
        .groupBy(F.col("recipient_id").alias("user_id"))
        .agg(F.sum("delta").alias("delta"))
    )
    return change.join(prior_unread, "user_id", "left").select(
        "user_id", (F.coalesce(F.col("unread"), F.lit(0)) + F.col("delta")).cast("bigint").alias("unread")
    )


def _celebrity(followers: Column, cfg: ViewConfig) -> Column:
    """The hybrid fan-out rule: an author with more followers than this is merged at read time."""
    return followers > cfg.fanout_threshold


def _rank_top(rows: DataFrame, n: int) -> DataFrame:
    w = Window.partitionBy("user_id").orderBy(F.col("event_time").desc(), F.col("post_id").desc())
    return rows.withColumn("_rn", F.row_number().over(w)).where(F.col("_rn") <= n).drop("_rn")


def _top_posts(posts: DataFrame, n: int) -> DataFrame:
    """Each author's latest ``n`` live posts (author_id, post_id, event_time)."""
    w = Window.partitionBy("author_id").orderBy(F.col("event_time").desc(), F.col("post_id").desc())
    live = posts.where(~F.col("deleted")).select("author_id", "post_id", "event_time")
    return live.withColumn("_rn", F.row_number().over(w)).where(F.col("_rn") <= n).drop("_rn")


def _recompute_timelines(
    users: DataFrame, follows: DataFrame, posts: DataFrame, cfg: ViewConfig
) -> DataFrame:
    """The whole home timeline of ``users`` from follows and posts (the definition, for a few users)."""
    n = cfg.timeline_length
    tl_cols = ["user_id", "post_id", "author_id", "event_time"]
    r_follows = follows.join(F.broadcast(users), "user_id", "left_semi")
    r_authors = r_follows.select("followee_id").distinct()
    r_normal = (
        follows.join(F.broadcast(r_authors), "followee_id", "left_semi")
        .groupBy("followee_id")
        .count()
        .where(~_celebrity(F.col("count"), cfg))
        .select(F.col("followee_id").alias("author_id"))
    )
    r_sources = (
        r_follows.select("user_id", F.col("followee_id").alias("author_id"))
        .join(r_normal, "author_id", "left_semi")
        .unionByName(users.select("user_id", F.col("user_id").alias("author_id")))
    )
    r_posts = _top_posts(posts.join(r_sources.select("author_id").distinct(), "author_id", "left_semi"), n)
    return _rank_top(r_sources.join(r_posts, "author_id").select(*tl_cols), n)


def timeline_changes(
    applied: DataFrame,
    state: State,
    follows_upserts: DataFrame,
    follows_deletes: DataFrame,
    posts_upserts: DataFrame,
    cfg: ViewConfig,
) -> tuple[DataFrame, DataFrame, DataFrame]:
    """Rows to insert into and keys to delete from home_timeline, and follower-count changes.

    Timelines change incrementally: new posts fan out to the followers of non-celebrity authors
    (and to their author); a new follow (or an author dropping below the threshold) backfills
    that author's latest N posts; an unfollow (or an author rising above it) and a delete remove
    posts. Then each touched timeline is trimmed to N. Only a *full* timeline that loses posts
    cannot be trimmed back: those few users are recomputed from posts and follows.
    """
    n = cfg.timeline_length
    tl_cols = ["user_id", "post_id", "author_id", "event_time"]
    post_key = ["author_id", "post_id"]
    changed_pairs = follows_upserts.select("user_id", "followee_id").unionByName(follows_deletes)

    def after_batch(follows: DataFrame) -> DataFrame:
        return follows.join(changed_pairs, ["user_id", "followee_id"], "left_anti").unionByName(
            follows_upserts
        )

    follows1 = after_batch(state.follows)
    new_posts = posts_upserts.where(~F.col("deleted") & F.col("text").isNotNull())
    deleted_posts = posts_upserts.where(F.col("deleted")).select(*post_key)
    authors = materialize(
        new_posts.select(F.col("author_id").alias("followee_id"))
        .union(changed_pairs.select("followee_id"))
        .distinct()
    )
    # Every use of follows by followee below is about these authors: read their followers once.
    followers_before = materialize(state.follows.join(F.broadcast(authors), "followee_id", "left_semi"))
    followers_after = after_batch(followers_before)

    def counts(follows: DataFrame, name: str) -> DataFrame:
        return follows.groupBy("followee_id").agg(F.count("*").alias(name))

    followers = materialize(
        authors.join(counts(followers_before, "before"), "followee_id", "left")
        .join(counts(followers_after, "after"), "followee_id", "left")
        .fillna(0, ["before", "after"])
        .withColumn("celebrity", _celebrity(F.col("after"), cfg))
        .withColumn("flipped", _celebrity(F.col("before"), cfg) != F.col("celebrity"))
    )
    celebrities = followers.where(F.col("before") != F.col("after")).select(
        F.col("followee_id").alias("author_id"), F.col("after").alias("followers"), "celebrity"
    )
    normal = followers.where(~F.col("celebrity")).select("followee_id")
    to_celeb = followers.where(F.col("flipped") & F.col("celebrity")).select("followee_id")
    to_normal = followers.where(F.col("flipped") & ~F.col("celebrity")).select("followee_id")

    # Whose posts leave whose timeline, and which (user, author) pairs get backfilled.
    removed_pairs = materialize(
        follows_deletes.unionByName(
            followers_after.join(F.broadcast(to_celeb), "followee_id", "left_semi").select(
                "user_id", "followee_id"
            )
        )
        .select("user_id", F.col("followee_id").alias("author_id"))
        .distinct()
    )
    backfill_pairs = (
        follows_upserts.join(F.broadcast(normal), "followee_id", "left_semi")
        .select("user_id", "followee_id")
        .unionByName(
            followers_after.join(F.broadcast(to_normal), "followee_id", "left_semi").select(
                "user_id", "followee_id"
            )
        )
        .select("user_id", F.col("followee_id").alias("author_id"))
        .distinct()
    )
    posts1 = state.posts.join(posts_upserts.select(*post_key), post_key, "left_anti").unionByName(
        posts_upserts
    )
    backfill_authors = backfill_pairs.select("author_id").distinct()
    backfill = materialize(
        backfill_pairs.join(
            _top_posts(posts1.join(F.broadcast(backfill_authors), "author_id", "left_semi"), n), "author_id"
        ).select(*tl_cols)
    )
    fanned = materialize(
        new_posts.join(
            F.broadcast(normal.withColumnRenamed("followee_id", "author_id")), "author_id", "left_semi"
        )
        .join(followers_after.withColumnRenamed("followee_id", "author_id"), "author_id")
        .select(*tl_cols)
        .unionByName(
            new_posts.select(F.col("author_id").alias("user_id"), "post_id", "author_id", "event_time")
        )
    )

    prior_tl = state.home_timeline
    hit = prior_tl.join(F.broadcast(deleted_posts), post_key, "left_semi").select("user_id")
    touched = materialize(
        hit.union(removed_pairs.select("user_id"))
        .union(backfill.select("user_id"))
        .union(fanned.select("user_id"))
        .distinct()
    )
    old = materialize(prior_tl.join(F.broadcast(touched), "user_id", "left_semi").select(*tl_cols))
    leaving = (
        old.join(F.broadcast(deleted_posts), post_key, "left_semi")
        .unionByName(old.join(F.broadcast(removed_pairs), ["user_id", "author_id"], "left_semi"))
        .select("user_id", "post_id")
        .distinct()
    )
    # A full timeline losing posts must be refilled from older posts: recompute those users.
    sizes = old.groupBy("user_id").count()
    recompute = materialize(
        leaving.select("user_id").distinct().join(sizes.where(F.col("count") >= n), "user_id", "left_semi")
    )
    recomputed = _recompute_timelines(recompute, follows1, posts1, cfg) if not recompute.isEmpty() else None

    kept = old.join(leaving, ["user_id", "post_id"], "left_anti")
    candidates = kept.unionByName(backfill).unionByName(fanned)
    if recomputed is not None:
        candidates = candidates.join(F.broadcast(recompute), "user_id", "left_anti")
    top = _rank_top(candidates.dropDuplicates(["user_id", "post_id"]), n)
    new = materialize(top.unionByName(recomputed) if recomputed is not None else top)
    inserts = new.join(old.select("user_id", "post_id"), ["user_id", "post_id"], "left_anti")
    deletes = old.join(new.select("user_id", "post_id"), ["user_id", "post_id"], "left_anti").select(
        "user_id", "post_id", "author_id"
    )
    return inserts, deletes, celebrities


# --------------------------------------------------------------------------------------------
# The fold step.
# --------------------------------------------------------------------------------------------
def apply_batch(events: DataFrame, state: State, cfg: ViewConfig) -> BatchOutput:
    """One fold step over contract-valid events (see :mod:`pipelines.parse`) of one batch."""
    marked = materialize(mark_duplicates(events, state.events_bronze, cfg.dedup_window_ms))
    fresh = marked.where(~F.col("duplicate"))
    checked = materialize(validate_stateful(fresh, state))
    applied = checked.where(F.col("reason").isNull()).drop("reason", "duplicate")

    bronze_cols = [c for c in TABLES["events_bronze"].columns]
    bronze = (
        marked.join(checked.select("partition", "offset", "reason"), ["partition", "offset"], "left")
        .withColumn(
            "disposition",
            F.when(F.col("duplicate"), DUPLICATE)
            .when(F.col("reason").isNotNull(), REJECTED)
            .otherwise(APPLIED),
        )
        .withColumn("received_date", F.date_format(F.timestamp_millis("received_time"), "yyyy-MM-dd"))
        .select(*bronze_cols)
    )
    rejected = checked.where(F.col("reason").isNotNull())

    # erasure: the erased users (this batch's and the prior state's) leave every view. The prior
    # state's rows of a user erased in this batch are not removed here: the fold supports
    # erasures as a whole-prefix fold (the replay verify runs, from empty state) only.
    erased = materialize(_erased(applied).unionByName(_erased(state.events_bronze)).distinct())
    if not erased.isEmpty():
        if not _erased(applied).isEmpty() and not state.events_bronze.isEmpty():
            raise ValueError("an erasure in a fold step over prior state: fold the whole prefix instead")
        applied = materialize(without_erased(applied, erased))

    follows_upserts, follows_deletes = map(materialize, follow_changes(applied))
    posts = materialize(posts_view(applied, state.posts))
    inbox = materialize(inbox_view(applied, state.inbox))
    tl_inserts, tl_deletes, celebrities = timeline_changes(
        applied, state, follows_upserts, follows_deletes, posts, cfg
    )
    return BatchOutput(
        bronze=bronze,
        rejected=rejected,
        users=users_view(applied),
        follows_upserts=follows_upserts,
        follows_deletes=follows_deletes,
        posts=posts,
        timeline_inserts=tl_inserts,
        timeline_deletes=tl_deletes,
        inbox=inbox,
        unread_counts=unread_view(inbox, state.inbox, state.unread_counts),
        user_status=user_status_view(applied),
        celebrities=celebrities,
    )


def _upsert(table: DataFrame, rows: DataFrame, keys: list[str]) -> DataFrame:
    return table.join(rows.select(*keys), keys, "left_anti").unionByName(rows.select(*table.columns))


def fold_into(state: State, out: BatchOutput) -> State:
    """Apply one step's output to in-memory state: what the Delta sink does with MERGE.

    Used where state is not in Delta (unit tests of the fold); the sink applies the same rows.
    """
    from pipelines.tables import TABLES as T

    def keys(name: str) -> list[str]:
        return list(T[name].keys)

    timeline = state.home_timeline.join(
        out.timeline_deletes.select("user_id", "post_id"), ["user_id", "post_id"], "left_anti"
    )
    return State(
        events_bronze=state.events_bronze.unionByName(out.bronze),
        users=_upsert(state.users, out.users, keys("users")),
        follows=_upsert(state.follows, out.follows_upserts, keys("follows")).join(
            out.follows_deletes, keys("follows"), "left_anti"
        ),
        posts=_upsert(state.posts, out.posts, keys("posts")),
        home_timeline=_upsert(timeline, out.timeline_inserts, keys("home_timeline")),
        inbox=_upsert(state.inbox, out.inbox, keys("inbox")),
        unread_counts=_upsert(state.unread_counts, out.unread_counts, keys("unread_counts")),
        user_status=_upsert(state.user_status, out.user_status, keys("user_status")),
    )
