"""Locust users of the simulated social app (``make load`` runs it headless via ``app_sim.load``).

Each simulated user registers, follows others by the generator's heavy-tailed popularity model
(``app_sim.graph.popularity``: a few celebrities attract most follows), then loops over a mixed
workload by weight. Two mixes (``LOAD_PROFILE``):

- ``write_heavy`` (the default): ~60% home timeline reads, ~30% other reads (inbox, unread,
  someone's status), ~10% writes (mostly posts, plus messages, message reads and follows): 10
  timeline reads per post;
- ``read_heavy``: 50 timeline reads per post (``LOAD_PROFILE=read_heavy make load``, or
  ``make load-read-heavy``), the workload the default fan-out threshold is chosen for.

Every Locust process draws the same popularity ranking (fixed seed) over a shared pool of users:
the first ``CELEBRITIES`` users registered become the popular ones, so follows concentrate on
them as in the generator's graph. Environment: ``LOAD_PROFILE`` (``write_heavy`` or
``read_heavy``), ``LOAD_FOLLOWS`` (mean follows per user, default 20), ``LOAD_SEED``,
``LOAD_USERS_FILE`` (a JSON list of ``[user_id, token]``: act as these existing users instead of
registering, e.g. over a pre-populated serving store in ``make bench``).

The serving target is Locust configuration like any other option (``locust.conf``, ``LOCUST_*``,
the command line): ``--max-read-p99-ms`` and ``--max-fail-ratio``. When the run misses it, Locust
exits with status 1 (``environment.process_exit_code``), so ``make load`` fails.
"""

from __future__ import annotations

import os
import random
import threading

import numpy as np
from locust import FastHttpUser, between, events, task

from app_sim import graph
from app_sim.load import target_misses

FOLLOWS = int(os.environ.get("LOAD_FOLLOWS", "20"))
SEED = int(os.environ.get("LOAD_SEED", "0"))
POOL = 2000  # popularity ranks: user k registered in this process gets weight pop[k % POOL]
_WORDS = "kafka log stream replay timeline inbox follow post coffee launch ship green fast".split()

# Task weights per profile. write_heavy is the original mix (timeline reads : posts = 10 : 1).
# read_heavy has timeline reads : posts = 50 : 1: above the floor of 20 where fanning out on write
# becomes the cheaper way to serve timelines (bench section threshold, docs/performance.md), and
# below Twitter's 2012 figures of ~65 (300k timeline reads/s over 4.6k posts/s): a read-heavy app,
# not an extreme one. Its other writes shrink with the posts.
PROFILES: dict[str, dict[str, int]] = {
    "write_heavy": {
        "home_timeline": 60,
        "inbox_read": 12,
        "unread": 10,
        "someones_status": 8,
        "post": 6,
        "message": 2,
        "read_message": 1,
        "follow_more": 1,
    },
    "read_heavy": {
        "home_timeline": 100,
        "inbox_read": 10,
        "unread": 10,
        "someones_status": 10,
        "post": 2,
        "message": 1,
        "read_message": 1,
        "follow_more": 1,
    },
}
PROFILE = os.environ.get("LOAD_PROFILE", "write_heavy")
if PROFILE not in PROFILES:
    raise ValueError(f"LOAD_PROFILE={PROFILE!r}: one of {sorted(PROFILES)}")
_W = PROFILES[PROFILE]

_lock = threading.Lock()
_registered: list[int] = []  # user ids registered by this process, in order
_popularity = graph.popularity(POOL, np.random.default_rng(SEED))
_existing: list[list] = []
if os.environ.get("LOAD_USERS_FILE"):
    import json

    with open(os.environ["LOAD_USERS_FILE"]) as _f:
        _existing = json.load(_f)


def _pick_followees(rng: random.Random, me: int, k: int) -> list[int]:
    """Up to k distinct registered users, drawn by popularity (heavy-tailed), never oneself."""
    with _lock:
        pool = list(_registered)
    if len(pool) < 2:
        return []
    weights = [_popularity[i % POOL] for i in range(len(pool))]
    picks: set[int] = set()
    for uid in rng.choices(pool, weights=weights, k=min(4 * k, 4 * len(pool))):
        if uid != me:
            picks.add(uid)
        if len(picks) >= k:
            break
    return list(picks)


def _text(rng: random.Random) -> str:
    return " ".join(rng.choices(_WORDS, k=rng.randint(2, 12)))


