"""``PUT /v1/status``: replace your status text (anyone reads it: ``GET /v1/users/{user_id}/status``, reads)."""

from __future__ import annotations

from fastapi import APIRouter

from app_sim.api import models as m
from app_sim.api.commands import append
from app_sim.api.deps import Caller, Client
from app_sim.api.errors import WRITES, json_response
from app_sim.api.state import ApiState

router = APIRouter()


@router.put("/v1/status", status_code=202, response_model=m.Accepted, responses=WRITES, tags=["writes"])
async def update_status(body: m.NewStatus, api: ApiState, me: Caller, client: Client):
    """Replace your status text (event ``status_updated``)."""
    out = await append(api, client, "status_updated", me, {"text": body.text})
    return json_response(out, 202)
