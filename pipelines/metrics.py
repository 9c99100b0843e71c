"""Live metrics of the speed layer and the archiver, for Prometheus (``prometheus-client``).

``python -m pipelines.metrics [--port 9464]`` serves ``/metrics`` (``make up`` starts it:
:class:`infra.services.MetricsExporter`); every scrape reads the live stores, so the figures are
those of that moment and a scrape depends on no state of the exporter's own:

- the log's end offsets (Kafka), the speed layer's fences (Redis) and the archive's position
  (the Delta ``batches`` log): per partition, the serving path's and the archive's lag in records;
- the speed layer's accounting per partition (``stats:<p>``: applied, duplicates, rejected,
  quarantined) and its freshness histogram (``freshness``: server receive -> applied in Redis);
- Redis time per event: the server's CPU time in ``FCALL`` (``INFO commandstats``) over the
  events the speed layer has decided;
- the archive's age: seconds since the last ``batches`` commit, and whether it covers the fences;
- the streaming queries' latest progress (the speed layer's keyed query, the analytics'): input
  and processing rates, batch duration, and per Kafka partition the records a query had not read
  when it planned its latest batch, from the files their listeners keep
  (:mod:`pipelines.stream_progress`).

The same port serves ``/dashboard``: the plots of the last minutes a person looks at, from a
bounded history a sampler thread keeps (:mod:`pipelines.dashboard`).

``python -m pipelines.metrics --summary`` prints the headline numbers once (``make status``).
Every metric, its labels and its meaning: docs/metrics.md.
"""

from __future__ import annotations

import argparse
import sys
import time

from infra.cli import command_name, run_main
from infra.settings import Settings, get_settings

# Prometheus histogram buckets (seconds) for the freshness histogram (kept in 10 ms buckets)
FRESHNESS_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
DISPOSITIONS = ("applied", "duplicates", "rejected", "quarantined")


def _archive(settings: Settings, namespace: str) -> tuple[dict[int, int], float | None]:
    """The archive's position (partition -> next offset) and its last commit time (epoch s)."""
    from pipelines.lake import committed_position, last_commit_ms

    found = committed_position(settings.lake_dir, namespace)
    position = found[1] if found else {}
    committed_ms = last_commit_ms(settings.lake_dir / namespace / "batches")
    return position, None if committed_ms is None else committed_ms / 1000


def serving_counts(r, ns: str, layout: str, parts: list[int]) -> tuple[dict[int, int], list, list]:
    """Each partition's fence, accounting hash and freshness hash(es), read in MULTIs: the speed layer
    changes them in one function call, so records read (the fences) = records decided (the
    accounting) in every snapshot. In the partitioned layout a MULTI per partition (its keys share
    a slot, which on a Redis Cluster one master holds: a MULTI over several slots is refused)."""
    from contract import functions

    if layout == "partitioned":
        fences, raw_stats, raw_hists = {}, [], []
        for p in parts:
            pipe = r.pipeline(transaction=True)
            pipe.get(functions.pkey(ns, p, "fence"))
            pipe.hgetall(functions.stats_key(ns, p, layout))
            pipe.hgetall(functions.pkey(ns, p, "freshness"))
            fence, stats_p, hist_p = pipe.execute()
            if fence is not None:
                fences[p] = int(fence)
            raw_stats.append(stats_p)
            raw_hists.append(hist_p)
    else:
        pipe = r.pipeline(transaction=True)
        pipe.hgetall(functions.key(ns, "fence"))
        for p in parts:
            pipe.hgetall(functions.stats_key(ns, p, layout))
        pipe.hgetall(functions.key(ns, "freshness"))
        got = pipe.execute()
        fences = {int(p): int(o) for p, o in got[0].items()}
        raw_stats, raw_hists = got[1 : 1 + len(parts)], got[1 + len(parts) :]
    return fences, raw_stats, raw_hists


