"""The FastAPI application: routes, auth, error mapping. See the package docstring for the rules."""

from __future__ import annotations

import fcntl
import os
import re
import time
from collections import OrderedDict
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
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

from app_sim import auth
from app_sim.api import dual_write
from app_sim.api import models as m
from app_sim.api.eventlog import EventLog, InvalidEvent, LogUnavailable
from app_sim.ids import GENERATOR_WORKER_ID, MAX_WORKER_ID, Snowflake, new_event_id, wall_clock_ms
from infra.settings import Settings, get_settings

RECENT_TTL_S = 24 * 3600  # how long the API remembers its own writes (the store lags by seconds)
NAMESPACE_TTL_S = 1.0  # a blue/green switch is picked up within this
IDEMPOTENCY_CACHE = 10_000
IDEMPOTENCY_KEY_PATTERN = r"^[\x21-\x7e]{1,64}$"


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


def claim_worker_id(settings: Settings) -> tuple[int, object]:
    """The first worker id >= ``api_worker_id`` no other API process on this host holds.

    Held by an flock on ``run/api-worker-<id>.lock`` for the life of the process (the kernel
    releases it when the process dies, even by kill -9). Never the generator's id.
    """
    run_dir = Path(settings.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    for wid in range(settings.api_worker_id, MAX_WORKER_ID + 1):
        if wid == GENERATOR_WORKER_ID:
            continue
        f = open(run_dir / f"api-worker-{wid}.lock", "w")  # noqa: SIM115 - held open on purpose
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            continue
        f.write(f"{os.getpid()}\n")
        f.flush()
        return wid, f
    raise RuntimeError(f"no free snowflake worker id from {settings.api_worker_id} up (1023 is reserved)")


# --- state of one API process ------------------------------------------------------------------------


@dataclass
class Api:
    settings: Settings
    redis: redis.asyncio.Redis
    log: EventLog
    tokens: auth.TokenSigner
    ids: Snowflake
    _ns: tuple[float, str] = (0.0, "")
    _idem: OrderedDict = field(default_factory=OrderedDict)

    async def namespace(self) -> str:
        """The live views namespace: the setting, else Redis ``active_namespace``, else the file."""
        from pipelines import namespaces

        if self.settings.views_namespace:
            return self.settings.views_namespace
        at, ns = self._ns
        now = time.monotonic()
        if now - at > NAMESPACE_TTL_S or not ns:
            ns = await self.redis.get(namespaces.REDIS_KEY) or namespaces.active(self.settings)
            self._ns = (now, ns)
        return ns

    async def store(self):
        from pipelines.serving import ServingReader

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

    async def post_author(self, post_id: int) -> int | None:
        """Author of a live post, None if unknown or deleted."""
        store = await self.store()
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(f"api:recent:post:{post_id}")
        pipe.get(store.k("p", post_id))
        recent, body = await pipe.execute()
        if recent == "deleted":
            return None
        if recent is not None:
            return int(recent)
        return int(orjson.loads(body)["author_id"]) if body else None

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
    try:
        return _api(request).tokens.verify(credentials.credentials)
    except auth.InvalidToken as exc:
        raise ApiError(401, "unauthorized", f"invalid token: {exc}", challenge) from None


Caller = Annotated[int, Depends(caller)]


@dataclass(frozen=True)
class ClientTimes:
    idempotency_key: str | None
    device_time: int | None
    sent_time: int | None


async def client_headers(
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            description="1-64 visible ASCII characters; becomes the event_id, so a retry is a duplicate",
        ),
    ] = None,
    x_device_time: Annotated[
        str | None, Header(description="epoch ms by the device's clock when it happened")
    ] = None,
    x_sent_time: Annotated[str | None, Header(description="epoch ms by the device's clock when sent")] = None,
) -> ClientTimes:
    if idempotency_key is not None and not re.fullmatch(IDEMPOTENCY_KEY_PATTERN, idempotency_key):
        raise ApiError(400, "bad_header", "Idempotency-Key must be 1-64 visible ASCII characters")

    def epoch_ms(name: str, raw: str | None) -> int | None:
        if raw is None:
            return None
        if not raw.isascii() or not raw.isdigit() or len(raw) > 19 or int(raw) > m.INT64_MAX:
            raise ApiError(400, "bad_header", f"{name} must be epoch milliseconds (a non-negative int64)")
        return int(raw)

    return ClientTimes(
        idempotency_key, epoch_ms("X-Device-Time", x_device_time), epoch_ms("X-Sent-Time", x_sent_time)
    )


