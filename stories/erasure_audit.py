"""``make erasure-audit``: prove that an erased user's personal data is unreadable everywhere.

On a scratch stack of its own (Kafka, Redis, the API, the keyed speed layer with its archiver and
compaction, under ``var/erasure_audit/``, on free ports), or on a running one (``audit()``, as the
integration test does):

1. a small sealed world from the generator, and a *canary* user made through the API, whose every
   personal field holds a random canary string: handle, display name, posts, a status, messages;
   it follows three users and three follow it, one of whom also messages it;
2. a *control* user written by a raw producer in plaintext (as ``kcat`` would): the proof that
   the search sees plaintext where there is some (docs/erasure.md: what erasure does not cover);
3. the pipeline runs over it: speed layer, archive, compaction, the compacted topics (and with
   ``--full``: the analytics, the quality suites and the reports index);
4. a search of every file the stack wrote (``pipelines/erasure_audit.py``: Kafka segments
   decoded batch by batch, Parquet values, Spark's lz4 files, Redis's AOF and RDB strings, logs,
   reports) for the canary strings, and for values sealed with the canary's key that still open;
5. ``DELETE /v1/users/me`` as the canary; the times until the key is gone (the erasure is complete
   for everything sealed), until the speed layer applied it, until the archive holds it;
6. the pipeline again, the search again: 0 plaintext hits of the canary and 0 readable sealed
   values anywhere, while the control is still found; ``verify``: the live state equals a replay.

Writes ``var/reports/erasure_audit/latest.json`` and ``index.html``; exits 1 when a hit remains
or verify fails. The report never contains the canary strings themselves, only their SHA-256.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import secrets
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from infra import clients
from infra.cli import command_name, run_main
from infra.html import render as render_page
from infra.settings import Settings, get_settings


def _say(msg: str) -> None:
    print(f"==> {msg}", flush=True)


@dataclasses.dataclass
class Canary:
    token: str  # in every personal field of the canary user: the needle
    handle: str

    @classmethod
    def new(cls, prefix: str = "c") -> Canary:
        token = secrets.token_hex(7)
        return cls(token=token, handle=f"{prefix}{token}"[:15])

    @property
    def needles(self) -> list[str]:
        return [self.token, self.handle]

    def digest(self) -> str:
        return hashlib.sha256(self.token.encode()).hexdigest()


def _api(base: str):
    import httpx

    return httpx.Client(base_url=base, timeout=30)


def act_out_canary(base: str, canary: Canary, posts: int = 3) -> dict:
    """The canary user and its neighbours, through the API; returns ids, the canary's token and
    how many events the canary wrote (``posts`` + 8: registration, status, 3 follows, 3 messages)."""
    with _api(base) as c:

        def register(handle: str, name: str) -> tuple[int, str]:
            r = c.post("/v1/users", json={"handle": handle, "display_name": name})
            r.raise_for_status()
            return r.json()["user_id"], r.json()["token"]

        me, token = register(canary.handle, f"Canary {canary.token}")
        friends = [register(f"friend{i}_{canary.token[:6]}", f"Friend {i}") for i in range(3)]
        auth = {"Authorization": f"Bearer {token}"}

        def post(i: int) -> None:
            c.post("/v1/posts", json={"text": f"post {i} by {canary.token}"}, headers=auth).raise_for_status()

        with ThreadPoolExecutor(max_workers=8 if posts > 100 else 1) as pool:  # many: the API's pace
            list(_progress(pool.map(post, range(posts)), posts, "canary posts (API)"))
        c.put("/v1/status", json={"text": f"status of {canary.token}"}, headers=auth).raise_for_status()
        for fid, ftoken in friends:
            fauth = {"Authorization": f"Bearer {ftoken}"}
            c.post("/v1/follows", json={"followee_id": fid}, headers=auth).raise_for_status()
            c.post("/v1/follows", json={"followee_id": me}, headers=fauth).raise_for_status()
            c.post(
                "/v1/messages", json={"recipient_id": fid, "text": f"hello from {canary.token}"}, headers=auth
            ).raise_for_status()
        fid, ftoken = friends[0]
        c.post(
            "/v1/messages",
            json={"recipient_id": me, "text": "hi canary"},
            headers={"Authorization": f"Bearer {ftoken}"},
        ).raise_for_status()
    return {"user_id": me, "token": token, "friends": [f for f, _ in friends], "events": posts + 8}


def _progress(items, total: int, desc: str):
    if total <= 100:
        return items
    from tqdm import tqdm

    return tqdm(items, total=total, desc=desc, unit="req", mininterval=5)


def _rewrite_aof(r) -> None:
    """Make Redis write its AOF's RDB base afresh (the data is then in the base as well as in
    the tail) and wait until it is written."""
    r.bgrewriteaof()
    time.sleep(0.5)
    while r.info("persistence").get("aof_rewrite_in_progress"):
        time.sleep(0.2)


def write_control(
    settings: Settings, control: Canary, user: int | None = None, post_id: int | None = None
) -> int:
    """A user and a post written in plaintext by a raw producer (not the API): never sealed.
    Given ``user`` (written before): one more post of theirs, with ``post_id``."""
    import orjson

    import contract
    from contract.ids import new_event_id, wall_clock_ms

    now = wall_clock_ms()
    events = []
    if user is None:
        user = post_id = 8_000_000_000_000_000 + secrets.randbelow(10**15)
        events.append({"type": "user_registered", "handle": control.handle, "display_name": "kcat"})
    events.append({"type": "post_created", "post_id": post_id, "text": f"raw {control.token}"})
    env = {"schema_version": 1, "user_id": user, "device_time": now, "sent_time": now, "received_time": now}
    p = clients.kafka_producer(settings, "erasure_audit")
    for body in events:
        e = {**env, "event_id": new_event_id(), **body}
        assert contract.validate(e) is None, contract.validate(e)
        p.produce(settings.events_topic, orjson.dumps(e), contract.record_key(e))
    if p.flush(30):
        raise RuntimeError("the control records were not acknowledged")
    return user


def search(
    roots: list[Path], canary: Canary, control: Canary, user_id: int, keystore, progress: bool
) -> dict:
    import functools

    from contract.keys import still_opens
    from pipelines import erasure_audit as ea

    out: dict = {"canary": {}, "control": {}}
    found: dict = {}
    opens = functools.partial(still_opens, keystore)
    for root in roots:
        findings = ea.scan(
            root, canary.needles, user_id=user_id, opens=opens, progress=progress, control=control.needles
        )
        for store, f in findings.items():
            found[f"{root.name}/{store}"] = f
            out["canary"][f"{root.name}/{store}"] = f.as_dict()
            out["control"][f"{root.name}/{store}"] = {"plaintext": f.control_plaintext}
    t = ea.totals(found)
    out["canary_plaintext"], out["canary_sealed"], out["canary_readable"] = (
        t["plaintext"],
        t["sealed"],
        t["readable"],
    )
    out["control_plaintext"] = t["control_plaintext"]
    out["files"], out["bytes"], out["decoded_containers"] = t["files"], t["bytes"], t["decoded_containers"]
    return out


def run_verify(settings: Settings, topic: str, namespace: str) -> dict:
    from infra.stack import settings_env

    done = subprocess.run(
        [sys.executable, "-m", "pipelines.verify", "--topic", topic, "--namespace", namespace],
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    path = Path(settings.reports_dir) / "verify" / "latest.json"
    if not path.exists():
        raise RuntimeError(f"verify wrote no report (exit {done.returncode}): {done.stderr[-3000:]}")
    report = json.loads(path.read_text())
    return {"exit_code": done.returncode, "ok": bool(report.get("ok")) and done.returncode == 0}


def _run_module(settings: Settings, *args: str, timeout: float = 1800) -> int:
    from infra.stack import settings_env

    return subprocess.run(
        [sys.executable, "-m", *args], env=settings_env(settings), timeout=timeout, capture_output=True
    ).returncode


def audit(
    settings: Settings,
    *,
    world_events: int = 3_000,
    world_users: int = 100,
    canary_posts: int = 3,
    full: bool = False,
    purge: bool = False,
    roots: list[Path] | None = None,
    progress: bool = True,
) -> dict:
    """Run the scenario on the stack of ``settings`` (Kafka and Redis running, the topic created,
    ``views_namespace`` set); returns the report (see the module docstring). ``purge``: after the
    speed layer applied the erasure, ``REORG ... APPLY (PURGE)`` and a VACUUM without retention
    over the namespace's Delta tables (what removes plaintext rows from old versions, for
    plaintext other producers wrote), timed as part of the erasure."""
    import functools

    from app_sim.generator import GeneratorConfig, produce
    from contract.keys import KeyStore, Sealer
    from infra.stack import ApiServer, end_offsets
    from pipelines.speed_layer_process import SpeedLayerProcess

    topic, ns = settings.events_topic, settings.views_namespace
    roots = roots or [Path(settings.var_dir)]  # every store the stack writes
    canary, control = Canary.new("c"), Canary.new("k")
    keystore = KeyStore.for_settings(settings)
    report: dict = {"topic": topic, "namespace": ns, "canary_sha256": canary.digest(), "full": full}

    _say(f"a sealed world of {world_events:,} generator events by {world_users:,} users")
    world = GeneratorConfig(users=world_users, seed=5, mean_followers=5, realtime=True)
    produce(
        world_events,
        world,
        topic=topic,
        bootstrap=settings,
        progress=progress and world_events > 100_000,
        sealer=Sealer(keystore),
    )
    sl = SpeedLayerProcess(settings, topic, ns, Path(settings.log_dir) / f"erasure-audit-{ns}.log")
    api = ApiServer(settings)
    sl.start()
    api.start()
    try:
        base = f"http://127.0.0.1:{settings.api_port}"
        _say("the canary user (API, sealed) and a control user (raw producer, plaintext)")
        who = act_out_canary(base, canary, posts=canary_posts)
        report["control_user"] = write_control(settings, control)
        user = who["user_id"]
        report["canary_user"], report["canary_events"] = user, who["events"]
        ends = end_offsets(settings, topic)
        report["log_events"] = sum(ends.values())
        _say(f"the speed layer, the archive and compaction over {report['log_events']:,} events")
        t_catch_up = time.perf_counter()
        sl.wait_for(ends, timeout=3600)
        report["catch_up_s"] = round(time.perf_counter() - t_catch_up, 1)
        if full:
            report["pipeline_before"] = _pipeline_extras(settings, topic, ns)
        r = clients.redis_client(settings.redis_url)
        searched = functools.partial(_searched, r, roots, canary, control, user, keystore, progress)
        report["before"] = searched("before")
        t0, erasure = _erase(sl, base, who["token"], keystore, user)
        report["erasure"] = erasure
        sl.wait_for(end_offsets(settings, topic), timeout=900)
        if purge:
            _purge(settings, sl, control, report["control_user"], erasure, t0)
        if full:
            report["pipeline_after"] = _pipeline_extras(settings, topic, ns)
        report["after"] = searched("after")
        erasure["audit_clean_s"] = round(time.perf_counter() - t0, 1)  # request -> the search's verdict
    finally:
        api.stop()
        sl.stop()
    _say("verify: the live state equals a replay of the log")
    report["verify"] = run_verify(settings, topic, ns)
    report["ok"] = _clean(report)
    return report


def _searched(
    r, roots: list[Path], canary: Canary, control: Canary, user: int, keystore, progress: bool, phase: str
) -> dict:
    """:func:`search` ``phase`` (before, after) the erasure, timed, once Redis rewrote its AOF."""
    _rewrite_aof(r)
    _say(f"search {phase} the erasure")
    t_search = time.perf_counter()
    found = search(roots, canary, control, user, keystore, progress)
    found["seconds"] = round(time.perf_counter() - t_search, 1)
    return found


def _erase(sl, base: str, token: str, keystore, user: int) -> tuple[float, dict]:
    """``DELETE /v1/users/me`` as the canary; when the request started (``perf_counter``), and the
    times until it was accepted, applied by the speed layer, archived and compacted."""
    _say("erase the canary: DELETE /v1/users/me")
    with _api(base) as c:
        t0 = time.perf_counter()
        r_del = c.delete("/v1/users/me", headers={"Authorization": f"Bearer {token}"})
        t_accepted = time.perf_counter() - t0
    r_del.raise_for_status()
    gone = keystore.get(user) is None
    at = r_del.json()
    partition, offset = at["partition"], at["offset"]
    while sl.redis_position().get(partition, 0) <= offset:
        time.sleep(0.05)
    t_applied = time.perf_counter() - t0
    sl.wait_for({partition: offset + 1}, timeout=900)
    t_archived = time.perf_counter() - t0
    return t0, {
        "key_deleted_when_accepted": gone,
        "accepted_s": round(t_accepted, 3),
        "applied_by_speed_layer_s": round(t_applied, 3),
        "archived_and_compacted_s": round(t_archived, 3),
    }


def _purge(settings: Settings, sl, control: Canary, control_user: int, erasure: dict, t0: float) -> None:
    """``REORG ... APPLY (PURGE)`` and a VACUUM without retention over the namespace's Delta
    tables; its exit code and the time since the erasure's request (``t0``) into ``erasure``."""
    from infra.stack import end_offsets

    _say("Delta: REORG ... APPLY (PURGE), then VACUUM without retention")
    code = _run_module(
        settings,
        "pipelines.maintenance",
        "--step",
        "purge",
        "--step",
        "vacuum",
        "--retention-hours",
        "0",
    )
    erasure["purge_exit_code"] = code
    erasure["purged_and_vacuumed_s"] = round(time.perf_counter() - t0, 1)
    # The purge rewrote the views' files and the VACUUM removed the old ones: the
    # versions the last batch recorded (verify's time travel) are gone. The next batch
    # records the purged ones: one more plaintext post of the control user.
    write_control(settings, control, user=control_user, post_id=control_user + 1)
    sl.wait_for(end_offsets(settings, settings.events_topic), timeout=900)


