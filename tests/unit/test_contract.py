"""The event contract: one schema, a compiled validator that agrees with JSON Schema, stable reasons."""

from __future__ import annotations

import json

import jsonschema
import orjson
import pytest

import contract
from contract.docs import render
from infra.settings import Settings

T = 1_767_225_600_000


def ev(type_="post_created", **kw):
    base = {
        "event_id": "0b7e7d1c-4a7f-4d2e-9b1a-3c5d7e9f1a2b",
        "type": type_,
        "schema_version": 1,
        "user_id": 7,
        "device_time": T,
        "sent_time": T + 10,
        "received_time": T + 50,
    }
    extra = {
        "user_registered": {"handle": "ada_l", "display_name": "Ada"},
        "status_updated": {"text": "away"},
        "followed": {"followee_id": 8},
        "unfollowed": {"followee_id": 8},
        "post_created": {"post_id": 99, "text": "hello"},
        "post_deleted": {"post_id": 99},
        "message_sent": {"message_id": 5, "recipient_id": 9, "text": "hi"},
        "message_read": {"message_id": 5},
    }.get(type_, {})
    out = {**base, **extra, **kw}
    return {k: v for k, v in out.items() if v is not _DROP}


_DROP = object()


@pytest.fixture(scope="module")
def reference():
    schema = contract.schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_schema_is_consistent():
    s = contract.schema()
    assert list(contract.EVENT_TYPES) == s["properties"]["type"]["enum"]
    branches = [b["if"]["properties"]["type"]["const"] for b in s["allOf"]]
    assert branches == list(contract.EVENT_TYPES)
    assert [b["then"]["$ref"] for b in s["allOf"]] == [f"#/$defs/{t}" for t in contract.EVENT_TYPES]
    for t in contract.EVENT_TYPES:
        d = s["$defs"][t]
        assert d["description"] and d["x-partition-key"] in contract.allowed_fields(t)
        for f in contract.event_type(t).fields:
            assert f.description, f"{t}.{f.name} has no description"
    assert contract.MAX_TEXT_LENGTH == Settings().max_text_length == 280


def test_partition_keys_per_contract():
    assert contract.PARTITION_KEY == {
        "user_registered": "user_id",
        "status_updated": "user_id",
        "followed": "user_id",
        "unfollowed": "user_id",
        "post_created": "user_id",
        "post_deleted": "user_id",
        "message_sent": "recipient_id",
        "message_read": "user_id",
        "user_erased": "user_id",
    }
    assert contract.record_key(ev("message_sent")) == b"9"
    assert contract.partition_key(ev("post_created")) == 7


def test_derived_field_lists():
    assert contract.required_fields("message_sent")[-3:] == ("message_id", "recipient_id", "text")
    assert contract.text_fields("message_sent") == ("text",)
    assert contract.text_fields("user_registered") == ()
    assert contract.text_fields("followed") == ()
    assert set(contract.allowed_fields("followed")) == set(contract.ENVELOPE_FIELDS) | {"followee_id"}


@pytest.mark.parametrize("type_", contract.EVENT_TYPES)
def test_every_type_valid(type_, reference):
    e = ev(type_)
    assert contract.validate(e) is None
    assert reference.is_valid(e)


SEALED = "sealed:v1:7:" + "Ab-_" * 80  # 320 base64url characters after the key id

