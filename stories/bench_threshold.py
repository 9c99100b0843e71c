"""``make bench`` section ``threshold``: the cost model the default fan-out threshold is chosen from.

A post by an author with F followers costs F timeline inserts if the author is fanned out on write;
if the author is merged at read time instead, each read of a follower's timeline costs one more
source in ``social_timeline``'s merge. Per post written, with ``ratio`` timeline reads per post:

    Redis per post (T) = inserts_per_post(T) * c_insert + ratio * (c_read + sources_per_read(T) * c_source)

where ``inserts_per_post(T)`` and ``sources_per_read(T)`` come from the follow graph and each
author's share of the posts (readers read alike), and the three costs are measured here, in
redis-server's CPU (user + system), on the generator's default log folded by the processor (the
code the executors run) into two namespaces of the stack's Redis:

- ``c_insert``: (Redis CPU at full fan-out - with no fan-out) / (timeline entries written by each),
  all in: the ZADD, the trim, the queueing and the changelog;
- ``c_read``, ``c_source``: ``FCALL_RO social_timeline`` (50 posts) for every user, 20 reads each
  in one pipeline: a least-squares line of the CPU per read against the celebrities merged.

The follower count cancels out of the comparison for one author (both sides scale with F), so
the cheaper rule is set by the reads per post; a threshold then bounds what one post may cost
(F * c_insert inside one function call, which reads wait behind). docs/performance.md,
"The fan-out threshold", has the figures and the choice.
"""

from __future__ import annotations

import time

from contract.functions import connect as keyed_connect
from stories.bench_common import BenchContext, keyed_processor, partition_batches, redis_cpu_s, section

# reads per post: the write-heavy bench (~900 timeline reads/s against ~1,400 posts/s), the
# read-heavy profile's floor, and Twitter 2012 (300k timeline reads/s against 4.6k posts/s)
RATIOS = (0.6, 20.0, 65.0)
CANDIDATES = (10, 31, 50, 100, 200, 500, 1_000, 10**9)
ONE_POST_BUDGET_MS = 10.0  # what one post's fan-out may hold Redis for (a fifth of the 50 ms read target)
READS_PER_USER = 20


def model(followers: dict, posts: dict, following: dict, threshold: int) -> tuple[float, float]:
    """(timeline inserts per post, celebrity sources per read) at ``threshold``: pure, unit-tested."""
    total = sum(posts.values())
    inserts = sum(
        n * (1 + (followers.get(a, 0) if followers.get(a, 0) <= threshold else 0)) for a, n in posts.items()
    )
    readers = list(following)
    sources = sum(sum(1 for a in following[u] if followers.get(a, 0) > threshold) for u in readers)
    return inserts / max(1, total), sources / max(1, len(readers))


def redis_per_post_us(
    ins: float, src: float, ratio: float, c_insert: float, c_read: float, c_source: float
) -> float:
    return ins * c_insert + ratio * (c_read + src * c_source)


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b x (b = 0 when x does not vary)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return my - b * mx, b


def _net_inserts(r, namespace: str, partitions: int) -> int:
    """Timeline entries the fold wrote: the users of every '+' item of the changelog's ``t`` field."""
    from contract.functions import key

    n = 0
    for p in range(partitions):
        last = "-"
        while True:
            rows = r.xrange(key(namespace, "changelog", p), min=last, count=5000)
            if last != "-":
                rows = rows[1:]
            if not rows:
                break
            for _id, fields in rows:
                t = fields.get(b"t")
                if t:
                    n += sum(len(i.rsplit(b":", 1)[1].split(b" ")) for i in t.split(b",") if i[:1] == b"+")
            last = rows[-1][0]
    return n


