"""Prometheus, opt-in (SOCIAL_PROMETHEUS=1, infra/prometheus.py): the alert rules fire on series shaped
like the stack's and stay quiet on a healthy one (``promtool test rules``, Prometheus's own rule
tester), and the server ``make up`` starts loads them and scrapes the real metrics exporter.

Both need Debian's ``prometheus`` package (``SOCIAL_PROMETHEUS=1 make setup`` fetches and unpacks
it under .tools/prometheus): without it they are skipped, saying so.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request

import pytest

from infra.prometheus import RULE_TESTS, RULES, binary, config

needs_promtool = pytest.mark.skipif(
    binary("promtool") is None,
    reason="no promtool: SOCIAL_PROMETHEUS=1 make setup fetches Debian's prometheus",
)


@needs_promtool
def test_the_alert_rules_fire_when_the_speed_layer_stops_under_load_and_not_before():
    checked = subprocess.run(
        [str(binary("promtool")), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 5 rules found" in checked.stdout
    tested = subprocess.run(
        [str(binary("promtool")), "test", "rules", RULE_TESTS.name],
        cwd=RULE_TESTS.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_the_configuration_scrapes_the_exporter_and_the_api_with_the_rules(tmp_path):
    from infra.settings import get_settings

    settings = get_settings(var_dir=tmp_path, metrics_port=29464, api_port=29800)
    text = config(settings)
    assert "targets: ['127.0.0.1:29464']" in text and f"targets: ['{settings.api_host}:29800']" in text
    assert f"  - {RULES}\n" in text


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return json.loads(answer.read())


@needs_promtool
def test_make_up_starts_prometheus_which_loads_the_rules_and_scrapes_the_exporter(tmp_path):
    from infra.services import SERVICES, MetricsExporter, PrometheusServer
    from infra.settings import get_settings
    from infra.stack import free_port_block, port_listening

    assert SERVICES.index(PrometheusServer) == SERVICES.index(MetricsExporter) + 1
    kafka, redis, metrics, prom = (free_port_block(1) for _ in range(4))
    settings = get_settings(
        var_dir=tmp_path,
        prometheus=1,
        prometheus_port=prom,
        metrics_port=metrics,
        kafka_bootstrap=f"127.0.0.1:{kafka}",
        redis_url=f"redis://127.0.0.1:{redis}/0",
    )
    off = PrometheusServer(get_settings(var_dir=tmp_path, prometheus=0))
    assert off.start() == "off (SOCIAL_PROMETHEUS=1 starts it)" and off.ports() == []
    exporter, server = MetricsExporter(settings), PrometheusServer(settings)
    try:
        assert exporter.start() == "started"
        assert server.start() == "started"
        base = f"http://127.0.0.1:{prom}/api/v1"
        rules = _get(f"{base}/rules")["data"]["groups"]
        assert sorted(r["name"] for g in rules for r in g["rules"]) == [
            "SocialArchiveLag",
            "SocialExporterDown",
            "SocialFreshnessP99",
            "SocialServingLag",
            "SocialServingStalled",
        ]
        # the exporter's first scrape: up, and (no Kafka or Redis listening) social_exporter_up 0
        deadline = time.monotonic() + 30
        while True:
            found = _get(f"{base}/query?query=social_exporter_up")["data"]["result"]
            if found or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert [r["value"][1] for r in found] == ["0"]
        targets = _get(f"{base}/targets")["data"]["activeTargets"]
        assert {t["labels"]["job"]: t["health"] for t in targets}["social_exporter"] == "up"
    finally:
        server.stop()
        exporter.stop()
    assert not port_listening(prom) and not port_listening(metrics)


def test_composes_prometheus_reads_the_config_the_code_writes():
    """docker-compose.yml's prometheus (profile monitoring): the same scrapes and rules as make up's."""
    from infra.prometheus import COMPOSE_CONFIG, COMPOSE_RULES, compose_config
    from infra.settings import get_settings

    assert COMPOSE_CONFIG.read_text() == compose_config(), (
        "infra/compose/prometheus.yml is stale: python -c 'from infra.prometheus import *; "
        "COMPOSE_CONFIG.write_text(compose_config())'"
    )
    local = config(get_settings(metrics_port=9464, api_port=8000))
    swap = {"127.0.0.1:9464": "metrics:9464", "127.0.0.1:8000": "api:8000", str(RULES): COMPOSE_RULES}
    for a, b in swap.items():
        local = local.replace(a, b)
    assert local.splitlines()[1:] == compose_config().splitlines()[1:]  # all but the "written by" line
