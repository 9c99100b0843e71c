"""The Locust workload of ``locustfile.py`` as a careful client: retries, and status updates.

Used by ``make dual-write`` (``stories/dual_write.py``), against both write modes alike. User class
``RetryingSocialUser`` (name it on Locust's command line: this module also holds ``SocialUser``):

- every write carries an ``Idempotency-Key`` (drawn from the user's seeded generator) and is
  retried with the same key, up to ``LOAD_RETRIES`` times (default 3), when it gets no answer
  within ``LOAD_TIMEOUT_S`` (default 1.5 s), a connection error, or a 502/503/504: what a mobile
  client does. A retry of a write still in flight (a stalled one) is answered 409 by the API
  (its idempotency record is shared by the workers) and not retried: the client moves on to its
  next write, which may then reach the stores before the stalled one;
- it also replaces its status now and then (``PUT /v1/status``), which ``SocialUser`` never does.

The user's generator is seeded from ``LOAD_SEED``, ``LOAD_RUN`` (a name for the run: two runs
appending to one log must not draw the same keys, or the second's events are duplicates) and
the user's number in this process.
"""

from __future__ import annotations

import itertools
import os
import random
import time

from locust import task

from app_sim.locustfile import SEED, SocialUser, _text

RETRIES = int(os.environ.get("LOAD_RETRIES", "3"))
TIMEOUT_S = float(os.environ.get("LOAD_TIMEOUT_S", "1.5"))
RUN = os.environ.get("LOAD_RUN", "")  # runs over one log need their own keys: a key is an event_id
RETRY_ON = {0, 502, 503, 504}  # 0: no answer (timeout, connection reset by a crashed worker)
_numbers = itertools.count()


class RetryingClient:
    """Wraps a FastHttpSession: writes get an Idempotency-Key and are retried with it."""

    def __init__(self, session, rng: random.Random):
        self.session = session
        self.rng = rng

    def get(self, *args, **kwargs):
        return self.session.get(*args, **kwargs)

    def post(self, url, **kwargs):
        return self._write("post", url, **kwargs)

    def put(self, url, **kwargs):
        return self._write("put", url, **kwargs)

    def delete(self, url, **kwargs):
        return self._write("delete", url, **kwargs)

    def _write(self, method: str, url: str, headers: dict | None = None, **kwargs):
        headers = {**(headers or {}), "Idempotency-Key": f"{self.rng.getrandbits(128):032x}"}
        send = getattr(self.session, method)
        if kwargs.get("catch_response"):  # the caller judges the answer itself (registration)
            return send(url, headers=headers, **kwargs)
        response = send(url, headers=headers, **kwargs)
        for attempt in range(RETRIES):
            if response.status_code not in RETRY_ON:
                break
            time.sleep(0.1 * (attempt + 1))
            response = send(url, headers=headers, **kwargs)
        return response


class RetryingSocialUser(SocialUser):
    network_timeout = TIMEOUT_S
    connection_timeout = TIMEOUT_S

    def __init__(self, environment) -> None:
        super().__init__(environment)
        self.rng = random.Random(f"{SEED}:{RUN}:{next(_numbers)}")
        self.client = RetryingClient(self.client, self.rng)

    def on_start(self) -> None:
        rng = self.rng
        super().on_start()  # it replaces self.rng with an unseeded one: keep ours
        self.rng = rng

    @task(3)
    def set_status(self) -> None:
        if self.user_id:
            self.client.put(
                "/v1/status", json={"text": _text(self.rng)}, headers=self.auth, name="PUT /v1/status"
            )
