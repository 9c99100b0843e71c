"""Event contract v1 of the ``social.events`` topic, derived from ONE schema file.

``events.v1.schema.json`` (JSON Schema 2020-12, next to this module) is the single source of
truth: every event type, field, constraint and partition key (``x-partition-key``). This module
*derives* everything else from it, so the writers (the app API, the generator) and the readers
(the Spark speed layer and batch replay, the quality suites) cannot drift apart:

- ``EVENT_TYPES``, ``required_fields(t)``, ``allowed_fields(t)``, ``text_fields(t)``,
  ``personal_fields(t)`` (handle, display name, texts: each holds its plaintext or a value sealed
  with the owner's data key, ``is_sealed``; docs/erasure.md), ``field_spec(t, f)``, ``PARTITION_KEY`` / ``partition_key(event)`` / ``record_key(event)``;
- ``validate(obj)`` / ``parse_and_validate(raw)``: a validator compiled once from the schema into
  flat per-type check lists (a few microseconds per event, fast enough for the HTTP API); a unit
  test checks it accepts exactly what a full JSON Schema validator accepts;
- ``spark_schema()``: the pyspark ``StructType`` (union of all fields) for ``from_json``;
- ``docs/events.md`` (``python -m contract docs``).

Reason codes (what the quarantine records; stable, the first failing check wins, in this order):

=========================  ========================================================================
``not_utf8``               the record value is not UTF-8 (the quarantine keeps its bytes in
                           ``raw`` as base64, RFC 4648, so the table stays text)
``bad_json``               the record value is not JSON
``not_an_object``          valid JSON, but not an object
``missing_field:type``     no ``type`` (``mistyped_field:type`` if it is not a string)
``unknown_type``           ``type`` is not one of ``EVENT_TYPES``
``unknown_field:<f>``      a field the type does not declare (first in sorted order); v1 is closed
``missing_field:<f>``      a required field is absent or ``null`` (Spark's JSON reader cannot tell
                           the two apart, so both count as missing), in declared order
``bad_schema_version``     ``schema_version`` is present but not the integer ``1``
``mistyped_field:<f>``     wrong JSON type; integers must be written without fraction or exponent
                           (``1.0``, or beyond int64, is mistyped: stricter than JSON Schema, as
                           Spark's LongType is)
``bad_value:<f>``          out of range (ids 1..int64 max, times 1970..2099 in epoch ms), empty,
                           or pattern mismatch
``text_too_long:<f>``      a string longer than its ``maxLength`` (text: 280 code points)
``clock_skew:sent_time``   ``|received_time - sent_time| > max_clock_skew_ms`` (``CLOCK_WINDOW``)
``clock_skew:device_time`` ``device_time > sent_time``, or ``sent_time - device_time >
                           max_offline_ms``, or a corrected event time before 1970
``self_follow``            ``followed``/``unfollowed`` with ``followee_id == user_id``
=========================  ========================================================================

Field checks run field by field in declared order (envelope first): type, then value; then the
clock window (``CLOCK_WINDOW``, from the schema's ``x-clock-window``): the corrected event time
``device_time + (received_time - sent_time)`` always lies in ``[received_time - max_offline_ms,
received_time]``, so a client clock can neither put an event in the future (pinned at the top of
every timeline) nor before 1970, and no arithmetic on the times of a valid event can overflow.
Two more reasons need state and are decided by the speed layer, not here (``STATEFUL_REASONS``):
``not_own_post`` (``post_deleted`` of a post the user did not create) and ``not_in_inbox``
(``message_read`` of a message that is not in the reader's inbox yet).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:  # the contract works without Spark installed (spark_schema imports it)
    from pyspark.sql.types import StructType

SCHEMA_PATH = Path(__file__).with_name("events.v1.schema.json")
SCHEMA_VERSION = 1
CLOCK_REASONS = ("clock_skew:sent_time", "clock_skew:device_time")
DOCS_PATH = Path(__file__).resolve().parents[1] / "docs" / "events.md"

# Rules a JSON Schema cannot express (they compare two fields), kept next to the schema as data
# so the Spark side can turn each into a Column expression: reason, types, field, other field
# (the event is invalid when event[field] == event[other]).
CROSS_FIELD_RULES: tuple[tuple[str, tuple[str, ...], str, str], ...] = (
    ("self_follow", ("followed", "unfollowed"), "followee_id", "user_id"),
)
# Reasons that need the derived state (the speed layer checks them against its tables).
STATEFUL_REASONS: dict[str, str] = {
    "not_own_post": "post_deleted of a post the user did not create (or that does not exist)",
    "not_in_inbox": "message_read of a message that is not (yet) in the reader's inbox",
}


@dataclass(frozen=True)
class FieldSpec:
    """One field of one event type, flattened from the schema (``$ref``s resolved)."""

    name: str
    json_type: str  # "integer" | "string"
    description: str
    required: bool
    minimum: int | None = None
    maximum: int | None = None
    min_length: int | None = None
    max_length: int | None = None
    pattern: str | None = None
    const: Any = None
    sealable: bool = False  # personal data: may hold a sealed value instead (``$defs/sealed``)

    @property
    def is_text(self) -> bool:
        """User-written text with the contract's text length limit (``$defs/text``)."""
        return self.json_type == "string" and self.max_length == MAX_TEXT_LENGTH and self.pattern is None


