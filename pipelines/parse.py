"""Kafka records -> contract-valid events + quarantine rows, as Spark Column expressions.

The checks are generated from the same contract data as the Python validator
(``contract``: field specs in declared order, cross-field rules), with the same reason
codes in the same order, so the API, the generator and the speed layer agree on what is valid.
A unit test runs both over the same invalid records and compares the reasons.
"""

from __future__ import annotations

import functools

from pyspark import SparkContext, StorageLevel
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

import contract
from pipelines.tables import TABLES

_VARIANT_TYPE = {"integer": "BIGINT", "string": "STRING"}  # schema_of_variant's names

# The checks are written as Spark SQL text and parsed once (one ``F.expr``): built as Column
# objects they took thousands of Py4J calls, ~2.8 s of every JVM that parses records (the
# archiver at each start, each verify, the batch layer). The rules and their order are the same.


def _lit(value: str) -> str:
    """A Spark SQL string literal of ``value`` (the parser unescapes backslashes)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _vtype(name: str) -> str:
    """The VARIANT type name of field ``name`` (None when absent, 'VOID' when JSON null).

    An expression, not a column: only records off the fast path (see :func:`reason_column`)
    ever evaluate it, so a valid record never pays for it.
    """
    return f"schema_of_variant(variant_get(_v, {_lit('$.' + name)}))"


def _value(name: str) -> str:
    return f"`_x_{name}`"


def _field_columns() -> list[Column]:
    """Each field's typed value (null when absent, JSON null or not castable), once per record."""
    cols = []
    for f in contract.spark_schema().fields:
        typ = "bigint" if f.dataType.typeName() == "long" else "string"
        cols.append(F.expr(f"try_variant_get(_v, {_lit('$.' + f.name)}, '{typ}') AS `_x_{f.name}`"))
    return cols


def _absent(name: str) -> str:
    t = _vtype(name)
    return f"({t} IS NULL OR {t} = 'VOID')"


def _type_rules(spec: contract.EventTypeSpec, *, shape_ok: bool = False) -> list[tuple[str, str]]:
    """(condition, reason) for one event type, in the validator's order, as SQL.

    ``shape_ok``: the record is known to hold exactly the type's fields, each present with its
    JSON type, so only the value rules can fire (same rules, same order, same reasons).
    """
    rules: list[tuple[str, str]] = []
    if not shape_ok:
        allowed = "array(" + ", ".join(_lit(f.name) for f in spec.fields) + ")"
        extra = f"array_sort(filter(json_object_keys(raw), k -> NOT array_contains({allowed}, k)))"
        rules.append((f"size({extra}) > 0", f"concat('unknown_field:', {extra}[0])"))
        for f in spec.fields:
            if f.required and f.name != "type":
                rules.append((_absent(f.name), _lit(f"missing_field:{f.name}")))
    for f in spec.fields:
        if f.name == "type":
            continue
        present = "true" if shape_ok else f"NOT {_absent(f.name)}"
        mistyped = "false" if shape_ok else f"({_vtype(f.name)} <> {_lit(_VARIANT_TYPE[f.json_type])})"
        v = _value(f.name)
        if f.const is not None:
            const = _lit(f.const) if isinstance(f.const, str) else int(f.const)
            bad = f"({mistyped} OR {v} <> {const})"
            reason = "bad_schema_version" if f.name == "schema_version" else f"bad_value:{f.name}"
            rules.append((f"({present} AND {bad})", _lit(reason)))
            continue
        if not shape_ok:
            rules.append((f"({present} AND {mistyped})", _lit(f"mistyped_field:{f.name}")))
        if f.json_type == "integer":
            out = "false"
            if f.minimum is not None:
                out = f"({out} OR {v} < {int(f.minimum)})"
            if f.maximum is not None:
                out = f"({out} OR {v} > {int(f.maximum)})"
            rules.append((f"({present} AND {out})", _lit(f"bad_value:{f.name}")))
        else:
            if f.sealable:  # a sealed value: its form only (the producer checked the plaintext)
                sealed = (
                    f"(startswith({v}, {_lit(contract.SEALED_PREFIX)})"
                    f" AND char_length({v}) <= {int(contract.SEALED_MAX_LENGTH)}"
                    f" AND {v} RLIKE {_lit(contract.SEALED_PATTERN)})"
                )
                present = f"({present} AND NOT coalesce({sealed}, false))"
            if f.max_length is not None:
                rules.append(
                    (
                        f"({present} AND char_length({v}) > {int(f.max_length)})",
                        _lit(f"text_too_long:{f.name}"),
                    )
                )
            bad = "false"
            if f.min_length is not None:
                bad = f"({bad} OR char_length({v}) < {int(f.min_length)})"
            if f.pattern:
                bad = f"({bad} OR NOT {v} RLIKE {_lit(f.pattern)})"
            rules.append((f"({present} AND {bad})", _lit(f"bad_value:{f.name}")))
    rules += _clock_rules()
    for reason, types, fld, other in contract.CROSS_FIELD_RULES:
        if spec.name in types:
            rules.append((f"({_value(fld)} = {_value(other)})", _lit(reason)))
    return rules


