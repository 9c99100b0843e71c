"""The reads: ``GET /v1/timeline``, ``/v1/inbox``, ``/v1/unread`` and ``/v1/users/{user_id}/status``.

The serving store only, each answer with ``as_of`` (read first, so the data covers at least as_of);
sealed texts are opened with their user's data key, and an erased user's are gone.
"""

from __future__ import annotations

from fastapi import APIRouter

from app_sim.api import models as m
from app_sim.api.deps import Caller, IdPath, Limit
from app_sim.api.errors import ERRORS, NOT_FOUND, ApiError, json_response
from app_sim.api.state import ApiState
from contract import keys

router = APIRouter()


@router.get("/v1/timeline", response_model=m.Timeline, responses=ERRORS, tags=["reads"])
async def timeline(api: ApiState, me: Caller, limit: Limit = 50):
    """Your home timeline: your posts and those of whom you follow, newest first."""
    posts, as_of = await (await api.store()).timeline(me, limit)
    return json_response(timeline_body(api.keystore, me, posts, as_of))


def timeline_body(keystore: keys.KeyStore, me: int, posts: list[dict], as_of: dict[str, int]) -> dict:
    """The answer of GET /v1/timeline (here and in its fast path, app_sim/api/fastpath.py)."""
    # sealed texts opened; a post whose key is gone is an erased author's, leaving every timeline
    posts = [p for p in keys.open_fields(keystore, posts, "text") if p["text"] is not None]
    return {"user_id": me, "posts": posts, "as_of": as_of}


@router.get("/v1/inbox", response_model=m.Inbox, responses=ERRORS, tags=["reads"])
async def inbox(api: ApiState, me: Caller, limit: Limit = 50):
    """Your inbox, newest first, each message with its read state."""
    messages, as_of = await (await api.store()).inbox(me, limit)
    keys.open_fields(api.keystore, messages, "text")  # null once the sender is erased
    return json_response({"user_id": me, "messages": messages, "as_of": as_of})


@router.get("/v1/unread", response_model=m.Unread, responses=ERRORS, tags=["reads"])
async def unread(api: ApiState, me: Caller):
    """How many messages in your inbox you have not read."""
    n, as_of = await (await api.store()).unread(me)
    return json_response({"user_id": me, "unread": n, "as_of": as_of})


@router.get(
    "/v1/users/{user_id}/status",
    response_model=m.UserStatus,
    responses={**NOT_FOUND, 422: ERRORS[422], 503: ERRORS[503]},
    tags=["reads"],
)
async def user_status(user_id: IdPath, api: ApiState):
    """Anyone's current status (public, no token needed); ``status`` is null if never set."""
    status, as_of = await (await api.store()).status(user_id)
    if status is not None and keys.open_fields(api.keystore, [status], "text")[0]["text"] is None:
        status = None  # sealed with a key that is gone: the user is erased
    if status is None and not await api.user_exists(user_id):
        raise ApiError(404, "unknown_user", f"user {user_id} does not exist")
    return json_response({"user_id": user_id, "status": status, "as_of": as_of})
