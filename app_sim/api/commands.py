"""A command of the app API becomes one event in the log: :func:`append`, with its idempotency record.

See the package docstring (app_sim/api/__init__.py) for the rules: an ``Idempotency-Key`` scopes a
record in Redis to (caller, endpoint, key), and a keyed request's ``event_id`` derives from them.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass

import orjson

import contract
from app_sim.api.deps import ClientTimes, event_times
from app_sim.api.errors import ApiError
from app_sim.api.state import Api
from contract import keys
from contract.ids import wall_clock_ms

# event_id of a keyed request: uuid5(EVENT_ID_NAMESPACE, "<user>|<endpoint>|<key>")
EVENT_ID_NAMESPACE = uuid.UUID("5b0a4c1e-3d7f-5e8a-9c2b-6f1d0e4a7b39")
IDEM_PENDING_TTL_S = 60  # a claim whose worker died mid-request frees the key after this
# SET key new EX ttl only if it still holds old: takes over a failed attempt exactly once
_COMPARE_AND_SET = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
  return 1
end
return 0
"""


@dataclass(frozen=True)
class Idempotency:
    """One keyed request's record in Redis, shared by every API worker (see the package docstring)."""

    redis_key: str
    request_hash: str


def _idempotency(api: Api, client: ClientTimes, etype: str, user_id: int | None, fields: dict):
    if client.idempotency_key is None:
        return None
    scope = f"{'anonymous' if user_id is None else user_id}|{etype}|{client.idempotency_key}"
    request = orjson.dumps([etype, user_id, fields], option=orjson.OPT_SORT_KEYS)
    return Idempotency(
        "api:idem:" + hashlib.sha256(scope.encode()).hexdigest(), hashlib.sha256(request).hexdigest()
    )


def _event_id(api: Api, user_id: int, etype: str, key: str | None) -> str:
    """Unkeyed: the next sequenced id of this API process; keyed: a UUID derived from the key (a
    retry, maybe to another API process, must carry the same id)."""
    if key is None:
        assert api.event_ids is not None
        return api.event_ids.next_id()
    return str(uuid.uuid5(EVENT_ID_NAMESPACE, f"{user_id}|{etype}|{key}"))


async def append(
    api: Api,
    client: ClientTimes,
    etype: str,
    user_id: int | None,
    fields: dict,
    mint: tuple[str, ...] = (),
    check=None,
) -> dict:
    """Build, validate and append one event; returns the 202 body.

    ``mint`` names snowflake ids to create (post_id, message_id, user_id); ``check`` is an
    async precondition (existence checks against Redis). ``user_id`` None: registration (the
    id is minted). With an ``Idempotency-Key`` the request is recorded in Redis under (caller,
    endpoint, key) with its hash and, once appended, its answer: a repeat by the same caller
    gets that answer and appends nothing.
    """
    idem = _idempotency(api, client, etype, user_id, fields)
    event = None
    claim = None
    if idem is not None:
        ttl = max(1, api.settings.dedup_window_ms // 1000)
        pending = orjson.dumps({"h": idem.request_hash, "s": "pending"}).decode()
        if await api.redis.set(idem.redis_key, pending, nx=True, ex=IDEM_PENDING_TTL_S):
            claim = pending
        else:
            raw = await api.redis.get(idem.redis_key)
            record = orjson.loads(raw) if raw else {"h": idem.request_hash, "s": "pending"}
            if record["h"] != idem.request_hash:
                raise ApiError(
                    422,
                    "idempotency_key_reused",
                    "this Idempotency-Key was already used by you on this endpoint for another request",
                )
            if record["s"] == "done":
                if user_id is None:
                    raise ApiError(
                        409,
                        "already_registered",
                        f"this Idempotency-Key already registered user {record['body']['user_id']}; "
                        "a token is only ever in the first answer",
                    )
                return record["body"]
            taken = record["s"] == "failed" and await api.redis.eval(
                _COMPARE_AND_SET, 1, idem.redis_key, raw, pending, IDEM_PENDING_TTL_S
            )
            if not taken:
                raise ApiError(
                    409,
                    "request_in_progress",
                    "a request with this Idempotency-Key is still in progress; retry",
                    {"Retry-After": "1"},
                )
            claim = pending
            event = record["event"]  # the failed attempt's event, re-appended identically
    produced = False  # the event went to the producer: it may be in the log whatever happens next
    try:
        if check is not None:
            await check()
        if event is None:
            received = wall_clock_ms()
            device, sent = event_times(client, received)
            event = {
                "event_id": "",
                "type": etype,
                "schema_version": 1,
                "user_id": user_id,
                "device_time": device,
                "sent_time": sent,
                "received_time": received,
                **fields,
            }
            for name in mint:
                event[name] = api.ids.next_id(received)
            event["event_id"] = _event_id(api, event["user_id"], etype, client.idempotency_key)
            reason = contract.validate(event)  # the plaintext: a seal hides it from the log's checks
            if reason is not None:  # the models should make this impossible; never append it
                raise ApiError(422, "invalid_event", f"the event would break the contract: {reason}")
            if api.sealer is not None:
                try:
                    api.sealer.seal(event)  # personal fields sealed with the user's data key
                except keys.Erased:
                    raise ApiError(401, "erased", f"user {event['user_id']} is erased") from None
        produced = True
        at = await api.log.append(event)
    except BaseException:
        if claim is not None:
            if produced and user_id is not None:
                # maybe in the log after all: a retry re-appends this very event (a duplicate)
                failed = orjson.dumps({"h": idem.request_hash, "s": "failed", "event": event}).decode()
                await api.redis.set(idem.redis_key, failed, ex=ttl)
            else:  # nothing appended, or a registration (never re-sent: its retry mints a new user)
                await api.redis.delete(idem.redis_key)
        raise
    body = {"event_id": event["event_id"], "type": etype, "partition": at.partition, "offset": at.offset}
    for name in mint:
        body[name] = event[name]
    if claim is not None:
        done = orjson.dumps({"h": idem.request_hash, "s": "done", "body": body}).decode()
        await api.redis.set(idem.redis_key, done, ex=ttl)
    return body