def _clean(report: dict) -> bool:
    """The audit's verdict: no canary plaintext and nothing readable after, while the search saw
    the sealed data before and the control's plaintext after; the key gone, purge and verify ok."""
    a, b = report["after"], report["before"]
    return (
        a["canary_plaintext"] == 0
        and a["canary_readable"] == 0
        and b["canary_plaintext"] == 0
        and b["canary_readable"] > 0  # before: the search finds the sealed data and it opens
        and a["control_plaintext"] > 0  # the search sees plaintext where a raw producer wrote some
        and report["erasure"]["key_deleted_when_accepted"]
        and report["erasure"].get("purge_exit_code", 0) == 0
        and report["verify"]["ok"]
        # with --full the analytics' outputs must exist to be searched
        and all(report.get(k, {}).get("analytics", 0) == 0 for k in ("pipeline_before", "pipeline_after"))
    )


def _pipeline_extras(settings: Settings, topic: str, ns: str) -> dict:
    """The rest of the pipeline over the namespace: analytics (one pass), quality, reports; the
    exit codes (quality's 1 is a verdict on the data, reported, not an audit failure)."""
    _say("analytics (one pass), quality suites, reports index")
    codes = {
        "analytics": _run_module(
            settings, "pipelines.analytics.runner", "--topic", topic, "--namespace", ns, "--available-now"
        ),
        "quality": _run_module(settings, "pipelines.quality", "--namespace", ns),
    }
    from infra.reports import write_index

    write_index(settings)
    return codes


