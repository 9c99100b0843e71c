"""``make bench`` section ``erasure``: the issue's erasure at scale (docs/erasure.md).

A user with 10,000 events in a log of ``--erasure-log-events`` (1M) events: ``make erasure-audit``'s
scenario (``stories/erasure_audit.py``, on a scratch stack of its own under ``var/bench_erasure/``)
with a world of 100 generator users and a canary who writes ``10,000 - 8`` posts through the API
beside its 8 other events. After the speed layer, the archive and compaction caught up with the
whole log, the canary erases itself (``DELETE /v1/users/me``), and the clock runs until the search
of every store gave its verdict, through:

- the key's deletion (the erasure is complete for everything sealed),
- the speed layer's application of ``user_erased`` and the archive's,
- the Delta purge: ``REORG ... APPLY (PURGE)`` and a VACUUM without retention on every table,
- the search of every file the stack wrote (Kafka segments, Delta files of every version,
  checkpoints, Redis's RDB and AOF, logs).

Target (issue 20): the erasure is complete, the audit clean, within 10 minutes on 2 cores.
``verify`` (the live state equals a replay of the whole log) runs after the clock stopped.
"""

from __future__ import annotations

from stories.bench_common import BenchContext, section

CANARY_EVENTS = 10_000
CANARY_OTHER_EVENTS = 8  # registration, status, 3 follows, 3 messages (act_out_canary)
FRIEND_EVENTS = 7  # 3 registrations, 3 follows of the canary, one message to it
TARGET_S = 600


@section("erasure")
def erasure_section(ctx: BenchContext) -> dict:
    from stories.erasure_audit import scratch_audit

    world = ctx.erasure_log_events - CANARY_EVENTS - FRIEND_EVENTS - 3  # 2 control records, the erasure
    report = scratch_audit(
        ctx.settings,
        name="bench_erasure",
        world_events=world,
        world_users=100,
        canary_posts=CANARY_EVENTS - CANARY_OTHER_EVENTS,
        full=False,
        purge=True,
    )
    e, before, after = report["erasure"], report["before"], report["after"]
    clean = report["ok"]
    return {
        "log_events": report["log_events"],
        "canary_events": report["canary_events"],
        "catch_up_s": report["catch_up_s"],
        "catch_up_events_per_s": round(report["log_events"] / report["catch_up_s"]),
        **{f"erasure_{k}": v for k, v in e.items()},
        "searched_files": after["files"],
        "searched_bytes": after["bytes"],
        "decoded_containers": after["decoded_containers"],
        "search_s": after["seconds"],
        "before_sealed": before["canary_sealed"],
        "before_readable": before["canary_readable"],
        "after_plaintext": after["canary_plaintext"],
        "after_sealed": after["canary_sealed"],
        "after_readable": after["canary_readable"],
        "control_plaintext_after": after["control_plaintext"],
        "verify_ok": report["verify"]["ok"],
        "audit_clean": clean,
        "target": f"a user with {CANARY_EVENTS:,} events in a {ctx.erasure_log_events:,}-event log erased, "
        f"Delta purged and vacuumed, audit clean within {TARGET_S} s",
        "target_met": clean and e["audit_clean_s"] <= TARGET_S,
    }
