"""The erasure audit through the real stack, in its reduced form (``make erasure-audit`` runs the
full one: a bigger world, the analytics, the quality suites and the reports on top).

A canary user made through the API (every personal field sealed with its key) and a control user
written in plaintext by a raw producer share a log; the speed layer, the archiver and the
compaction run over it; then the stack's files are searched, decoded as their readers decode
them (stories/erasure_audit.py, pipelines/erasure_audit.py), before and after the canary's erasure.
"""

from __future__ import annotations

import dataclasses
import socket
import uuid
from pathlib import Path

from stories.erasure_audit import audit


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_after_an_erasure_no_store_holds_anything_readable_of_the_user(kafka_stack, topic_factory):
    ns = f"audit_{uuid.uuid4().hex[:8]}"
    settings = dataclasses.replace(
        kafka_stack.settings, events_topic=topic_factory(4), views_namespace=ns, api_port=_free_port()
    )
    var = Path(settings.var_dir)
    # this test's stores in the session's var dir (other tests' namespaces are not its business)
    roots = [var / "kafka", var / "redis", var / "lake" / ns, var / "checkpoints", var / "log"]
    report = audit(settings, world_events=2_000, full=False, roots=roots, progress=False)
    before, after = report["before"], report["after"]

    def where(phase: dict, key: str, kind: str = "canary") -> set[str]:
        """The roots (kafka, redis, the namespace's lake, ...) with a finding of that kind."""
        return {store.split("/")[0] for store, f in phase[kind].items() if f[key]}

    # sealed at the source: no plaintext of the canary anywhere, ever
    assert before["canary_plaintext"] == 0 and after["canary_plaintext"] == 0
    # before the erasure its sealed values are in the log, the archive and Redis, and they open
    assert {"kafka", "redis", ns} <= where(before, "readable"), before["canary"]
    # after it: still there (the log is immutable), and none of it opens
    assert after["canary_sealed"] > 0 and after["canary_readable"] == 0, after["canary"]
    assert {"kafka", ns} <= where(after, "sealed")
    # the search does see plaintext: the raw producer's control user, in the log, the archive, Redis
    assert {"kafka", "redis", ns} <= where(after, "plaintext", "control"), after["control"]
    assert report["erasure"]["key_deleted_when_accepted"]
    assert report["verify"]["ok"], report["verify"]
    assert report["ok"]