@dataclass(frozen=True)
class EventTypeSpec:
    name: str
    description: str
    partition_key: str
    fields: tuple[FieldSpec, ...] = field(default_factory=tuple)

    def field(self, name: str) -> FieldSpec:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)


# --- loading and flattening the schema ----------------------------------------------------------


@cache
def schema() -> dict:
    """The raw JSON Schema document (parsed once)."""
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def _resolve(node: dict, root: dict) -> dict:
    """Inline a local ``$ref`` (sibling keywords such as ``description`` override the target)."""
    if "$ref" not in node:
        return node
    ref = node["$ref"]
    if not ref.startswith("#/$defs/"):
        raise ValueError(f"only local $defs refs are supported, got {ref!r}")
    target = _resolve(root["$defs"][ref.removeprefix("#/$defs/")], root)
    merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return merged


SEALED_REF = "#/$defs/sealed"


def _field_spec(name: str, node: dict, required: bool, root: dict) -> FieldSpec:
    node = _resolve(node, root)
    sealable = False
    if "anyOf" in node:  # personal data: its plaintext rule, or a sealed value
        branches = node["anyOf"]
        sealable = any(b.get("$ref") == SEALED_REF for b in branches)
        plain = [_resolve(b, root) for b in branches if b.get("$ref") != SEALED_REF]
        if not sealable or len(plain) != 1:
            raise ValueError(f"{name}: anyOf is only supported as [<plaintext rule>, {SEALED_REF}]")
        node = {**plain[0], **{k: v for k, v in node.items() if k != "anyOf"}}
    json_type = node.get("type")
    if json_type is None and "const" in node:
        json_type = "integer" if isinstance(node["const"], int) else "string"
    if json_type is None:
        raise ValueError(f"{name}: a field needs a type or a const")
    return FieldSpec(
        name=name,
        json_type=json_type,
        description=node.get("description", ""),
        required=required,
        minimum=node.get("minimum"),
        maximum=node.get("maximum"),
        min_length=node.get("minLength"),
        max_length=node.get("maxLength"),
        pattern=node.get("pattern"),
        const=node.get("const"),
        sealable=sealable,
    )


@cache
def _event_type_specs() -> dict[str, EventTypeSpec]:
    root = schema()
    out: dict[str, EventTypeSpec] = {}
    for name in root["properties"]["type"]["enum"]:
        node = root["$defs"][name]
        specs: dict[str, FieldSpec] = {}
        required: list[str] = []
        props: dict[str, dict] = {}
        for part in [_resolve(p, root) for p in node.get("allOf", [])] + [node]:
            required += [r for r in part.get("required", []) if r not in required]
            for fname, fnode in part.get("properties", {}).items():
                merged = {**_resolve(props.get(fname, {}), root), **_resolve(fnode, root)}
                props[fname] = merged
        for fname, fnode in props.items():
            specs[fname] = _field_spec(fname, fnode, fname in required, root)
        out[name] = EventTypeSpec(
            name=name,
            description=node["description"],
            partition_key=node["x-partition-key"],
            fields=tuple(specs.values()),
        )
    return out


_text_max_length = _field_spec("text", schema()["$defs"]["text"], True, schema()).max_length
assert _text_max_length is not None, "$defs/text of the schema has no maxLength"
MAX_TEXT_LENGTH: int = _text_max_length
# A sealed personal value (``$defs/sealed``; ``contract.keys`` seals and opens them).
SEALED_PREFIX = "sealed:v1:"
SEALED_PATTERN: str = schema()["$defs"]["sealed"]["pattern"]
SEALED_MAX_LENGTH: int = schema()["$defs"]["sealed"]["maxLength"]
_sealed_form = re.compile(SEALED_PATTERN).search


