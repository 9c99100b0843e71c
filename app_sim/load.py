"""``make load``: a bounded, headless Locust run of ``app_sim/locustfile.py`` against the running API.

``python -m app_sim.load [--users 50] [--spawn-rate 10] [--run-time 60] [--processes 1] [--host URL]``
(or ``LOAD_USERS``, ``LOAD_SPAWN_RATE``, ``LOAD_RUN_TIME``, ``LOAD_PROCESSES``). Needs ``make up``
first; says so when the API does not answer. Writes ``var/reports/load/report.html``, Locust's
CSVs (``load_stats.csv``, ``load_stats_history.csv``, ``load_failures.csv``) and ``summary.json``,
then prints requests/s and p50/p99 per endpoint and for all reads and all writes.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from infra.settings import Settings, get_settings

LOCUSTFILE = Path(__file__).with_name("locustfile.py")


def api_url(settings: Settings) -> str:
    return f"http://{settings.api_host}:{settings.api_port}"


def api_is_up(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/v1/health", timeout=3) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def run_locust(
    host: str,
    out_dir: Path,
    *,
    users: int,
    spawn_rate: float,
    run_time_s: int,
    processes: int = 1,
    extra_env: dict[str, str] | None = None,
    locustfile: Path = LOCUSTFILE,
    user_classes: tuple[str, ...] = (),
) -> dict:
    """Run Locust headless; returns ``summary.json`` (reads/writes merged) plus per-endpoint rows."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary_file = out_dir / "summary.json"
    summary_file.unlink(missing_ok=True)
    cmd = [
        sys.executable, "-m", "locust",
        "-f", str(locustfile),
        "--headless",
        "--host", host,
        "--users", str(users),
        "--spawn-rate", str(spawn_rate),
        "--run-time", f"{run_time_s}s",
        "--stop-timeout", "5",
        "--csv", str(out_dir / "load"),
        "--html", str(out_dir / "report.html"),
        "--only-summary",
        "--loglevel", "WARNING",
    ]  # fmt: skip
    if processes > 1:
        cmd += ["--processes", str(processes)]
    cmd += list(user_classes)  # none: every User class in the locustfile
    env = {**os.environ, "LOAD_SUMMARY_JSON": str(summary_file), **(extra_env or {})}
    # hard bound on wall time: run time + spawn + stop, whatever happens
    done = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=run_time_s + users / spawn_rate + 60
    )
    if not summary_file.exists():
        raise RuntimeError(f"locust failed ({done.returncode}): {(done.stderr or done.stdout)[-2000:]}")
    summary = json.loads(summary_file.read_text())
    summary["endpoints"] = endpoint_rows(out_dir / "load_stats.csv")
    # rates as Locust computes them (requests over its own run time); percentiles from the merge
    for label, is_read in (("reads", True), ("writes", False)):
        rows = [r for r in summary["endpoints"] if r["method"] and (r["method"] == "GET") == is_read]
        summary[label]["per_s"] = round(sum(r["per_s"] for r in rows), 1)
    summary["locust_exit_code"] = done.returncode  # 1 when any request failed
    summary_file.write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def endpoint_rows(stats_csv: Path) -> list[dict]:
    rows = []
    with stats_csv.open() as f:
        for r in csv.DictReader(f):
            rows.append(
                {
                    "name": r["Name"] if r["Name"] != "Aggregated" else "all",
                    "method": r["Type"] or None,
                    "requests": int(r["Request Count"]),
                    "failures": int(r["Failure Count"]),
                    "per_s": round(float(r["Requests/s"]), 1),
                    "p50_ms": _num(r["50%"]),
                    "p99_ms": _num(r["99%"]),
                }
            )
    return rows


def _num(raw: str) -> float | None:
    try:
        return float(raw)
    except ValueError:
        return None  # "N/A"


def render(summary: dict) -> str:
    rows = [*summary["endpoints"]]
    rows += [{"name": label, **summary[label]} for label in ("reads", "writes")]
    header = ("endpoint", "requests", "failures", "req/s", "p50 ms", "p99 ms")
    table = [
        (
            r["name"],
            str(r["requests"]),
            str(r["failures"]),
            f"{r['per_s']:.1f}",
            f"{r['p50_ms'] or 0:.0f}",
            f"{r['p99_ms'] or 0:.0f}",
        )
        for r in rows
    ]
    widths = [max(len(x[i]) for x in [header, *table]) for i in range(len(header))]
    lines = [
        "  ".join(
            h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths, strict=True))
        )
    ]
    for x in table:
        lines.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(x, widths, strict=True))
            )
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    settings = get_settings()
    env = os.environ.get
    p = argparse.ArgumentParser(prog="python -m app_sim.load", description=__doc__.splitlines()[0])
    p.add_argument(
        "--host", default=api_url(settings), help="API base URL (default: settings api_host:api_port)"
    )
    p.add_argument("--users", type=int, default=int(env("LOAD_USERS", "50")), help="simulated users (50)")
    p.add_argument(
        "--spawn-rate", type=float, default=float(env("LOAD_SPAWN_RATE", "10")), help="users/s (10)"
    )
    p.add_argument("--run-time", type=int, default=int(env("LOAD_RUN_TIME", "60")), help="seconds (60)")
    p.add_argument("--processes", type=int, default=int(env("LOAD_PROCESSES", "1")), help="Locust processes")
    p.add_argument("--out", type=Path, default=Path(settings.reports_dir) / "load")
    a = p.parse_args(argv)
    if not api_is_up(a.host):
        print(
            f"error: the API does not answer at {a.host}/v1/health; start the stack first: make up",
            file=sys.stderr,
        )
        return 1
    print(f"locust: {a.users} users, {a.run_time} s against {a.host} ...", file=sys.stderr)
    summary = run_locust(
        a.host, a.out, users=a.users, spawn_rate=a.spawn_rate, run_time_s=a.run_time, processes=a.processes
    )
    print(render(summary))
    print(f"-> {a.out / 'report.html'}, {a.out}/load_*.csv, {a.out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
