"""What a route reads from the request besides its body: the caller, the client's headers, limits and ids.

``Caller`` is the authenticated user's id (bearer token, 401 otherwise); ``Client`` the optional
``Idempotency-Key``, ``X-Device-Time`` and ``X-Sent-Time`` (400 naming a malformed one);
``event_times`` checks the client's clocks against the contract's clock window.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Query
from fastapi import Path as PathParam
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

import contract
from app_sim import auth
from app_sim.api import models as m
from app_sim.api.errors import ApiError
from app_sim.api.state import ApiState

IDEMPOTENCY_KEY_PATTERN = r"^[\x21-\x7e]{1,64}$"
EPOCH_MS_PATTERN = r"^[0-9]{1,13}$"  # up to contract.MAX_EPOCH_MS (end of 2099): 13 digits

bearer = HTTPBearer(auto_error=False, description="the token returned by POST /v1/users")


async def caller(
    api: ApiState, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> int:
    """The authenticated user's id, from the bearer token alone."""
    challenge = {"WWW-Authenticate": "Bearer"}
    if credentials is None:
        raise ApiError(401, "unauthorized", "missing bearer token (Authorization: Bearer <token>)", challenge)
    try:
        user_id = api.tokens.verify(credentials.credentials)
    except auth.InvalidToken as exc:
        raise ApiError(401, "unauthorized", f"invalid token: {exc}", challenge) from None
    if await auth.revoked(api.redis, user_id, await api.store()):
        raise ApiError(401, "unauthorized", f"invalid token: user {user_id} is erased", challenge)
    return user_id


Caller = Annotated[int, Depends(caller)]


@dataclass(frozen=True)
class ClientTimes:
    idempotency_key: str | None
    device_time: int | None
    sent_time: int | None


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