@section("threshold")
def threshold_section(ctx: BenchContext) -> dict:
    from app_sim.generator import GeneratorConfig, generate
    from contract import functions

    r = keyed_connect(ctx.settings.redis_url)
    functions.ensure_loaded(r)
    parts = ctx.settings.events_partitions
    per_p, _ = partition_batches(generate(ctx.catchup_events, GeneratorConfig()), parts)
    out: dict = {"events": ctx.catchup_events, "reads_per_post": list(RATIOS)}
    folds = {
        label: _fold(ctx, r, per_p, label, threshold)
        for label, threshold in (("no_fanout", 0), ("full_fanout", 10**9))
    }
    graph_ns = folds["full_fanout"]["namespace"]
    users = sorted(int(u) for u in r.hkeys(functions.key(graph_ns, "users")))
    followers = {u: r.scard(functions.key(graph_ns, "followers", u)) for u in users}
    posts = {u: r.hlen(functions.key(graph_ns, "pids", u)) for u in users}
    following = {u: [int(a) for a in r.smembers(functions.key(graph_ns, "following", u))] for u in users}
    c_read, c_source = _read_costs(r, [folds[label]["namespace"] for label in folds], users, following)
    f, n = folds["full_fanout"], folds["no_fanout"]
    c_insert = (
        (f["redis_cpu_s"] - n["redis_cpu_s"])
        * 1e6
        / max(1, f["timeline_entries_written"] - n["timeline_entries_written"])
    )
    for label in folds:
        functions.drop_namespace(r, folds[label]["namespace"])
        del folds[label]["namespace"]
    out["folds"] = folds
    out["c_insert_us"] = round(c_insert, 2)
    out["c_read_us"] = round(c_read, 1)
    out["c_source_us"] = round(c_source, 2)
    out["followers_mean"] = round(sum(followers.values()) / len(users), 1)
    out["followers_max"] = max(followers.values())
    rows = []
    for t in CANDIDATES:
        ins, src = model(followers, posts, following, t)
        row = {"threshold": t, "inserts_per_post": round(ins, 1), "sources_per_read": round(src, 1)}
        for ratio in RATIOS:
            row[f"redis_us_per_post_at_{ratio:g}"] = round(
                redis_per_post_us(ins, src, ratio, c_insert, c_read, c_source)
            )
        rows.append(row)
    out["model"] = rows
    for ratio in RATIOS:
        best = min(rows, key=lambda row: row[f"redis_us_per_post_at_{ratio:g}"])
        out[f"cheapest_threshold_at_{ratio:g}"] = best["threshold"]
    out["one_post_cap_followers"] = int(ONE_POST_BUDGET_MS * 1000 / max(c_insert, 1e-9))
    out["default_threshold"] = ctx.settings.fanout_threshold
    return out


def _fold(ctx: BenchContext, r, per_p: dict[int, list], label: str, threshold: int) -> dict:
    """The log folded by the keyed processor at ``threshold`` into a namespace of its own: its
    seconds, Redis CPU and timeline entries written (and the namespace, for the reads)."""
    ns = f"bench_threshold_{label}_{ctx.run_id}".lower()
    proc = keyed_processor(ctx.settings, ns, fanout_threshold=threshold)
    cpu0, t0 = redis_cpu_s(r), time.perf_counter()
    # as the stream does: every partition advanced alike, 2,000 records at a time
    pos = dict.fromkeys(per_p, 0)
    while any(pos[p] < len(v) for p, v in per_p.items()):
        for p, v in per_p.items():
            if pos[p] < len(v):
                proc.process(p, v[pos[p] : pos[p] + 2000])
                pos[p] += 2000
    cpu = redis_cpu_s(r) - cpu0
    return {
        "namespace": ns,
        "seconds": round(time.perf_counter() - t0, 1),
        "redis_cpu_s": round(cpu, 2),
        "timeline_entries_written": _net_inserts(r, ns, ctx.settings.events_partitions),
    }


def _read_costs(r, namespaces: list[str], users: list[int], following: dict) -> tuple[float, float]:
    """(c_read, c_source): the least-squares line of Redis CPU per read (µs) against the
    celebrities merged, over every user's reads in each folded namespace (with no fan-out, every
    followee is one)."""
    from contract import functions

    xs: list[float] = []
    ys: list[float] = []
    for ns in namespaces:
        celebs = {int(a) for a in r.smembers(functions.key(ns, "celebs"))}
        for u in users:
            pipe = r.pipeline(transaction=False)
            for _ in range(READS_PER_USER):
                pipe.fcall_ro("social_timeline", 0, ns, u, 50)
            c0 = redis_cpu_s(r)
            pipe.execute()
            xs.append(float(sum(1 for a in following[u] if a in celebs)))
            ys.append((redis_cpu_s(r) - c0) / READS_PER_USER * 1e6)
    return fit_line(xs, ys)