CASES = [
    ([1, 2], "not_an_object"),
    ("text", "not_an_object"),
    (ev(type=_DROP), "missing_field:type"),
    (ev(type=5), "mistyped_field:type"),
    (ev(type="post_liked"), "unknown_type"),
    (ev(zzz=1, aaa=2), "unknown_field:aaa"),
    (ev("followed", text="x"), "unknown_field:text"),
    (ev(received_time=_DROP), "missing_field:received_time"),
    (ev(text=None), "missing_field:text"),
    (ev(schema_version=_DROP), "missing_field:schema_version"),
    (ev(schema_version=2), "bad_schema_version"),
    (ev(schema_version="1"), "bad_schema_version"),
    (ev(user_id="7"), "mistyped_field:user_id"),
    (ev(user_id=True), "mistyped_field:user_id"),
    (ev(user_id=0), "bad_value:user_id"),
    (ev(post_id=2**63), "mistyped_field:post_id"),  # beyond int64, as Spark's LongType reads it
    (ev(post_id=2**63 - 1), None),
    (ev(device_time=-1), "bad_value:device_time"),
    (ev(device_time=2**63 - 1, sent_time=0), "bad_value:device_time"),  # issue 17's API poison
    (ev(received_time=2**63 - 1), "bad_value:received_time"),  # issue 17's raw-log poison
    (ev(device_time=253402300799999), "bad_value:device_time"),  # year 9999
    (ev(received_time=4102444800000), "bad_value:received_time"),  # 2100-01-01T00:00:00Z
    (ev(sent_time=T + 50 - 86_400_001, device_time=T - 86_400_001), "clock_skew:sent_time"),
    (ev(sent_time=T + 50 + 86_400_001), "clock_skew:sent_time"),  # 1 day + 1 ms ahead
    (ev(sent_time=T + 50 + 86_400_000), None),  # exactly 1 day ahead: the limit
    (ev(device_time=T + 11), "clock_skew:device_time"),  # after it was sent, by the same clock
    (ev(device_time=T + 10 - 2_592_000_001), "clock_skew:device_time"),  # held 30 days + 1 ms
    (ev(device_time=T + 10 - 2_592_000_000), None),  # held exactly 30 days
    (ev(device_time=0, sent_time=10, received_time=5), "clock_skew:device_time"),  # before 1970
    (ev("followed", followee_id=7, device_time=T + 11), "clock_skew:device_time"),  # clock first
    (ev(event_id=""), "bad_value:event_id"),
    (ev(event_id=5), "mistyped_field:event_id"),
    (ev(text="x" * 281), "text_too_long:text"),
    (ev("message_sent", text="y" * 300), "text_too_long:text"),
    (ev("user_registered", handle="no spaces"), "bad_value:handle"),
    (ev("user_registered", handle="x" * 16), "bad_value:handle"),
    (ev("user_registered", display_name="d" * 51), "text_too_long:display_name"),
    (ev("followed", followee_id=7), "self_follow"),
    (ev("unfollowed", followee_id=7), "self_follow"),
    (ev("followed", followee_id="8"), "mistyped_field:followee_id"),
    # sealed personal data ($defs/sealed): the form of the seal is checked, the plaintext was
    # checked by the producer (a seal may be longer than the plaintext rule allows)
    (ev(text=SEALED), None),
    (ev("message_sent", text=SEALED), None),
    (ev("user_registered", handle=SEALED, display_name=SEALED), None),
    (ev("user_registered", handle="sealed:v1:7:" + "A" * 37), "bad_value:handle"),  # too short a seal
    (ev("user_registered", handle="sealed:v1:0:" + "A" * 40), "bad_value:handle"),  # key id 0
    (ev(text="sealed:v1:7:" + "A" * 2037), "text_too_long:text"),  # longer than any seal
    (ev(text="sealed:v1:7:" + "A=" * 200), "text_too_long:text"),  # not base64url
    (ev(text="sealed:v1:7:" + "A" * 20), None),  # not a seal, but a valid plain text
]


@pytest.mark.parametrize(("obj", "reason"), CASES)
def test_reason_codes(obj, reason, reference):
    assert contract.validate(obj) == reason
    if reason is None:
        assert reference.is_valid(obj)
        return
    if reason != "self_follow" and not reason.startswith("clock_skew:"):  # rules JSON Schema cannot express
        assert not reference.is_valid(obj)
    assert reason.split(":")[0] in {r.split(":")[0] for r in contract.reason_codes()} | {"unknown_field"}


def test_text_length_counts_code_points():
    assert contract.validate(ev(text="é" * 280)) is None
    assert contract.validate(ev(text="😀" * 280)) is None
    assert contract.validate(ev(text="😀" * 281)) == "text_too_long:text"


def test_float_integers_are_mistyped_although_json_schema_accepts_them(reference):
    e = ev(user_id=7.0)
    assert reference.is_valid(e)  # JSON Schema: 7.0 is an integer ...
    assert contract.validate(e) == "mistyped_field:user_id"  # ... Spark's LongType parse is not


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"not json", "bad_json"),
        (b'{"type": "post_created", ', "bad_json"),
        (b"\x80\x81", "not_utf8"),
        (b'{"type": "post_created", "text": "caf\xe9"}', "not_utf8"),
        (
            orjson.dumps(ev(user_id=0)).replace(b'"user_id":0', b'"user_id":100000000000000000000000'),
            "mistyped_field:user_id",
        ),  # beyond 64 bits: parsed as a float
        (b"[]", "not_an_object"),
        (orjson.dumps(ev()), None),
        (json.dumps(ev("message_read")).encode(), None),
    ],
)
def test_parse_and_validate(raw, reason):
    event, got = contract.parse_and_validate(raw)
    assert got == reason
    assert (event is None) == (reason is not None)


