"""Local Airflow: metadata in SQLite under ``var/airflow``, DAGs from ``dags/``, no examples.

``python -m infra.airflow env`` prints the environment (``eval "$(python -m infra.airflow env)"``
then any ``airflow ...`` command uses this project's Airflow); ``db`` migrates the metadata DB;
``test DAG_ID [--conf JSON]`` runs one DAG run in-process (``airflow dags test``), which is what the
demo and the integration tests do; ``standalone`` runs scheduler + API server + UI in the
foreground (``SOCIAL_AIRFLOW_STANDALONE=1 make up`` starts it in the background, see
:class:`AirflowService`).

DAG tasks call :func:`run_module`: the same ``python -m ...`` entrypoint a person would run, in a
child process, so Spark never runs inside an Airflow worker and the task log shows its output.
This module is imported by the DAG files: keep it light (no pyspark, no great_expectations).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from infra.settings import REPO_ROOT, Settings, get_settings

DAGS_FOLDER = REPO_ROOT / "dags"
AIRFLOW_BIN = Path(sys.executable).with_name("airflow")


class TaskFailed(RuntimeError):
    """A verdict (exit status 1: mismatch, failed suite): retrying will not change it."""


def airflow_env(settings: Settings | None = None, base: dict | None = None) -> dict[str, str]:
    """Environment for any ``airflow`` command of this project."""
    settings = settings or get_settings()
    home = Path(settings.airflow_home)
    env = dict(os.environ if base is None else base)
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__API__PORT": str(settings.airflow_port),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
            # tasks run `python -m pipelines...` from the repository with the project's settings
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p),
            "SOCIAL_VAR_DIR": str(settings.var_dir),
        }
    )
    return env


def ensure_db(settings: Settings | None = None) -> Path:
    """Create or migrate the SQLite metadata DB (idempotent, seconds)."""
    settings = settings or get_settings()
    home = Path(settings.airflow_home)
    home.mkdir(parents=True, exist_ok=True)
    db = home / "airflow.db"
    stamp = home / ".migrated"
    if db.exists() and stamp.exists() and stamp.read_text() == _airflow_version():
        return db
    done = subprocess.run(
        [str(AIRFLOW_BIN), "db", "migrate"], env=airflow_env(settings), capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    stamp.write_text(_airflow_version())
    return db


def _airflow_version() -> str:
    from importlib.metadata import version

    return version("apache-airflow")


def dags_test(
    dag_id: str,
    settings: Settings | None = None,
    conf: dict | None = None,
    timeout_s: float | None = None,
    capture: bool = False,
) -> subprocess.CompletedProcess:
    """``airflow dags test DAG_ID`` against this project's Airflow; returns the finished process."""
    settings = settings or get_settings()
    ensure_db(settings)
    cmd = [str(AIRFLOW_BIN), "dags", "test", dag_id]
    if conf:
        cmd += ["--conf", json.dumps(conf)]
    return subprocess.run(
        cmd,
        env=airflow_env(settings),
        cwd=REPO_ROOT,
        timeout=timeout_s,
        capture_output=capture,
        text=True,
    )


def dag_run_state(output: str) -> str | None:
    """The final state (``success``/``failed``) from ``airflow dags test`` output, None if it never finished.

    Read from the "DagRun Finished: ... state=..." line, not from task lines (``new_state=success``
    of an upstream task says nothing about the run).
    """
    state = None
    for line in output.splitlines():
        if "DagRun Finished" in line:
            m = re.search(r"[ ,]state=(\w+)", line)
            state = m.group(1) if m else state
    return state


def run_module(module: str, args: list[str] | None = None, *, timeout_s: float | None = None) -> int:
    """Run ``python -m module args`` from the repository, streaming its output into the task log.

    Exit status 0 returns 0; 1 is a verdict (mismatch, failed suite): :class:`TaskFailed`, which a
    DAG turns into a failure without retries; anything else (a crash) is a RuntimeError, retried.
    """
    cmd = [sys.executable, "-m", module, *(args or [])]
    print(f"$ {shlex.join(cmd)}", flush=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p),
    }
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line.rstrip("\n"), flush=True)
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"{module} did not finish within {timeout_s}s") from None
    print(f"{module} exited {code} after {time.monotonic() - started:.0f}s", flush=True)
    if code == 1:
        raise TaskFailed(f"{module} {shlex.join(args or [])}: exit 1")
    if code != 0:
        raise RuntimeError(f"{module} {shlex.join(args or [])}: exit {code}")
    return code


# Opt-in service for `make up` ----------------------------------------------------------------------

try:
    from infra.stack import Service, StackError, port_listening

    class AirflowService(Service):
        """``airflow standalone`` (scheduler, DAG processor, API server + UI) on 127.0.0.1.

        Opt-in: started by ``make up`` only with ``SOCIAL_AIRFLOW_STANDALONE=1``. Metadata in
        SQLite under ``var/airflow``; the admin password standalone generates is in
        ``var/airflow/simple_auth_manager_passwords.json.generated``.
        """

        name = "airflow"
        marker = "airflow"
        ready_timeout_s = 240.0
        stop_timeout_s = 60.0

        def ports(self) -> list[int]:
            return [self.settings.airflow_port] if self.settings.airflow_standalone else []

        def start(self) -> str:
            if not self.settings.airflow_standalone and not self.is_running():
                return "disabled (SOCIAL_AIRFLOW_STANDALONE=1 enables it)"
            return super().start()

        def env(self):
            return airflow_env(self.settings)

        def prepare(self) -> None:
            ensure_db(self.settings)

        def command(self) -> list[str]:
            return [str(AIRFLOW_BIN), "standalone"]

        def wait_ready(self, deadline: float) -> None:
            while not port_listening(self.settings.airflow_port):
                if not self.is_running():
                    raise self._died()
                if time.monotonic() > deadline:
                    raise StackError(
                        f"airflow did not listen on {self.settings.airflow_port}; see {self.log_file}"
                    )
                time.sleep(1)

except ImportError:  # pragma: no cover - infra.stack needs confluent_kafka at call time only
    AirflowService = None  # type: ignore[assignment,misc]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m infra.airflow", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("env", help="print `export` lines for this project's Airflow")
    sub.add_parser("db", help="create/migrate the metadata DB")
    t = sub.add_parser("test", help="airflow dags test DAG_ID")
    t.add_argument("dag_id")
    t.add_argument("--conf", help="JSON params for the run")
    sub.add_parser("standalone", help="airflow standalone in the foreground")
    args = p.parse_args(argv)
    settings = get_settings()
    if args.command == "env":
        env = airflow_env(settings, base={})
        print("\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items()))
    elif args.command == "db":
        print(ensure_db(settings))
    elif args.command == "test":
        return dags_test(args.dag_id, settings, json.loads(args.conf) if args.conf else None).returncode
    elif args.command == "standalone":
        ensure_db(settings)
        os.execve(str(AIRFLOW_BIN), [str(AIRFLOW_BIN), "standalone"], airflow_env(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
