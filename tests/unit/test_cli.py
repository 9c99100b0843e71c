"""The ``social`` command line (social/cli.py): every command reaches its module's own parser, the
module's exit status is the command's, and ``social --help`` loads none of them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra.settings import REPO_ROOT
from social.cli import COMMANDS, app

# command -> a flag (or, for a module without flags, the usage line) its module's --help shows
OWN_HELP = {
    "up": "{up,down,status,ensure-redis,ensure-prometheus,ensure-chromium}",
    "down": "{up,down,status,ensure-redis,ensure-prometheus,ensure-chromium}",
    "status": "{up,down,status,ensure-redis,ensure-prometheus,ensure-chromium}",
    "ensure-redis": "{up,down,status,ensure-redis,ensure-prometheus,ensure-chromium}",
    "ensure-prometheus": "{up,down,status,ensure-redis,ensure-prometheus,ensure-chromium}",
    "ensure-chromium": "{up,down,status,ensure-redis,ensure-prometheus,ensure-chromium}",
    "check-external": "usage: social check-external",
    "ensure-s3server": "usage: social ensure-s3server",
    "jars": "{fetch,verify,lock}",
    "airflow": "standalone",
    "tail": "--max-messages",
    "history": "--port",
    "reports": "usage: social reports",
    "settings": "usage: social settings",
    "contract-docs": "--check",
    "api": "--workers",
    "generate": "--mean-followers",
    "erase": "--user-id",
    "load": "--steps",
    "speed-layer": "--available-now",
    "archiver": "--once",
    "analytics": "--only",
    "analytics-report": "--injected-user",
    "verify": "--no-serving",
    "replay": "--until",
    "rebuild": "{run,build,verify,switch,rollback,status}",
    "restore": "--force",
    "bootstrap": "--wait",
    "batch-layer": "--upto",
    "quality": "--suite",
    "maintenance": "--dry-run",
    "metrics": "--summary",
    "spark": "class-archive",
    "demo": "--catch-up-timeout",
    "bench": "--keyed-seconds",
    "compare": "--events",
    "dual-write": "--run-time",
    "erasure-audit": "--canary-posts",
    "faults": "--rate",
}

runner = CliRunner()


def test_every_command_has_a_help_check():
    assert set(OWN_HELP) == set(COMMANDS)


def test_the_app_help_lists_every_command_with_its_line():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0, result.output
    for name in COMMANDS:
        assert name in result.output


@pytest.mark.parametrize("command", sorted(OWN_HELP))
def test_command_help_is_the_modules_own(command):
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0, result.output
    assert OWN_HELP[command] in result.output


@pytest.mark.parametrize("command", sorted(OWN_HELP))
def test_command_help_names_the_command_typed(command):
    """The module's usage line names the ``social`` command, not ``__main__.py`` or ``python -m``
    (a module whose first argument is a subcommand, ``social up``, shows ``social`` and its choices)."""
    result = runner.invoke(app, [command, "--help"])
    usage = result.output.split("usage: ", 1)[1]
    prefixed = bool(COMMANDS[command][1])
    assert usage.startswith("social " if prefixed else f"social {command} "), result.output[:200]


# command -> the arguments it needs to get as far as reading the settings (a subcommand, a
# required flag); a command left out here needs none
ARGS = {
    "jars": ["verify"],
    "airflow": ["env"],
    "erase": ["--user-id", "1"],
    "rebuild": ["status"],
    "spark": ["class-archive"],
    "faults": ["spark-worker"],
}
# commands that read no setting: they rewrite a document of the repository from its source
READ_NO_SETTING = {"settings", "contract-docs"}
BAD_SETTING = sorted(set(COMMANDS) - READ_NO_SETTING)


def _lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


@pytest.mark.parametrize("command", BAD_SETTING)
def test_a_bad_setting_is_one_line_naming_it(command, tmp_path):
    result = runner.invoke(
        app,
        [command, *ARGS.get(command, [])],
        env={"SOCIAL_KAFKA_PORT": "x", "SOCIAL_VAR_DIR": str(tmp_path)},
    )
    assert result.exit_code == 2, result.output
    assert _lines(result.output) == [
        f"social {command}: bad setting: SOCIAL_KAFKA_PORT='x': expected int (docs/configuration.md)"
    ]


@pytest.mark.parametrize(
    ("variable", "value", "wants"),
    [
        ("SOCIAL_PROFILE", "bogus", "expected one of local, cluster"),
        ("SOCIAL_LOG_LEVEL", "loud", "expected one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
        ("SOCIAL_ARCHIVE_INTERVAL_S", "soon", "expected float"),
    ],
)
def test_a_value_out_of_its_choices_is_one_line_too(variable, value, wants, tmp_path):
    result = runner.invoke(app, ["verify"], env={variable: value, "SOCIAL_VAR_DIR": str(tmp_path)})
    assert result.exit_code == 2, result.output
    assert _lines(result.output) == [
        f"social verify: bad setting: {variable}={value!r}: {wants} (docs/configuration.md)"
    ]


def test_the_commands_that_read_no_setting_are_still_commands():
    assert READ_NO_SETTING <= set(COMMANDS) and set(ARGS) <= set(COMMANDS)


def _module(target: str) -> str:
    """What ``python -m`` runs for a command's entry point."""
    return target.split(":")[0].removesuffix(".__main__")


