"""Error bodies and status codes of the app API: ``{"error": <code>, "detail": <text>}`` for every one.

:class:`ApiError` is what a route or dependency raises; :data:`HANDLERS` turn it, a request that
fails validation, an HTTP error of the framework, an unacknowledged append and an unavailable Redis
into those bodies (``create_app`` installs them). ``ERRORS``, ``WRITES`` and ``NOT_FOUND`` document
the error answers in the OpenAPI document.
"""

from __future__ import annotations

import orjson
import redis
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from app_sim.api import models as m
from app_sim.api.eventlog import LogUnavailable


class ApiError(Exception):
    def __init__(self, status: int, code: str, detail: str, headers: dict | None = None):
        self.status, self.code, self.detail, self.headers = status, code, detail, headers


def json_response(body, status: int = 200, headers: dict | None = None) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json", headers=headers)


def error_response(status: int, code: str, detail: str, headers: dict | None = None, errors=None) -> Response:
    body = {"error": code, "detail": detail}
    if errors is not None:
        body["errors"] = errors
    return json_response(body, status, headers)


# a header's name as a client writes it, from its name in a validation error's loc
HEADER_NAMES = {
    "idempotency-key": "Idempotency-Key",
    "x-device-time": "X-Device-Time",
    "x-sent-time": "X-Sent-Time",
    "x_device_time": "X-Device-Time",
    "x_sent_time": "X-Sent-Time",
}


async def _api_error(_request, exc: ApiError):
    return error_response(exc.status, exc.code, exc.detail, exc.headers)


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
        return error_response(400, "bad_header", f"malformed header {named}: {detail}", errors=errors)
    return error_response(422, "invalid_request", detail, errors=errors)


async def _http(_request, exc: StarletteHTTPException):
    # FastAPI's only 400: a body it cannot decode (e.g. not UTF-8)
    code = "undecodable_body" if exc.status_code == 400 else "http_error"
    return error_response(exc.status_code, code, str(exc.detail), getattr(exc, "headers", None))


async def _log_down(_request, exc: LogUnavailable):
    return error_response(
        503,
        "log_unavailable",
        f"the event log did not acknowledge the write: {exc}",
        {"Retry-After": "1"},
    )


def store_unavailable(exc: redis.RedisError) -> Response:
    return error_response(
        503,
        "store_unavailable",
        f"the serving store is unavailable: {type(exc).__name__}",
        {"Retry-After": "1"},
    )


async def _redis_down(_request, exc: redis.RedisError):
    return store_unavailable(exc)


# (exception class, handler), in the order create_app installs them
HANDLERS = (
    (ApiError, _api_error),
    (RequestValidationError, _invalid),
    (StarletteHTTPException, _http),
    (LogUnavailable, _log_down),
    (redis.RedisError, _redis_down),
)

# --- the error answers in the OpenAPI document ------------------------------------------------------

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
