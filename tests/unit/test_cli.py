"""The ``social`` command line (social/cli.py): every command reaches its module's own parser, the
module's exit status is the command's, and ``social --help`` loads none of them."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest
from typer.testing import CliRunner

from infra.settings import REPO_ROOT
from social.cli import COMMANDS, app

# command -> a flag (or, for a module without flags, the usage line) its module's --help shows
OWN_HELP = {
    "up": "{up,down,status,ensure-redis}",
    "down": "{up,down,status,ensure-redis}",
    "status": "{up,down,status,ensure-redis}",
    "ensure-redis": "{up,down,status,ensure-redis}",
    "check-external": "usage: social check-external",
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


# commands that read the settings first thing, each with its one line for a bad value
BAD_SETTING = [
    ["status"],
    ["archiver"],
    ["restore"],
    ["generate"],
    ["replay"],
    ["rebuild", "status"],
    ["tail"],
]


@pytest.mark.parametrize("argv", BAD_SETTING, ids=" ".join)
def test_a_bad_setting_is_one_line_naming_it(argv):
    command = argv[0]
    result = runner.invoke(app, argv, env={"SOCIAL_KAFKA_PORT": "x"})
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == [
        f"social {command}: bad setting: SOCIAL_KAFKA_PORT='x': expected int (docs/configuration.md)"
    ]


def test_an_unreachable_redis_is_one_line_naming_it():
    from redis.exceptions import ConnectionError as RedisDown

    from social.cli import one_line

    down = RedisDown("Error 111 connecting to 127.0.0.1:1. Connection refused.")
    assert one_line("restore", down) == (
        "social restore: Redis does not answer: Error 111 connecting to 127.0.0.1:1. Connection refused."
    )
    assert one_line("restore", KeyError("a bug")) is None  # anything else keeps its traceback


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
