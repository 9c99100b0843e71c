"""``social-erase --user-id N``: the operator's erasure request (docs/views.md, "Erasure").

Appends the same ``user_erased`` event as ``DELETE /v1/users/me`` (through the API's
:class:`app_sim.api.eventlog.EventLog`: validated against the contract, acknowledged by the
broker), deletes the user's data key (``contract.keys``: every sealed copy of their personal data
becomes unreadable) and revokes the user's tokens (:func:`app_sim.auth.revoke`). A user the served views do
not know (and the API has not just registered) is refused with a clear error and exit code 2;
a user already erased is reported and nothing is appended (exit code 0: erasing twice is
harmless; a second ``user_erased`` in the log would be rejected as ``user_erased`` anyway).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import redis.asyncio

from app_sim import auth
from app_sim.api.eventlog import EventLog, LogUnavailable
from contract.ids import new_event_id, wall_clock_ms
from contract.keys import KeyStore
from infra import clients
from infra.cli import command_name, run_main
from infra.settings import Settings, get_settings


class EraseError(RuntimeError):
    pass


async def namespace(client: redis.asyncio.Redis, settings: Settings) -> str:
    """The served views namespace, decided as the API decides it."""
    from contract import namespaces

    if settings.views_namespace:
        return settings.views_namespace
    return await client.get(namespaces.REDIS_KEY) or namespaces.active(settings)


async def erase(user_id: int, settings: Settings) -> dict:
    """Append ``user_erased`` for ``user_id``; returns ``{event_id, partition, offset}`` (or
    ``{"already_erased": true}``)."""
    client = clients.redis_client(settings.redis_url, "request", decode_responses=True, asyncio=True)
    try:
        ns = await namespace(client, settings)
        pipe = client.pipeline(transaction=False)
        pipe.sismember(f"{ns}:erased", user_id)
        pipe.hexists(f"{ns}:users", user_id)
        pipe.exists(f"api:recent:user:{user_id}")
        erased, known, recent = await pipe.execute()
        if erased:  # again harmless: covers a crash between an earlier append and these
            KeyStore.for_settings(settings).erase(user_id)
            await auth.revoke(client, user_id)
            return {"user_id": user_id, "already_erased": True}
        if not (known or recent):
            raise EraseError(f"unknown user {user_id}: not registered in the served views ({ns!r})")
        now = wall_clock_ms()
        event = {
            "event_id": new_event_id(),
            "type": "user_erased",
            "schema_version": 1,
            "user_id": user_id,
            "device_time": now,
            "sent_time": now,
            "received_time": now,
        }
        log = EventLog(settings, settings.events_topic, settings.api_produce_timeout_ms)
        try:
            at = await log.append(event)
        finally:
            log.close()
        KeyStore.for_settings(settings).erase(user_id)  # every sealed copy of their data: unreadable
        await auth.revoke(client, user_id)
        return {
            "user_id": user_id,
            "event_id": event["event_id"],
            "partition": at.partition,
            "offset": at.offset,
        }
    finally:
        await client.aclose()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=command_name("app_sim.erase"), description=__doc__.splitlines()[0])
    p.add_argument("--user-id", type=int, required=True, help="the user to erase")
    args = p.parse_args(argv)
    if args.user_id < 1:
        print("social-erase: --user-id must be >= 1", file=sys.stderr)
        return 2
    try:
        out = asyncio.run(erase(args.user_id, get_settings()))
    except EraseError as exc:
        print(f"social-erase: {exc}", file=sys.stderr)
        return 2
    except LogUnavailable as exc:
        print(f"social-erase: the log did not take the event: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "app_sim.erase"))