def snapshot(settings: Settings) -> dict:
    """Everything the exporter reports, read once from Kafka, Redis and the Delta log."""
    from contract import functions, namespaces
    from infra.stack import end_offsets
    from pipelines.speed.processor import FRESHNESS_BUCKET_MS

    ns = namespaces.active(settings)
    r = functions.connect(settings.redis_url)
    ends = end_offsets(settings, settings.events_topic)
    layout = settings.serving_layout
    fences, raw_stats, raw_hists = serving_counts(r, ns, layout, sorted(ends))
    stats = {
        p: {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in raw.items()}
        for p, raw in zip(sorted(ends), raw_stats, strict=True)
    }
    hist: dict[int, int] = {}
    for raw in raw_hists:
        for b, n in raw.items():
            hist[int(b)] = hist.get(int(b), 0) + int(n)
    fcall = functions.command_stats(r).get("cmdstat_fcall", {})
    archive, archived_at = _archive(settings, ns)
    from pipelines.stream_progress import progress_dir, read

    streams = read(progress_dir(settings))
    decided = sum(sum(s.get(d, 0) for d in DISPOSITIONS) for s in stats.values())
    return {
        "namespace": ns,
        "topic": settings.events_topic,
        "end": ends,
        "fence": {p: fences.get(p, 0) for p in ends},
        "archive": {p: archive.get(p, 0) for p in ends},
        "archived_at": archived_at,
        "stats": stats,
        "freshness": hist,
        "bucket_ms": FRESHNESS_BUCKET_MS,
        "fcall_calls": int(fcall.get("calls", 0)),
        "fcall_usec": int(fcall.get("usec", 0)),
        "redis_us_per_event": (int(fcall.get("usec", 0)) / decided) if decided else None,
        "streams": streams,
        "now": time.time(),
    }


def _epoch_s(timestamp: str) -> float | None:
    """Spark's progress ``timestamp`` (``2026-12-06T07:00:00.123Z``) in epoch seconds."""
    from datetime import datetime

    try:
        return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except (AttributeError, ValueError):
        return None


def stream_families(streams: dict[str, dict], now: float):
    """The streaming queries' latest progress reports as metric families (label ``query``)."""
    from prometheus_client.core import GaugeMetricFamily

    from pipelines.stream_progress import partition_lag

    def per_query(name: str, doc: str, value) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=["query"])
        for query, progress in sorted(streams.items()):
            v = value(progress)
            if v is not None:
                g.add_metric([query], float(v))
        return g

    yield per_query(
        "social_stream_input_rows_per_second",
        "records per second arriving for the query's latest batch (Spark's inputRowsPerSecond)",
        lambda p: p.get("inputRowsPerSecond"),
    )
    yield per_query(
        "social_stream_processed_rows_per_second",
        "records per second the query's latest batch processed (Spark's processedRowsPerSecond)",
        lambda p: p.get("processedRowsPerSecond"),
    )
    yield per_query(
        "social_stream_batch_duration_seconds",
        "wall time of the query's latest batch (Spark's batchDuration)",
        lambda p: (p["batchDuration"] / 1000) if p.get("batchDuration") is not None else None,
    )
    yield per_query(
        "social_stream_input_rows",
        "records in the query's latest batch",
        lambda p: p.get("numInputRows"),
    )
    yield per_query("social_stream_batch_id", "id of the query's latest batch", lambda p: p.get("batchId"))
    yield per_query(
        "social_stream_progress_age_seconds",
        "seconds since the query's latest progress report (a stopped query's grows)",
        lambda p: max(0.0, now - at) if (at := _epoch_s(p.get("timestamp"))) is not None else None,
    )
    g = GaugeMetricFamily(
        "social_stream_partition_lag_records",
        "per Kafka partition, records the query had not read when it planned its latest batch "
        "(the source's latestOffset - endOffset)",
        labels=["query", "topic", "partition"],
    )
    for query, progress in sorted(streams.items()):
        for (topic, partition), lag in sorted(partition_lag(progress).items()):
            g.add_metric([query, topic, str(partition)], lag)
    yield g


