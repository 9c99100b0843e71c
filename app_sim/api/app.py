"""The FastAPI application: routes, auth, error mapping. See the package docstring for the rules."""

from __future__ import annotations

import hashlib
import re
import sys
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated

import orjson
import redis
import redis.asyncio
from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException
from uvicorn.config import STARTUP_FAILURE

import contract
from app_sim import auth
from app_sim.api import dual_write
from app_sim.api import metrics as api_metrics
from app_sim.api import models as m
from app_sim.api.eventlog import EventLog, LogUnavailable
from contract import keys, writers
from contract.ids import Snowflake, new_event_id, wall_clock_ms
from infra.settings import Settings, get_settings

RECENT_TTL_S = 24 * 3600  # how long the API remembers its own writes (the store lags by seconds)
NAMESPACE_TTL_S = 1.0  # a blue/green switch is picked up within this
IDEMPOTENCY_KEY_PATTERN = r"^[\x21-\x7e]{1,64}$"
EPOCH_MS_PATTERN = r"^[0-9]{1,13}$"  # up to contract.MAX_EPOCH_MS (end of 2099): 13 digits
# event_id of a keyed request: uuid5(EVENT_ID_NAMESPACE, "<user>|<endpoint>|<key>")
EVENT_ID_NAMESPACE = uuid.UUID("5b0a4c1e-3d7f-5e8a-9c2b-6f1d0e4a7b39")
IDEM_PENDING_TTL_S = 60  # a claim whose worker died mid-request frees the key after this
# SET key new EX ttl only if it still holds old: takes over a failed attempt exactly once
_COMPARE_AND_SET = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
  return 1
end
return 0
"""


class ApiError(Exception):
    def __init__(self, status: int, code: str, detail: str, headers: dict | None = None):
        self.status, self.code, self.detail, self.headers = status, code, detail, headers


def _json(body, status: int = 200, headers: dict | None = None) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json", headers=headers)


def _error(status: int, code: str, detail: str, headers: dict | None = None, errors=None) -> Response:
    body = {"error": code, "detail": detail}
    if errors is not None:
        body["errors"] = errors
    return _json(body, status, headers)


# --- snowflake worker ids: one per API process ------------------------------------------------------


def claim_worker_id(settings: Settings) -> int:
    """This API process's snowflake worker id, one of its own for the life of the log.

    Claimed in the log's registry of writers in Kafka (``contract.writers``), so no other API
    process, on this host or another, and no generator run ever mints ids with it, whatever a
    Redis FLUSHALL, a restore or a restart does; never given back. Raises
    :class:`~contract.writers.WriterIdUnavailable` (a one-line message) when none can be had.
    """
    return writers.allocate(settings, "api").worker_id


# --- state of one API process ------------------------------------------------------------------------


@dataclass
class Api:
    settings: Settings
    redis: redis.asyncio.Redis
    log: EventLog
    tokens: auth.TokenSigner
    ids: Snowflake
    keystore: keys.KeyStore  # data keys: seal personal fields on write, open them on read
    sealer: keys.Sealer | None  # None: SOCIAL_SEAL_PERSONAL_DATA=0, plaintext writes
    _ns: tuple[float, str] = (0.0, "")

    async def namespace(self) -> str:
        """The live views namespace: the setting, else Redis ``active_namespace``, else the file."""
        from contract import namespaces

        if self.settings.views_namespace:
            return self.settings.views_namespace
        at, ns = self._ns
        now = time.monotonic()
        if now - at > NAMESPACE_TTL_S or not ns:
            ns = await self.redis.get(namespaces.REDIS_KEY) or namespaces.active(self.settings)
            self._ns = (now, ns)
        return ns

    async def store(self):
        from contract.serving import ServingReader

        return ServingReader(self.redis, await self.namespace())

    # hints about the API's own recent writes (see the package docstring)
    async def remember(self, kind: str, ident: int, value) -> None:
        await self.redis.set(f"api:recent:{kind}:{ident}", value, ex=RECENT_TTL_S)

    async def user_exists(self, user_id: int) -> bool:
        store = await self.store()
        pipe = self.redis.pipeline(transaction=False)
        pipe.hexists(store.k("users"), user_id)
        pipe.exists(f"api:recent:user:{user_id}")
        in_store, recent = await pipe.execute()
        return bool(in_store or recent)

    async def own_live_post(self, author_id: int, post_id: int) -> bool:
        """Whether (author, post) is a live post: a post is (author_id, post_id), docs/views.md."""
        store = await self.store()
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(f"api:recent:post:{author_id}:{post_id}")
        pipe.hget(store.k("pids", author_id), post_id)
        recent, live = await pipe.execute()
        if recent is not None:
            return recent == "live"
        return live == "1"

    async def in_inbox(self, user_id: int, message_id: int) -> bool:
        store = await self.store()
        pipe = self.redis.pipeline(transaction=False)
        pipe.hexists(store.k("msgs", user_id), message_id)
        pipe.get(f"api:recent:msg:{message_id}")
        in_store, recipient = await pipe.execute()
        return bool(in_store) or recipient == str(user_id)


def _api(request: Request) -> Api:
    return request.app.state.api


bearer = HTTPBearer(auto_error=False, description="the token returned by POST /v1/users")


async def caller(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> int:
    """The authenticated user's id, from the bearer token alone."""
    challenge = {"WWW-Authenticate": "Bearer"}
    if credentials is None:
        raise ApiError(401, "unauthorized", "missing bearer token (Authorization: Bearer <token>)", challenge)
    api = _api(request)
    try:
        user_id = api.tokens.verify(credentials.credentials)
    except auth.InvalidToken as exc:
        raise ApiError(401, "unauthorized", f"invalid token: {exc}", challenge) from None
    if await auth.revoked(api.redis, user_id, await api.namespace()):
        raise ApiError(401, "unauthorized", f"invalid token: user {user_id} is erased", challenge)
    return user_id


