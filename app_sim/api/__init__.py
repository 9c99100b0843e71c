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
400    a malformed or out-of-range header (``Idempotency-Key``, ``X-Device-Time``, ``X-Sent-Time``;
       the detail names it: ``bad_header``), or a body that cannot be decoded, e.g. not UTF-8
       (``undecodable_body``)
401    missing, malformed or forged bearer token, or the token of an erased user
       (``WWW-Authenticate: Bearer``)
403    erasing another user (``not_yourself``: ``DELETE /v1/users/{id}`` erases only the caller,
       as ``/v1/users/me``)
404    the thing named does not exist *as far as the API can tell*: unknown user (followee,
       recipient, status, erasure), a post id the caller has no live post under, a message not in
       the caller's inbox (404, not 403: a post is (author, post) and a message (recipient,
       message), docs/views.md "Identity", so whether someone else has one with that id is not the
       caller's business)
409    ``Idempotency-Key``: a request with it is still in progress (``request_in_progress``,
       ``Retry-After: 1``), or a registration repeated with it (``already_registered``, no token)
422    an ``Idempotency-Key`` the caller already used on this endpoint for another request
       (``idempotency_key_reused``); the request body or parameters break the rules: unknown fields, wrong JSON types (strict:
       no coercion), empty or oversized text (> contract ``MAX_TEXT_LENGTH``), bad handle, a
       ``limit`` out of range, following or unfollowing oneself (``self_follow``)
503    the log (broker) did not acknowledge within ``api_produce_timeout_ms``, or Redis is down:
       nothing is promised; retry with the same ``Idempotency-Key``
=====  ========================================================================================

"Exists" means: in the serving store (users hash, the caller's ``pids`` and ``msgs`` hashes), or
written through this API recently. The store lags the log, so every API process also records
what it appended (users, posts with their author, messages with their recipient) under
``api:recent:*`` keys in Redis for a day; these are hints for validation only, never read by
anyone as data, and losing them only makes a check wait for the speed layer. The speed layer
re-checks everything stateful (``not_own_post``, ``not_in_inbox``) against the log itself.

Events: validated with ``contract.validate`` before the append; ``received_time`` is the
server's clock; ``sent_time`` is header ``X-Sent-Time`` else ``received_time``; ``device_time``
is ``X-Device-Time`` else ``sent_time`` (epoch ms). Client times must fit the contract's clock
window (``contract.CLOCK_WINDOW``): ``X-Sent-Time`` within a day of the server's clock,
``X-Device-Time`` not after the send time and at most 30 days before it; anything else is a 400
naming the header, so the corrected event time is never later than the server's receive time.

Idempotency: ``Idempotency-Key`` (1-64 visible ASCII characters) is scoped to (caller, endpoint):
the record lives in Redis under ``api:idem:<sha256 of "<user>|<event type>|<key>">``, shared by
every API worker, for ``dedup_window_ms``, holding the request's hash and, once appended, the
answer. The first request claims it atomically (``SET NX``); a repeat by the same caller with the
same request (body and path; the clock headers may change between retries) gets the first answer
and appends nothing; with another request 422; while the first is in flight 409. Another caller's
identical key is another record, so it neither learns of nor collides with this one. The
``event_id`` of a keyed request is ``uuid5("<user>|<event type>|<key>")``: a retry is a duplicate
by construction (should a 503 hide a write that happened, the retry re-appends that very event,
kept in the record) and nothing else is. Without a key, ``event_id`` is the API process's next
sequenced id ``sq:<worker id>:<n>`` (contract/ids.py), whose dedup memory is per writer, not per
event (docs/views.md, "Duplicates").

Registration proves nothing about its caller (there is no user yet), so a repeated registration
key is answered 409 ``already_registered`` without a token (the token is only ever in the first
answer; a client that lost it registers again with a new key), and a registration that failed
(503) is not re-sent: its retry mints a new user. The ``event_id`` of a keyed registration
derives from the new user's id, so two registrations are never duplicates of each other.

Handle uniqueness is not enforced (there is no index of handles in the serving store).
"""

from app_sim.api.app import create_app

__all__ = ["create_app"]
