"""The start-up check of a Redis the project did not start (infra/external.py), against a real
redis-server that asks for a password (``--requirepass``), started here in milliseconds: each
problem is one line naming the server (its password masked) and what the design needs."""

from __future__ import annotations

import random
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from infra import clients, external, stack
from infra.external import ExternalUnfit, check_redis, redis_problems
from infra.processes import port_free
from infra.settings import Settings

PASSWORD = "s3cret-redis"
PORTS = range(19000, 20000)  # this suite's own range, beside the stacks of other test runs


def free_port() -> int:
    rng = random.Random()
    for _ in range(200):
        port = rng.choice(PORTS)
        if port_free(port):
            return port
    raise RuntimeError("no free port in 19000-19999")


@pytest.fixture(scope="module")
def redis_with_password(tmp_path_factory):
    """A redis-server with requirepass and an append-only file, as an operator would run it."""
    server = shutil.which("redis-server")
    if server is None:
        pytest.fail("redis-server not on PATH: run `make setup`")
    port = free_port()
    d: Path = tmp_path_factory.mktemp("redis-auth")
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--requirepass", PASSWORD, "--save", "",
         "--appendonly", "yes", "--maxmemory-policy", "noeviction", "--dir", str(d)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"redis://:{PASSWORD}@127.0.0.1:{port}/0"
    client = clients.redis_client(url, "probe")
    deadline = time.monotonic() + 20
    while True:
        try:
            client.ping()
            break
        except Exception:  # noqa: BLE001 - not up yet
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail("redis-server did not start")
            time.sleep(0.05)
    yield port, client
    client.close()
    proc.kill()  # scratch data: no AOF rewrite to wait for at shutdown (appendonly is toggled below)
    proc.wait(10)


def settings_for(url: str) -> Settings:
    return Settings(redis_url=url, redis_external=1)


def test_a_fit_redis_passes_and_its_password_is_never_shown(redis_with_password):
    port, _ = redis_with_password
    line = check_redis(settings_for(f"redis://:{PASSWORD}@127.0.0.1:{port}/0"))
    assert line.startswith(f"redis at redis://:***@127.0.0.1:{port}/0: Redis 7.")
    assert "maxmemory-policy noeviction, appendonly yes" in line
    assert PASSWORD not in line


@pytest.mark.parametrize("url_auth", ["", ":wrong@"], ids=["no password", "wrong password"])
def test_without_the_password_it_is_one_line_about_authentication(redis_with_password, url_auth):
    port, _ = redis_with_password
    with pytest.raises(ExternalUnfit) as failed:
        check_redis(settings_for(f"redis://{url_auth}127.0.0.1:{port}/0"))
    (line,) = failed.value.problems
    assert line.startswith(
        f"redis at redis://{':***@' if url_auth else ''}127.0.0.1:{port}/0: authentication failed"
    )
    assert line.endswith("check the password in SOCIAL_REDIS_URL")
    assert "wrong" not in line and "\n" not in line


def test_an_unreachable_redis_is_one_line():
    port = free_port()  # nobody listens there
    with pytest.raises(ExternalUnfit) as failed:
        check_redis(settings_for(f"redis://:{PASSWORD}@127.0.0.1:{port}/0"))
    (line,) = failed.value.problems
    assert line.startswith(f"redis at redis://:***@127.0.0.1:{port}/0: unreachable (")
    assert PASSWORD not in line and "\n" not in line


def test_eviction_and_no_append_only_file_are_a_line_each(redis_with_password):
    port, client = redis_with_password
    client.config_set("maxmemory-policy", "allkeys-lru")
    client.config_set("appendonly", "no")
    try:
        with pytest.raises(ExternalUnfit) as failed:
            check_redis(settings_for(f"redis://:{PASSWORD}@127.0.0.1:{port}/0"))
    finally:
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("appendonly", "yes")
    where = f"redis at redis://:***@127.0.0.1:{port}/0"
    assert failed.value.problems == [
        f"{where}: maxmemory-policy is allkeys-lru, needs noeviction (an evicted key is serving state lost without a trace)",
        f"{where}: appendonly is no, needs yes (the archiver archives only what Redis's append-only file holds)",
    ]


def test_the_verdicts_on_redis_facts():
    fit = {"redis_version": "7.2.4", "maxmemory_policy": "noeviction", "aof_enabled": 1}
    assert redis_problems("redis at r", fit) == []
    old = redis_problems("redis at r", {**fit, "redis_version": "6.2.14"})
    assert old == ["redis at r: version 6.2.14, the serving store needs 7.0 or later (Redis functions)"]
    assert redis_problems("redis at r", {**fit, "redis_version": "10.0.1"}) == []
    assert len(redis_problems("redis at r", {})) == 3  # INFO without the fields: nothing is assumed


