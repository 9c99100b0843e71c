"""Each injected fault makes dual writes diverge from the log; the log design never does.

A small seeded run through the real API (``python -m app_sim.api``, 2 uvicorn workers, as
``make up`` runs it), Kafka and Redis, per write mode: users are registered through a fault-free
API, then one API per fault (only that fault on) serves a scenario that fault can hurt:

- ``crash`` (250 per mille): 12 messages to one inbox, retried after the dropped connection;
- ``race`` (every counter update held up to 300 ms): 12 messages to one inbox at once;
- ``timeout`` (every write on this API stalls 3 s just before its log append, the client gives
  up after 0.4 s; its retry with the same key is answered 409, the original being in flight):
  status "first" through it, then the same user's status "second" through a second, fault-free
  API (the next server behind the load balancer), which lands in the store and the log while
  the first is stalled. The log says "first" is the last status (it reached the log last);
  dual mode's store says "second": an out-of-order write;
- ``store_fail`` (every store update after the log append fails): 3 messages and a post the
  recipient's timeline should get.

Dual mode is compared with an independent fold of its topic (``stories.dual_write.fold``); log mode
is the real speed layer's namespace over its topic, compared with the same fold. Both stores are
read as the API reads them (timelines through ``social_timeline``); that the log design's store
shows no divergence at any fan-out threshold is tests/unit/test_dual_write_counting.py's.
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from app_sim.api.dual_write import FAULTS
from stories.dual_write import attribute, divergences, fold, read_journal, read_log, read_store

pytestmark = pytest.mark.integration

RATES = {"crash": 250, "race": 1000, "timeout": 1000, "store_fail": 1000}
CLIENT_TIMEOUT_S = 0.4
STALL_MS = 3000


def _write(
    url: str, path: str, token: str, body: dict, retries: int = 6, method: str = "POST"
) -> httpx.Response | None:
    """A careful client: one Idempotency-Key per write, retried on no answer or a 5xx."""
    headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": uuid.uuid4().hex}
    answer = None
    for attempt in range(retries + 1):
        try:
            answer = httpx.request(
                method, f"{url}{path}", json=body, headers=headers, timeout=CLIENT_TIMEOUT_S
            )
            if answer.status_code < 500:
                return answer
        except httpx.TransportError:  # timed out, or the worker died under us
            pass
        time.sleep(0.3 * (attempt + 1))
    return answer


def _api(settings, **faults):
    from infra.stack import ApiServer

    api = ApiServer(replace(settings, **{f"fault_{f}_permille": faults.get(f, 0) for f in FAULTS}))
    api.start()
    return api


def _scenario(fault: str, url: str, users: dict[str, tuple[int, str]], healthy_url: str) -> None:
    recipient, _ = users["recipient"]
    sender, sender_token = users["sender"]

    def message(i: int) -> None:
        body = {"recipient_id": recipient, "text": f"{fault} {i}"}
        _write(url, "/v1/messages", sender_token, body)

    if fault == "timeout":
        started = time.monotonic()
        first = _write(url, "/v1/status", sender_token, {"text": "first"}, retries=1, method="PUT")
        # the retry meets the original in flight (409) or stalls itself: either way one lands late
        assert first is None or first.status_code == 409, first
        second = _write(healthy_url, "/v1/status", sender_token, {"text": "second"}, method="PUT")
        assert second is not None and second.status_code == 202, second
        assert time.monotonic() - started < STALL_MS / 1000, "the second status came too late"
        time.sleep(STALL_MS / 1000 + 1)  # the stalled first one reaches the log
        return
    if fault == "race":
        with ThreadPoolExecutor(12) as pool:
            list(pool.map(message, range(12)))
    else:
        for i in range({"crash": 12, "store_fail": 3}[fault]):
            message(i)
    if fault == "store_fail":
        _write(url, "/v1/posts", sender_token, {"text": "fan me out"})


def _register(url: str, handle: str) -> tuple[int, str]:
    answer = httpx.post(f"{url}/v1/users", json={"handle": handle, "display_name": handle}, timeout=15)
    assert answer.status_code == 201, answer.text
    return answer.json()["user_id"], answer.json()["token"]


def _run_mode(mode: str, base, topic: str, namespace: str) -> None:
    """Register each scenario's users (fault-free API) with a follow, then one API per fault."""
    from app_sim.auth import load_secret
    from app_sim.load import api_is_up

    settings = replace(
        base,
        events_topic=topic,
        write_mode=mode,
        views_namespace=namespace,  # reads: the speed layer's namespace, or dual mode's own
        dual_namespace=namespace,
        fault_seed=11,
        fault_race_ms=300,
        fault_stall_ms=STALL_MS,
    )
    url = f"http://127.0.0.1:{settings.api_port}"
    users: dict[str, dict[str, tuple[int, str]]] = {}
    api = _api(settings)
    try:
        for fault in FAULTS:
            users[fault] = {
                role: _register(url, f"{fault[:6]}{role[:4]}") for role in ("recipient", "sender")
            }
            recipient_token = users[fault]["recipient"][1]
            answer = _write(url, "/v1/follows", recipient_token, {"followee_id": users[fault]["sender"][0]})
            assert answer is not None and answer.status_code == 202, answer
    finally:
        api.stop()
    # a second, fault-free API beside the faulty one (its own port, pid file and log; the same
    # token secret, as two servers behind one load balancer)
    healthy = replace(
        settings,
        api_port=_free_port(),
        var_dir=Path(settings.var_dir) / "healthy",
        api_secret=load_secret(settings).decode(),
    )
    for fault in FAULTS:
        apis = [_api(settings, **{fault: RATES[fault]})]
        try:
            if fault == "timeout":
                apis.append(_api(healthy))
            assert api_is_up(url)
            _scenario(fault, url, users[fault], f"http://127.0.0.1:{healthy.api_port}")
        finally:
            for api in apis:
                api.stop()


