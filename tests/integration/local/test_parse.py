"""The Spark parse and the Python validator agree record by record (same contract, same reasons)."""

from __future__ import annotations

import json

import pytest

import contract

pytestmark = pytest.mark.spark

T = 1_700_000_000_000


def _ev(**kw):
    base = {
        "event_id": "e-1",
        "type": "post_created",
        "schema_version": 1,
        "user_id": 7,
        "device_time": T,
        "sent_time": T + 10,
        "received_time": T + 500,
        "post_id": 99,
        "text": "hi",
    }
    base.update(kw)
    return base


def _without(d, *keys):
    return {k: v for k, v in d.items() if k not in keys}


SEALED_TEXT = "sealed:v1:7:" + "Ab-_" * 80  # the form of a sealed value (contract $defs/sealed)

RECORDS: list[bytes] = [
    json.dumps(_ev()).encode(),
    json.dumps(_ev(type="followed", followee_id=8, post_id=None, text=None)).encode(),  # null = missing
    json.dumps(_without(_ev(type="followed", followee_id=8), "post_id", "text")).encode(),
    json.dumps(_without(_ev(type="followed", followee_id=7), "post_id", "text")).encode(),  # self
    json.dumps(_ev(text="x" * 281)).encode(),
    json.dumps(_ev(text="é" * 280)).encode(),  # 280 code points: valid
    json.dumps(_ev(user_id="7")).encode(),
    json.dumps(_ev(user_id=7.0)).encode(),
    json.dumps(_ev(user_id=0)).encode(),
    json.dumps(_ev(schema_version=2)).encode(),
    json.dumps(_ev(type="teleported")).encode(),
    json.dumps(_ev(type=5)).encode(),
    json.dumps(_without(_ev(), "type")).encode(),
    json.dumps(_ev(extra=1, zzz=2)).encode(),
    json.dumps(_without(_ev(), "received_time")).encode(),
    json.dumps(_ev(type="user_registered", handle="ok_name", display_name="Ok")).encode(),
    json.dumps(
        _without(_ev(type="user_registered", handle="no spaces!", display_name="Ok"), "post_id", "text")
    ).encode(),
    json.dumps(_without(_ev(type="message_sent", message_id=5, recipient_id=9), "post_id")).encode(),
    json.dumps(_without(_ev(type="message_read", message_id=5), "post_id", "text")).encode(),
    # the right shape, wrong values: these take the fast path (value rules only)
    json.dumps(_ev(event_id="")).encode(),
    json.dumps(_ev(event_id="e" * 65)).encode(),
    json.dumps(_ev(received_time=-1)).encode(),
    json.dumps(_ev(post_id=2**63 - 1)).encode(),  # the largest id: valid
    json.dumps(_ev(text="")).encode(),  # no minimum length: valid
    # personal data sealed (contract $defs/sealed): the seal's form is checked, not the plaintext's
    json.dumps(_ev(text=SEALED_TEXT)).encode(),  # longer than 280 characters: valid when sealed
    json.dumps(_ev(text=SEALED_TEXT[:-1] + "!")).encode(),  # not base64url: plaintext too long
    json.dumps(_ev(text="sealed:v1:0:" + "A" * 40)).encode(),  # key id 0: a plain text (valid)
    json.dumps(_ev(text="sealed:v1:7:" + "A" * 2040)).encode(),  # longer than a seal: too long
    json.dumps(
        _without(_ev(type="user_registered", handle=SEALED_TEXT, display_name=SEALED_TEXT), "post_id", "text")
    ).encode(),
    json.dumps(
        _without(_ev(type="user_registered", handle="sealed:v1:7:AAA", display_name="x"), "post_id", "text")
    ).encode(),  # neither a handle nor a seal
    json.dumps(
        _without(_ev(type="user_registered", handle="x" * 16, display_name="Ok"), "post_id", "text")
    ).encode(),
    json.dumps(
        _without(_ev(type="user_registered", handle="ok_name", display_name=""), "post_id", "text")
    ).encode(),
    json.dumps(_without(_ev(type="unfollowed", followee_id=7), "post_id", "text")).encode(),  # self
    # the right key count, one value of another JSON type: off the fast path
    json.dumps(_ev(post_id=True)).encode(),
    json.dumps(_ev(text=["hi"])).encode(),
    json.dumps(_ev(post_id=1e30)).encode(),
    json.dumps(_ev(schema_version="1")).encode(),
    json.dumps({**_without(_ev(), "text"), "text ": "hi"}).encode(),  # a look-alike key
    json.dumps([1, 2]).encode(),
    b"not json",
    b'{"type": "post_created", ',
    b"\x80\x81 binary",
    b"\xed\xa0\x80",  # a UTF-8-encoded surrogate: not UTF-8
    json.dumps(_ev(text="caf")).encode().replace(b'"caf"', b'"caf\xe9"'),  # Latin-1, not UTF-8
    json.dumps("just a string").encode(),
    # times: out of range (int64 max, year > 2099, negative) and outside the clock window
    json.dumps(_ev(device_time=2**63 - 1, sent_time=0)).encode(),  # the API poison of issue 17
    json.dumps(_ev(received_time=2**63 - 1)).encode(),  # the raw-log poison of issue 17
    json.dumps(_ev(received_time=253402300800000)).encode(),  # year 10000
    json.dumps(_ev(device_time=253402300799999, sent_time=253402300799999)).encode(),  # year 9999
    json.dumps(_ev(sent_time=-5)).encode(),
    json.dumps(_ev(received_time=4102444799999, sent_time=4102444799999, device_time=4102444799999)).encode(),
    json.dumps(_ev(received_time=4102444800000)).encode(),  # 2100-01-01: one ms too late
    json.dumps(_ev(sent_time=T + 500 - 86_400_000)).encode(),  # skew exactly at the limit: valid
    json.dumps(_ev(sent_time=T + 500 - 86_400_001, device_time=T - 86_400_001)).encode(),
    json.dumps(_ev(sent_time=T + 500 + 86_400_001, device_time=T)).encode(),
    json.dumps(_ev(device_time=T + 11)).encode(),  # after it was sent, by the same clock
    json.dumps(_ev(device_time=T + 10 - 2_592_000_000)).encode(),  # held exactly 30 days: valid
    json.dumps(_ev(device_time=T + 10 - 2_592_000_001)).encode(),
    json.dumps(_ev(device_time=0, sent_time=10, received_time=5)).encode(),  # corrected time < 0
    json.dumps(_ev(device_time=0, sent_time=5, received_time=5)).encode(),  # corrected time 0
    json.dumps(_ev(device_time=2**63, sent_time=0)).encode(),  # beyond int64: mistyped
]


