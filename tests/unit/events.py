"""Hand-made events for the unit tests of both implementations of the views (the keyed processor
and the set-wise fold): the same cases, written once."""

from __future__ import annotations

import uuid

T0 = 1_700_000_000_000
KEY_FIELD = {"message_sent": "recipient_id"}  # the partition key of each type, where not user_id


def ev(type_, user, t, eid=None, **fields):
    """A valid event; ``t`` is the device time offset in seconds (clocks in sync by default)."""
    ms = T0 + int(t * 1000)
    return {
        "event_id": eid
        or str(uuid.uuid5(uuid.NAMESPACE_OID, f"{type_}-{user}-{t}-{sorted(fields.items())}")),
        "type": type_,
        "schema_version": 1,
        "user_id": user,
        "device_time": ms,
        "sent_time": ms,
        "received_time": ms,
        **fields,
    }
