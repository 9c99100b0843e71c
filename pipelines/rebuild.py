"""Reprocessing (blue/green): rebuild every view into a new namespace, from either path.

Where it sits: beside the speed layer, driven by the ``rebuild_views`` DAG or by hand. The steps
are the same code the rest of the system runs, so a Kappa rebuild is nothing but a second speed
layer that starts from offset 0:

1. ``build``: ``python -m pipelines.speed_layer --namespace NEW --available-now`` into its own
   Redis keys (``NEW:*``), stopping once it has caught up with the log; then
   ``python -m pipelines.archiver --namespace NEW --once`` archives and compacts its changelog
   into its own Delta tables. With ``--source batch`` (Lambda's path), first
   ``python -m pipelines.batch_layer`` recomputes every view from the live namespace's archive
   up to the position P it covers, and ``python -m pipelines.restore --from-batch`` seeds NEW
   (Delta and Redis) from them: the speed layer then starts at P, not at offset 0.
2. ``verify``: ``python -m pipelines.verify --namespace NEW`` (a replay of the log up to the new
   views' position must equal them, and Redis must equal Delta); a mismatch stops the rebuild.
3. ``switch``: the pointer moves atomically (``var/lake/ACTIVE`` + Redis ``active_namespace``,
   which the API reads per request), then the stack's speed-layer service, if it runs, restarts on
   the new namespace and catches up from its checkpoint.
4. The old namespace stays as it is (frozen at the switch) for rollback until
   ``python -m pipelines.maintenance`` removes it after ``SOCIAL_NAMESPACE_RETENTION_DAYS``.

Rollback is one command: ``python -m pipelines.rebuild rollback`` (switch back to the namespace
that was live before; its speed layer resumes from its own checkpoint).

The history of switches is ``var/lake/namespaces.json``. Each step calls the same functions as the
command named above, in this process: a whole ``run`` is one Spark application (one JVM started,
its classes loaded and compiled once), not one per step. Each of the ``rebuild_views`` DAG's tasks
runs one step (``python -m pipelines.rebuild build|verify|switch``) in a child process of its own,
so the Airflow worker stays light.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from contract import namespaces
from infra import logs
from infra.cli import command_name, run_main
from infra.lake_store import write_atomically
from infra.settings import Settings, get_settings

log = logging.getLogger("rebuild")

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


class RebuildError(RuntimeError):
    """A step failed; nothing after it ran (the live namespace is unchanged unless it says so)."""


# History ------------------------------------------------------------------------------------------


def history_file(settings: Settings) -> Path:
    return settings.lake_dir / "namespaces.json"


def load_history(settings: Settings) -> list[dict]:
    try:
        return json.loads(history_file(settings).read_text())["switches"]
    except (OSError, ValueError, KeyError):
        return []


def _record(settings: Settings, entry: dict) -> None:
    switches = [*load_history(settings), entry]
    write_atomically(history_file(settings), json.dumps({"switches": switches}, indent=2) + "\n")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def existing_namespaces(settings: Settings) -> list[str]:
    root = settings.lake_dir
    if not root.exists():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and (p / "batches" / "_delta_log").exists())


def next_namespace(settings: Settings) -> str:
    """``v<N+1>`` for the highest ``v<N>`` seen (active, on disk or in the history)."""
    seen = {namespaces.active(settings), *existing_namespaces(settings)}
    seen |= {e["namespace"] for e in load_history(settings)}
    numbers = [int(m.group(1)) for n in seen if (m := re.fullmatch(r"v(\d+)", n))]
    return f"v{max(numbers, default=1) + 1}"


def previous_namespace(settings: Settings) -> str | None:
    """The namespace that was live before the current one (the rollback target)."""
    active = namespaces.active(settings)
    for entry in reversed(load_history(settings)):
        if entry["namespace"] == active and entry.get("previous") and entry["previous"] != active:
            return entry["previous"]
    return None


# Steps ----------------------------------------------------------------------------------------------


def _build_progress(settings: Settings, namespace: str, topic: str):
    """A progress bar of the build on a terminal: the new namespace's fences against the log's end."""
    import threading

    from contract import functions
    from contract.serving import connect
    from infra.stack import end_offsets
    from pipelines.progress import log_position

    try:
        ends = end_offsets(settings, topic)
        client = connect(settings.redis_url)
    except Exception:  # noqa: BLE001 - no bar then; the build reports its own errors
        return threading.Event()
    layout, partitions = settings.serving_layout, len(ends)
    return log_position(
        lambda: sum(functions.layout_fences(client, namespace, layout, partitions).values()),
        sum(ends.values()),
        f"build {namespace}",
    )


SOURCES = ("kappa", "batch")


def catch_up(settings: Settings, namespace: str, topic: str | None = None) -> None:
    """Bring ``namespace`` up to the log's end: its speed layer until caught up
    (``python -m pipelines.speed_layer --available-now``), then its Delta archive and views
    (``python -m pipelines.archiver --once``), in one Spark application."""
    from pipelines import archiver, speed_layer

    stop = _build_progress(settings, namespace, topic or settings.events_topic)
    try:
        speed_layer.run(settings, namespace=namespace, topic=topic, available_now=True)
    except Exception as exc:
        raise RebuildError(f"building namespace {namespace!r} failed: {exc}") from exc
    finally:
        stop.set()
    # its Delta archive and views: everything the new keyed state's changelog holds, compacted
    try:
        archiver.run(settings, namespace=namespace, topic=topic, once=True)
    except Exception as exc:
        raise RebuildError(f"archiving namespace {namespace!r} failed: {exc}") from exc


def build(settings: Settings, namespace: str, topic: str | None = None, source: str = "kappa") -> None:
    """Compute the new views until caught up with the log.

    ``kappa``: a fresh speed layer from the earliest offset. ``batch``: the batch layer recomputes
    every view from the live namespace's Delta archive up to the position P it covers, the new
    namespace is seeded from them (Delta and Redis, ``pipelines.restore --from-batch``), and its
    speed layer reads the log from P on.
    """
    if namespace == namespaces.active(settings):
        raise RebuildError(f"{namespace!r} is the live namespace; rebuild into a new one")
    if source not in SOURCES:
        raise RebuildError(f"unknown source {source!r}; one of {', '.join(SOURCES)}")
    if source == "batch":
        from pipelines import restore
        from pipelines.batch_layer import job as batch_layer
        from pipelines.spark import build_spark

        spark = build_spark(f"rebuild-{namespace}", settings)
        batch_ns = namespace + batch_layer.SUFFIX
        live = namespaces.active(settings)
        log.info("batch layer: %s's archive -> %s", live, batch_ns)
        result = batch_layer.run(spark, settings, namespace=live, upto=None, out_namespace=batch_ns)
        if not result["ok"]:
            raise RebuildError(f"the batch layer into {batch_ns!r} failed: {json.dumps(result)[:2000]}")
        log.info("seeding %s from %s", namespace, batch_ns)
        try:
            restore.seed_from_batch(spark, settings, namespace, batch_ns)
            log.info("restored: %s", json.dumps(restore.restore(spark, settings, namespace)))
        except restore.RestoreError as exc:
            raise RebuildError(f"seeding {namespace!r} from {batch_ns!r} failed: {exc}") from exc
    catch_up(settings, namespace, topic)


def verify(settings: Settings, namespace: str, topic: str | None = None) -> None:
    """``python -m pipelines.verify --namespace NEW``, in this process: a mismatch stops the rebuild."""
    from pipelines import verify as verifying
    from pipelines.spark import build_spark

    spark = build_spark(f"rebuild-{namespace}", settings)
    report = verifying.verify(spark, settings, namespace=namespace, topic=topic)
    print(verifying.summary(report))
    if not report["ok"]:
        raise RebuildError(
            f"namespace {namespace!r} does not verify; not switching "
            f"(report: {Path(settings.reports_dir) / 'verify' / 'latest.html'})"
        )


def restart_speed_layer(settings: Settings) -> str:
    """Restart the stack's speed layer and archiver (those running) so they follow the active namespace."""
    from infra import stack

    outcome = []
    for cls in stack.SERVICES:
        if cls.name in ("speed_layer", "archiver"):
            service = cls(settings)
            if service.is_running():
                service.stop()
                service.start()
                outcome.append(f"{cls.name} restarted")
            else:
                outcome.append(f"{cls.name} not running")
    return ", ".join(outcome) or "no speed-layer service in the stack"


