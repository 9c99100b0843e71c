"""Render ``docs/events.md`` from the contract schema (the docs are generated, never hand-edited)."""

from __future__ import annotations

import contract as c


def _constraints(f: c.FieldSpec) -> str:
    parts = []
    if f.const is not None:
        parts.append(f"= `{f.const}`")
    if f.minimum is not None:
        parts.append(f">= {f.minimum}")
    if f.maximum is not None and f.maximum != 2**63 - 1:
        parts.append(f"<= {f.maximum}")
    if f.min_length is not None:
        parts.append(f"length >= {f.min_length}")
    if f.max_length is not None:
        parts.append(f"length <= {f.max_length}")
    if f.pattern is not None:
        parts.append(f"matches `{f.pattern}`")
    if f.sealable:
        parts.append("or sealed (personal data, `$defs/sealed`)")
    return ", ".join(parts)


def _json_type(f: c.FieldSpec) -> str:
    return "int64" if f.json_type == "integer" else f.json_type


def render() -> str:
    s = c.schema()
    out = [
        "# Event contract v1 (`social.events`)",
        "",
        "<!-- Generated from contract/events.v1.schema.json by `python -m contract docs`."
        " Do not edit by hand: a unit test fails when this file is stale. -->",
        "",
        s["description"],
        "",
        "## Envelope (every event)",
        "",
        "| field | type | constraints | meaning |",
        "|---|---|---|---|",
    ]
    env = c.event_type(c.EVENT_TYPES[0])
    for name in c.ENVELOPE_FIELDS:
        f = env.field(name)
        desc = "one of the event types below" if name == "type" else f.description
        out.append(
            f"| `{name}` | {_json_type(f) if name != 'type' else 'string'} | {_constraints(f) if name != 'type' else ''} | {desc} |"
        )
    window = s["$defs"]["envelope"]["x-clock-window"]
    out += [
        "",
        "## Clock window (`x-clock-window`, `contract.CLOCK_WINDOW`)",
        "",
        window["description"],
        "",
        f"- `max_clock_skew_ms` = {window['max_clock_skew_ms']} ({window['max_clock_skew_ms'] / 3_600_000:g} h)",
        f"- `max_offline_ms` = {window['max_offline_ms']} ({window['max_offline_ms'] / 86_400_000:g} days)",
        "",
        "The API refuses a request whose `X-Device-Time` or `X-Sent-Time` header would break these",
        "rules (400 `bad_header`, naming the header), so only raw producers can write such events;",
        "the speed layer quarantines them with the reason (they never reach the views).",
    ]
    sealed = s["$defs"]["sealed"]
    personal = sorted({f"`{f}`" for t in c.EVENT_TYPES for f in c.personal_fields(t)})
    out += [
        "",
        "## Sealed personal data (`$defs/sealed`, `contract.keys`)",
        "",
        sealed["description"],
        "",
        f"- personal fields: {', '.join(personal)}",
        f"- form: matches `{sealed['pattern']}`, length <= {sealed['maxLength']}",
        "",
        "The API and the generator seal every personal field; a raw producer (kcat) may still write",
        "plaintext, which stays valid and readable in the log forever (docs/erasure.md says what an",
        "erasure covers for it).",
    ]
    out += ["", "## Event types", "", "| type | extra fields | partition key (record key) |", "|---|---|---|"]
    for t in c.EVENT_TYPES:
        extra = [f"`{f.name}`" for f in c.event_type(t).fields if f.name not in c.ENVELOPE_FIELDS]
        out.append(f"| [`{t}`](#{t}) | {', '.join(extra)} | `{c.PARTITION_KEY[t]}` |")
    for t in c.EVENT_TYPES:
        spec = c.event_type(t)
        out += [
            "",
            f"### `{t}`",
            "",
            spec.description,
            "",
            f"Record key: decimal string of `{spec.partition_key}`. "
            f"Required: {', '.join(f'`{r}`' for r in c.required_fields(t))}.",
            "",
            "| field | type | constraints | meaning |",
            "|---|---|---|---|",
        ]
        for f in spec.fields:
            if f.name in c.ENVELOPE_FIELDS:
                continue
            out.append(f"| `{f.name}` | {_json_type(f)} | {_constraints(f)} | {f.description} |")
    out += [
        "",
        "## Validation and quarantine reason codes",
        "",
        "`contract.validate(obj)` returns the first failing check's reason code; invalid events",
        "have no effect and land in the quarantine with that reason. Checks run in this order:",
        "",
    ]
    doc = c.__doc__ or ""
    table = doc[doc.index("=====") : doc.index("Field checks")].strip()
    out += ["```", table, "```", ""]
    out += [
        "Cross-field rules (not expressible in JSON Schema, kept as data in `CROSS_FIELD_RULES`):",
        "",
    ]
    for reason, types, fld, other in c.CROSS_FIELD_RULES:
        out.append(f"- `{reason}`: {', '.join(f'`{t}`' for t in types)} with `{fld}` equal to `{other}`")
    out += ["", "Rules that need the derived state (checked by the speed layer):", ""]
    for reason, meaning in c.STATEFUL_REASONS.items():
        out.append(f"- `{reason}`: {meaning}")
    out += ["", "Every reason code this schema can produce:", ""]
    out.append(", ".join(f"`{r}`" for r in c.reason_codes()))
    out.append("")
    return "\n".join(out)
