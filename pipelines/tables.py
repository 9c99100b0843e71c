"""The derived Delta tables: names, schemas, keys and meaning, in one place.

The archiver and the compaction (from the speed layer's changelog) write exactly these tables,
and the batch layer computes the views in the same form; `verify` compares them row by row.
docs/views.md (the meaning of each view) is generated from this module.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Table:
    name: str
    ddl: str  # Spark DDL of the columns
    keys: tuple[str, ...]  # primary key: one row per key
    doc: str
    verified: bool = True  # compared row for row by verify
    partition_by: tuple[str, ...] = ()
    # a view derived at read time from these stored tables at the batch's versions
    # (pipelines/derived.py), never written: it costs the compaction nothing
    derived_from: tuple[str, ...] = ()

    @property
    def stored(self) -> bool:
        return not self.derived_from

    @property
    def columns(self) -> list[str]:
        return [c.strip().split(" ")[0] for c in self.ddl.split(",")]


EVENT_COLUMNS = (
    "event_id STRING, type STRING, user_id BIGINT, device_time BIGINT, sent_time BIGINT, "
    "received_time BIGINT, event_time BIGINT, handle STRING, display_name STRING, text STRING, "
    "followee_id BIGINT, post_id BIGINT, message_id BIGINT, recipient_id BIGINT, "
    "partition INT, offset BIGINT"
)

TABLES: dict[str, Table] = {
    t.name: t
    for t in [
        Table(
            "events_bronze",
            EVENT_COLUMNS + ", disposition STRING, reason STRING, received_date STRING",
            ("partition", "offset"),
            "Every record that satisfies the event contract, in log order, with its disposition: "
            '`applied`, `duplicate` ("Duplicates" above) or '
            "`rejected` (valid shape but not applicable, e.g. deleting someone else's post; also in "
            "quarantine). Also what a restore rebuilds the dedup memory from.",
            partition_by=("received_date",),
        ),
        Table(
            "quarantine",
            "partition INT, offset BIGINT, key STRING, raw STRING, reason STRING, event_id STRING, "
            "type STRING, kafka_timestamp BIGINT",
            ("partition", "offset"),
            "Every record that has no effect because it is invalid: the raw record, its log position "
            "and the reason. `raw` is the record value as text; a value that is not UTF-8 (reason "
            "`not_utf8`) is kept as its bytes in base64, and a key that is not UTF-8 as `base64:` and "
            "its bytes in base64, so every column stays valid UTF-8 for any Parquet reader.",
        ),
        Table(
            "users",
            "user_id BIGINT, handle STRING, display_name STRING, registered_time BIGINT",
            ("user_id",),
            "Registered users (last `user_registered` per user in log order), except erased users.",
        ),
        Table(
            "follows",
            "user_id BIGINT, followee_id BIGINT, since_time BIGINT",
            ("user_id", "followee_id"),
            "follows(u): who u follows after applying u's followed/unfollowed in log order; no edge "
            "from or to an erased user.",
        ),
        Table(
            "posts",
            "author_id BIGINT, post_id BIGINT, event_time BIGINT, text STRING, deleted BOOLEAN, "
            "deleted_time BIGINT",
            ("author_id", "post_id"),
            "Every post ever created; `deleted` marks a tombstone (a deleted post never comes back). "
            "An erased author's posts, deleted ones included, have no rows.",
        ),
        Table(
            "home_timeline",
            "user_id BIGINT, post_id BIGINT, author_id BIGINT, event_time BIGINT",
            ("user_id", "author_id", "post_id"),
            "Fanned-out part of home timeline(u): the latest N non-deleted posts by u or by the "
            "people u follows whose follower count is at most the fan-out threshold, newest first by "
            "corrected event time (ties: post_id desc, then author_id desc). A post is "
            "(author_id, post_id). Posts of authors above the threshold are merged at read time. "
            "A view of `posts` and `follows` at the same batch, derived when it is read "
            "(`pipelines/derived.py`), not stored: a post costs the archive one row, whatever its "
            "fan-out.",
            derived_from=("posts", "follows"),
        ),
        Table(
            "inbox",
            "recipient_id BIGINT, message_id BIGINT, sender_id BIGINT, text STRING, event_time BIGINT, "
            "read BOOLEAN",
            ("recipient_id", "message_id"),
            "inbox(u): messages sent to u, with their read state; none for an erased u. A message "
            "whose sender is erased keeps its row with `sender_id` 0 (never a user id) and `text` "
            "null.",
        ),
        Table(
            "unread_counts",
            "user_id BIGINT, unread BIGINT",
            ("user_id",),
            "unread(u): messages in inbox(u) not read by u; always equals the count over inbox "
            "(messages from erased senders included); none for an erased u.",
        ),
        Table(
            "user_status",
            "user_id BIGINT, text STRING, event_time BIGINT",
            ("user_id",),
            "status(u): text of u's last status_updated in log order; none for an erased u.",
        ),
        Table(
            "changelog",
            "partition INT, offset BIGINT, seq BIGINT, disposition STRING, reason STRING, changes STRING, "
            "archive_id BIGINT",
            ("partition", "offset"),
            "The speed layer's changelog, archived: one row per record with its disposition "
            "(`a`pplied, `d`uplicate, `r`ejected, `q`uarantined), reason, `seq`, the order Redis "
            "applied it in (in the partitioned layout the entry's place in its partition's stream, "
            "`ms << 20 | n`; in the keyed layout a global sequence number), and its view changes "
            "(format in `pipelines/speed/changelog.py`): primary facts (users, follows, posts, "
            "messages, reads, statuses, erasures), not the fan-out's timeline entries, which "
            "`home_timeline` derives. In the partitioned layout a change a delivery made in another "
            "partition (an erasure's edges and messages there) is a row of its own, disposition `x`, "
            "no offset, reason `delivery <source>:<offset>`. Appended by the archiver; the views "
            "are compacted from it (a key's last change in `seq` order: each key belongs to one "
            "partition).",
            verified=False,
        ),
        Table(
            "archives",
            "archive_id BIGINT, start_offsets STRING, end_offsets STRING, seq BIGINT, records BIGINT, "
            "applied BIGINT, duplicates BIGINT, rejected BIGINT, quarantined BIGINT, "
            "min_received BIGINT, max_received BIGINT, received_hist STRING, archived_at BIGINT",
            ("archive_id",),
            "One row per archiver append, written last: the log range it covers (a consistent cut "
            "of the keyed state: every record below `end_offsets` and no other; in the partitioned "
            "layout a position every partition marked, `seq` 0; in the keyed layout changelog "
            "sequence numbers up to `seq`) and its accounting.",
            verified=False,
        ),
        Table(
            "batches",
            "batch_id BIGINT, end_offsets STRING, events_read BIGINT, applied BIGINT, "
            "duplicates BIGINT, quarantined BIGINT, versions STRING, committed_at BIGINT, "
            "min_received BIGINT, max_received BIGINT, received_hist STRING, visible_at BIGINT, "
            "phases STRING",
            ("batch_id",),
            "One row per compaction, written last: the log position the views now cover (per-partition "
            "end offsets, exclusive; `batch_id` is the archive id it reaches), the accounting of the "
            "records it folded in, the version of every table after it, freshness (received -> "
            "visible in the views), and `phases` (JSON).",
            verified=False,
        ),
    ]
}

VIEWS = ("users", "follows", "posts", "home_timeline", "inbox", "unread_counts", "user_status")
STORED = tuple(name for name, t in TABLES.items() if t.stored)  # the tables with a Delta log of their own
ARCHIVES = ("events_bronze", "quarantine")


IDENTITY_DOC = """## Identity, order and duplicates