Caller = Annotated[int, Depends(caller)]


@dataclass(frozen=True)
class ClientTimes:
    idempotency_key: str | None
    device_time: int | None
    sent_time: int | None


HEADER_NAMES = {
    "idempotency-key": "Idempotency-Key",
    "x-device-time": "X-Device-Time",
    "x-sent-time": "X-Sent-Time",
    "x_device_time": "X-Device-Time",
    "x_sent_time": "X-Sent-Time",
}
SKEW_H = contract.MAX_CLOCK_SKEW_MS // 3_600_000
OFFLINE_D = contract.MAX_OFFLINE_MS // 86_400_000


async def client_headers(
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            pattern=IDEMPOTENCY_KEY_PATTERN,
            description=(
                "1-64 visible ASCII characters (else 400). Scoped to the caller and the endpoint: "
                "the same caller repeating the same request with the same key gets the first answer "
                "again (nothing is appended twice); a different request with it gets 422; one still "
                "in progress 409. The event_id derives from (caller, endpoint, key). On POST /v1/users "
                "a repeat is answered 409 without a token."
            ),
        ),
    ] = None,
    x_device_time: Annotated[
        str | None,
        Header(
            pattern=EPOCH_MS_PATTERN,
            description=(
                "epoch ms by the device's clock when it happened: not after X-Sent-Time and at most "
                f"{OFFLINE_D} days before it (else 400 naming this header)"
            ),
        ),
    ] = None,
    x_sent_time: Annotated[
        str | None,
        Header(
            pattern=EPOCH_MS_PATTERN,
            description=(
                "epoch ms by the device's clock when sent: within "
                f"{SKEW_H} h of the server's clock (else 400 naming this header)"
            ),
        ),
    ] = None,
) -> ClientTimes:
    if idempotency_key is not None and not re.fullmatch(IDEMPOTENCY_KEY_PATTERN, idempotency_key):
        raise ApiError(400, "bad_header", "Idempotency-Key must be 1-64 visible ASCII characters")

    def epoch_ms(name: str, raw: str | None) -> int | None:
        if raw is None:
            return None
        if not re.fullmatch(EPOCH_MS_PATTERN, raw) or int(raw) > contract.MAX_EPOCH_MS:
            raise ApiError(
                400,
                "bad_header",
                f"{name} must be epoch milliseconds between 0 and {contract.MAX_EPOCH_MS} (end of 2099)",
            )
        return int(raw)

    return ClientTimes(
        idempotency_key, epoch_ms("X-Device-Time", x_device_time), epoch_ms("X-Sent-Time", x_sent_time)
    )


