"""Local Airflow: metadata in SQLite under ``var/airflow``, DAGs from ``dags/``, no examples.

``python -m infra.airflow env`` prints the environment (``eval "$(python -m infra.airflow env)"``
then any ``airflow ...`` command uses this project's Airflow); ``db`` migrates the metadata DB and
provisions it (the ``spark`` pool, the failure notices' connection: :func:`provision`);
``test DAG_ID [--conf JSON]`` runs one DAG run with ``dag.test()`` (exit 1 when the run failed),
which is what the demo and the integration tests do; ``standalone`` runs scheduler + API server +
UI in the foreground (``make airflow``; ``SOCIAL_AIRFLOW_STANDALONE=1 make up`` starts it in the
background, :class:`infra.stack.AirflowService`).

The DAG tasks themselves are :class:`infra.airflow_job.JobOperator`: the same ``python -m ...``
entrypoint a person would run, in a child process. Light: no pyspark, no great_expectations.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from infra.cli import command_name, run_main
from infra.settings import REPO_ROOT, Settings, get_settings

DAGS_FOLDER = REPO_ROOT / "dags"
PLUGINS_FOLDER = REPO_ROOT / "infra" / "airflow_plugins"
AIRFLOW_BIN = Path(sys.executable).with_name("airflow")


def airflow_env(settings: Settings | None = None, base: dict | None = None) -> dict[str, str]:
    """Environment for any ``airflow`` command of this project."""
    settings = settings or get_settings()
    home = Path(settings.airflow_home)
    env = dict(os.environ if base is None else base)
    env.update(
        {
            # `airflow standalone` starts its scheduler, API server, ... as `airflow` from PATH
            "PATH": os.pathsep.join(p for p in (str(AIRFLOW_BIN.parent), env.get("PATH", "")) if p),
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
            # the API server serves var/reports/ at /reports/: the tasks' "Report" links
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS_FOLDER),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__API__PORT": str(settings.airflow_port),
            # where task processes report to: the API server on this port, not Airflow's default 8080
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{settings.airflow_port}/execution/",
            # 127.0.0.1 unless told otherwise (the compose container binds 0.0.0.0)
            "AIRFLOW__API__HOST": env.get("AIRFLOW__API__HOST", "127.0.0.1"),
            # a local, single-person Airflow: no login (docs/running.md: make airflow); DAGs still start paused
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
            "SOCIAL_VAR_DIR": str(settings.var_dir),
        }
    )
    return env


def ensure_db(settings: Settings | None = None) -> Path:
    """Create or migrate the SQLite metadata DB, then :func:`provision` it (idempotent, seconds)."""
    settings = settings or get_settings()
    home = Path(settings.airflow_home)
    home.mkdir(parents=True, exist_ok=True)
    db = home / "airflow.db"
    stamp = home / ".migrated"
    # what the DB was last made for: Airflow's version (its schema) and the spark pool's slots
    made_for = f"{_airflow_version()} spark={settings.airflow_spark_slots}"
    if db.exists() and stamp.exists() and stamp.read_text() == made_for:
        return db
    env = airflow_env(settings)
    for step in ([str(AIRFLOW_BIN), "db", "migrate"], [sys.executable, "-m", "infra.airflow", "provision"]):
        done = subprocess.run(step, env=env, cwd=REPO_ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(step[-2:])} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    stamp.write_text(made_for)
    return db


def provision(settings: Settings) -> dict:
    """What the DAGs expect of the metadata DB besides its schema: the ``spark`` pool with
    SOCIAL_AIRFLOW_SPARK_SLOTS slots, and the failure notices' connection when none exists yet
    (one given by the user, in the DB or as ``AIRFLOW_CONN_SOCIAL_FAILURES``, is left alone).
    Run in a process with :func:`airflow_env` (``python -m infra.airflow provision``)."""
    from airflow.models import Connection
    from airflow.models.pool import Pool
    from airflow.utils.session import create_session

    from infra.airflow_job import SPARK_POOL
    from infra.airflow_notice import CONNECTION_ID, default_connection

    Pool.create_or_update_pool(
        SPARK_POOL,
        settings.airflow_spark_slots,
        "tasks that start a Spark driver (infra/airflow_job.py): SOCIAL_AIRFLOW_SPARK_SLOTS at once",
        include_deferred=False,
    )
    with create_session() as session:
        exists = session.query(Connection).filter(Connection.conn_id == CONNECTION_ID).first() is not None
        if not exists and f"AIRFLOW_CONN_{CONNECTION_ID.upper()}" not in os.environ:
            conn = default_connection(settings.var_dir)
            session.add(
                Connection(
                    conn_id=CONNECTION_ID,
                    conn_type=conn["conn_type"],
                    description=conn["description"],
                    extra=json.dumps(conn["extra"]),
                )
            )
    return {"pool": SPARK_POOL, "slots": settings.airflow_spark_slots, "connection": CONNECTION_ID}


def _airflow_version() -> str:
    from importlib.metadata import version

    return version("apache-airflow")


def dags_test(
    dag_id: str,
    settings: Settings | None = None,
    conf: dict | None = None,
    timeout_s: float | None = None,
    capture: bool = False,
    base_env: dict | None = None,
) -> subprocess.CompletedProcess:
    """One run of ``dag_id`` with ``dag.test()`` in a child process with this project's Airflow.

    Exit status 0 when the run succeeded, 1 when it failed; its last output line is the run as
    JSON (``{"dag_id", "state", "tasks": {task_id: state}}``).
    """
    settings = settings or get_settings()
    ensure_db(settings)
    cmd = [sys.executable, "-m", "infra.airflow", "run-in-process", dag_id]
    if conf:
        cmd += ["--conf", json.dumps(conf)]
    return subprocess.run(
        cmd,
        env=airflow_env(settings, base=base_env),
        cwd=REPO_ROOT,
        timeout=timeout_s,
        capture_output=capture,
        text=True,
    )


def run_in_process(dag_id: str, conf: dict | None = None) -> dict:
    """``dag.test()`` of one DAG of ``dags/`` in this process (its environment: :func:`airflow_env`)."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS_FOLDER))
    if bag.import_errors:
        raise RuntimeError(f"DAG import errors: {bag.import_errors}")
    run = bag.dags[dag_id].test(run_conf=conf or {})
    return {
        "dag_id": dag_id,
        "state": str(run.state),
        "tasks": {ti.task_id: str(ti.state) for ti in run.get_task_instances()},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=command_name("infra.airflow"), description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("env", help="print `export` lines for this project's Airflow")
    sub.add_parser("db", help="create/migrate the metadata DB")
    t = sub.add_parser("test", help="one run of DAG_ID (dag.test() in a child process); exit 1 if it failed")
    t.add_argument("dag_id")
    t.add_argument("--conf", help="JSON params for the run")
    r = sub.add_parser("run-in-process", help="dag.test() of DAG_ID in this process (what `test` runs)")
    r.add_argument("dag_id")
    r.add_argument("--conf", help="JSON params for the run")
    sub.add_parser("standalone", help="airflow standalone in the foreground")
    sub.add_parser("provision", help="the spark pool and the failure notices' connection (what `db` runs)")
    args = p.parse_args(argv)
    settings = get_settings()
    if args.command == "env":
        env = airflow_env(settings, base={})
        print("\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items()))
    elif args.command == "db":
        print(ensure_db(settings))
    elif args.command == "test":
        return dags_test(args.dag_id, settings, json.loads(args.conf) if args.conf else None).returncode
    elif args.command == "run-in-process":
        run = run_in_process(args.dag_id, json.loads(args.conf) if args.conf else None)
        print(json.dumps(run))
        return 0 if run["state"] == "success" else 1
    elif args.command == "provision":
        print(json.dumps(provision(settings)))
    elif args.command == "standalone":
        ensure_db(settings)
        os.execve(str(AIRFLOW_BIN), [str(AIRFLOW_BIN), "standalone"], airflow_env(settings))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "infra.airflow"))