def test_make_up_checks_an_external_redis_before_starting_anything(redis_with_password, tmp_path, capsys):
    """`up` with SOCIAL_REDIS_EXTERNAL=1 starts no redis-server, and an unfit one stops it before
    anything starts: the stack's CLI prints each problem as one `error:` line, exit 1."""
    port, client = redis_with_password
    settings = Settings(
        redis_url=f"redis://:wrong@127.0.0.1:{port}/0", redis_external=1, var_dir=tmp_path / "var"
    )
    up = stack.Stack(settings, service_types=stack.BACKBONE)
    assert not [s for s in up.services if s.name == "redis"]
    with pytest.raises(ExternalUnfit):
        up.up()
    assert not (tmp_path / "var" / "run").exists()  # nothing was started
    row = up.status()[0]
    assert row[:2] == ("redis", "external") and ":***@" in row[3] and "wrong" not in row[3]


def test_the_check_command_prints_one_error_line_per_problem(redis_with_password, monkeypatch, capsys):
    port, _ = redis_with_password
    monkeypatch.setenv("SOCIAL_REDIS_EXTERNAL", "1")
    monkeypatch.setenv("SOCIAL_REDIS_URL", f"redis://:wrong@127.0.0.1:{port}/0")
    assert external.main([]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"error: redis at redis://:***@127.0.0.1:{port}/0: authentication failed"
    )
    monkeypatch.setenv("SOCIAL_REDIS_URL", f"redis://:{PASSWORD}@127.0.0.1:{port}/0")
    assert external.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ok: redis at redis://:***@") and PASSWORD not in out


def test_a_tls_redis_with_a_password_is_checked_through_its_rediss_url(tmp_path):
    """``rediss://`` with ``?ssl_ca_certs=``: the check (and every client: the same factory) speaks
    TLS to a real redis-server that accepts nothing else; without the CA it is one line."""
    from tests.certs import tls_files

    tls = tls_files(tmp_path)
    ca, cert, key = tls.ca, tls.server_cert, tls.server_key
    port = free_port()
    proc = subprocess.Popen(
        [shutil.which("redis-server") or "redis-server", "--port", "0", "--tls-port", str(port),
         "--bind", "127.0.0.1", "--tls-cert-file", str(cert), "--tls-key-file", str(key),
         "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no", "--requirepass", PASSWORD,
         "--appendonly", "yes", "--save", "", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"rediss://:{PASSWORD}@127.0.0.1:{port}/0?ssl_ca_certs={ca}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                line = check_redis(settings_for(url))
                break
            except ExternalUnfit as exc:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError(f"the TLS redis-server did not answer: {exc}") from None
                time.sleep(0.05)
        assert line.startswith(f"redis at rediss://:***@127.0.0.1:{port}/0?ssl_ca_certs={ca}: Redis 7.")
        with pytest.raises(ExternalUnfit) as failed:  # the server's certificate is not trusted
            check_redis(settings_for(f"rediss://:{PASSWORD}@127.0.0.1:{port}/0"))
        (problem,) = failed.value.problems
        assert problem.startswith(f"redis at rediss://:***@127.0.0.1:{port}/0: unreachable (")
        assert "certificate verify failed" in problem and PASSWORD not in problem
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.redis_cluster
def test_a_users_redis_cluster_is_checked_master_by_master(redis_cluster):
    """A user's own Redis Cluster (its address in SOCIAL_REDIS_URL): every master must keep its
    append-only file and refuse eviction; a master that does not is named, and the keyed layout,
    which cannot run on a cluster, is one line too."""
    url = redis_cluster.url
    assert check_redis(settings_for(url)) == (
        f"redis at {url}: a Redis Cluster of 3 masters, each "
        + clients.redis_client(url, "probe").info("server")["redis_version"]
        + ", maxmemory-policy noeviction, appendonly yes"
    )
    last = redis_cluster.ports[-1]
    node = clients.redis_client(f"redis://127.0.0.1:{last}/0", "probe", cluster=False)
    node.config_set("maxmemory-policy", "allkeys-lru")
    try:
        with pytest.raises(ExternalUnfit) as got:
            check_redis(Settings(redis_url=url, redis_external=1, serving_layout="keyed"))
        assert got.value.problems == [
            f"redis at {url}: a Redis Cluster, where SOCIAL_SERVING_LAYOUT=keyed cannot run (its calls "
            "span slots): set SOCIAL_SERVING_LAYOUT=partitioned",
            f"redis at {url}, master 127.0.0.1:{last}: maxmemory-policy is allkeys-lru, needs noeviction "
            "(an evicted key is serving state lost without a trace)",
        ]
    finally:
        node.config_set("maxmemory-policy", "noeviction")