def switch(
    settings: Settings, namespace: str, *, restart: bool = True, reason: str = "rebuild"
) -> str | None:
    """Make ``namespace`` live (file + Redis pointer); returns the previous one."""
    from contract.serving import connect

    if namespace not in existing_namespaces(settings):
        raise RebuildError(f"no namespace {namespace!r} under {settings.lake_dir}; build it first")
    client = connect(settings.redis_url)
    client.ping()  # both pointers or neither: fail before moving the file pointer
    previous = namespaces.switch(settings, namespace, redis_client=client)
    _record(settings, {"namespace": namespace, "previous": previous, "switched_at": _now(), "reason": reason})
    log.info("live namespace: %s (was %s)", namespace, previous)
    if restart:
        log.info("speed layer: %s", restart_speed_layer(settings))
    return previous


def rollback(settings: Settings, *, restart: bool = True) -> str:
    target = previous_namespace(settings)
    if target is None:
        raise RebuildError("nothing to roll back to: no earlier namespace in " + str(history_file(settings)))
    if target not in existing_namespaces(settings):
        raise RebuildError(f"the previous namespace {target!r} was already removed by maintenance")
    switch(settings, target, restart=restart, reason="rollback")
    return target


def rebuild(
    settings: Settings,
    namespace: str | None = None,
    topic: str | None = None,
    *,
    do_switch: bool = True,
    restart: bool = True,
    source: str = "kappa",
) -> str:
    """build -> verify -> switch; returns the new namespace."""
    namespace = namespace or next_namespace(settings)
    if not NAME_RE.match(namespace):
        raise RebuildError(f"bad namespace name {namespace!r}")
    started = time.monotonic()
    build(settings, namespace, topic, source)
    verify(settings, namespace, topic)
    if do_switch:
        switch(settings, namespace, restart=restart)
    log.info("rebuild of %s done in %.0fs", namespace, time.monotonic() - started)
    return namespace


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=command_name("pipelines.rebuild"), description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name, doc in [
        ("run", "build, verify, switch"),
        ("build", "compute a namespace from the earliest offset"),
        ("verify", "verify a namespace against a replay"),
        ("switch", "make a namespace live"),
    ]:
        s = sub.add_parser(name, help=doc)
        s.add_argument("--namespace", required=name != "run", help="default for run: the next vN")
        s.add_argument("--topic", help="event topic (default: SOCIAL_EVENTS_TOPIC)")
        if name in ("run", "build"):
            s.add_argument(
                "--source",
                choices=SOURCES,
                default="kappa",
                help="kappa: replay the log from offset 0 (default); batch: the batch layer's views "
                "at the archived position, then the log after it",
            )
        if name in ("run", "switch"):
            s.add_argument("--no-restart", action="store_true", help="do not restart the speed-layer service")
        if name == "switch":
            s.add_argument("--reason", default="manual", help="recorded in the switch history")
        if name == "run":
            s.add_argument("--no-switch", action="store_true", help="build and verify only")
    r = sub.add_parser("rollback", help="switch back to the namespace live before the current one")
    r.add_argument("--no-restart", action="store_true")
    sub.add_parser("status", help="live namespace, namespaces on disk, switch history")
    args = p.parse_args(argv)
    logs.configure("rebuild")
    settings = get_settings()
    try:
        if args.command == "run":
            ns = rebuild(
                settings,
                args.namespace,
                args.topic,
                do_switch=not args.no_switch,
                restart=not args.no_restart,
                source=args.source,
            )
            print(f"rebuilt namespace {ns}; live: {namespaces.active(settings)}")
        elif args.command == "build":
            build(settings, args.namespace, args.topic, args.source)
        elif args.command == "verify":
            verify(settings, args.namespace, args.topic)
        elif args.command == "switch":
            prev = switch(settings, args.namespace, restart=not args.no_restart, reason=args.reason)
            print(f"live: {args.namespace} (was {prev})")
        elif args.command == "rollback":
            print(f"rolled back; live: {rollback(settings, restart=not args.no_restart)}")
        elif args.command == "status":
            print(f"live: {namespaces.active(settings)}")
            print(f"on disk: {', '.join(existing_namespaces(settings)) or '-'}")
            print(f"rollback target: {previous_namespace(settings) or '-'}")
            for e in load_history(settings):
                print(f"  {e['switched_at']}  {e.get('previous')} -> {e['namespace']}  ({e.get('reason')})")
    except RebuildError as exc:
        print(f"rebuild: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "pipelines.rebuild"))