# every module a command runs, with the arguments that reach its settings: `python -m` each
MODULES = {
    _module(target): [*prefix, *ARGS.get(name, [])]
    for name, (target, prefix, _) in COMMANDS.items()
    if name not in READ_NO_SETTING
}


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv, capture_output=True, text=True, cwd=REPO_ROOT, timeout=90, env={**os.environ, **env}
    )


@pytest.fixture(scope="module")
def bad_setting_runs(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """``python -m <module>`` of every command's module under a bad setting, four at a time."""
    env = {"SOCIAL_KAFKA_PORT": "x", "SOCIAL_VAR_DIR": str(tmp_path_factory.mktemp("var"))}
    with ThreadPoolExecutor(4) as pool:
        runs = {m: pool.submit(_run, [sys.executable, "-m", m, *argv], env) for m, argv in MODULES.items()}
        return {m: run.result() for m, run in runs.items()}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_python_m_answers_a_bad_setting_with_one_line(module, bad_setting_runs):
    done = bad_setting_runs[module]
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stdout == ""
    [line] = _lines(done.stderr)
    assert re.fullmatch(
        r"python -m [\w.]+: bad setting: SOCIAL_KAFKA_PORT='x': expected int \(docs/configuration\.md\)", line
    ), line


# commands that need a component before anything else, with the component their line names
UNREACHABLE = {
    "tail": (["--max-messages", "1"], "Kafka"),
    "analytics": (["--available-now"], "Kafka"),
    "erase": (["--user-id", "1"], "Redis"),
    "replay": ([], "Redis"),
    "restore": ([], "Redis"),
    "bootstrap": ([], "Kafka"),  # the partitioned layout asks the topic its partitions first
    "speed-layer": ([], "Redis"),
    "archiver": (["--once"], "Redis"),
    "load": ([], "the API"),
}


@pytest.fixture(scope="module")
def unreachable_runs(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """``social <command>`` with Kafka, Redis and the API on ports nobody listens on."""
    from infra.stack import free_port_block

    kafka, redis, api = (free_port_block(1) for _ in range(3))
    env = {
        "SOCIAL_VAR_DIR": str(tmp_path_factory.mktemp("var")),
        "SOCIAL_KAFKA_BOOTSTRAP": f"127.0.0.1:{kafka}",
        "SOCIAL_REDIS_URL": f"redis://127.0.0.1:{redis}/0",
        "SOCIAL_API_PORT": str(api),
    }
    social = str(Path(sys.executable).with_name("social"))
    with ThreadPoolExecutor(4) as pool:
        runs = {c: pool.submit(_run, [social, c, *argv], env) for c, (argv, _) in UNREACHABLE.items()}
        return {c: run.result() for c, run in runs.items()}


@pytest.mark.parametrize("command", sorted(UNREACHABLE))
def test_a_component_that_does_not_answer_is_one_line_naming_it(command, unreachable_runs):
    done = unreachable_runs[command]
    assert done.returncode == 2, done.stderr[-2000:]
    [line] = _lines(done.stderr)
    assert line.startswith(f"social {command}: {UNREACHABLE[command][1]} does not answer: "), line


def test_an_unreachable_redis_is_one_line_naming_it():
    from redis.exceptions import ConnectionError as RedisDown

    from infra.cli import one_line

    down = RedisDown("Error 111 connecting to 127.0.0.1:1. Connection refused.")
    assert one_line("social restore", down) == (
        "social restore: Redis does not answer: Error 111 connecting to 127.0.0.1:1. Connection refused."
    )
    assert one_line("social restore", KeyError("a bug")) is None  # anything else keeps its traceback


def test_a_redis_master_down_under_a_streaming_query_is_one_line_too():
    """The speed layer's processor runs in Spark tasks: PySpark raises the task's exception as text
    inside its own. The text below is the shape of a real one (a master killed under the speed
    layer: tests/integration/test_redis_cluster_stack.py)."""
    from pyspark.errors.exceptions.captured import StreamingQueryException

    from infra.cli import one_line

    text = (
        "[PYTHON_EXCEPTION] An exception was thrown from the Python worker: Traceback (most recent call last):\n"
        '  File "/work/main/pipelines/speed/partitioned.py", line 160, in process\n'
        "ConnectionRefusedError: [Errno 111] Connection refused\n\n"
        "During handling of the above exception, another exception occurred:\n\n"
        "redis.exceptions.ConnectionError: Error 111 connecting to 127.0.0.1:30377. Connection refused.\n"
        "=== Streaming Query ===\nIdentifier: keyed_ns [id = 9ebcb0f1]\n"
    )

    class Stopped(StreamingQueryException):  # PySpark's, with its text, without a JVM behind it
        def __init__(self, text: str):
            Exception.__init__(self, text)

        def __str__(self) -> str:
            return self.args[0]

    assert one_line("python -m pipelines.speed_layer", Stopped(text)) == (
        "python -m pipelines.speed_layer: Redis does not answer: Error 111 connecting to "
        "127.0.0.1:30377. Connection refused. (in a Spark task; the query stopped)"
    )
    # a bug in a task keeps its traceback
    assert one_line("python -m pipelines.speed_layer", Stopped("KeyError: 'x'")) is None


def test_a_bug_keeps_its_traceback_under_python_m():
    from infra.cli import run_main

    def main():
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        run_main(main, "pipelines.verify")


def test_every_console_script_module_has_a_command():
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["social"] == "social.cli:app"
    wrapped = {target for target, _, _ in COMMANDS.values()}
    assert {target for name, target in scripts.items() if name != "social"} <= wrapped


def test_a_bad_flag_exits_2_as_the_modules_argparse_does():
    result = runner.invoke(app, ["verify", "--no-such-flag"])
    assert result.exit_code == 2
    assert "unrecognized arguments: --no-such-flag" in result.output


def test_arguments_pass_untouched_and_the_return_value_is_the_exit_status(monkeypatch):
    import app_sim.load

    seen = []
    monkeypatch.setattr(app_sim.load, "main", lambda argv: seen.append(argv) or 3)
    result = runner.invoke(app, ["load", "--steps", "--", "-u", "5", "--help"])
    assert result.exit_code == 3
    assert seen == [["--steps", "--", "-u", "5", "--help"]]


def test_the_app_imports_no_module_until_a_command_runs():
    probe = (
        "import sys, social.cli; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'infra', 'contract', 'app_sim', 'pipelines', 'stories', 'pyspark', 'airflow', 'great_expectations'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
