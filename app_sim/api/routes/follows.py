"""``POST /v1/follows`` and ``DELETE /v1/follows/{followee_id}``: follow and unfollow a user."""

from __future__ import annotations

from fastapi import APIRouter

from app_sim.api import models as m
from app_sim.api.commands import append
from app_sim.api.deps import Caller, Client, ClientTimes, IdPath
from app_sim.api.errors import NOT_FOUND, WRITES, ApiError, json_response
from app_sim.api.state import Api, ApiState

router = APIRouter()


@router.post(
    "/v1/follows",
    status_code=202,
    response_model=m.Accepted,
    responses=WRITES | NOT_FOUND,
    tags=["writes"],
)
async def follow(body: m.NewFollow, api: ApiState, me: Caller, client: Client):
    """Follow a user (event ``followed``)."""
    return await _follow(api, client, me, body.followee_id, "followed")


@router.delete(
    "/v1/follows/{followee_id}",
    status_code=202,
    response_model=m.Accepted,
    responses=WRITES | NOT_FOUND,
    tags=["writes"],
)
async def unfollow(
    followee_id: IdPath,
    api: ApiState,
    me: Caller,
    client: Client,
):
    """Stop following a user (event ``unfollowed``)."""
    return await _follow(api, client, me, followee_id, "unfollowed")


async def _follow(api: Api, client: ClientTimes, me: int, followee_id: int, etype: str):
    if me == followee_id:
        raise ApiError(422, "self_follow", "a user cannot follow or unfollow themselves")

    async def check():
        if not await api.user_exists(followee_id):
            raise ApiError(404, "unknown_user", f"user {followee_id} does not exist")

    out = await append(api, client, etype, me, {"followee_id": followee_id}, check=check)
    return json_response(out, 202)