def test_spark_reasons_match_python_validator(spark):
    from pipelines.parse import parse_records

    rows = [(None, raw, 0, i, None) for i, raw in enumerate(RECORDS)]
    df = spark.createDataFrame(
        rows, "key binary, value binary, partition int, offset long, timestamp timestamp"
    )
    events, quarantine = parse_records(df)
    spark_reason = {r["offset"]: r["reason"] for r in quarantine.collect()}
    valid_offsets = {r["offset"] for r in events.select("offset").collect()}
    assert len(spark_reason) + len(valid_offsets) == len(RECORDS)  # nothing lost
    for i, raw in enumerate(RECORDS):
        _, py_reason = contract.parse_and_validate(raw)
        assert spark_reason.get(i) == py_reason, (i, raw[:80])
    assert len(valid_offsets) >= 4 and len(spark_reason) >= 15  # the set exercises both sides


def test_valid_event_columns_and_corrected_time(spark):
    from pipelines.parse import parse_records

    raw = json.dumps(_ev(device_time=1000, sent_time=1300, received_time=5000)).encode()
    df = spark.createDataFrame(
        [(b"7", raw, 3, 42, None)],
        "key binary, value binary, partition int, offset long, timestamp timestamp",
    )
    events, quarantine = parse_records(df)
    assert quarantine.count() == 0
    row = events.collect()[0]
    assert (row.partition, row.offset, row.user_id, row.post_id, row.text) == (3, 42, 7, 99, "hi")
    assert row.event_time == 1000 + (5000 - 1300)  # device clock corrected by its offset
    assert row.key == "7"


