"""``GET /v1/timeline`` in one Redis round trip and without FastAPI's request machinery.

The read the load tests and the hey target are about (docs/performance.md, "The API's reads"). The
route in :mod:`app_sim.api.routes.reads` stays its definition: the OpenAPI document, the
validation, every error body. This pure ASGI middleware (inside the metrics middleware, so a read
is counted and timed as the route's) answers only a request whose answer it knows to be the
route's 200, and hands every other one to the route untouched:

- exactly ``GET /v1/timeline``, with no query or ``limit=<n>`` (1..MAX_LIMIT, no leading zero);
- an ``Authorization`` header that ``HTTPBearer`` reads as a bearer token, and that verifies;
- then one pipelined round trip: the token's revocation (``auth.revoked_commands``) and the read
  (``FCALL_RO social_timeline``). A revoked user, or an error reply (the library not loaded
  yet), goes to the route, which answers 401 or loads the library; a Redis that does not answer
  gets the route's 503 (``errors.store_unavailable``) without a second wait.

The body is built by the route's own :func:`~app_sim.api.routes.reads.timeline_body` and sent as
the same ``Response``. What it saves per read (py-spy of a worker under hey): FastAPI's
dependency solving (``caller``, ``HTTPBearer``, ``get_api``, the ``limit`` query), the routing and
exception middlewares, and the route's second round trip to Redis (it checks revocation in one and
reads in the next): about half of a worker's CPU per 50-post read (docs/performance.md, "The API's
reads").
"""

from __future__ import annotations

import re

import redis

from app_sim import auth
from app_sim.api import models as m
from app_sim.api.errors import json_response, store_unavailable
from app_sim.api.routes.reads import timeline_body

PATH = "/v1/timeline"
DEFAULT_LIMIT = 50  # the route's default
_LIMIT = re.compile(rb"limit=([1-9][0-9]{0,3})")


def _limit(query: bytes) -> int | None:
    """The read's limit, or None for a query only the route should judge."""
    if not query:
        return DEFAULT_LIMIT
    found = _LIMIT.fullmatch(query)
    limit = int(found[1]) if found else 0
    return limit if 1 <= limit <= m.MAX_LIMIT else None


def _token(headers) -> str | None:
    """The bearer token as ``HTTPBearer`` reads it (the first Authorization header), or None."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            token = token.strip()
            return token if token and scheme.lower() == "bearer" else None
    return None


class TimelineFastPath:
    def __init__(self, app) -> None:
        self.app = app
        self._route = None  # the route's APIRoute: the metrics label it (scope["route"])

    async def __call__(self, scope, receive, send) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] != PATH
            or scope["method"] != "GET"
            or scope.get("root_path")
            or not await self._answer(scope, receive, send)
        ):
            await self.app(scope, receive, send)

    async def _answer(self, scope, receive, send) -> bool:
        """Answer the read; False (nothing sent) when the route must."""
        api = getattr(scope["app"].state, "api", None)
        limit = _limit(scope["query_string"])
        token = _token(scope["headers"]) if limit is not None and api is not None else None
        if token is None:
            return False
        try:
            user_id = api.tokens.verify(token)
        except auth.InvalidToken:
            return False
        try:
            store = await api.store()
            pipe = api.redis.pipeline(transaction=False)
            for name, *args in auth.revoked_commands(user_id, store):
                getattr(pipe, name)(*args)
            pipe.fcall_ro(*store.timeline_args(user_id, limit))
            *revoked, reply = await pipe.execute()
        except redis.ResponseError:
            return False
        except redis.RedisError as exc:
            response = store_unavailable(exc)
        else:
            if any(revoked):
                return False
            response = json_response(timeline_body(api.keystore, user_id, *store.timeline_reply(reply)))
        scope["route"] = self._route or self._find_route(scope["app"])
        await response(scope, receive, send)
        return True

    def _find_route(self, app):
        self._route = next(
            r for r in app.router.routes if getattr(r, "path", None) == PATH and "GET" in r.methods
        )
        return self._route