def families(snap: dict):
    """The snapshot as Prometheus metric families."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    ns = snap["namespace"]
    labels = ["namespace", "partition"]

    def per_partition(name: str, doc: str, values: dict[int, float]) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=labels)
        for p, v in sorted(values.items()):
            g.add_metric([ns, str(p)], v)
        return g

    end, fence, archive = snap["end"], snap["fence"], snap["archive"]
    yield per_partition("social_log_end_offset", "next offset of the event log (Kafka)", end)
    yield per_partition("social_serving_fence", "next offset the keyed state in Redis covers", fence)
    yield per_partition(
        "social_serving_lag_records",
        "records in the log the speed layer has not applied (log end - fence)",
        {p: max(0, end[p] - fence[p]) for p in end},
    )
    yield per_partition("social_archive_position", "next offset the Delta views cover", archive)
    yield per_partition(
        "social_archive_lag_records",
        "records in the log the Delta views do not cover (log end - archive position)",
        {p: max(0, end[p] - archive[p]) for p in end},
    )
    yield per_partition(
        "social_archive_behind_serving_records",
        "records Redis covers and the Delta views do not yet (fence - archive position)",
        {p: max(0, fence[p] - archive[p]) for p in end},
    )
    events = CounterMetricFamily(
        "social_events",
        "records the speed layer decided, by disposition (applied, duplicates, rejected, quarantined)",
        labels=[*labels, "disposition"],
    )
    for p, s in sorted(snap["stats"].items()):
        for d in DISPOSITIONS:
            events.add_metric([ns, str(p), d], s.get(d, 0))
    yield events
    hist, bucket_ms = snap["freshness"], snap["bucket_ms"]
    buckets, acc, total_s = [], 0, 0.0
    ordered = sorted(hist.items())
    for bound in FRESHNESS_BUCKETS_S:
        acc = sum(n for b, n in ordered if (b + 1) * bucket_ms <= bound * 1000)
        buckets.append((str(bound), acc))
    buckets.append(("+Inf", sum(hist.values())))
    total_s = sum(n * (b + 0.5) * bucket_ms / 1000 for b, n in ordered)
    h = HistogramMetricFamily(
        "social_freshness_seconds",
        "server receive time -> applied in Redis, per event (the speed layer's 10 ms histogram; "
        "delays over 120 s share the last bucket)",
        labels=["namespace"],
    )
    h.add_metric([ns], buckets=buckets, sum_value=total_s)
    yield h
    yield CounterMetricFamily(
        "social_redis_fcall_seconds",
        "Redis CPU time in FCALL (every namespace)",
        value=snap["fcall_usec"] / 1e6,
    )
    g = GaugeMetricFamily(
        "social_redis_seconds_per_event",
        "Redis CPU time in FCALL per record the speed layer decided (since Redis started)",
        labels=["namespace"],
    )
    if snap["redis_us_per_event"] is not None:
        g.add_metric([ns], snap["redis_us_per_event"] / 1e6)
    yield g
    g = GaugeMetricFamily(
        "social_archive_age_seconds",
        "seconds since the archiver's last Delta batches commit",
        labels=["namespace"],
    )
    if snap["archived_at"] is not None:
        g.add_metric([ns], max(0.0, snap["now"] - snap["archived_at"]))
    yield g
    yield from stream_families(snap.get("streams") or {}, snap["now"])


def stores_down(settings: Settings) -> str | None:
    """Why a snapshot cannot be read right now (Kafka's or Redis's port has no listener), else
    None: checked first, so a scrape answers at once instead of waiting out a client's timeout."""
    from infra.stack import port_listening

    kafka = settings.kafka_bootstrap.split(",")[0]
    redis_port = int(settings.redis_url.rsplit(":", 1)[1].split("/")[0])
    # the local stack's ports; an external Kafka or Redis is asked by the snapshot itself
    local = [int(kafka.rsplit(":", 1)[1])] * (not settings.kafka_external)
    local += [redis_port] * (not settings.redis_external)
    if not all(port_listening(p) for p in local):
        return f"Kafka {kafka} or Redis {redis_port} is not running"
    return None


class Collector:
    """A prometheus-client collector that reads the stores on every scrape."""

    def __init__(self, settings: Settings):
        self.settings = settings

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        up = GaugeMetricFamily("social_exporter_up", "1 when the stores answered this scrape")
        try:
            down = stores_down(self.settings)
            if down:
                raise ConnectionError(down)
            snap = snapshot(self.settings)
        except Exception as exc:  # noqa: BLE001 - a scrape must answer even when a store is down
            print(f"scrape failed: {exc}", file=sys.stderr)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families(snap)