def test_times_can_never_overflow_and_bad_bytes_stay_readable(spark, tmp_path):
    """Issue 17: int64-max and year-9999 times are quarantined with a reason (no ANSI overflow),
    and a record that is not UTF-8 is stored as base64 text that pyarrow can read back."""
    import base64

    import pyarrow.parquet as pq

    from pipelines.parse import parse_records

    latin1 = b'{"type": "post_created", "text": "caf\xe9"}'
    records = [
        (b"7", json.dumps(_ev(device_time=2**63 - 1, sent_time=0)).encode()),
        (b"7", json.dumps(_ev(received_time=2**63 - 1)).encode()),
        (b"7", json.dumps(_ev(device_time=253402300799999)).encode()),
        (b"\xff\xfe", latin1),
        (b"7", json.dumps(_ev(device_time=T - 60_000)).encode()),  # offline a minute: valid
    ]
    df = spark.createDataFrame(
        [(k, v, 0, i, None) for i, (k, v) in enumerate(records)],
        "key binary, value binary, partition int, offset long, timestamp timestamp",
    )
    events, quarantine = parse_records(df)
    got = {r["offset"]: r for r in quarantine.collect()}
    assert {o: r["reason"] for o, r in got.items()} == {
        0: "bad_value:device_time",
        1: "bad_value:received_time",
        2: "bad_value:device_time",
        3: "not_utf8",
    }
    assert base64.b64decode(got[3]["raw"]) == latin1 and got[3]["key"] == "base64://4="
    (ok,) = events.collect()
    assert ok.event_time == (T - 60_000) + ((T + 500) - (T + 10))  # corrected by hand: T + 429_940
    quarantine.write.parquet(str(tmp_path / "q"))
    table = pq.read_table(str(tmp_path / "q"))  # raises on invalid UTF-8 in a string column
    assert sorted(table.column("reason").to_pylist())[-1] == "not_utf8"


def test_every_valid_generated_event_takes_the_fast_path(spark):
    """The fast path is an optimisation only if valid records take it: all of them must."""
    import orjson
    from pyspark.sql import functions as F

    from app_sim.generator import GeneratorConfig, generate
    from pipelines.parse import clean_shape

    raws = [
        orjson.dumps(v).decode()
        for _, v, injected in generate(3_000, GeneratorConfig(users=50, erasure_share=0.002))
        if not injected
    ]
    shapes = {t: clean_shape(contract.event_type(t)) for t in contract.EVENT_TYPES}
    df = spark.createDataFrame([(r,) for r in raws], "raw string").select(
        F.expr("try_variant_get(parse_json(raw), '$.type', 'string')").alias("type"),
        F.expr("schema_of_variant(parse_json(raw))").alias("shape"),
    )
    seen = {(r["type"], r["shape"]) for r in df.distinct().collect()}
    assert {t for t, _ in seen} == set(contract.EVENT_TYPES)  # the sample holds every type
    assert all(shape == shapes[t] for t, shape in seen), sorted(seen)


def test_random_mutations_agree_with_python_validator(spark):
    """Valid events of every type, each bent once or twice at random (a value of another JSON
    type or out of range, a key dropped, added or renamed): both parse paths must give the
    validator's verdict and reason, record by record."""
    import random

    import orjson

    from app_sim.generator import GeneratorConfig, generate
    from pipelines.parse import parse_records

    rng = random.Random(7)
    values = [None, "x", "", "7", 7, 0, -1, 7.5, 2**63 - 1, True, [1], {"a": 1}, "é" * 281, "no spaces!"]
    other_keys = ["extra", "text ", "Type", "followee_id", "handle", "message_id", "post_id", "text"]
    samples = [v for _, v, injected in generate(2_000, GeneratorConfig(users=40, seed=5)) if not injected]
    records = []
    for ev in rng.sample(samples, 400):
        ev = dict(ev)
        for _ in range(rng.choice((1, 2))):
            key = rng.choice(sorted(ev))
            match rng.randrange(4):
                case 0:
                    ev[key] = rng.choice(values)
                case 1:
                    del ev[key]
                case 2:
                    ev[rng.choice(other_keys)] = rng.choice(values[3:9])
                case _:
                    ev[key + rng.choice(("_", " ", "X"))] = ev.pop(key)
            if not ev:
                break
        records.append(orjson.dumps(ev))
    df = spark.createDataFrame(
        [(None, raw, 0, i, None) for i, raw in enumerate(records)],
        "key binary, value binary, partition int, offset long, timestamp timestamp",
    )
    events, quarantine = parse_records(df)
    spark_reason = {r["offset"]: r["reason"] for r in quarantine.collect()}
    valid = {r["offset"] for r in events.select("offset").collect()}
    assert len(spark_reason) + len(valid) == len(records)
    python_reason = [contract.parse_and_validate(raw)[1] for raw in records]
    mismatches = [
        (i, spark_reason.get(i), python_reason[i], raw[:120])
        for i, raw in enumerate(records)
        if spark_reason.get(i) != python_reason[i]
    ]
    assert not mismatches, mismatches[:5]
    assert len(valid) >= 10 and len(spark_reason) >= 200  # both verdicts well represented