Every rule below is decided from one Kafka partition alone, because the log orders records only
within a partition: a rule that asked "which author used this id first?" across partitions would
have no single answer, and the live state, a replay and the batch layer could disagree.

- **A post is `(author_id, post_id)`; a message is `(recipient_id, message_id)`.** Any int64 >= 1
  is a contract-valid id, so two authors may use one `post_id` (and two inboxes one
  `message_id`): they are different posts (messages), each in every view under its own key. The
  writers allocate ids that never collide in normal operation (snowflakes whose worker ids come
  from a registry in the log: `contract/writers.py`), but no view depends on it.
- A second `post_created` by the same author with a `post_id` that author already used (live or
  deleted) is rejected with reason `reused_id`, as is a `message_sent` whose `message_id` is
  already in the recipient's inbox. A `post_deleted` acts only on the actor's own
  `(user_id, post_id)` (otherwise `not_own_post`, or `post_already_deleted`); a `message_read`
  only on `(user_id, message_id)` of the reader's own inbox (otherwise `not_in_inbox`).
- **Timeline order:** newest first by corrected event time, ties by `post_id`, then `author_id`,
  all descending.
- **Duplicates:** decided within one partition. The same `event_id` in two partitions is two
  events, each decided by its own partition (a writer that retries sends the same record with the
  same key, so to the same partition). Let *newest* be the partition's newest `received_time`
  before the record and *the bound* newest minus the dedup window (24 h) minus the grace (1 h).
  An `event_id` has one of two forms (docs/events.md):
  - **Sequenced**, `sq:<writer>:<seq>` (the project's writers: the generator, the API's unkeyed
    writes, `--inject`; the writer is its worker id from the log's registry, the seq its count of
    its events from 1). A writer's *run* in a partition is its records there since its first, or
    since one before which the writer's newest `received_time` there was older than the bound
    (the writer is then forgotten and starts again). The record is a duplicate when its run
    already holds its seq, or when the seq is at or below the run's highest so far minus R, the
    reorder window (`SOCIAL_DEDUP_REORDER`, 256): a writer's ids may reach a partition out of order
    by fewer than R seqs, and one further behind counts as seen, since what the memory keeps of a
    writer is its highest seq and which of the R below it arrived. The memory is R bytes per
    writer and partition, whatever the number of its events, and a repeat is caught however late
    while the writer is remembered.
  - **Any other** string (a UUID: keyed API requests, `social-erase`, producers outside the
    project, every log written before sequenced ids): a duplicate when the same `event_id` was
    received in the partition at most the window before this one; the memory holds each id until
    its newest `received_time` is older than the bound, so it grows with the ids of a day. The
    speed layer forgets an id behind the bound; the batch layer never forgets one (only a
    hand-written record received more than the grace behind its partition can tell the two
    apart). Sequenced ids are forgotten alike by both.