def percentile(hist: dict[int, int], bucket_ms: int, q: float) -> int | None:
    total = sum(hist.values())
    acc = 0
    for b in sorted(hist):
        acc += hist[b]
        if acc >= q * total:
            return (b + 1) * bucket_ms
    return None


def summary(snap: dict) -> str:
    """The headline numbers in a few lines (``make status``)."""
    end, fence, archive = (sum(snap[k].values()) for k in ("end", "fence", "archive"))
    decided = {d: sum(s.get(d, 0) for s in snap["stats"].values()) for d in DISPOSITIONS}
    hist, bucket = snap["freshness"], snap["bucket_ms"]
    fresh = (
        f"p50 {percentile(hist, bucket, 0.5)} ms, p99 {percentile(hist, bucket, 0.99)} ms over "
        f"{sum(hist.values()):,} events"
        if hist
        else "no event applied yet"
    )
    age = (
        f"last commit {snap['now'] - snap['archived_at']:.0f}s ago"
        if snap["archived_at"]
        else "nothing archived yet"
    )
    per_event = (
        f"{snap['redis_us_per_event']:.0f} µs of Redis per event"
        if snap["redis_us_per_event"] is not None
        else "no event decided yet"
    )
    return "\n".join(
        [
            f"metrics ({snap['namespace']}, {snap['topic']}):",
            f"  log end {end:,}; serving path (Redis fences) {fence:,}, lag {end - fence:,} records; "
            f"archive (Delta) {archive:,}, lag {end - archive:,} records ({age})",
            "  decided: " + ", ".join(f"{d} {n:,}" for d, n in decided.items()) + f"; {per_event}",
            f"  freshness (received -> visible in Redis): {fresh}",
        ]
    )


def sampled_snapshot(settings: Settings) -> dict:
    """A snapshot for the dashboard's history (:mod:`pipelines.dashboard`): the scrape's, refused at
    once when a store's port has no listener."""
    down = stores_down(settings)
    if down:
        raise ConnectionError(down)
    return snapshot(settings)


def api_url(settings: Settings) -> str:
    """The app API whose ``/metrics`` the dashboard plots (SOCIAL_DASHBOARD_API_URL, else the API's
    host and port; a wildcard bind address is asked on 127.0.0.1)."""
    if settings.dashboard_api_url:
        return settings.dashboard_api_url
    host = "127.0.0.1" if settings.api_host in ("0.0.0.0", "::", "") else settings.api_host
    return f"http://{host}:{settings.api_port}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=command_name("pipelines.metrics"), description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, help="port of /metrics (default: SOCIAL_METRICS_PORT, 9464)")
    p.add_argument("--host", help="bind address (default: SOCIAL_METRICS_HOST, 127.0.0.1)")
    p.add_argument("--summary", action="store_true", help="print the headline numbers once and exit")
    args = p.parse_args(argv)
    settings = get_settings()
    port = args.port or settings.metrics_port
    host = args.host or settings.metrics_host
    if args.summary:
        down = stores_down(settings)
        if down:
            print(f"metrics: none ({down})")
            return 0
        try:
            print(summary(snapshot(settings)))
        except Exception as exc:  # noqa: BLE001 - `make status` says why, in one line
            print(f"metrics: not available ({type(exc).__name__}: {exc})")
        return 0
    from prometheus_client import make_wsgi_app
    from prometheus_client.core import REGISTRY

    from pipelines import dashboard

    REGISTRY.register(Collector(settings))
    history = dashboard.History(settings.dashboard_sample_s, settings.dashboard_history_s)
    sampler = dashboard.Sampler(history, lambda: sampled_snapshot(settings), api_url(settings))
    server = dashboard.serve(
        dashboard.wsgi_app(history, make_wsgi_app(REGISTRY), settings.dashboard_sample_s), host, port
    )
    sampler.start()
    print(f"serving http://{host}:{port}/metrics and http://{host}:{port}/dashboard", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        sampler.stopped.set()
        server.shutdown()


if __name__ == "__main__":
    sys.exit(run_main(main, "pipelines.metrics"))