def test_validator_agrees_with_json_schema_on_generated_records(reference):
    """The fast validator accepts exactly what the full JSON Schema validator accepts."""
    from app_sim.generator import GeneratorConfig, generate

    cfg = GeneratorConfig(users=60, mean_followers=5, seed=3, invalid_share=0.05, duplicate_share=0.02)
    for _key, value, injected in generate(3000, cfg):
        if isinstance(value, bytes):
            continue
        ours = contract.validate(value)
        if ours == "self_follow" or injected in contract.STATEFUL_REASONS:
            continue
        assert (ours is None) == reference.is_valid(value), (value, ours)


def test_validate_is_fast():
    import time

    e = ev("message_sent")
    n = 20_000
    t = time.perf_counter()
    for _ in range(n):
        contract.validate(e)
    per_event_us = (time.perf_counter() - t) / n * 1e6
    assert per_event_us < 50  # ~1-2 us on a laptop; generous for shared CI machines


def test_spark_schema_is_the_union_of_fields():
    from pyspark.sql.types import LongType, StringType

    st = contract.spark_schema()
    assert tuple(st.fieldNames()) == contract.all_fields()
    types = {f.name: f.dataType for f in st.fields}
    assert types["user_id"] == LongType() and types["post_id"] == LongType()
    assert types["text"] == StringType() and types["event_id"] == StringType()
    assert types["schema_version"] == LongType()


def test_docs_are_up_to_date():
    assert contract.DOCS_PATH.read_text(encoding="utf-8") == render(), (
        "docs/events.md is stale: run `python -m contract docs`"
    )


def test_the_bronze_quality_suite_knows_every_event_type():
    """The events_bronze suite's set of types is written by hand: it must follow the contract."""
    from infra.settings import REPO_ROOT

    suite = json.loads((REPO_ROOT / "quality/gx/expectations/events_bronze.json").read_text())
    sets = [
        e["kwargs"]["value_set"]
        for e in suite["expectations"]
        if e["type"] == "expect_column_values_to_be_in_set" and e["kwargs"]["column"] == "type"
    ]
    assert sets == [list(contract.EVENT_TYPES)]


def test_sealed_values_open_only_with_their_key(tmp_path):
    """A value sealed by contract.keys is valid in the contract, opens with its owner's key, and
    is unreadable once the key is erased; a value that breaks its plaintext rule stays plaintext
    (so the log still rejects it with the rule's reason)."""
    from contract import keys

    store = keys.KeyStore(tmp_path / "keys.sqlite3")
    sealer = keys.Sealer(store)
    reg = sealer.seal(ev("user_registered", handle="canary_7", display_name="Canary Seven"))
    post = sealer.seal(ev(text="a canary post"))
    too_long = sealer.seal(ev(text="x" * 281))
    assert contract.is_sealed(reg["handle"]) and contract.is_sealed(reg["display_name"])
    assert "canary" not in orjson.dumps(reg).decode().lower() and "canary" not in post["text"]
    assert contract.validate(reg) is None and contract.validate(post) is None
    assert too_long["text"] == "x" * 281 and contract.validate(too_long) == "text_too_long:text"
    assert keys.key_id(post["text"]) == 7
    # the field name is bound in: a sealed handle does not open as a text
    assert keys.open_value(store.get(7), "text", reg["handle"]) is None
    # a value cut short (a truncated statistic, a log line) opens to nothing, whatever its length
    for cut in range(1, 5):
        assert keys.open_value(store.get(7), "text", post["text"][:-cut]) is None
    assert keys.open_fields(store, [dict(post)], "text")[0]["text"] == "a canary post"
    assert store.erase(7) and not store.erase(7)
    assert keys.open_fields(store, [dict(post)], "text")[0]["text"] is None
    with pytest.raises(keys.Erased):
        store.ensure([7])
    assert store.counts() == {"keys": 0, "erased": 1}
    # secure_delete: the key's bytes are gone from the file, not just unlinked from the table
    other = keys.KeyStore(tmp_path / "other.sqlite3")
    key = other.ensure([9])[9]
    assert key in (tmp_path / "other.sqlite3").read_bytes()
    other.erase(9)
    assert key not in (tmp_path / "other.sqlite3").read_bytes()