"""


ERASURE_DOC = """## Erasure

`user_erased(u)` (docs/events.md; `DELETE /v1/users/me`, `social-erase --user-id N`) is part of
the view semantics, so the live state, any replay and the batch layer agree. Let E be the set of
users with an applied `user_erased`; every view is defined over the applied events with E taken
out:

- `users`, `user_status`, `inbox`, `unread_counts`: no row of a user in E (u's profile, status,
  own inbox and unread counter are gone);
- `posts`: no row of an author in E (deleted posts' tombstones included), so u's posts leave
  every `home_timeline`, and each timeline is the latest N of what remains (refilled from older
  posts exactly as after `post_deleted`); a celebrity's posts, merged at read time, are gone with
  them;
- `follows`: no edge from or to a user in E, so follower counts (and who is over the fan-out
  threshold) follow;
- messages u sent stay in their recipients' inboxes with `sender_id` 0 (ids are >= 1, so 0
  names nobody) and `text` null; their read state and the recipients' unread counts are
  unchanged (unread == the count of unread inbox rows).

Events after the erasure. The erased id is a tombstone kept forever (user ids are minted and
never reused: re-registering the same handle makes a new user). An event keyed by u (its
partition key: `user_id`, or the recipient of a `message_sent`) that comes after u's
`user_erased` in log order, a second erasure included, is rejected with reason `user_erased`:
counted in `rejected`, with its row in `quarantine`. This is decided in u's partition, so it is
the same live and on any replay. An event of another partition that names u (a `followed` of
u, a `message_sent` by u) has no order relative to the erasure; it is applied, and its effect is
what the definition above gives whatever the interleaving and whatever its event time: no edge
to u, and the message lands with sender 0 and no text.

Representation. The speed layer keeps E in `erased` (docs/architecture.md; in the partitioned
layout in the user's partition, and every partition keeps the ids it was told of in `gone`) and
logs the removals as changelog kinds `U-`, `S-`, `P-`, `I-`, `N-` (a row deleted), `F-` (an edge)
and `I` (a message anonymised), and in the keyed layout timeline `-` entries
(`pipelines/speed/changelog.py`); the compaction deletes a key whose last change is a removal,
and a restore rebuilds E from the applied `user_erased` events of `events_bronze`.

What this does not remove: the erased user's events themselves stay in the log
(`social.events`), in `events_bronze` and `quarantine`, and older versions of the Delta views
keep their rows until Delta's history is vacuumed; the views and the serving state are what it
clears. Their personal fields in all those copies are sealed with the user's data key, which the
erasure deletes, so they stay but cannot be read ([erasure.md](erasure.md)).
"""


def views_doc() -> str:
    """Markdown documentation of every table (docs/views.md)."""
    lines = ["# Derived tables", "", "Generated from `pipelines/tables.py`.", "", IDENTITY_DOC, ERASURE_DOC]
    for t in TABLES.values():
        lines += [
            f"## `{t.name}`",
            "",
            t.doc,
            "",
            f"Key: `{', '.join(t.keys)}`",
            "",
            "| column | type |",
            "|---|---|",
        ]
        for col in t.ddl.split(","):
            name, typ = col.strip().split(" ", 1)
            lines.append(f"| `{name}` | {typ} |")
        lines.append("")
    return "\n".join(lines)
