"""The simulated social app's HTTP API: commands become events in the log, reads come from Redis.

Where it sits: ``client --HTTP--> API --append--> Kafka social.events --> speed layer --> Redis``
and ``client <--HTTP-- API <--read-- Redis serving store``. The API never writes derived state:
a write answers 202 only after the broker acknowledged the event (acks=all), with the event's
``partition`` and ``offset``; a read answers with ``as_of``, the per-partition end offsets the
serving store covers. **Read-your-writes**: a write at ``(partition, offset)`` is visible once
``as_of[str(partition)] > offset``; clients poll the read until then.

Run: ``python -m app_sim.api`` (uvicorn, ``settings.api_workers`` processes, on
``api_host:api_port``; ``make up`` runs it as the ``api`` service). OpenAPI at ``/openapi.json``.

Status codes (every error body is JSON ``{"error": <code>, "detail": <text>}``):

=====  ========================================================================================
201    ``POST /v1/users``: registered; ``{user_id, token, event_id, partition, offset}``
202    other writes: the event is in the log; ``{event_id, type, partition, offset, post_id?...}``
200    reads, with ``as_of``
400    a malformed header (``Idempotency-Key``, ``X-Device-Time``, ``X-Sent-Time``)
401    missing, malformed or forged bearer token (``WWW-Authenticate: Bearer``)
403    deleting a post someone else wrote (``not_your_post``)
404    the thing named does not exist *as far as the API can tell*: unknown user (followee,
       recipient, status), unknown or deleted post, a message not in the caller's inbox (404,
       not 403: whether someone else's message exists is not the caller's business)
409    an ``Idempotency-Key`` reused for a different request
422    the request body or parameters break the rules: unknown fields, wrong JSON types (strict:
       no coercion), empty or oversized text (> contract ``MAX_TEXT_LENGTH``), bad handle, a
       ``limit`` out of range, following or unfollowing oneself (``self_follow``)
503    the log (broker) did not acknowledge within ``api_produce_timeout_ms``, or Redis is down:
       nothing is promised; retry with the same ``Idempotency-Key``
=====  ========================================================================================

"Exists" means: in the serving store (users hash, ``p:<id>``, the caller's ``msgs`` hash), or
written through this API recently. The store lags the log, so every API process also records
what it appended (users, posts with their author, messages with their recipient) under
``api:recent:*`` keys in Redis for a day; these are hints for validation only, never read by
anyone as data, and losing them only makes a check wait for the speed layer. The speed layer
re-checks everything stateful (``not_own_post``, ``not_in_inbox``) against the log itself.

Events: validated with ``app_sim.contract.validate`` before the append; ``received_time`` is the
server's clock; ``sent_time`` is header ``X-Sent-Time`` else ``received_time``; ``device_time``
is ``X-Device-Time`` else ``sent_time`` (epoch ms). ``event_id`` is a random UUID, or the
request's ``Idempotency-Key`` (1-64 visible ASCII characters); a retry with the same key and the
same request re-appends the identical event (same post/message id), which the speed layer drops
as a duplicate; with a different request it is refused (409). The key cache is per API process
(10,000 keys), so a retry that lands on another process mints new ids for the same event id:
still at most one effect in the views, but the ids in the two answers differ.

Handle uniqueness is not enforced (there is no index of handles in the serving store).
"""

from app_sim.api.app import create_app

__all__ = ["create_app"]
