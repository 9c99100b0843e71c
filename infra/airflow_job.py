"""The one Airflow operator of the DAGs: run a job's own CLI (``python -m pipelines.<job> ...``) as a child.

:class:`JobOperator` runs the module through Airflow's :class:`SubprocessHook` in the repository,
so Spark and Great Expectations never load in an Airflow worker, the task log shows the job's
output line by line, and what a DAG does is exactly what a person can run by hand.

* Exit status 0: success. 1: a verdict (mismatch, failed suite, a namespace that does not verify):
  :class:`AirflowFailException`, failed without retries, since rerunning gives the same answer.
  Anything else (a crash, a broker away): :class:`AirflowException`, retried as the task says.
* ``on_kill`` (the task timed out, was marked failed, or its worker is stopping): SIGTERM to the
  job's whole process group (the Python driver and the Spark JVM it launched), SIGKILL after
  ``kill_grace_s`` if anything of it is left. The hook starts the child in a session of its own,
  so the group is exactly the job.
* ``flag_params`` turns non-empty DAG params into flags (``{"namespace": "--namespace"}``);
  ``enabled_param`` names a boolean param that, when false, skips the task.
* ``spark`` (the default): the job starts a Spark driver, so the task runs in the :data:`SPARK_POOL`
  pool, whose slots (``SOCIAL_AIRFLOW_SPARK_SLOTS``, 1 by default) bound how many Spark jobs the
  DAGs run at once; several DAGs are due at the same minute. ``spark=False`` for a job that starts
  none (a file sweep, the switch).
* ``report``: the page the job writes, under ``var/reports/`` (``verify/latest.html``): the task's
  extra link (:class:`ReportLink`, the "Report" button of the task in the UI), served by the API
  server at ``/reports/`` (infra/airflow_plugins/social_reports.py).

Imported by the DAG files: light (no pyspark, no great_expectations).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from airflow.providers.standard.hooks.subprocess import SubprocessHook
from airflow.sdk import Asset, AssetOrTimeSchedule, BaseOperator, BaseOperatorLink, CronTriggerTimetable
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from infra.settings import REPO_ROOT, get_settings

VERDICT = 1  # the exit status every job uses for "checked, and the answer is no"

# Emitted by rebuild_views' switch when a new namespace goes live: verify_views and data_quality
# run right after it, besides their own schedule.
LIVE_VIEWS = Asset(name="live_views", uri="social://views/live")


# The pool of every task that starts a Spark driver (created by `python -m infra.airflow db`).
SPARK_POOL = "spark"
REPORTS_PREFIX = "/reports"  # where the API server serves var/reports/ (infra/airflow_plugins/)


def report_url(report: str) -> str:
    """The URL of ``var/reports/<report>`` as this project's Airflow API server serves it."""
    return f"http://127.0.0.1:{get_settings().airflow_port}{REPORTS_PREFIX}/{report}"


class ReportLink(BaseOperatorLink):
    """The task's "Report" button: the page its job writes (empty for a job that writes none).

    Airflow 3 computes it when the task ends, in the worker, and keeps it as an XCom the UI reads."""

    name = "Report"

    def get_link(self, operator, *, ti_key) -> str:
        report = getattr(operator, "report", None)
        return report_url(report) if report else ""


def on_cron_or_switch(cron: str) -> AssetOrTimeSchedule:
    """A schedule: ``cron`` (UTC), and each time a rebuild switches the live namespace."""
    return AssetOrTimeSchedule(timetable=CronTriggerTimetable(cron, timezone="UTC"), assets=[LIVE_VIEWS])


class JobOperator(BaseOperator):
    """``python -m module *args`` through :class:`SubprocessHook`; exit 1 fails without retry."""

    template_fields: Sequence[str] = ("args",)
    ui_color = "#e8f1fb"
    operator_extra_links = (ReportLink(),)

    def __init__(
        self,
        *,
        module: str,
        args: Sequence[str] = (),
        flag_params: Mapping[str, str] | None = None,
        enabled_param: str | None = None,
        verdict: str = "the job's verdict is negative",
        kill_grace_s: float = 30.0,
        spark: bool = True,
        report: str | None = None,
        **kwargs,
    ) -> None:
        if spark:
            kwargs.setdefault("pool", SPARK_POOL)
        super().__init__(**kwargs)
        self.spark = spark
        self.report = report
        self.module = module
        self.args = list(args)
        self.flag_params = dict(flag_params or {})
        self.enabled_param = enabled_param
        self.verdict = verdict
        self.kill_grace_s = kill_grace_s
        self.hook: SubprocessHook | None = None

    def command(self, params: Mapping) -> list[str]:
        flags = [
            x for name, flag in self.flag_params.items() if params.get(name) for x in (flag, params[name])
        ]
        return [sys.executable, "-m", self.module, *[str(a) for a in self.args], *flags]

    def execute(self, context) -> int:
        params = context.get("params") or {}
        if self.enabled_param and not params.get(self.enabled_param, True):
            raise AirflowSkipException(f"{self.enabled_param}=false")
        self.hook = SubprocessHook()
        # the job reads the same SOCIAL_* settings as the worker; output unbuffered into the task log
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        result = self.hook.run_command(self.command(params), env=env, cwd=str(REPO_ROOT))
        if result.exit_code == VERDICT:
            raise AirflowFailException(f"{self.verdict} ({self.module}: exit 1; last line: {result.output})")
        if result.exit_code != 0:
            raise AirflowException(f"{self.module} exited {result.exit_code}: {result.output}")
        return result.exit_code

    def on_kill(self) -> None:
        hook = self.hook
        proc = hook.sub_process if hook else None
        if hook is None or proc is None or proc.poll() is not None:
            return
        pgid = os.getpgid(proc.pid)
        hook.send_sigterm()  # the whole group: the Python driver and its Spark JVM
        deadline = time.monotonic() + self.kill_grace_s
        while time.monotonic() < deadline and _group_alive(pgid):
            if proc.poll() is None:
                try:
                    proc.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    pass
            else:
                time.sleep(0.2)
        if _group_alive(pgid):
            self.log.warning("process group %s outlived SIGTERM by %ss: SIGKILL", pgid, self.kill_grace_s)
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.poll()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
