"""The app API as `make up` runs it (uvicorn, 2 worker processes) against a hostile client.

Issue 17: idempotency keys are the caller's own, stored once for all workers in Redis; client
clocks are bounded; registration never hands out another user's token; the OpenAPI document
describes every answer (schemathesis, all checks).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson
import pytest

import contract
from contract import keys
from contract.ids import snowflake_worker
from infra.settings import Settings

pytestmark = pytest.mark.integration

DAY_MS = 86_400_000


@dataclasses.dataclass
class Api:
    settings: Settings

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.settings.api_port}"

    @property
    def topic(self) -> str:
        return self.settings.events_topic

    def call(self, method: str, path: str, token: str | None = None, **kw) -> httpx.Response:
        """One request on a fresh connection, so the kernel may hand it to either worker."""
        headers = dict(kw.pop("headers", None) or {})
        if token:
            headers["Authorization"] = f"Bearer {token}"
        with httpx.Client(base_url=self.url, timeout=15) as c:
            return c.request(method, path, headers=headers, **kw)

    def register(self, handle: str) -> tuple[int, str]:
        r = self.call("POST", "/v1/users", json={"handle": handle, "display_name": handle})
        assert r.status_code == 201, r.text
        return r.json()["user_id"], r.json()["token"]

    def log_size(self) -> int:
        from infra.stack import end_offsets

        return sum(end_offsets(self.settings, self.topic).values())

    def records(self) -> list[dict]:
        from confluent_kafka import Consumer, TopicPartition

        from infra.stack import end_offsets

        ends = end_offsets(self.settings, self.topic)
        c = Consumer({"bootstrap.servers": self.settings.kafka_bootstrap, "group.id": "hostile"})
        out: list[dict] = []
        try:
            c.assign([TopicPartition(self.topic, p, 0) for p in ends])
            deadline = time.monotonic() + 30
            while len(out) < sum(ends.values()) and time.monotonic() < deadline:
                out += [orjson.loads(m.value()) for m in c.consume(500, timeout=0.5) if m.error() is None]
        finally:
            c.close()
        return out


@pytest.fixture(scope="module")
def api(kafka_stack, tmp_path_factory) -> Iterator[Api]:
    """`python -m app_sim.api` with 2 uvicorn workers (the ApiServer service of `make up`)."""
    from infra.stack import ApiServer, create_topic, delete_topic
    from tests.conftest import _free_port

    topic = f"test.api-hostile.{uuid.uuid4().hex[:8]}"
    create_topic(kafka_stack.settings, topic, 4)
    settings = dataclasses.replace(
        kafka_stack.settings,
        var_dir=tmp_path_factory.mktemp("api-var"),
        api_port=_free_port(18100, set()),
        api_workers=2,
        events_topic=topic,
        views_namespace=f"hostile-{uuid.uuid4().hex[:8]}",
    )
    server = ApiServer(settings)
    assert server.start() == "started"
    try:
        yield Api(settings)
    finally:
        server.stop()
        delete_topic(kafka_stack.settings, topic)


def test_both_workers_serve(api):
    """User ids are minted by the worker that answered. Which worker the kernel hands a connection
    to is its choice (an idle machine may give twelve in a row to one), so rounds of 8 at once,
    each on its own connection, until both answered: at most 12 rounds."""
    workers: set[int] = set()
    with ThreadPoolExecutor(8) as pool:
        for r in range(12):
            ids = pool.map(lambda i, r=r: api.register(f"w{r}x{i}")[0], range(8))
            workers |= {snowflake_worker(u) for u in ids}
            if len(workers) == 2:
                break
    assert len(workers) == 2, workers


def test_a_key_is_the_callers_own_and_a_retry_gets_the_first_answer_from_any_worker(api):
    alice, at = api.register("alice")
    bob, bt = api.register("bob")
    now = int(time.time() * 1000)
    h = {"Idempotency-Key": "retry-1", "X-Device-Time": str(now - 60_000), "X-Sent-Time": str(now - 1000)}
    before = api.log_size()
    # 8 identical requests at once, each on its own connection: one is appended, the others get
    # its answer or, while it is in flight, 409 (retry)
    with ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(lambda _: api.call("POST", "/v1/posts", at, json={"text": "once"}, headers=h), range(8))
        )
    assert {r.status_code for r in answers} <= {202, 409}, [r.text for r in answers]
    assert api.log_size() == before + 1
    first = next(r.json() for r in answers if r.status_code == 202)
    for r in answers:
        if r.status_code == 409:
            assert r.json()["error"] == "request_in_progress"
    retries = [api.call("POST", "/v1/posts", at, json={"text": "once"}, headers=h) for _ in range(10)]
    assert all(r.status_code == 202 and r.json() == first for r in retries)  # the same answer
    later = dict(h, **{"X-Sent-Time": str(now)})  # a retry re-stamps its send time: still a retry
    assert api.call("POST", "/v1/posts", at, json={"text": "once"}, headers=later).json() == first
    assert api.log_size() == before + 1  # nothing appended twice

    other_body = api.call("POST", "/v1/posts", at, json={"text": "different"}, headers=h)
    assert other_body.status_code == 422 and other_body.json()["error"] == "idempotency_key_reused"

    # bob's "retry-1" is bob's: a new post of his, not a 409, not a duplicate of alice's event
    bobs = api.call("POST", "/v1/posts", bt, json={"text": "once"}, headers=h)
    assert bobs.status_code == 202 and bobs.json()["event_id"] != first["event_id"]
    assert bobs.json()["post_id"] != first["post_id"]
    # alice's "retry-1" on another endpoint is another request
    status = api.call("PUT", "/v1/status", at, json={"text": "once"}, headers=h)
    assert status.status_code == 202 and status.json()["event_id"] not in (
        first["event_id"],
        bobs.json()["event_id"],
    )
    assert api.log_size() == before + 3

    events = {e["event_id"]: e for e in api.records()}
    # in the log the text is sealed with alice's data key (contract.keys); opened, it is hers
    assert contract.is_sealed(events[first["event_id"]]["text"])
    opened = keys.open_fields(keys.KeyStore.for_settings(api.settings), [events[first["event_id"]]], "text")
    assert events[first["event_id"]]["user_id"] == alice and opened[0]["text"] == "once"
    assert events[bobs.json()["event_id"]]["user_id"] == bob
    # the event_id is a function of (caller, endpoint, key): a fresh key gives a fresh id
    fresh = api.call(
        "POST", "/v1/posts", at, json={"text": "once"}, headers=dict(h, **{"Idempotency-Key": "retry-2"})
    )
    assert fresh.status_code == 202 and fresh.json()["event_id"] not in events


def test_a_repeated_registration_never_answers_a_token(api):
    key = {"Idempotency-Key": f"signup-{uuid.uuid4().hex[:6]}"}
    body = {"handle": "carol", "display_name": "Carol"}
    first = api.call("POST", "/v1/users", json=body, headers=key)
    assert first.status_code == 201 and first.json()["token"]
    before = api.log_size()
    for _ in range(6):  # over both workers
        again = api.call("POST", "/v1/users", json=body, headers=key)
        assert again.status_code == 409 and again.json()["error"] == "already_registered", again.text
        assert "token" not in again.json() and first.json()["token"] not in again.text
    other = api.call("POST", "/v1/users", json={"handle": "mallory", "display_name": "M"}, headers=key)
    assert other.status_code == 422 and other.json()["error"] == "idempotency_key_reused"
    assert api.log_size() == before  # no second user, in no partition


@pytest.mark.parametrize(
    ("headers", "named"),
    [
        ({"X-Device-Time": str(2**63 - 1), "X-Sent-Time": "0"}, "X-Device-Time"),  # issue 17, #1
        ({"X-Device-Time": "253402300799999"}, "X-Device-Time"),  # year 9999
        ({"X-Sent-Time": str(2**63 - 1)}, "X-Sent-Time"),
        ({"X-Sent-Time": "{now+1d+1s}"}, "X-Sent-Time"),
        ({"X-Sent-Time": "{now-1d-1s}"}, "X-Sent-Time"),
        ({"X-Device-Time": "{now+1s}"}, "X-Device-Time"),  # after the send time (= now)
        ({"X-Device-Time": "{now-31d}"}, "X-Device-Time"),  # held longer than 30 days
        ({"X-Device-Time": "-5"}, "X-Device-Time"),
        ({"X-Sent-Time": "1e12"}, "X-Sent-Time"),
    ],
)
def test_out_of_range_client_times_are_refused_naming_the_header(api, headers, named):
    _u, token = api.register("clocky")
    now = int(time.time() * 1000)
    shifts = {
        "{now+1d+1s}": now + DAY_MS + 1000 + 5000,
        "{now-1d-1s}": now - DAY_MS - 1000,
        "{now+1s}": now + 1000 + 5000,
        "{now-31d}": now - 31 * DAY_MS,
    }
    headers = {k: str(shifts.get(v, v)) for k, v in headers.items()}
    before = api.log_size()
    r = api.call("POST", "/v1/posts", token, json={"text": "when?"}, headers=headers)
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "bad_header" and named in r.json()["detail"]
    assert api.log_size() == before


def test_in_window_client_times_are_kept_and_the_event_time_never_passes_the_server_clock(api):
    _u, token = api.register("offline")
    now = int(time.time() * 1000)
    device, sent = now - 10 * DAY_MS, now - 20 * 3_600_000  # written 10 days ago; the device is 20 h slow
    r = api.call(
        "POST",
        "/v1/posts",
        token,
        json={"text": "late"},
        headers={"X-Device-Time": str(device), "X-Sent-Time": str(sent)},
    )
    assert r.status_code == 202, r.text
    (event,) = [e for e in api.records() if e["event_id"] == r.json()["event_id"]]
    assert (event["device_time"], event["sent_time"]) == (device, sent)
    corrected = event["device_time"] + (event["received_time"] - event["sent_time"])
    # held 10 d - 20 h by the device's clock before it was sent: that long before the server got it
    assert corrected == event["received_time"] - (10 * DAY_MS - 20 * 3_600_000) <= event["received_time"]
    assert contract.validate(event) is None


def test_schemathesis_all_checks_pass_on_the_real_api(api, tmp_path):
    """Every answer the API gives is in its OpenAPI document (schemathesis, every check), half
    the operations as an authenticated user; a bounded budget (--max-time) keeps it short."""
    import subprocess
    import sys

    _u, token = api.register("fuzzer")
    cmd = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(Path(__file__).with_name("schemathesis.toml")),
        "run",
        f"{api.url}/openapi.json",
        "--checks",
        "all",
        "--max-examples",
        "10",
        "--max-time",
        "25",
        "--seed",
        "17",
        "--generation-deterministic",
        "--request-timeout",
        "15",
        "--suppress-health-check",
        "all",
        "--no-color",
        "-H",
        f"Authorization: Bearer {token}",
    ]
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    took = time.monotonic() - started
    report = done.stdout[-6000:] + done.stderr[-2000:]
    assert done.returncode == 0, report
    assert "passed" in done.stdout and took < 45, report
