"""``POST /v1/posts`` and ``DELETE /v1/posts/{post_id}``: publish a post, delete one of your own."""

from __future__ import annotations

from fastapi import APIRouter

from app_sim.api import models as m
from app_sim.api.commands import append
from app_sim.api.deps import Caller, Client, IdPath
from app_sim.api.errors import NOT_FOUND, WRITES, ApiError, json_response
from app_sim.api.state import ApiState

router = APIRouter()


@router.post("/v1/posts", status_code=202, response_model=m.Accepted, responses=WRITES, tags=["writes"])
async def create_post(body: m.NewPost, api: ApiState, me: Caller, client: Client):
    """Publish a post (event ``post_created``); the answer carries the new ``post_id``."""
    out = await append(api, client, "post_created", me, {"text": body.text}, mint=("post_id",))
    await api.remember("post", f"{me}:{out['post_id']}", "live")
    return json_response(out, 202)


@router.delete(
    "/v1/posts/{post_id}",
    status_code=202,
    response_model=m.Accepted,
    responses=WRITES | NOT_FOUND,
    tags=["writes"],
)
async def delete_post(post_id: IdPath, api: ApiState, me: Caller, client: Client):
    """Delete one of your own posts (event ``post_deleted``)."""

    async def check():
        # a post is (author, post): another author's post with this id is not the caller's
        # business, so it answers as a missing one does (as messages do)
        if not await api.own_live_post(me, post_id):
            raise ApiError(404, "unknown_post", f"you have no live post {post_id}")

    out = await append(api, client, "post_deleted", me, {"post_id": post_id}, check=check)
    await api.remember("post", f"{me}:{post_id}", "deleted")
    return json_response(out, 202)