def _clock_rules() -> list[tuple[str, str]]:
    """The clock window (``contract.clock_reason``), after the field rules put every time in range.

    Overflow-proof whatever the record holds: the differences are ``try_subtract`` (null instead
    of an ANSI overflow error should Spark ever evaluate them ahead of the range rules), and a
    null difference counts as outside the window.
    """
    device, sent, received = (_value(n) for n in ("device_time", "sent_time", "received_time"))
    skew = f"try_subtract({received}, {sent})"
    held = f"try_subtract({sent}, {device})"
    k, off = int(contract.MAX_CLOCK_SKEW_MS), int(contract.MAX_OFFLINE_MS)
    return [
        (f"coalesce({skew} > {k} OR {skew} < -{k}, true)", _lit("clock_skew:sent_time")),
        (
            f"coalesce({held} < 0 OR {held} > {off} OR {held} > {received}, true)",
            _lit("clock_skew:device_time"),
        ),
    ]


def _case(rules: list[tuple[str, str]], otherwise: str | None = None) -> str:
    """The reason of the first rule that holds (``otherwise``, or null, when none does)."""
    whens = " ".join(f"WHEN {cond} THEN {reason}" for cond, reason in rules)
    return f"CASE {whens}{f' ELSE {otherwise}' if otherwise else ''} END"


def clean_shape(spec: contract.EventTypeSpec) -> str:
    """``schema_of_variant`` of a record holding exactly the type's fields with their JSON types."""
    fields = sorted((f.name, _VARIANT_TYPE[f.json_type]) for f in spec.fields)
    return "OBJECT<" + ", ".join(f"{name}: {typ}" for name, typ in fields) + ">"


def _fast_path(spec: contract.EventTypeSpec) -> str:
    """True when a record of this type has exactly the type's shape (see :func:`reason_column`).

    Sound for any input: every field of every type is required, so all of them non-null means
    every ``name: TYPE`` segment of :func:`clean_shape` is present, and each of the type names
    is 6 characters, the shortest a non-null JSON value gets (VOID, a JSON null, is excluded by
    the non-null test). Any other key would make the string longer, and any other type at an
    equal length would differ in place: equal strings mean exactly these keys with these types.
    """
    assert all(f.required for f in spec.fields), "the fast path assumes every field is required"
    ok = [f"schema_of_variant(_v) = {_lit(clean_shape(spec))}"]
    ok += [f"{_value(f.name)} IS NOT NULL" for f in spec.fields]
    return "(" + " AND ".join(ok) + ")"


def reason_sql() -> str:
    """The quarantine reason of a record (null when it satisfies the contract), as Spark SQL.

    Expects columns ``raw`` (string), ``_utf8`` (the value is UTF-8), ``_v`` (VARIANT or null)
    and the typed ``_x_<field>``.

    Two paths, one answer. A record whose whole shape is its type's (every field present with
    its JSON type, nothing else) can only fail a value rule, so it is checked against those
    alone: one ``schema_of_variant`` per record instead of one per field, and no second JSON
    parse for its keys. Any other record takes the exact path, the validator's rules in order.
    A unit test runs both paths over the same records as the Python validator.
    """
    etype = _value("type")
    exact = [
        ("NOT _utf8", _lit("not_utf8")),
        ("_v IS NULL", _lit("bad_json")),
        ("NOT startswith(schema_of_variant(_v), 'OBJECT')", _lit("not_an_object")),
        (_absent("type"), _lit("missing_field:type")),
        (f"({_vtype('type')} <> 'STRING')", _lit("mistyped_field:type")),
        (f"NOT {etype} IN ({', '.join(_lit(t) for t in contract.EVENT_TYPES)})", _lit("unknown_type")),
    ]
    for name in contract.EVENT_TYPES:
        for cond, reason in _type_rules(contract.event_type(name)):
            exact.append((f"({etype} = {_lit(name)} AND {cond})", reason))
    fast = []
    for name in contract.EVENT_TYPES:
        spec = contract.event_type(name)
        cond = f"({etype} = {_lit(name)} AND {_fast_path(spec)})"
        fast.append((cond, _case(_type_rules(spec, shape_ok=True))))
    return _case(fast, otherwise=_case(exact))


