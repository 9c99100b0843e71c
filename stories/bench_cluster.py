"""``make bench`` section ``cluster_scaling``: the keyed speed layer on the cluster profile's
engines, one engine changed at a time, every configuration in one run.

Four configurations, each a speed layer of its own (``python -m pipelines.speed_layer`` through
:class:`pipelines.speed_layer_process.SpeedLayerProcess`) on its own topic and Redis namespace, each
fed the same generated traffic by :func:`stories.bench_analytics.speed_layer_phase`: a bootstrap of
2,000 users (not measured), ``cluster_rate`` events/s for ``cluster_seconds`` (freshness p50/p99
from the processor's own histogram), then a burst of ``cluster_burst_events`` sent as fast as the
generator goes (the events/s the speed layer drains a backlog at: its throughput). Where the time
goes, per configuration: the speed layer's micro-batch durations (its ``keyed batch`` log lines,
Spark's ``batchDuration``) and the acks=all round trip of single records to the topic (what a
replicated write waits for before a consumer may read it).

=======================  ====================================  ==============================
configuration            Kafka                                 Spark
=======================  ====================================  ==============================
``1_broker_local``       the bench's broker (replication 1)    ``local[*]`` (the default)
``3_brokers_local``      3 KRaft nodes, RF 3, min ISR 2        ``local[*]``
``1_broker_1_worker``    the bench's broker                    standalone, 1 worker x 1 core
``1_broker_2_workers``   the bench's broker                    standalone, 2 workers x 1 core
=======================  ====================================  ==============================

The ratios say what each step costs or gains: 3 brokers over 1 (replication: every acks=all
write waits for a second replica, the consumer reads from leaders spread over three JVMs), 2
workers over 1 (one more executor with a core of its own), and standalone over ``local`` (the
executors in other JVMs: task results and Python workers cross processes). The Kafka cluster and
the Spark cluster are started for the section (``infra.stack``, the cluster profile's services on
free ports and a scratch ``var/``) and stopped after it; Redis is the bench's.

On a 2-core machine the absolute figures are small and the workers share the cores with the
driver, Kafka and Redis: the curve and the ratios are what count (docs/cluster-and-faults.md).
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import tempfile
import time
from pathlib import Path

from infra.settings import Settings
from stories.bench_common import BenchContext, pct, section

BATCH_LINE = re.compile(r"keyed batch \d+: .* in ([\d.]+)s")
ACK_PROBES = 200

CONFIGS = ("1_broker_local", "3_brokers_local", "1_broker_1_worker", "1_broker_2_workers")


def kafka_cluster_settings(base: Settings, var: Path, brokers: int = 3) -> Settings:
    """The cluster profile's Kafka (``brokers`` KRaft nodes, RF 3, min ISR 2) on free ports under
    ``var``; Spark stays the base's."""
    from infra.stack import free_port_block

    port = free_port_block(2 * brokers)
    ports = dataclasses.replace(
        base,
        profile="cluster",
        cluster_brokers=brokers,
        kafka_port=port,
        kafka_controller_port=port + 1,  # node i: port + 2i, port + 1 + 2i
        var_dir=var,
    )
    bootstrap = ",".join(f"127.0.0.1:{b}" for b, _ in ports.broker_ports())
    return dataclasses.replace(ports, kafka_bootstrap=bootstrap, spark_master=base.spark_master)


def batch_seconds(log_text: str) -> list[float]:
    """Every micro-batch's duration (s) in a speed layer's log."""
    return [float(m.group(1)) for m in BATCH_LINE.finditer(log_text)]


def _ack_round_trips_ms(settings: Settings, topic: str, n: int = ACK_PROBES) -> list[float]:
    """``n`` single records, each flushed alone, with the generator's producer settings (acks=all,
    idempotence): the round trip until the broker acknowledges, i.e. until min ISR replicas
    have it."""

    from infra import clients

    producer = clients.kafka_producer(settings, "bench.cluster.probe", "probe")
    out = []
    for i in range(n):
        t = time.perf_counter()
        producer.produce(topic, b'{"probe": %d}' % i, str(i).encode())
        if producer.flush(30):
            raise RuntimeError(f"probe record {i} not acknowledged in 30 s")
        out.append((time.perf_counter() - t) * 1000)
    return out


