"""An Airflow plugin: the API server serves ``var/reports/`` at ``/reports/``, so a task's "Report"
link (:class:`infra.airflow_job.ReportLink`) opens the page its job wrote, in the browser that shows
the Airflow UI (a ``file://`` link from an http page is blocked by browsers).

Loaded from ``AIRFLOW__CORE__PLUGINS_FOLDER`` (:func:`infra.airflow.airflow_env`). Read-only static
files; like the rest of this local Airflow it asks for no login (a single-person Airflow on
127.0.0.1: docs/running.md, make airflow).
"""

from __future__ import annotations

from pathlib import Path

from airflow.plugins_manager import AirflowPlugin
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from infra.airflow_job import REPORTS_PREFIX
from infra.settings import get_settings


def reports_app(directory: Path) -> FastAPI:
    """``directory`` as static files; ``index.html`` for a folder (Data Docs' ``quality/``)."""
    app = FastAPI(title="kappa-social reports", openapi_url=None, docs_url=None, redoc_url=None)
    app.mount("/", StaticFiles(directory=directory, html=True, check_dir=False), name="reports")
    return app


class SocialReports(AirflowPlugin):
    name = "social_reports"
    fastapi_apps = [
        {
            "app": reports_app(Path(get_settings().reports_dir)),
            "url_prefix": REPORTS_PREFIX,
            "name": "kappa-social reports",
        }
    ]
