"""Views derived when they are read: ``home_timeline`` from ``posts`` and ``follows``.

The speed layer fans a post out to every follower's timeline in Redis, so a timeline entry there
is a unit of state. In Delta it is not: ``home_timeline`` is a function of two compacted tables
at one batch (docs/views.md), so the archive holds the primary facts (one row per post, one per
follow) and this module derives the timeline when somebody reads it. A compaction then costs what
its records cost, not their fan-out (docs/architecture.md, "Where state lives").

This is deliberately not the batch layer's code (:mod:`pipelines.batch_layer.definition` derives
its own timeline from its own ``posts`` and ``follows``): verify compares the two, and the Redis
timelines against this one (:func:`pipelines.verify.compare_serving`).
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import DataFrame

from pipelines.tables import TABLES

# docs/views.md, home_timeline(u): the latest N live posts by u or by the people u follows, except
# authors above the fan-out threshold (merged at read time), newest first by corrected event time,
# ties by post id, then author id. Only an author's own latest N posts can be among anyone's N.
_HOME_TIMELINE = """
WITH live AS (
  SELECT author_id, post_id, event_time FROM (
    SELECT author_id, post_id, event_time,
           row_number() OVER (PARTITION BY author_id
                              ORDER BY event_time DESC, post_id DESC) AS k
    FROM {posts} WHERE NOT deleted) WHERE k <= {n}),
above AS (
  SELECT followee_id AS author_id FROM {follows} GROUP BY followee_id HAVING count(*) > {threshold}),
sources AS (
  SELECT user_id, followee_id AS author_id FROM {follows} f
  WHERE NOT EXISTS (SELECT 1 FROM above a WHERE a.author_id = f.followee_id)
  UNION
  SELECT DISTINCT author_id AS user_id, author_id FROM live)
SELECT user_id, post_id, author_id, event_time FROM (
  SELECT s.user_id, l.post_id, l.author_id, l.event_time,
         row_number() OVER (PARTITION BY s.user_id
                            ORDER BY l.event_time DESC, l.post_id DESC, l.author_id DESC) AS r
  FROM sources s JOIN live l ON l.author_id = s.author_id)
WHERE r <= {n}
"""


def home_timeline(posts: DataFrame, follows: DataFrame, *, length: int, threshold: int) -> DataFrame:
    """Every user's fanned-out home timeline from ``posts`` and ``follows`` (as the views hold them)."""
    spark = posts.sparkSession
    return spark.sql(
        _HOME_TIMELINE,
        posts=posts,
        follows=follows,
        n=int(length),
        threshold=int(threshold),
    ).select(*TABLES["home_timeline"].columns)


def read(lake, name: str, versions: Mapping[str, int | None], settings) -> DataFrame:
    """Table or view ``name`` of ``lake`` at ``versions`` (table -> version, None or absent: the
    latest); a derived view is computed from its tables at their versions."""
    t = TABLES[name]
    if t.stored:
        return lake.read(name, versions.get(name))
    sources = [lake.read(s, versions.get(s)) for s in t.derived_from]
    return DERIVE[name](*sources, length=settings.timeline_length, threshold=settings.fanout_threshold)


# each derived view (pipelines/tables.py: ``derived_from``) -> its function of those tables, in order
DERIVE = {"home_timeline": home_timeline}
