"""``POST /v1/messages`` and ``POST /v1/messages/{message_id}/read``: send a direct message, mark one read."""

from __future__ import annotations

from fastapi import APIRouter

from app_sim.api import models as m
from app_sim.api.commands import append
from app_sim.api.deps import Caller, Client, IdPath
from app_sim.api.errors import NOT_FOUND, WRITES, ApiError, json_response
from app_sim.api.state import ApiState

router = APIRouter()


@router.post(
    "/v1/messages",
    status_code=202,
    response_model=m.Accepted,
    responses=WRITES | NOT_FOUND,
    tags=["writes"],
)
async def send_message(body: m.NewMessage, api: ApiState, me: Caller, client: Client):
    """Send a direct message (event ``message_sent``, keyed by the recipient's inbox)."""

    async def check():
        if not await api.user_exists(body.recipient_id):
            raise ApiError(404, "unknown_user", f"user {body.recipient_id} does not exist")

    fields = {"recipient_id": body.recipient_id, "text": body.text}
    out = await append(api, client, "message_sent", me, fields, mint=("message_id",), check=check)
    await api.remember("msg", out["message_id"], body.recipient_id)
    return json_response(out, 202)


@router.post(
    "/v1/messages/{message_id}/read",
    status_code=202,
    response_model=m.Accepted,
    responses=WRITES | NOT_FOUND,
    tags=["writes"],
)
async def read_message(
    message_id: IdPath,
    api: ApiState,
    me: Caller,
    client: Client,
):
    """Mark a message in your inbox as read (event ``message_read``)."""

    async def check():
        if not await api.in_inbox(me, message_id):
            raise ApiError(404, "unknown_message", f"message {message_id} is not in your inbox")

    out = await append(api, client, "message_read", me, {"message_id": message_id}, check=check)
    return json_response(out, 202)