@pytest.fixture(scope="module")
def runs(kafka_stack, tmp_path_factory):
    """mode -> (divergences, attribution, journal) after the seeded scenarios."""
    from contract.serving import connect
    from infra.stack import create_topic, delete_topic, end_offsets
    from pipelines.speed_layer_process import SpeedLayerProcess

    base = replace(
        kafka_stack.settings,
        var_dir=tmp_path_factory.mktemp("dual-write-var"),
        api_port=_free_port(),
        api_workers=2,
    )
    r = connect(base.redis_url)
    tag = uuid.uuid4().hex[:6]
    topics = {mode: f"test.dual_write.{mode}.{tag}" for mode in ("log", "dual")}
    for topic in topics.values():
        create_topic(base, topic, base.events_partitions)
    _run_mode("log", base, topics["log"], f"log{tag}")
    # the log design's store: the real speed layer over the whole topic (one micro-batch, the
    # cheapest on a busy machine; the views are a function of the log, not of when it runs),
    # starting while the dual mode runs
    speed_layer = SpeedLayerProcess(
        replace(base, events_topic=topics["log"]),
        topics["log"],
        f"log{tag}",
        base.var_dir / f"speed_layer-log{tag}.log",
        archive=False,
    ).start()
    try:
        _run_mode("dual", base, topics["dual"], f"dual{tag}")
        speed_layer.wait_caught_up(timeout=420)
    finally:
        speed_layer.stop()
    out = {}
    for mode, topic in topics.items():
        truth = fold(read_log(base, topic), base.timeline_length)
        # the store as users read it: timelines through the API's read (social_timeline)
        # the speed layer's store in its layout (the dual-mode API writes the keyed one)
        layout = base.serving_layout if mode == "log" else "keyed"
        parts = len(end_offsets(base, topic))
        store = read_store(r, f"{mode}{tag}", truth.users, base.timeline_length, layout, parts)
        found = divergences(store, truth)
        journal = read_journal(r, topic)
        out[mode] = (found, attribute(found, journal), journal)
    yield out
    for topic in topics.values():
        delete_topic(base, topic)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("fault", FAULTS)
def test_each_fault_makes_dual_writes_diverge(runs, fault):
    found, by_fault, journal = runs["dual"]
    injected = [j for j in journal if j["fault"] == fault]
    assert injected, f"the seeded run injected no {fault}"
    assert sum(by_fault[fault].values()) >= 1, (fault, {m: len(v) for m, v in found.items()}, by_fault)


def test_a_stalled_write_lands_out_of_order_in_dual_mode(runs):
    """The timeout scenario's one status, worked out by hand: the log's last is "first"; the
    store kept "second" (the write that passed the stalled one)."""
    found, by_fault, journal = runs["dual"]
    (stalled,) = [j for j in journal if j["fault"] == "timeout"]
    assert stalled["type"] == "status_updated"
    assert found["status_not_last"] == [stalled["user_id"]]
    assert by_fault["timeout"]["status_not_last"] == 1


def test_the_log_design_does_not_diverge_under_the_same_faults(runs):
    found, _, journal = runs["log"]
    injected = {f: sum(1 for j in journal if j["fault"] == f) for f in FAULTS}
    # the same faults hit the log mode's requests (a store write to fail exists in dual mode only)
    assert injected["crash"] >= 1 and injected["race"] >= 1 and injected["timeout"] >= 1, injected
    assert found == {m: [] for m in found}
