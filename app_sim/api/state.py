"""The state of one API process (:class:`Api`), built by ``create_app``'s lifespan into ``app.state.api``.

A route takes it as a parameter ``api: ApiState`` (a FastAPI dependency reading ``app.state``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated

import redis.asyncio
from fastapi import Depends, Request

from app_sim import auth
from app_sim.api.eventlog import EventLog
from contract import keys
from contract.ids import EventIds, Snowflake
from infra.settings import Settings

RECENT_TTL_S = 24 * 3600  # how long the API remembers its own writes (the store lags by seconds)
NAMESPACE_TTL_S = 1.0  # a blue/green switch is picked up within this


@dataclass
class Api:
    settings: Settings
    redis: redis.asyncio.Redis
    log: EventLog
    tokens: auth.TokenSigner
    ids: Snowflake
    keystore: keys.KeyStore  # data keys: seal personal fields on write, open them on read
    sealer: keys.Sealer | None  # None: SOCIAL_SEAL_PERSONAL_DATA=0, plaintext writes
    partitions: int = 0  # the event topic's (the partitioned layout's owners); 0: the setting's
    # event ids of unkeyed writes, sq:<worker id>:<n> (docs/views.md, "Duplicates")
    event_ids: EventIds | None = None
    _ns: tuple[float, str] = (0.0, "")

    def __post_init__(self) -> None:
        if self.event_ids is None:
            self.event_ids = EventIds(self.ids.worker_id)

    async def namespace(self) -> str:
        """The live views namespace: the setting, else Redis ``active_namespace``, else the file."""
        from contract import namespaces

        if self.settings.views_namespace:
            return self.settings.views_namespace
        at, ns = self._ns
        now = time.monotonic()
        if now - at > NAMESPACE_TTL_S or not ns:
            ns = await self.redis.get(namespaces.REDIS_KEY) or namespaces.active(self.settings)
            self._ns = (now, ns)
        return ns

    async def store(self):
        from contract.serving import reader

        s = self.settings
        return reader(
            self.redis, await self.namespace(), s.serving_layout, self.partitions or s.events_partitions
        )

    # hints about the API's own recent writes (see the package docstring)
    async def remember(self, kind: str, ident: int, value) -> None:
        await self.redis.set(f"api:recent:{kind}:{ident}", value, ex=RECENT_TTL_S)

    async def user_exists(self, user_id: int) -> bool:
        store = await self.store()
        pipe = self.redis.pipeline(transaction=False)
        pipe.hexists(store.key_for(user_id, "users"), user_id)
        pipe.exists(f"api:recent:user:{user_id}")
        in_store, recent = await pipe.execute()
        return bool(in_store or recent)

    async def own_live_post(self, author_id: int, post_id: int) -> bool:
        """Whether (author, post) is a live post: a post is (author_id, post_id), docs/views.md."""
        store = await self.store()
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(f"api:recent:post:{author_id}:{post_id}")
        pipe.hget(store.key_for(author_id, "pids", author_id), post_id)
        recent, live = await pipe.execute()
        if recent is not None:
            return recent == "live"
        return live == "1"

    async def in_inbox(self, user_id: int, message_id: int) -> bool:
        store = await self.store()
        pipe = self.redis.pipeline(transaction=False)
        pipe.hexists(store.key_for(user_id, "msgs", user_id), message_id)
        pipe.get(f"api:recent:msg:{message_id}")
        in_store, recipient = await pipe.execute()
        return bool(in_store) or recipient == str(user_id)


async def get_api(request: Request) -> Api:
    # async: FastAPI awaits it on the event loop; a plain def ran in its thread pool on every request
    return request.app.state.api


ApiState = Annotated[Api, Depends(get_api)]
