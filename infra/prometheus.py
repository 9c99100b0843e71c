"""Prometheus for the local stack, opt-in (``SOCIAL_PROMETHEUS=1``): Debian's ``prometheus``
package, its configuration, and the alert rules of ``infra/prometheus_rules/alerts.yml``.

The package is used as shipped but not installed system-wide: ``make setup`` (``social
ensure-prometheus``) takes ``prometheus`` and ``promtool`` from PATH if they are there, else
fetches the package with ``apt-get download`` and unpacks it with ``dpkg -x`` under
``.tools/prometheus/`` (no root, no daemon started by the package's scripts, nothing on port 9090
behind the project's back). :class:`infra.services.PrometheusServer` then runs it like the
stack's other processes, on 127.0.0.1:SOCIAL_PROMETHEUS_PORT, its data under
``var/prometheus/``, scraping the metrics exporter and the API every 5 s.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from infra.processes import StackError
from infra.settings import REPO_ROOT, Settings

TOOLS = REPO_ROOT / ".tools" / "prometheus"
RULES = REPO_ROOT / "infra" / "prometheus_rules" / "alerts.yml"
RULE_TESTS = REPO_ROOT / "infra" / "prometheus_rules" / "alerts_test.yml"
PACKAGE = "prometheus"  # Debian's (bookworm: 2.42)
SCRAPE_INTERVAL_S = 5


def binary(name: str = "prometheus") -> Path | None:
    """``prometheus`` or ``promtool``: on PATH, else unpacked under .tools/prometheus; None if neither."""
    found = shutil.which(name)
    if found:
        return Path(found)
    unpacked = TOOLS / "usr" / "bin" / name
    return unpacked if unpacked.exists() else None


def ensure_prometheus() -> Path:
    """The ``prometheus`` binary, fetched from the Debian archive and unpacked if missing."""
    found = binary()
    if found is not None:
        return found
    if not (shutil.which("apt-get") and shutil.which("dpkg")):
        raise StackError(
            "prometheus is not on PATH and there is no apt-get/dpkg to fetch Debian's package: install "
            "Prometheus (2.x) or set SOCIAL_PROMETHEUS=0"
        )
    with tempfile.TemporaryDirectory() as tmp:
        got = subprocess.run(["apt-get", "download", PACKAGE], cwd=tmp, capture_output=True, text=True)
        debs = sorted(Path(tmp).glob(f"{PACKAGE}_*.deb"))
        if got.returncode != 0 or not debs:
            raise StackError(
                f"apt-get download {PACKAGE} failed ({(got.stderr or got.stdout).strip()[-300:]}); "
                "run `apt-get update` first, or set SOCIAL_PROMETHEUS=0"
            )
        TOOLS.mkdir(parents=True, exist_ok=True)
        subprocess.run(["dpkg", "-x", str(debs[-1]), str(TOOLS)], check=True)
    found = binary()
    if found is None:
        raise StackError(f"{PACKAGE}'s package held no usr/bin/prometheus")
    return found


def data_dir(settings: Settings) -> Path:
    return Path(settings.var_dir) / "prometheus"


def config(settings: Settings) -> str:
    """prometheus.yml for this stack: the exporter and the API, the project's alert rules."""
    return render_config(
        exporter=f"127.0.0.1:{settings.metrics_port}",
        api=f"{settings.api_host}:{settings.api_port}",
        rules=str(RULES),
        written_by="infra/prometheus.py at each start: edits are lost",
    )


# docker-compose.yml's Prometheus (profile `monitoring`) reads this file: the same scrapes and rules as
# `SOCIAL_PROMETHEUS=1 make up`'s, its targets the compose services (tests/unit/test_prometheus.py
# checks it is what compose_config() writes)
COMPOSE_CONFIG = REPO_ROOT / "infra" / "compose" / "prometheus.yml"
COMPOSE_RULES = "/etc/prometheus/rules/alerts.yml"  # where docker-compose.yml mounts RULES


def compose_config() -> str:
    return render_config(
        exporter="metrics:9464",
        api="api:8000",
        rules=COMPOSE_RULES,
        written_by="infra/prometheus.py (compose_config) for docker-compose.yml's prometheus",
    )


def render_config(exporter: str, api: str, rules: str, written_by: str) -> str:
    return (
        f"# written by {written_by}\n"
        "global:\n"
        f"  scrape_interval: {SCRAPE_INTERVAL_S}s\n"
        f"  evaluation_interval: {SCRAPE_INTERVAL_S}s\n"
        "rule_files:\n"
        f"  - {rules}\n"
        "scrape_configs:\n"
        "  - job_name: social_exporter\n"
        "    static_configs:\n"
        f"      - targets: ['{exporter}']\n"
        "  - job_name: social_api\n"
        "    static_configs:\n"
        f"      - targets: ['{api}']\n"
    )


def write_config(settings: Settings) -> Path:
    path = data_dir(settings) / "prometheus.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config(settings))
    return path