def reason_column() -> Column:
    """:func:`reason_sql` as a Column: parsed by Spark in one call."""
    return F.expr(reason_sql())


@functools.cache
def _checks(gateway: int) -> tuple[list[Column], Column]:
    """The typed field columns and the reason column, built once per JVM gateway.

    A Column is an expression tree that belongs to no session, so the same objects serve every
    batch, stream and replay alike.
    """
    return _field_columns(), reason_column()


def received_date() -> Column:
    """``events_bronze``'s partition column: the server's receive day (UTC, the session zone)."""
    return F.date_format(F.timestamp_millis("received_time"), "yyyy-MM-dd")


def parse_records(records: DataFrame, *, checkpoint: bool = True) -> tuple[DataFrame, DataFrame]:
    """Split Kafka records (key, value, partition, offset, timestamp) into (events, quarantine).

    ``events`` has the columns of ``events_bronze`` (less disposition/reason) plus ``key``,
    ``raw`` and ``kafka_timestamp`` (kept so a later stateful rejection can be quarantined
    with its raw record). Corrected event time = device_time + (received_time - sent_time),
    computed with ``try_add``/``try_subtract`` on times the contract has already bounded.

    Text columns hold valid UTF-8 only (Parquet readers such as pyarrow refuse anything else):
    a value that is not UTF-8 is quarantined as ``not_utf8`` with ``raw`` = its bytes in base64;
    a key that is not UTF-8 is kept as ``base64:`` followed by its bytes in base64.

    ``checkpoint=False`` skips the local checkpoint that cuts the checked records from their
    lineage: a streaming DataFrame (the analytics queries, ``pipelines.analytics``) cannot be
    checkpointed, and there each output is its own query anyway.
    """
    utf8 = F.expr("is_valid_utf8(value)")
    base = records.select(
        F.col("partition").cast("int").alias("partition"),
        F.col("offset"),
        F.when(F.expr("is_valid_utf8(key)"), F.col("key").cast("string"))
        .otherwise(F.concat(F.lit("base64:"), F.base64("key")))
        .alias("key"),
        F.when(utf8, F.col("value").cast("string")).otherwise(F.base64("value")).alias("raw"),
        (F.unix_micros(F.col("timestamp")) / 1000).cast("bigint").alias("kafka_timestamp"),
        F.coalesce(utf8, F.lit(True)).alias("_utf8"),  # a null value (tombstone) is bad_json
    )
    parsed = base.withColumn("_v", F.when(F.col("_utf8"), F.expr("try_parse_json(raw)")))
    # Computed once and cut from its lineage: events and quarantine both come from it.
    checks, reason = _checks(id(SparkContext._gateway))
    checked = parsed.select("*", *checks).withColumn("reason", reason).drop("_v", "_utf8")
    if checkpoint:
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
            F.col("_x_event_id").alias("event_id"),
            F.col("_x_type").alias("type"),
            "kafka_timestamp",
        )
        .select(*quarantine_cols)
    )

    schema = contract.spark_schema()
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
        *[F.col(f"_x_{f.name}").alias(f.name) for f in schema],
    ).withColumn(
        "event_time",
        F.try_add(F.col("device_time"), F.try_subtract(F.col("received_time"), F.col("sent_time"))),
    )
    for col in event_cols:
        if col not in extracted.columns:
            extracted = extracted.withColumn(col, F.lit(None).cast("bigint"))
    events = extracted.select(*event_cols, "key", "raw", "kafka_timestamp")
    return events, quarantine