class SocialUser(FastHttpUser):
    wait_time = between(0.0, 0.05)  # overridden by `load --wait`; small: the test is about throughput

    def on_start(self) -> None:
        self.rng = random.Random()
        self.my_posts: list[int] = []
        self.inbox: list[int] = []
        if _existing:  # log in as a pre-populated user: they already follow others
            with _lock:
                self.user_id, token = _existing[len(_registered) % len(_existing)]
                _registered.append(self.user_id)
            self.auth = {"Authorization": f"Bearer {token}"}
            return
        handle = f"u{self.rng.getrandbits(40):x}"[:15]
        with self.client.post(
            "/v1/users",
            json={"handle": handle, "display_name": handle},
            name="POST /v1/users",
            catch_response=True,
        ) as r:
            if r.status_code != 201:
                r.failure(f"register: {r.status_code} {r.text[:200]}")
                self.user_id = None
                return
            body = r.json()
        self.user_id = body["user_id"]
        self.auth = {"Authorization": f"Bearer {body['token']}"}
        with _lock:
            _registered.append(self.user_id)
        n = max(1, int(self.rng.lognormvariate(np.log(FOLLOWS), 0.8)))
        for followee in _pick_followees(self.rng, self.user_id, n):
            self.client.post(
                "/v1/follows", json={"followee_id": followee}, headers=self.auth, name="POST /v1/follows"
            )
        self.my_posts: list[int] = []
        self.inbox: list[int] = []

    # -- reads: ~90% (write_heavy), ~96% (read_heavy) ----------------------------------------------
    @task(_W["home_timeline"])
    def home_timeline(self) -> None:
        if self.user_id:
            self.client.get("/v1/timeline?limit=50", headers=self.auth, name="GET /v1/timeline")

    @task(_W["inbox_read"])
    def inbox_read(self) -> None:
        if not self.user_id:
            return
        r = self.client.get("/v1/inbox?limit=20", headers=self.auth, name="GET /v1/inbox")
        if r.status_code == 200:
            self.inbox = [m["message_id"] for m in r.json()["messages"] if not m["read"]]

    @task(_W["unread"])
    def unread(self) -> None:
        if self.user_id:
            self.client.get("/v1/unread", headers=self.auth, name="GET /v1/unread")

    @task(_W["someones_status"])
    def someones_status(self) -> None:
        if self.user_id:
            (other,) = _pick_followees(self.rng, self.user_id, 1) or [self.user_id]
            self.client.get(f"/v1/users/{other}/status", name="GET /v1/users/{id}/status")

    # -- writes: ~10% (write_heavy), ~4% (read_heavy) ----------------------------------------------
    @task(_W["post"])
    def post(self) -> None:
        if not self.user_id:
            return
        r = self.client.post(
            "/v1/posts", json={"text": _text(self.rng)}, headers=self.auth, name="POST /v1/posts"
        )
        if r.status_code == 202 and self.rng.random() < 0.1:
            # now and then delete it again (at most one delete per post)
            self.client.delete(
                f"/v1/posts/{r.json()['post_id']}", headers=self.auth, name="DELETE /v1/posts/{id}"
            )

    @task(_W["message"])
    def message(self) -> None:
        if self.user_id:
            (to,) = _pick_followees(self.rng, self.user_id, 1) or [self.user_id]
            body = {"recipient_id": to, "text": _text(self.rng)}
            self.client.post("/v1/messages", json=body, headers=self.auth, name="POST /v1/messages")

    @task(_W["read_message"])
    def read_message(self) -> None:
        if self.user_id and self.inbox:
            mid = self.inbox.pop()
            self.client.post(
                f"/v1/messages/{mid}/read", headers=self.auth, name="POST /v1/messages/{id}/read"
            )

    @task(_W["follow_more"])
    def follow_more(self) -> None:
        if self.user_id:
            for f in _pick_followees(self.rng, self.user_id, 1):
                self.client.post(
                    "/v1/follows", json={"followee_id": f}, headers=self.auth, name="POST /v1/follows"
                )


@events.init_command_line_parser.add_listener
def _serving_target(parser) -> None:
    parser.add_argument(
        "--max-read-p99-ms",
        type=float,
        default=0.0,
        env_var="LOCUST_MAX_READ_P99_MS",
        help="exit 1 when the reads' p99 (all GET endpoints merged) is above this; 0: no check",
    )
    parser.add_argument(
        "--max-fail-ratio",
        type=float,
        default=1.0,
        env_var="LOCUST_MAX_FAIL_RATIO",
        help="exit 1 when failed requests / requests is above this (1: no check)",
    )


@events.test_start.add_listener
def _reset(**_kwargs) -> None:
    with _lock:
        _registered.clear()


@events.quitting.add_listener
def _write_summary(environment, **_kwargs) -> None:
    """Reads vs writes, each merged over its endpoints (exact percentiles); the target's verdict."""
    if environment.stats is None:
        return
    import json
    import logging

    from locust.stats import StatsEntry

    stats = environment.stats
    groups = {"reads": StatsEntry(stats, "reads", ""), "writes": StatsEntry(stats, "writes", "")}
    for (_name, method), entry in stats.entries.items():
        groups["reads" if method == "GET" else "writes"].extend(entry)
    seconds = max(stats.total.last_request_timestamp - stats.total.start_time, 1e-9)
    out = {
        "seconds": round(seconds, 1),
        "requests": stats.total.num_requests,
        "failures": stats.total.num_failures,
    }
    for label, g in groups.items():
        out[label] = {
            "requests": g.num_requests,
            "failures": g.num_failures,
            "per_s": round(g.num_requests / seconds, 1),
            "p50_ms": g.get_response_time_percentile(0.5),
            "p99_ms": g.get_response_time_percentile(0.99),
        }
    options = environment.parsed_options
    target = {
        "max_read_p99_ms": getattr(options, "max_read_p99_ms", 0.0),
        "max_fail_ratio": getattr(options, "max_fail_ratio", 1.0),
    }
    misses = target_misses(out, **target)
    out["target"] = {**target, "met": not misses, "misses": misses}
    if misses:
        logging.getLogger("locust").error("serving target missed: %s", "; ".join(misses))
        environment.process_exit_code = 1
    if path := os.environ.get("LOAD_SUMMARY_JSON"):
        with open(path, "w") as f:
            json.dump(out, f, indent=2)
