"""The Kappa speed layer: Kafka ``social.events`` -> Redis, the keyed state the API serves.

One streaming query (:mod:`pipelines.speed.stream`): the per-partition processor in the executors
applies each record to the keyed state in Redis through the project's Redis functions (fan-out,
refills, dedup, per-partition fences and a changelog entry, atomically per event). Micro-batches
of ~0.1-0.5 s; nothing on this path writes Delta. The Delta archive and views are the archiver's
(:mod:`pipelines.archiver`, a process of its own), read from the changelog this query leaves in
Redis.

Run in the foreground: ``python -m pipelines.speed_layer``; ``make up`` runs it in the background
with its log under ``var/log/speed_layer.log``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from contract import functions, namespaces
from infra import logs
from infra.cli import command_name, run_main
from infra.settings import Settings, get_settings
from pipelines.spark import build_spark
from pipelines.speed import stream as keyed
from pipelines.stopping import stop_requested

log = logging.getLogger("speed_layer")


def run(
    settings: Settings,
    *,
    namespace: str | None = None,
    topic: str | None = None,
    available_now: bool = False,
) -> None:
    """Start the speed layer; returns when its queries stop (``available_now``: when caught up)."""
    namespace = namespace or namespaces.active(settings)
    topic = topic or settings.events_topic
    # state an older key layout wrote is refused before anything starts (docs/architecture.md)
    functions.check_layout(functions.connect(settings.redis_url), namespace, settings.serving_layout)
    spark = build_spark(f"speed-layer-{namespace}", settings)
    publisher = None
    if settings.compacted_topics:
        from pipelines.speed.compacted import PublisherThread

        publisher = PublisherThread(settings, namespace, topic)
        publisher.start()
    queries = [
        keyed.start(
            spark,
            settings,
            namespace,
            topic,
            available_now=available_now,
            on_batch=publisher.wake if publisher is not None else None,
        )
    ]
    log.info(
        "speed layer running: namespace=%s topic=%s queries=%s", namespace, topic, [q.name for q in queries]
    )

    with stop_requested() as stopping:
        # Stop between micro-batches, not in the middle of one (an interrupted one is harmless: the
        # fences make its re-run change nothing, but it delays what the next start serves).
        deadline = None
        while any(q.isActive for q in queries):
            for q in queries:
                if q.exception() is not None:
                    for other in queries:
                        if other is not q and other.isActive:
                            other.stop()
                    raise q.exception()
            if stopping.is_set():
                deadline = deadline or time.monotonic() + 120
                if all(not q.isActive or not q.status["isTriggerActive"] for q in queries) or (
                    time.monotonic() > deadline
                ):
                    log.info("stopping")
                    for q in queries:
                        q.stop()
                    break
            time.sleep(0.5)
        if publisher is not None:  # publish what the last batches left, then stop
            publisher.stop()
            publisher.join(timeout=60)
    for q in queries:
        if q.exception() is not None:
            raise q.exception()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog=command_name("pipelines.speed_layer"), description=__doc__.splitlines()[0]
    )
    p.add_argument("--namespace", help="views version to maintain (default: the active one)")
    p.add_argument("--topic", help="event topic (default: SOCIAL_EVENTS_TOPIC)")
    p.add_argument("--available-now", action="store_true", help="process what is in the log, then stop")
    args = p.parse_args(argv)
    logs.configure("speed_layer")
    try:
        run(
            get_settings(),
            namespace=args.namespace,
            topic=args.topic,
            available_now=args.available_now,
        )
    except functions.LayoutError as exc:
        print(f"speed layer: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "pipelines.speed_layer"))
