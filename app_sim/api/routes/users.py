"""``POST /v1/users``: registration, the one write without a caller; the answer carries the token."""

from __future__ import annotations

from fastapi import APIRouter

from app_sim.api import models as m
from app_sim.api.commands import append
from app_sim.api.deps import Client
from app_sim.api.errors import WRITES, json_response
from app_sim.api.state import ApiState

router = APIRouter()


@router.post("/v1/users", status_code=201, response_model=m.Registered, responses=WRITES, tags=["writes"])
async def register(body: m.NewUser, api: ApiState, client: Client):
    """Register a user (event ``user_registered``); the answer carries the bearer token."""
    # the user id is minted like a post id: unique across API processes, never a generator id
    out = await append(api, client, "user_registered", None, body.model_dump(), mint=("user_id",))
    user_id = out["user_id"]
    await api.remember("user", user_id, 1)
    return json_response({"user_id": user_id, "token": api.tokens.issue(user_id), **_loc(out)}, 201)


def _loc(out: dict) -> dict:
    return {"event_id": out["event_id"], "partition": out["partition"], "offset": out["offset"]}