def event_times(client: ClientTimes, received: int) -> tuple[int, int]:
    """(device_time, sent_time) of a new event, or 400 naming the header outside the clock window."""
    sent = client.sent_time if client.sent_time is not None else received
    device = client.device_time if client.device_time is not None else sent
    reason = contract.clock_reason(device, sent, received)
    if reason == "clock_skew:sent_time":
        raise ApiError(
            400,
            "bad_header",
            f"X-Sent-Time {sent} is more than {SKEW_H} h away from the server's clock ({received})",
        )
    if reason is not None:
        raise ApiError(
            400,
            "bad_header",
            f"X-Device-Time {device} must not be after the send time ({sent}) nor more than "
            f"{OFFLINE_D} days before it",
        )
    return device, sent


Client = Annotated[ClientTimes, Depends(client_headers)]
Limit = Annotated[int, Query(ge=1, le=m.MAX_LIMIT, description="how many, newest first")]
IdPath = Annotated[int, PathParam(ge=1, le=m.INT64_MAX)]


@dataclass(frozen=True)
class Idempotency:
    """One keyed request's record in Redis, shared by every API worker (see the package docstring)."""

    redis_key: str
    request_hash: str


def _idempotency(api: Api, client: ClientTimes, etype: str, user_id: int | None, fields: dict):
    if client.idempotency_key is None:
        return None
    scope = f"{'anonymous' if user_id is None else user_id}|{etype}|{client.idempotency_key}"
    request = orjson.dumps([etype, user_id, fields], option=orjson.OPT_SORT_KEYS)
    return Idempotency(
        "api:idem:" + hashlib.sha256(scope.encode()).hexdigest(), hashlib.sha256(request).hexdigest()
    )


def _event_id(user_id: int, etype: str, key: str | None) -> str:
    if key is None:
        return new_event_id()
    return str(uuid.uuid5(EVENT_ID_NAMESPACE, f"{user_id}|{etype}|{key}"))