def render(report: dict) -> str:
    """The audit's page (infra/templates/erasure_audit.html.j2)."""
    rows = []
    for phase in ("before", "after"):
        for store, f in sorted(report[phase]["canary"].items()):
            rows.append(
                {
                    "phase": phase,
                    "store": store,
                    "files": f"{f['files']:,}",
                    "bytes": f"{f['bytes']:,}",
                    "decoded": f"{f['decoded_containers']:,}",
                    "plaintext": f["plaintext"],
                    "sealed": f["sealed"],
                    "readable": f["readable"],
                    "control": report[phase]["control"].get(store, {}).get("plaintext", 0),
                }
            )
    e = report["erasure"]
    purged = (
        f", Delta purged and vacuumed after {e['purged_and_vacuumed_s']} s"
        if "purged_and_vacuumed_s" in e
        else ""
    )
    return render_page(
        "erasure_audit.html.j2",
        verdict="CLEAN" if report["ok"] else "NOT CLEAN",
        canary_user=report["canary_user"],
        canary_sha256=report["canary_sha256"][:16],
        topic=report["topic"],
        namespace=report["namespace"],
        e=e,
        purged=purged,
        log_events=f"{report.get('log_events', 0):,}",
        canary_events=f"{report.get('canary_events', 0):,}",
        verify_ok=report["verify"]["ok"],
        rows=rows,
    )