Client = Annotated[ClientTimes, Depends(client_headers)]
Limit = Annotated[int, Query(ge=1, le=m.MAX_LIMIT, description="how many, newest first")]
IdPath = Annotated[int, PathParam(ge=1, le=m.INT64_MAX)]


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

    ``mint`` names snowflake ids to create (post_id, message_id); ``check`` is an async
    precondition (existence checks against Redis), skipped for a retry of a cached request.
    """
    key = client.idempotency_key
    fingerprint = (etype, user_id, tuple(sorted(fields.items())))
    cached = api._idem.get(key) if key is not None else None
    if cached is not None:
        if cached[0] != fingerprint:
            raise ApiError(409, "idempotency_key_reused", "this Idempotency-Key was used for another request")
        event = cached[1]
    else:
        if check is not None:
            await check()
        received = wall_clock_ms()
        sent = client.sent_time if client.sent_time is not None else received
        event = {
            "event_id": key if key is not None else new_event_id(),
            "type": etype,
            "schema_version": 1,
            "user_id": user_id,
            "device_time": client.device_time if client.device_time is not None else sent,
            "sent_time": sent,
            "received_time": received,
            **fields,
        }
        for name in mint:
            event[name] = api.ids.next_id(received)
        if key is not None:
            api._idem[key] = (fingerprint, event)
            if len(api._idem) > IDEMPOTENCY_CACHE:
                api._idem.popitem(last=False)
    try:
        at = await api.log.append(event)
    except InvalidEvent as exc:  # the models should make this impossible; never append it
        raise ApiError(422, "invalid_event", f"the event would break the contract: {exc.reason}") from None
    body = {"event_id": event["event_id"], "type": etype, "partition": at.partition, "offset": at.offset}
    for name in mint:
        body[name] = event[name]
    return body


def _not_self(user_id: int, other: int) -> None:
    if user_id == other:
        raise ApiError(422, "self_follow", "a user cannot follow or unfollow themselves")


# --- the app ---------------------------------------------------------------------------------------

ERRORS = {
    400: {"model": m.Error, "description": "malformed header"},
    401: {"model": m.Error, "description": "missing or invalid token"},
    422: {"model": m.Error, "description": "invalid request"},
    503: {"model": m.Error, "description": "the log or the serving store is unavailable"},
}
NOT_FOUND = {404: {"model": m.Error, "description": "unknown user, post or message"}}


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    if settings.api_worker_id == GENERATOR_WORKER_ID:
        raise ValueError(f"api_worker_id {GENERATOR_WORKER_ID} is reserved for the generator")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        worker_id, lock = claim_worker_id(settings)
        # asyncio all the way: a read is a pipelined round trip or two on the event loop, no
        # thread hops; a Redis that hangs fails the request after 5 s (503), not the process.
        client = redis.asyncio.Redis.from_url(settings.redis_url, decode_responses=True, socket_timeout=5)
        log = EventLog(settings.kafka_bootstrap, settings.events_topic, settings.api_produce_timeout_ms)
        # SOCIAL_WRITE_MODE=dual / SOCIAL_FAULT_*: the measured anti-pattern (make dual-write); off by default
        log = dual_write.wrap(log, client, settings, worker_id)
        app.state.api = Api(
            settings=settings,
            redis=client,
            log=log,
            tokens=auth.TokenSigner(auth.load_secret(settings)),
            ids=Snowflake(worker_id),
        )
        try:
            yield
        finally:
            log.close()
            await client.aclose()
            lock.close()

    app = FastAPI(
        title="kappa-social app API",
        version="1",
        summary="Commands append events to the log; reads come from the serving store with as_of.",
        lifespan=lifespan,
    )

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
        return _error(422, "invalid_request", detail, errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request, exc: StarletteHTTPException):
        return _error(exc.status_code, "http_error", str(exc.detail), getattr(exc, "headers", None))

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

    @app.post("/v1/users", status_code=201, response_model=m.Registered, responses=ERRORS, tags=["writes"])
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
        responses=ERRORS | NOT_FOUND,
        tags=["writes"],
    )
    async def follow(body: m.NewFollow, request: Request, me: Caller, client: Client):
        """Follow a user (event ``followed``)."""
        return await _follow(_api(request), client, me, body.followee_id, "followed")

    @app.delete(
        "/v1/follows/{followee_id}",
        status_code=202,
        response_model=m.Accepted,
        responses=ERRORS | NOT_FOUND,
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

    @app.post("/v1/posts", status_code=202, response_model=m.Accepted, responses=ERRORS, tags=["writes"])
    async def create_post(body: m.NewPost, request: Request, me: Caller, client: Client):
        """Publish a post (event ``post_created``); the answer carries the new ``post_id``."""
        api = _api(request)
        out = await append(api, client, "post_created", me, {"text": body.text}, mint=("post_id",))
        await api.remember("post", out["post_id"], me)
        return _json(out, 202)

    @app.delete(
        "/v1/posts/{post_id}",
        status_code=202,
        response_model=m.Accepted,
        responses=ERRORS | NOT_FOUND | {403: {"model": m.Error, "description": "not your post"}},
        tags=["writes"],
    )
    async def delete_post(post_id: IdPath, request: Request, me: Caller, client: Client):
        """Delete one of your own posts (event ``post_deleted``)."""
        api = _api(request)

        async def check():
            author = await api.post_author(post_id)
            if author is None:
                raise ApiError(404, "unknown_post", f"post {post_id} does not exist (or is deleted)")
            if author != me:
                raise ApiError(403, "not_your_post", f"post {post_id} was written by someone else")

        out = await append(api, client, "post_deleted", me, {"post_id": post_id}, check=check)
        await api.remember("post", post_id, "deleted")
        return _json(out, 202)

    @app.post(
        "/v1/messages",
        status_code=202,
        response_model=m.Accepted,
        responses=ERRORS | NOT_FOUND,
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
        responses=ERRORS | NOT_FOUND,
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

    @app.put("/v1/status", status_code=202, response_model=m.Accepted, responses=ERRORS, tags=["writes"])
    async def update_status(body: m.NewStatus, request: Request, me: Caller, client: Client):
        """Replace your status text (event ``status_updated``)."""
        out = await append(_api(request), client, "status_updated", me, {"text": body.text})
        return _json(out, 202)

    # -- reads (serving store only; as_of read first, so the data covers at least as_of) -----------

    @app.get("/v1/timeline", response_model=m.Timeline, responses=ERRORS, tags=["reads"])
    async def timeline(request: Request, me: Caller, limit: Limit = 50):
        """Your home timeline: your posts and those of whom you follow, newest first."""
        posts, as_of = await (await _api(request).store()).timeline(me, limit)
        return _json({"user_id": me, "posts": posts, "as_of": as_of})

    @app.get("/v1/inbox", response_model=m.Inbox, responses=ERRORS, tags=["reads"])
    async def inbox(request: Request, me: Caller, limit: Limit = 50):
        """Your inbox, newest first, each message with its read state."""
        messages, as_of = await (await _api(request).store()).inbox(me, limit)
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