def is_sealed(value: object) -> bool:
    """Whether ``value`` has the form of a sealed value (it may still not open: wrong or erased key)."""
    return (
        type(value) is str
        and value.startswith(SEALED_PREFIX)
        and len(value) <= SEALED_MAX_LENGTH
        and _sealed_form(value) is not None
    )


EVENT_TYPES: tuple[str, ...] = tuple(schema()["properties"]["type"]["enum"])
ENVELOPE_FIELDS: tuple[str, ...] = tuple(schema()["$defs"]["envelope"]["properties"])
PARTITION_KEY: dict[str, str] = {t: s.partition_key for t, s in _event_type_specs().items()}

# The clock window around the server's receive time (see the module docstring).
CLOCK_WINDOW: dict[str, int] = {
    k: v for k, v in schema()["$defs"]["envelope"]["x-clock-window"].items() if k != "description"
}
MAX_CLOCK_SKEW_MS: int = CLOCK_WINDOW["max_clock_skew_ms"]
MAX_OFFLINE_MS: int = CLOCK_WINDOW["max_offline_ms"]
MAX_EPOCH_MS: int = schema()["$defs"]["epoch_ms"]["maximum"]


def clock_reason(device_time: int, sent_time: int, received_time: int) -> str | None:
    """The clock-window reason for three in-range times (None when they fit the window)."""
    skew = received_time - sent_time
    if skew > MAX_CLOCK_SKEW_MS or skew < -MAX_CLOCK_SKEW_MS:
        return "clock_skew:sent_time"
    held = sent_time - device_time
    if held < 0 or held > MAX_OFFLINE_MS or held > received_time:
        return "clock_skew:device_time"
    return None


def event_type(name: str) -> EventTypeSpec:
    """The flattened spec of one event type (fields in declared order, envelope first)."""
    return _event_type_specs()[name]


def required_fields(event_type_name: str) -> tuple[str, ...]:
    return tuple(f.name for f in event_type(event_type_name).fields if f.required)


def allowed_fields(event_type_name: str) -> tuple[str, ...]:
    return tuple(f.name for f in event_type(event_type_name).fields)


def personal_fields(event_type_name: str) -> tuple[str, ...]:
    """Fields holding personal data, which a producer seals with the owner's key (``$defs/sealed``)."""
    return tuple(f.name for f in event_type(event_type_name).fields if f.sealable)


def text_fields(event_type_name: str) -> tuple[str, ...]:
    """Fields holding user-written text limited to ``MAX_TEXT_LENGTH`` code points."""
    return tuple(f.name for f in event_type(event_type_name).fields if f.is_text)


def field_spec(event_type_name: str, field_name: str) -> FieldSpec:
    return event_type(event_type_name).field(field_name)


def partition_key(event: dict) -> int:
    """The id whose decimal string is the record key (so its events share a partition)."""
    return event[PARTITION_KEY[event["type"]]]


def record_key(event: dict) -> bytes:
    """The Kafka record key of a (valid) event: the partition key as decimal string bytes."""
    return str(event[PARTITION_KEY[event["type"]]]).encode()


# --- the compiled validator ---------------------------------------------------------------------

# One check per field, as a small tuple the loop below interprets; compiled once per type.
_INT, _STR, _CONST = 0, 1, 2
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class _Compiled:
    allowed: frozenset
    required: tuple[str, ...]
    checks: tuple[tuple, ...]  # (name, kind, lo, hi, min_len, max_len, regex, const, sealable)
    cross: tuple[tuple[str, str, str], ...]  # (reason, field, other)


@cache
def _compiled() -> dict[str, _Compiled]:
    out: dict[str, _Compiled] = {}
    for name, spec in _event_type_specs().items():
        checks: list[tuple] = []
        for f in spec.fields:
            if f.name == "type":
                continue  # already decided by the dispatch on type
            if f.const is not None:
                checks.append((f.name, _CONST, None, None, None, None, None, f.const, False))
            elif f.json_type == "integer":
                checks.append((f.name, _INT, f.minimum, f.maximum, None, None, None, None, False))
            elif f.json_type == "string":
                rx = re.compile(f.pattern).search if f.pattern else None
                checks.append((f.name, _STR, None, None, f.min_length, f.max_length, rx, None, f.sealable))
            else:  # pragma: no cover - the schema only uses these
                raise ValueError(f"unsupported field type {f.json_type!r} of {name}.{f.name}")
        cross = tuple((r, fld, other) for r, types, fld, other in CROSS_FIELD_RULES if name in types)
        out[name] = _Compiled(
            allowed=frozenset(f.name for f in spec.fields),
            required=tuple(f.name for f in spec.fields if f.required),
            checks=tuple(checks),
            cross=cross,
        )
    return out