def write_report(report: dict, settings: Settings) -> Path:
    out = Path(settings.reports_dir) / "erasure_audit"
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "index.html").write_text(render(report))
    return out


def scratch_audit(base: Settings, name: str = "erasure_audit", **audit_args) -> dict:
    """``audit()`` on a scratch stack of its own: Kafka, Redis and the API under
    ``var/<name>/`` (emptied first), on free ports; stopped afterwards."""
    from infra.stack import BACKBONE, Stack, create_topic, free_port_block

    var = Path(base.var_dir) / name
    shutil.rmtree(var, ignore_errors=True)
    port = free_port_block(4)
    settings = dataclasses.replace(
        base,
        profile="local",
        var_dir=var,
        kafka_port=port,
        kafka_controller_port=port + 1,
        kafka_bootstrap=f"127.0.0.1:{port}",
        redis_port=port + 2,
        redis_url=f"redis://127.0.0.1:{port + 2}/0",
        api_port=port + 3,
        views_namespace="audit",
    )
    stack = Stack(settings, service_types=BACKBONE)
    _say(f"a scratch stack under {var}")
    stack.up()
    try:
        create_topic(settings, settings.events_topic, settings.events_partitions)
        return audit(settings, **audit_args)
    finally:
        stack.down()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog=command_name("stories.erasure_audit"), description=__doc__.splitlines()[0]
    )
    p.add_argument("--world-events", type=int, default=20_000, help="generator events around the canary")
    p.add_argument("--world-users", type=int, default=100, help="the generator's users")
    p.add_argument("--canary-posts", type=int, default=3, help="posts the canary writes through the API")
    p.add_argument("--quick", action="store_true", help="skip the analytics, quality and reports steps")
    p.add_argument(
        "--no-purge",
        action="store_true",
        help="skip the Delta REORG ... APPLY (PURGE) and VACUUM after the erasure",
    )
    a = p.parse_args(argv)
    base = get_settings()
    report = scratch_audit(
        base,
        world_events=a.world_events,
        world_users=a.world_users,
        canary_posts=a.canary_posts,
        full=not a.quick,
        purge=not a.no_purge,
    )
    out = write_report(report, base)
    b, f = report["before"], report["after"]
    print(
        f"\nbefore: {b['files']:,} files, canary plaintext {b['canary_plaintext']}, sealed {b['canary_sealed']}, "
        f"readable {b['canary_readable']}; control plaintext {b['control_plaintext']}\n"
        f"after:  {f['files']:,} files, canary plaintext {f['canary_plaintext']}, sealed {f['canary_sealed']}, "
        f"readable {f['canary_readable']}; control plaintext {f['control_plaintext']}\n"
        f"erasure: {report['erasure']}\nverify: {report['verify']}\n"
        f"{'CLEAN' if report['ok'] else 'NOT CLEAN'}: {out / 'index.html'}"
    )
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(run_main(main, "stories.erasure_audit"))
