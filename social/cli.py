"""The ``social`` command line: one Typer app whose commands are the project's entry points.

Every command is a passthrough: it imports its module only when run (``social --help`` loads no
Spark, Airflow or Great Expectations) and hands the rest of the command line, untouched, to the
module's own ``main(argv)``, whose argparse owns the flags (``social demo --help`` is
``python -m stories.demo --help``) and whose return value is the exit status. The ``python -m
<module>`` entry points and the ``social-*`` console scripts stay; the Makefile calls this app.
One difference from ``python -m <module>``: Ctrl-C ends a command with status 130 and no traceback
(Typer's handling of ``KeyboardInterrupt``).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

import typer
from typer.core import TyperCommand


class Passthrough(TyperCommand):
    """A command that parses nothing itself: every argument, ``--`` and ``--help`` included, is the
    module's. (Click's own parser drops a ``--``, which ``social load -- <locust options>`` needs.)"""

    def parse_args(self, ctx, args):
        ctx.args = list(args)
        return []


def settings_main(argv: list[str] | None = None) -> int:
    """``python -m infra.settings``, which reads no arguments, with a parser for ``--help``."""
    argparse.ArgumentParser(
        prog="social settings", description="rewrite the settings table of docs/configuration.md"
    ).parse_args(argv)
    from infra.settings import sync_readme

    print("docs/configuration.md settings table", "updated" if sync_readme() else "already up to date")
    return 0


# command -> (the module's entry point "module:function", arguments put before the user's, help)
COMMANDS: dict[str, tuple[str, tuple[str, ...], str]] = {
    # infra: the stack and its tools
    "up": ("infra.stack:main", ("up",), "Start Kafka, Redis, the speed layer and the API on 127.0.0.1."),
    "down": ("infra.stack:main", ("down",), "Stop exactly what `social up` started."),
    "status": ("infra.stack:main", ("status",), "What of the stack runs: service, state, pid, ports, log."),
    "ensure-redis": (
        "infra.stack:main",
        ("ensure-redis",),
        "Find redis-server (7.0+), installing it with apt-get if missing.",
    ),
    "check-external": (
        "infra.external:main",
        (),
        "Check your own Kafka, Redis and S3 lake (SOCIAL_*_EXTERNAL, SOCIAL_LAKE_URI) as `up` does.",
    ),
    "ensure-prometheus": (
        "infra.stack:main",
        ("ensure-prometheus",),
        "With SOCIAL_PROMETHEUS=1: Prometheus from PATH, else Debian's package unpacked under .tools.",
    ),
    "ensure-s3server": (
        "infra.s3server:main",
        (),
        "Build the S3-compatible server the S3 lake's tests start (versitygw, pinned, with go install).",
    ),
    "ensure-chromium": (
        "infra.stack:main",
        ("ensure-chromium",),
        "A headless Chromium for the browser test: from PATH, else Debian's chromium-headless-shell (apt-get).",
    ),
    "jars": ("infra.jars:main", (), "The JVM jars: fetched from Maven Central, pinned, checksum-verified."),
    "airflow": ("infra.airflow:main", (), "Local Airflow over dags/: env, db, test, standalone."),
    "tail": ("infra.tail:main", (), "The event log, record by record (Kafka's console consumer)."),
    "history": ("infra.history:main", (), "The Spark History Server over var/spark-events."),
    "reports": ("infra.reports:main", (), "Rebuild var/reports/index.html: every report, its time, verdict."),
    "settings": ("social.cli:settings_main", (), "Rewrite the settings table of docs/configuration.md."),
    # contract
    "contract-docs": ("contract.__main__:main", ("docs",), "(Re)generate docs/events.md from the schema."),
    # app_sim: the app
    "api": ("app_sim.api.__main__:main", (), "Serve the app API with uvicorn."),
    "generate": ("app_sim.generator:main", (), "The direct load generator: simulated events to the log."),
    "erase": ("app_sim.erase:main", (), "The operator's erasure request for one user."),
    "load": ("app_sim.load:main", (), "A bounded, headless Locust run against the running API."),
    # pipelines: the processing
    "speed-layer": ("pipelines.speed_layer:main", (), "The Kappa speed layer: Kafka -> Redis."),
    "archiver": ("pipelines.archiver:main", (), "The changelog and the raw log into Delta."),
    "analytics": ("pipelines.analytics.runner:main", (), "Start the analytics streaming queries."),
    "analytics-report": ("pipelines.analytics.report:main", (), "The analytics page (plots, summary)."),
    "verify": ("pipelines.verify:main", (), "The live views equal a replay of the log they cover."),
    "replay": ("pipelines.replay:main", (), "The keyed processor over the retained log, up to P."),
    "rebuild": ("pipelines.rebuild:main", (), "Rebuild every view into a new namespace (blue/green)."),
    "restore": ("pipelines.restore:main", (), "Restore Redis's keyed state from Delta."),
    "bootstrap": ("pipelines.bootstrap:main", (), "Bootstrap a new service from the compacted topics."),
    "batch-layer": (
        "pipelines.batch_layer.job:main",
        (),
        "The batch layer: the archive up to P -> every view.",
    ),
    "quality": ("pipelines.quality:main", (), "Data-quality reports (Great Expectations checkpoints)."),
    "maintenance": ("pipelines.maintenance:main", (), "Housekeeping of everything under var/."),
    "metrics": ("pipelines.metrics:main", (), "Live metrics for Prometheus; --summary prints them once."),
    "spark": ("pipelines.spark:main", (), "The Spark drivers' class archive."),
    # stories: callers of everything
    "demo": ("stories.demo:main", (), "The whole story end to end, on the local stack."),
    "bench": ("stories.bench:main", (), "Side-by-side benchmarks, each a ratio measured in one run."),
    "compare": ("stories.compare:main", (), "Lambda vs Kappa on the same generated log."),
    "dual-write": ("stories.dual_write:main", (), "Dual writes vs the log: the inconsistency, measured."),
    "erasure-audit": ("stories.erasure_audit:main", (), "Erase a canary user, then search every store."),
    "faults": ("stories.faults:main", (), "Fault runs on the cluster profile's Kafka."),
}

app = typer.Typer(
    name="social",
    help="kappa-social: the stack, the app, the pipelines and the stories. `social COMMAND --help`: its flags.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,  # a crash prints Python's own traceback, as `python -m <module>` does
)


def _entry_point(target: str) -> Callable[[list[str]], int | None]:
    module, function = target.split(":")
    return getattr(importlib.import_module(module), function)


def _passthrough(name: str, target: str, prefix: tuple[str, ...], help_line: str) -> None:
    def command(ctx: typer.Context) -> None:
        from infra import cli

        # the usage line names the command typed; a module whose first argument is a subcommand
        # (`social up` runs `python -m infra.stack up`) adds that itself
        cli.COMMAND = "social" if prefix else f"social {name}"
        try:
            code = _entry_point(target)([*prefix, *ctx.args])
        except Exception as exc:
            line = cli.one_line(f"social {name}", exc)
            if line is None:
                raise
            typer.echo(line, err=True)
            raise typer.Exit(2) from None
        finally:
            cli.COMMAND = None
        raise typer.Exit(code or 0)

    command.__name__ = name.replace("-", "_")
    app.command(
        name,
        help=help_line,
        cls=Passthrough,
        add_help_option=False,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(command)


for _name, (_target, _prefix, _help) in COMMANDS.items():
    _passthrough(_name, _target, _prefix, _help)