def validate(obj: Any) -> str | None:
    """None when ``obj`` is a valid v1 event, else the reason code (see the module docstring)."""
    if type(obj) is not dict:
        return "not_an_object"
    etype = obj.get("type")
    if etype is None:
        return "missing_field:type"
    if type(etype) is not str:
        return "mistyped_field:type"
    plan = _COMPILED.get(etype)
    if plan is None:
        return "unknown_type"
    allowed = plan.allowed
    if len(obj) > len(allowed) or not allowed.issuperset(obj):
        extra = sorted(k for k in obj if k not in allowed)
        if extra:
            return f"unknown_field:{extra[0]}"
    for name in plan.required:
        if obj.get(name) is None:
            return f"missing_field:{name}"
    for name, kind, lo, hi, min_len, max_len, rx, const, sealable in plan.checks:
        v = obj.get(name)
        if v is None:
            continue  # optional and absent (v1 has no optional fields, but keep the rule general)
        if kind == _INT:
            if type(v) is not int or not _I64_MIN <= v <= _I64_MAX:
                return f"mistyped_field:{name}"  # beyond int64 (orjson reads up to 2**64 - 1)
            if (lo is not None and v < lo) or (hi is not None and v > hi):
                return f"bad_value:{name}"
        elif kind == _STR:
            if type(v) is not str:
                return f"mistyped_field:{name}"
            if sealable and is_sealed(v):
                continue  # the plaintext was checked by its producer before sealing
            if max_len is not None and len(v) > max_len:
                return f"text_too_long:{name}"
            if (min_len is not None and len(v) < min_len) or (rx is not None and rx(v) is None):
                return f"bad_value:{name}"
        elif type(v) is not type(const) or v != const:
            return "bad_schema_version" if name == "schema_version" else f"bad_value:{name}"
    reason = clock_reason(obj["device_time"], obj["sent_time"], obj["received_time"])
    if reason is not None:
        return reason
    for reason, fld, other in plan.cross:
        if obj[fld] == obj[other]:
            return reason
    return None


_COMPILED = _compiled()


def parse_and_validate(raw: bytes | str) -> tuple[dict | None, str | None]:
    """Parse one record value: ``(event, None)`` when valid, ``(None, reason)`` when not."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        if isinstance(raw, bytes | bytearray | memoryview):
            try:
                bytes(raw).decode("utf-8")
            except UnicodeDecodeError:
                return None, "not_utf8"
        return None, "bad_json"
    reason = validate(obj)
    if reason is not None:
        return None, reason
    return obj, None


def reason_codes() -> list[str]:
    """Every reason code ``validate`` can return for this schema, plus the stateful ones.

    ``unknown_field:<name>`` is open-ended (any undeclared name) and so is not listed.
    """
    codes = ["not_utf8", "bad_json", "not_an_object", "unknown_type", "bad_schema_version"]
    seen = set(codes)

    def add(code: str) -> None:
        if code not in seen:
            seen.add(code)
            codes.append(code)

    add("missing_field:type")
    add("mistyped_field:type")
    for t in EVENT_TYPES:
        for f in event_type(t).fields:
            if f.name == "type":
                continue
            if f.required:
                add(f"missing_field:{f.name}")
            if f.const is None:
                add(f"mistyped_field:{f.name}")
            if f.const is None and (
                f.minimum is not None or f.maximum is not None or f.min_length is not None or f.pattern
            ):
                add(f"bad_value:{f.name}")
            if f.max_length is not None:
                add(f"text_too_long:{f.name}")
    for reason in CLOCK_REASONS:
        add(reason)
    for reason, *_ in CROSS_FIELD_RULES:
        add(reason)
    codes += list(STATEFUL_REASONS)
    return codes


# --- Spark ----------------------------------------------------------------------------------------


def spark_schema() -> StructType:
    """pyspark ``StructType`` of every field of every type (integer -> long, string -> string).

    Fields are nullable: one struct covers all types; per-type presence is ``required_fields``.
    pyspark is imported here so the contract works without Spark installed.
    """
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    spark_types = {"integer": LongType(), "string": StringType()}
    cols: dict[str, str] = {}
    for t in EVENT_TYPES:
        for f in event_type(t).fields:
            cols.setdefault(f.name, f.json_type)
    return StructType([StructField(name, spark_types[jt], nullable=True) for name, jt in cols.items()])


def all_fields() -> tuple[str, ...]:
    """The union of all fields in ``spark_schema`` order (envelope first)."""
    cols: dict[str, None] = {}
    for t in EVENT_TYPES:
        for f in event_type(t).fields:
            cols.setdefault(f.name, None)
    return tuple(cols)
