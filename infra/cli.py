"""What every command line of the project shares: the name its ``--help`` shows, and the one line a
bad setting or a component that does not answer ends it with.

Each module with a ``main(argv)`` builds its own argparse parser (``python -m <module>``); the
``social`` app (social/cli.py) runs the same ``main`` and sets :data:`COMMAND` meanwhile, so the
usage line names the command the user typed (``usage: social verify ...``), not ``__main__.py``.
Both ways in end the same way on a bad environment: ``social`` through :func:`one_line`, ``python -m
<module>`` through :func:`run_main`, each with one line on stderr and exit status 2; anything else (a bug)
keeps its traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

COMMAND: str | None = None  # "social verify" while the social app runs a command

# what an exception of these packages means, for the one line a command answers it with
COMPONENTS = {"redis": "Redis", "confluent_kafka": "Kafka", "py4j": "Spark"}


class Unreachable(ConnectionError):
    """A component a command needs did not answer (``component``: "Kafka", "Redis", "the API")."""

    def __init__(self, component: str, detail: str):
        super().__init__(detail)
        self.component = component


def command_name(module: str) -> str:
    """A parser's ``prog``: the ``social`` command running it, else ``python -m <module>``."""
    return COMMAND or f"python -m {module}"


def one_line(command: str, exc: BaseException) -> str | None:
    """The one line ``command`` (``social verify``, ``python -m pipelines.verify``) answers ``exc``
    with, when it is a bad setting or a component that does not answer; None for anything else."""
    from infra.settings import SettingsError

    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    if isinstance(exc, SettingsError):
        return f"{command}: bad setting: {first} (docs/configuration.md)"
    if isinstance(exc, Unreachable):
        return f"{command}: {exc.component} does not answer: {first}"
    package = type(exc).__module__.split(".")[0]
    unreachable = isinstance(exc, ConnectionError | TimeoutError) or "Connection" in type(exc).__name__
    if package in COMPONENTS and unreachable:
        return f"{command}: {COMPONENTS[package]} does not answer: {first}"
    if isinstance(exc, ConnectionRefusedError):
        return f"{command}: a component does not answer: {first}"
    inner = _in_a_spark_task(exc)
    if inner is not None:
        component, detail = inner
        return f"{command}: {component} does not answer: {detail} (in a Spark task; the query stopped)"
    return None


def _in_a_spark_task(exc: BaseException) -> tuple[str, str] | None:
    """A streaming query stopped by a component that does not answer in one of its tasks (a Redis
    master down under the speed layer's processor): PySpark raises the task's Python exception as
    text inside its own (``StreamingQueryException``, ``PythonException``); its last
    ``redis.exceptions.ConnectionError: <detail>`` line names the component and the reason."""
    import re

    if not any(t.__module__.startswith(("pyspark.", "py4j.")) for t in type(exc).__mro__):
        return None
    found = None
    for m in re.finditer(
        r"^(\w+)\.[\w.]*?\.?(\w*(?:Connection|Timeout|ClusterDown)\w*): (.+)$", str(exc), re.MULTILINE
    ):
        if m.group(1) in COMPONENTS:
            found = (COMPONENTS[m.group(1)], m.group(3).strip()[:300])
    return found


def run_main(main: Callable[[], int | None], module: str) -> int:
    """``python -m <module>``: ``main()``'s exit status, or 2 and one line (:func:`one_line`)."""
    try:
        return main() or 0
    except Exception as exc:
        line = one_line(command_name(module), exc)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 2
