"""Kafka records -> contract-valid events + quarantine rows, as Spark Column expressions.

The checks are generated from the same contract data as the Python validator
(``app_sim.contract``: field specs in declared order, cross-field rules), with the same reason
codes in the same order, so the API, the generator and the speed layer agree on what is valid.
A unit test runs both over the same invalid records and compares the reasons.
"""

from __future__ import annotations

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from app_sim import contract
from pipelines.tables import TABLES

_SPARK_TYPE = {"integer": "bigint", "string": "string"}


def _vtype(name: str) -> Column:
    """The VARIANT type name of field ``name`` (None when absent, 'VOID' when JSON null)."""
    return F.col(f"_t_{name}")


def _value(name: str, json_type: str) -> Column:
    return F.col(f"_x_{name}")


def _field_columns() -> list[Column]:
    """Each field's VARIANT type name and typed value, computed once per record."""
    cols = []
    for f in contract.spark_schema().fields:
        typ = "bigint" if f.dataType.typeName() == "long" else "string"
        cols.append(F.expr(f"schema_of_variant(variant_get(_v, '$.{f.name}'))").alias(f"_t_{f.name}"))
        cols.append(F.expr(f"try_variant_get(_v, '$.{f.name}', '{typ}')").alias(f"_x_{f.name}"))
    return cols


def _absent(name: str) -> Column:
    t = _vtype(name)
    return t.isNull() | (t == "VOID")


def _type_rules(spec: contract.EventTypeSpec) -> list[tuple[Column, Column]]:
    """(condition, reason) for one event type, in the validator's order."""
    allowed = F.array(*[F.lit(f.name) for f in spec.fields])
    extra = F.array_sort(F.filter(F.col("_keys"), lambda k: ~F.array_contains(allowed, k)))
    rules: list[tuple[Column, Column]] = [
        (F.size(extra) > 0, F.concat(F.lit("unknown_field:"), extra.getItem(0)))
    ]
    for f in spec.fields:
        if f.required and f.name != "type":
            rules.append((_absent(f.name), F.lit(f"missing_field:{f.name}")))
    for f in spec.fields:
        if f.name == "type":
            continue
        present = ~_absent(f.name)
        t = _vtype(f.name)
        if f.const is not None:
            bad = (t != "BIGINT") | (_value(f.name, "integer") != F.lit(f.const))
            reason = "bad_schema_version" if f.name == "schema_version" else f"bad_value:{f.name}"
            rules.append((present & bad, F.lit(reason)))
            continue
        if f.json_type == "integer":
            v = _value(f.name, "integer")
            rules.append((present & (t != "BIGINT"), F.lit(f"mistyped_field:{f.name}")))
            out = F.lit(False)
            if f.minimum is not None:
                out = out | (v < F.lit(f.minimum))
            if f.maximum is not None:
                out = out | (v > F.lit(f.maximum))
            rules.append((present & out, F.lit(f"bad_value:{f.name}")))
        else:
            v = _value(f.name, "string")
            rules.append((present & (t != "STRING"), F.lit(f"mistyped_field:{f.name}")))
            if f.max_length is not None:
                rules.append((present & (F.char_length(v) > f.max_length), F.lit(f"text_too_long:{f.name}")))
            bad = F.lit(False)
            if f.min_length is not None:
                bad = bad | (F.char_length(v) < f.min_length)
            if f.pattern:
                bad = bad | ~v.rlike(f.pattern)
            rules.append((present & bad, F.lit(f"bad_value:{f.name}")))
    for reason, types, fld, other in contract.CROSS_FIELD_RULES:
        if spec.name in types:
            rules.append((_value(fld, "integer") == _value(other, "integer"), F.lit(reason)))
    return rules


def reason_column() -> Column:
    """The quarantine reason of a record (null when it satisfies the contract).

    Expects columns ``_raw`` (string), ``_v`` (VARIANT or null), ``_keys`` (top-level keys).
    """
    etype = _value("type", "string")
    expr = (
        F.when(F.col("_v").isNull(), F.lit("bad_json"))
        .when(~F.expr("schema_of_variant(_v)").startswith("OBJECT"), F.lit("not_an_object"))
        .when(_absent("type"), F.lit("missing_field:type"))
        .when(_vtype("type") != "STRING", F.lit("mistyped_field:type"))
        .when(~etype.isin(*contract.EVENT_TYPES), F.lit("unknown_type"))
    )
    for name in contract.EVENT_TYPES:
        for cond, reason in _type_rules(contract.event_type(name)):
            expr = expr.when((etype == name) & cond, reason)
    return expr


def parse_records(records: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Split Kafka records (key, value, partition, offset, timestamp) into (events, quarantine).

    ``events`` has the columns of ``events_bronze`` (less disposition/reason) plus ``key``,
    ``raw`` and ``kafka_timestamp`` (kept so a later stateful rejection can be quarantined
    with its raw record). Corrected event time = device_time + (received_time - sent_time).
    """
    base = records.select(
        F.col("partition").cast("int").alias("partition"),
        F.col("offset"),
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").alias("raw"),
        (F.unix_micros(F.col("timestamp")) / 1000).cast("bigint").alias("kafka_timestamp"),
        F.expr("is_valid_utf8(value)").alias("_utf8"),
    )
    parsed = base.withColumn("_v", F.when(F.col("_utf8"), F.expr("try_parse_json(raw)"))).withColumn(
        "_keys", F.when(F.col("_v").isNotNull(), F.expr("json_object_keys(raw)"))
    )
    # Computed once and cut from its lineage: events and quarantine both come from it.
    checked = parsed.select("*", *_field_columns()).withColumn("reason", reason_column())
    checked = checked.localCheckpoint(eager=True, storageLevel=StorageLevel.DISK_ONLY)

    quarantine_cols = TABLES["quarantine"].columns
    quarantine = (
        checked.where(F.col("reason").isNotNull())
        .select(
            "partition",
            "offset",
            "key",
            "raw",
            "reason",
            _value("event_id", "string").alias("event_id"),
            _value("type", "string").alias("type"),
            "kafka_timestamp",
        )
        .select(*quarantine_cols)
    )

    fields = contract.spark_schema()
    event_cols = [
        c for c in TABLES["events_bronze"].columns if c not in ("disposition", "reason", "received_date")
    ]
    valid = checked.where(F.col("reason").isNull())
    extracted = valid.select(
        "partition",
        "offset",
        "key",
        "raw",
        "kafka_timestamp",
        *[
            _value(f.name, "integer" if f.dataType.typeName() == "long" else "string").alias(f.name)
            for f in fields
        ],
    ).withColumn("event_time", F.col("device_time") + (F.col("received_time") - F.col("sent_time")))
    for col in event_cols:
        if col not in extracted.columns:
            extracted = extracted.withColumn(col, F.lit(None).cast("bigint"))
    events = extracted.select(*event_cols, "key", "raw", "kafka_timestamp")
    return events, quarantine