async def append(
    api: Api,
    client: ClientTimes,
    etype: str,
    user_id: int | None,
    fields: dict,
    mint: tuple[str, ...] = (),
    check=None,
) -> dict:
    """Build, validate and append one event; returns the 202 body.

    ``mint`` names snowflake ids to create (post_id, message_id, user_id); ``check`` is an
    async precondition (existence checks against Redis). ``user_id`` None: registration (the
    id is minted). With an ``Idempotency-Key`` the request is recorded in Redis under (caller,
    endpoint, key) with its hash and, once appended, its answer: a repeat by the same caller
    gets that answer and appends nothing.
    """
    idem = _idempotency(api, client, etype, user_id, fields)
    event = None
    claim = None
    if idem is not None:
        ttl = max(1, api.settings.dedup_window_ms // 1000)
        pending = orjson.dumps({"h": idem.request_hash, "s": "pending"}).decode()
        if await api.redis.set(idem.redis_key, pending, nx=True, ex=IDEM_PENDING_TTL_S):
            claim = pending
        else:
            raw = await api.redis.get(idem.redis_key)
            record = orjson.loads(raw) if raw else {"h": idem.request_hash, "s": "pending"}
            if record["h"] != idem.request_hash:
                raise ApiError(
                    422,
                    "idempotency_key_reused",
                    "this Idempotency-Key was already used by you on this endpoint for another request",
                )
            if record["s"] == "done":
                if user_id is None:
                    raise ApiError(
                        409,
                        "already_registered",
                        f"this Idempotency-Key already registered user {record['body']['user_id']}; "
                        "a token is only ever in the first answer",
                    )
                return record["body"]
            taken = record["s"] == "failed" and await api.redis.eval(
                _COMPARE_AND_SET, 1, idem.redis_key, raw, pending, IDEM_PENDING_TTL_S
            )
            if not taken:
                raise ApiError(
                    409,
                    "request_in_progress",
                    "a request with this Idempotency-Key is still in progress; retry",
                    {"Retry-After": "1"},
                )
            claim = pending
            event = record["event"]  # the failed attempt's event, re-appended identically
    produced = False  # the event went to the producer: it may be in the log whatever happens next
    try:
        if check is not None:
            await check()
        if event is None:
            received = wall_clock_ms()
            device, sent = event_times(client, received)
            event = {
                "event_id": "",
                "type": etype,
                "schema_version": 1,
                "user_id": user_id,
                "device_time": device,
                "sent_time": sent,
                "received_time": received,
                **fields,
            }
            for name in mint:
                event[name] = api.ids.next_id(received)
            event["event_id"] = _event_id(event["user_id"], etype, client.idempotency_key)
            reason = contract.validate(event)  # the plaintext: a seal hides it from the log's checks
            if reason is not None:  # the models should make this impossible; never append it
                raise ApiError(422, "invalid_event", f"the event would break the contract: {reason}")
            if api.sealer is not None:
                try:
                    api.sealer.seal(event)  # personal fields sealed with the user's data key
                except keys.Erased:
                    raise ApiError(401, "erased", f"user {event['user_id']} is erased") from None
        produced = True
        at = await api.log.append(event)
    except BaseException:
        if claim is not None:
            if produced and user_id is not None:
                # maybe in the log after all: a retry re-appends this very event (a duplicate)
                failed = orjson.dumps({"h": idem.request_hash, "s": "failed", "event": event}).decode()
                await api.redis.set(idem.redis_key, failed, ex=ttl)
            else:  # nothing appended, or a registration (never re-sent: its retry mints a new user)
                await api.redis.delete(idem.redis_key)
        raise
    body = {"event_id": event["event_id"], "type": etype, "partition": at.partition, "offset": at.offset}
    for name in mint:
        body[name] = event[name]
    if claim is not None:
        done = orjson.dumps({"h": idem.request_hash, "s": "done", "body": body}).decode()
        await api.redis.set(idem.redis_key, done, ex=ttl)
    return body


def _not_self(user_id: int, other: int) -> None:
    if user_id == other:
        raise ApiError(422, "self_follow", "a user cannot follow or unfollow themselves")


# --- the app ---------------------------------------------------------------------------------------

ERRORS = {
    400: {
        "model": m.Error,
        "description": "a malformed or out-of-range header (Idempotency-Key, X-Device-Time, "
        "X-Sent-Time; the detail names it), or a body that cannot be decoded (not UTF-8)",
    },
    401: {"model": m.Error, "description": "missing or invalid token"},
    422: {
        "model": m.Error,
        "description": "invalid request (body, parameters), or an Idempotency-Key you already used "
        "on this endpoint for another request (idempotency_key_reused)",
    },
    503: {"model": m.Error, "description": "the log or the serving store is unavailable"},
}
WRITES = ERRORS | {
    409: {
        "model": m.Error,
        "description": "Idempotency-Key: a request with it is still in progress (request_in_progress, "
        "retry after Retry-After), or a registration repeated with it (already_registered: the token "
        "is only in the first answer)",
    }
}
NOT_FOUND = {404: {"model": m.Error, "description": "unknown user, post or message"}}


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    # before serving: a process without a worker id of its own refuses to start, with one line and
    # uvicorn's "failed to start" status (its supervisor then stops instead of restarting it)
    try:
        worker_id = claim_worker_id(settings)
    except writers.WriterIdUnavailable as exc:
        print(f"app API: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(STARTUP_FAILURE) from None
    metrics = api_metrics.ApiMetrics()  # GET /metrics (app_sim/api/metrics.py, docs/metrics.md)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # asyncio all the way: a read is a pipelined round trip or two on the event loop, no
        # thread hops; a Redis that hangs fails the request after 5 s (503), not the process.
        client = redis.asyncio.Redis.from_url(settings.redis_url, decode_responses=True, socket_timeout=5)
        log = EventLog(settings.kafka_bootstrap, settings.events_topic, settings.api_produce_timeout_ms)
        # SOCIAL_WRITE_MODE=dual / SOCIAL_FAULT_*: the measured anti-pattern (make dual-write); off by default
        log = dual_write.wrap(log, client, settings, worker_id)
        log = api_metrics.CountedLog(log, metrics)  # appends by outcome, on /metrics
        keystore = keys.KeyStore.for_settings(settings)
        app.state.api = Api(
            settings=settings,
            redis=client,
            log=log,
            tokens=auth.TokenSigner(auth.load_secret(settings)),
            ids=Snowflake(worker_id),
            keystore=keystore,
            sealer=keys.Sealer(keystore, cache=False) if settings.seal_personal_data else None,
        )
        try:
            yield
        finally:
            log.close()
            await client.aclose()
            keystore.close()

    app = FastAPI(
        title="kappa-social app API",
        version="1",
        summary="Commands append events to the log; reads come from the serving store with as_of.",
        lifespan=lifespan,
    )
    app.add_middleware(api_metrics.MetricsMiddleware, metrics=metrics)

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics():
        # Prometheus text format, no token (like /v1/health); every worker's values in one scrape
        return Response(metrics.exposition(), media_type=api_metrics.CONTENT_TYPE)

    @app.exception_handler(ApiError)
    async def _api_error(_request, exc: ApiError):
        return _error(exc.status, exc.code, exc.detail, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request, exc: RequestValidationError):
        errors = [
            {
                "loc": [str(p) for p in e.get("loc", ())],
                "msg": str(e.get("msg", "")),
                "type": str(e.get("type", "")),
            }
            for e in exc.errors()
        ]
        detail = "; ".join(f"{'.'.join(e['loc'])}: {e['msg']}" for e in errors) or "invalid request"
        if errors and all(e["loc"][:1] == ["header"] for e in errors):
            named = ", ".join(HEADER_NAMES.get(e["loc"][-1].lower(), e["loc"][-1]) for e in errors)
            return _error(400, "bad_header", f"malformed header {named}: {detail}", errors=errors)
        return _error(422, "invalid_request", detail, errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request, exc: StarletteHTTPException):
        # FastAPI's only 400: a body it cannot decode (e.g. not UTF-8)
        code = "undecodable_body" if exc.status_code == 400 else "http_error"
        return _error(exc.status_code, code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(LogUnavailable)
    async def _log_down(_request, exc: LogUnavailable):
        return _error(
            503,
            "log_unavailable",
            f"the event log did not acknowledge the write: {exc}",
            {"Retry-After": "1"},
        )

    @app.exception_handler(redis.RedisError)
    async def _redis_down(_request, exc: redis.RedisError):
        return _error(
            503,
            "store_unavailable",
            f"the serving store is unavailable: {type(exc).__name__}",
            {"Retry-After": "1"},
        )

    # -- writes ------------------------------------------------------------------------------------

    @app.post("/v1/users", status_code=201, response_model=m.Registered, responses=WRITES, tags=["writes"])
    async def register(body: m.NewUser, request: Request, client: Client):
        """Register a user (event ``user_registered``); the answer carries the bearer token."""
        api = _api(request)
        # the user id is minted like a post id: unique across API processes, never a generator id
        out = await append(api, client, "user_registered", None, body.model_dump(), mint=("user_id",))
        user_id = out["user_id"]
        await api.remember("user", user_id, 1)
        return _json({"user_id": user_id, "token": api.tokens.issue(user_id), **_loc(out)}, 201)

    @app.post(
        "/v1/follows",
        status_code=202,
        response_model=m.Accepted,
        responses=WRITES | NOT_FOUND,
        tags=["writes"],
    )
    async def follow(body: m.NewFollow, request: Request, me: Caller, client: Client):
        """Follow a user (event ``followed``)."""
        return await _follow(_api(request), client, me, body.followee_id, "followed")

    @app.delete(
        "/v1/follows/{followee_id}",
        status_code=202,
        response_model=m.Accepted,
        responses=WRITES | NOT_FOUND,
        tags=["writes"],
    )
    async def unfollow(
        followee_id: IdPath,
        request: Request,
        me: Caller,
        client: Client,
    ):
        """Stop following a user (event ``unfollowed``)."""
        return await _follow(_api(request), client, me, followee_id, "unfollowed")

    async def _follow(api: Api, client: ClientTimes, me: int, followee_id: int, etype: str):
        _not_self(me, followee_id)

        async def check():
            if not await api.user_exists(followee_id):
                raise ApiError(404, "unknown_user", f"user {followee_id} does not exist")

        out = await append(api, client, etype, me, {"followee_id": followee_id}, check=check)
        return _json(out, 202)

    @app.post("/v1/posts", status_code=202, response_model=m.Accepted, responses=WRITES, tags=["writes"])
    async def create_post(body: m.NewPost, request: Request, me: Caller, client: Client):
        """Publish a post (event ``post_created``); the answer carries the new ``post_id``."""
        api = _api(request)
        out = await append(api, client, "post_created", me, {"text": body.text}, mint=("post_id",))
        await api.remember("post", f"{me}:{out['post_id']}", "live")
        return _json(out, 202)

    @app.delete(
        "/v1/posts/{post_id}",
        status_code=202,
        response_model=m.Accepted,
        responses=WRITES | NOT_FOUND,
        tags=["writes"],
    )
    async def delete_post(post_id: IdPath, request: Request, me: Caller, client: Client):
        """Delete one of your own posts (event ``post_deleted``)."""
        api = _api(request)

        async def check():
            # a post is (author, post): another author's post with this id is not the caller's
            # business, so it answers as a missing one does (as messages do)
            if not await api.own_live_post(me, post_id):
                raise ApiError(404, "unknown_post", f"you have no live post {post_id}")

        out = await append(api, client, "post_deleted", me, {"post_id": post_id}, check=check)
        await api.remember("post", f"{me}:{post_id}", "deleted")
        return _json(out, 202)

    @app.post(
        "/v1/messages",
        status_code=202,
        response_model=m.Accepted,
        responses=WRITES | NOT_FOUND,
        tags=["writes"],
    )
    async def send_message(body: m.NewMessage, request: Request, me: Caller, client: Client):
        """Send a direct message (event ``message_sent``, keyed by the recipient's inbox)."""
        api = _api(request)

        async def check():
            if not await api.user_exists(body.recipient_id):
                raise ApiError(404, "unknown_user", f"user {body.recipient_id} does not exist")

        fields = {"recipient_id": body.recipient_id, "text": body.text}
        out = await append(api, client, "message_sent", me, fields, mint=("message_id",), check=check)
        await api.remember("msg", out["message_id"], body.recipient_id)
        return _json(out, 202)

    @app.post(
        "/v1/messages/{message_id}/read",
        status_code=202,
        response_model=m.Accepted,
        responses=WRITES | NOT_FOUND,
        tags=["writes"],
    )
    async def read_message(
        message_id: IdPath,
        request: Request,
        me: Caller,
        client: Client,
    ):
        """Mark a message in your inbox as read (event ``message_read``)."""
        api = _api(request)

        async def check():
            if not await api.in_inbox(me, message_id):
                raise ApiError(404, "unknown_message", f"message {message_id} is not in your inbox")

        out = await append(api, client, "message_read", me, {"message_id": message_id}, check=check)
        return _json(out, 202)

    @app.put("/v1/status", status_code=202, response_model=m.Accepted, responses=WRITES, tags=["writes"])
    async def update_status(body: m.NewStatus, request: Request, me: Caller, client: Client):
        """Replace your status text (event ``status_updated``)."""
        out = await append(_api(request), client, "status_updated", me, {"text": body.text})
        return _json(out, 202)

    # -- reads (serving store only; as_of read first, so the data covers at least as_of) -----------

    @app.delete("/v1/users/me", status_code=202, response_model=m.Accepted, responses=WRITES, tags=["writes"])
    async def erase_me(request: Request, me: Caller, client: Client):
        """Erase yourself (event ``user_erased``, docs/views.md "Erasure"): your profile, status,
        posts, follows, inbox and unread count leave every view, messages you sent stay with their
        recipients without sender and text; your token stops working (401)."""
        return await _erase(_api(request), client, me)

    @app.delete(
        "/v1/users/{user_id}",
        status_code=202,
        response_model=m.Accepted,
        responses=WRITES | NOT_FOUND | {403: {"model": m.Error, "description": "not yourself"}},
        tags=["writes"],
    )
    async def erase_user(user_id: IdPath, request: Request, me: Caller, client: Client):
        """Erase a user: only yourself (the same as ``DELETE /v1/users/me``)."""
        api = _api(request)
        if user_id != me:
            if not await api.user_exists(user_id):
                raise ApiError(404, "unknown_user", f"user {user_id} does not exist")
            raise ApiError(403, "not_yourself", "only the user themself can be erased through the API")
        return await _erase(api, client, me)

    async def _erase(api: Api, client: ClientTimes, me: int):
        out = await append(api, client, "user_erased", me, {})
        # after the append (a failed append erases nothing): the data key goes first, so every
        # sealed copy of this user's data is unreadable from here on; then the token
        api.keystore.erase(me)
        await auth.revoke(api.redis, me)
        return _json(out, 202)

    @app.get("/v1/timeline", response_model=m.Timeline, responses=ERRORS, tags=["reads"])
    async def timeline(request: Request, me: Caller, limit: Limit = 50):
        """Your home timeline: your posts and those of whom you follow, newest first."""
        api = _api(request)
        posts, as_of = await (await api.store()).timeline(me, limit)
        # sealed texts opened; a post whose key is gone is an erased author's, leaving every timeline
        posts = [p for p in keys.open_fields(api.keystore, posts, "text") if p["text"] is not None]
        return _json({"user_id": me, "posts": posts, "as_of": as_of})

    @app.get("/v1/inbox", response_model=m.Inbox, responses=ERRORS, tags=["reads"])
    async def inbox(request: Request, me: Caller, limit: Limit = 50):
        """Your inbox, newest first, each message with its read state."""
        api = _api(request)
        messages, as_of = await (await api.store()).inbox(me, limit)
        keys.open_fields(api.keystore, messages, "text")  # null once the sender is erased
        return _json({"user_id": me, "messages": messages, "as_of": as_of})

    @app.get("/v1/unread", response_model=m.Unread, responses=ERRORS, tags=["reads"])
    async def unread(request: Request, me: Caller):
        """How many messages in your inbox you have not read."""
        n, as_of = await (await _api(request).store()).unread(me)
        return _json({"user_id": me, "unread": n, "as_of": as_of})

    @app.get(
        "/v1/users/{user_id}/status",
        response_model=m.UserStatus,
        responses={**NOT_FOUND, 422: ERRORS[422], 503: ERRORS[503]},
        tags=["reads"],
    )
    async def user_status(user_id: IdPath, request: Request):
        """Anyone's current status (public, no token needed); ``status`` is null if never set."""
        api = _api(request)
        status, as_of = await (await api.store()).status(user_id)
        if status is not None and keys.open_fields(api.keystore, [status], "text")[0]["text"] is None:
            status = None  # sealed with a key that is gone: the user is erased
        if status is None and not await api.user_exists(user_id):
            raise ApiError(404, "unknown_user", f"user {user_id} does not exist")
        return _json({"user_id": user_id, "status": status, "as_of": as_of})

    @app.get("/v1/health", response_model=m.Health, responses={503: ERRORS[503]}, tags=["ops"])
    async def health(request: Request):
        """200 when the process serves and Redis answers."""
        api = _api(request)
        await api.redis.ping()
        return _json({"status": "ok", "namespace": await api.namespace(), "topic": settings.events_topic})

    return app


def _loc(out: dict) -> dict:
    return {"event_id": out["event_id"], "partition": out["partition"], "offset": out["offset"]}
