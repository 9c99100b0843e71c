"""``DELETE /v1/users/me`` and ``DELETE /v1/users/{user_id}``: a user erases themself (docs/views.md "Erasure")."""

from __future__ import annotations

from fastapi import APIRouter

from app_sim import auth
from app_sim.api import models as m
from app_sim.api.commands import append
from app_sim.api.deps import Caller, Client, ClientTimes, IdPath
from app_sim.api.errors import NOT_FOUND, WRITES, ApiError, json_response
from app_sim.api.state import Api, ApiState

router = APIRouter()


@router.delete("/v1/users/me", status_code=202, response_model=m.Accepted, responses=WRITES, tags=["writes"])
async def erase_me(api: ApiState, me: Caller, client: Client):
    """Erase yourself (event ``user_erased``, docs/views.md "Erasure"): your profile, status,
    posts, follows, inbox and unread count leave every view, messages you sent stay with their
    recipients without sender and text; your token stops working (401)."""
    return await _erase(api, client, me)


@router.delete(
    "/v1/users/{user_id}",
    status_code=202,
    response_model=m.Accepted,
    responses=WRITES | NOT_FOUND | {403: {"model": m.Error, "description": "not yourself"}},
    tags=["writes"],
)
async def erase_user(user_id: IdPath, api: ApiState, me: Caller, client: Client):
    """Erase a user: only yourself (the same as ``DELETE /v1/users/me``)."""
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
    return json_response(out, 202)