def scaling_ratios(results: dict[str, dict]) -> dict:
    """Each step's ratio of throughput (burst events/s applied) and of freshness p99, from the
    configurations' results; a ratio is None where either side has no figure."""

    def ratio(key: str, over: str, under: str) -> float | None:
        a, b = results.get(over, {}).get(key), results.get(under, {}).get(key)
        return round(a / b, 2) if a and b else None

    steps = {
        "3_brokers_over_1": ("3_brokers_local", "1_broker_local"),
        "2_workers_over_1": ("1_broker_2_workers", "1_broker_1_worker"),
        "1_worker_over_local": ("1_broker_1_worker", "1_broker_local"),
    }
    out = {}
    for name, (over, under) in steps.items():
        out[f"throughput_{name}"] = ratio("burst_applied_events_per_s", over, under)
        out[f"freshness_p99_{name}"] = ratio("freshness_p99_ms", over, under)
    return out


def _engines(config: str, base: Settings, var: Path):
    """The settings of one configuration, and the Stack of what it needs started (or None)."""
    from infra.stack import KafkaBroker, SparkMaster, SparkWorker, Stack, standalone_spark_settings

    if config == "1_broker_local":
        return base, None
    if config == "3_brokers_local":
        settings = kafka_cluster_settings(base, var)
        return settings, Stack(settings, service_types=(KafkaBroker,))
    workers = 2 if config == "1_broker_2_workers" else 1
    settings = standalone_spark_settings(base, var, workers)
    return settings, Stack(settings, service_types=(SparkMaster, SparkWorker))


@section("cluster_scaling")
def cluster_scaling_section(ctx: BenchContext) -> dict:
    from contract.functions import connect as keyed_connect
    from contract.functions import drop_namespace
    from infra.stack import create_topic, events_topic_configs
    from stories.bench_analytics import speed_layer_phase

    r = keyed_connect(ctx.settings.redis_url)
    out: dict = {
        "rate_events_per_s": ctx.cluster_rate,
        "seconds_at_rate": ctx.cluster_seconds,
        "burst_events": ctx.cluster_burst_events,
    }
    results: dict[str, dict] = {}
    for config in CONFIGS:
        var = Path(tempfile.mkdtemp(prefix=f"bench-cluster-{config}-"))
        ns = f"bench_cl_{config}_{ctx.run_id}".lower()
        print(f"bench cluster_scaling: {config}", flush=True)
        t = time.perf_counter()
        settings, stack = _engines(config, dataclasses.replace(ctx.settings, var_dir=var), var)
        try:
            if stack is not None:
                stack.up()
            if config == "3_brokers_local":
                topic = f"bench.cluster_{config}.{ctx.run_id}".lower()
                create_topic(
                    settings,
                    topic,
                    settings.events_partitions,
                    events_topic_configs(settings),
                    replication_factor=settings.replication_factor,
                )
            else:
                topic = ctx.topic(f"cluster_{config}")
            settings = dataclasses.replace(settings, events_topic=topic, views_namespace=ns)
            results[config] = speed_layer_phase(
                settings,
                r,
                var / "speed_layer.log",
                rate=ctx.cluster_rate,
                seconds=ctx.cluster_seconds,
                burst_events=ctx.cluster_burst_events,
            )
            # where the time goes: the micro-batches, and a replicated write's round trip (after
            # the speed layer stopped: the probe records are not events and nothing reads them)
            batches = batch_seconds((var / "speed_layer.log").read_text(errors="replace"))
            acks = _ack_round_trips_ms(settings, topic)
            results[config].update(
                {
                    "batches": len(batches),
                    "batch_ms_p50": pct([b * 1000 for b in batches], 0.5),
                    "batch_ms_p99": pct([b * 1000 for b in batches], 0.99),
                    "ack_ms_p50": pct(acks, 0.5),
                    "ack_ms_p99": pct(acks, 0.99),
                }
            )
            results[config]["spark_master"] = settings.spark_master
            results[config]["kafka_nodes"] = len(settings.kafka_bootstrap.split(","))
        except Exception as exc:  # one configuration failing must not lose the others
            results[config] = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            if stack is not None:
                stack.down()
            drop_namespace(r, ns)
            shutil.rmtree(var, ignore_errors=True)
        results[config]["seconds"] = round(time.perf_counter() - t, 1)
    out.update({f"{c}_{k}": v for c, res in results.items() for k, v in res.items()})
    out.update(scaling_ratios(results))
    return out
