"""``make load``: a bounded, headless Locust run of ``app_sim/locustfile.py`` against the running API.

Locust is configured as Locust is: ``locust.conf`` (users, spawn rate, run time, the serving
target ``max-read-p99-ms`` / ``max-fail-ratio``), ``LOCUST_*`` environment variables, or Locust
options after ``--`` (``python -m app_sim.load -- --users 200``). This wrapper only adds what
comes from the project's settings (the API's URL, the report folder), checks the API answers
first (``make up``), prints a table, and exits with Locust's own exit status: 1 when the serving
target was missed or Locust failed.

``--steps`` (``make load-steps``) runs ``app_sim/locustfile_steps.py``, a step-load shape, and
plots requests/s and p99 per step: ``steps.png`` / ``steps.html``, and in ``summary.json``
the most users for which the reads' p99 stayed within the target.

Writes ``var/reports/load/report.html``, Locust's CSVs (``load_stats.csv``,
``load_stats_history.csv``, ``load_failures.csv``) and ``summary.json``.
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

from infra.cli import Unreachable, command_name, run_main
from infra.html import render as render_page
from infra.settings import REPO_ROOT, Settings, get_settings

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
STEPS_LOCUSTFILE = Path(__file__).with_name("locustfile_steps.py")


def target_misses(summary: dict, max_read_p99_ms: float, max_fail_ratio: float) -> list[str]:
    """Why a run missed the serving target (empty: it met it)."""
    misses = []
    p99 = summary["reads"]["p99_ms"]
    if max_read_p99_ms and summary["reads"]["requests"] and p99 > max_read_p99_ms:
        misses.append(f"reads p99 {p99:.0f} ms > {max_read_p99_ms:g} ms")
    ratio = summary["failures"] / summary["requests"] if summary["requests"] else 0.0
    if ratio > max_fail_ratio:
        misses.append(f"failure ratio {ratio:.4f} > {max_fail_ratio:g}")
    return misses


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


def run_configured(host: str, out_dir: Path, locustfile: Path, extra: list[str]) -> tuple[int, dict | None]:
    """Locust with locust.conf (from the repository), the host and report paths; (exit status, summary)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary_file = out_dir / "summary.json"
    summary_file.unlink(missing_ok=True)
    cmd = [
        sys.executable, "-m", "locust",
        "-f", str(locustfile),
        "--host", host,
        "--csv", str(out_dir / "load"),
        "--csv-full-history",
        "--html", str(out_dir / "report.html"),
        *extra,
    ]  # fmt: skip
    env = {**os.environ, "LOAD_SUMMARY_JSON": str(summary_file)}
    code = subprocess.run(cmd, env=env, cwd=REPO_ROOT).returncode  # cwd: Locust reads ./locust.conf
    if not summary_file.exists():
        return code, None
    summary = json.loads(summary_file.read_text())
    summary["endpoints"] = endpoint_rows(out_dir / "load_stats.csv")
    summary["locust_exit_code"] = code  # 1 when the serving target (locust.conf) is missed
    summary_file.write_text(json.dumps(summary, indent=2) + "\n")
    return code, summary


def step_table(history_csv: Path, step_seconds: int, max_read_p99_ms: float) -> list[dict]:
    """Per step of a step-load run: users, requests/s, p99 (all requests), from Locust's history CSV.

    Each row of the history is Locust's state at one second: its p99 is over a sliding window of
    recent requests, so the step's value is the median of its seconds, after its first quarter
    (the spawn).
    """
    import statistics

    rows = []
    with history_csv.open() as f:
        for r in csv.DictReader(f):
            if r["Name"] == "Aggregated" and r["User Count"] and _num(r["99%"]) is not None:
                rows.append(
                    (int(r["Timestamp"]), int(r["User Count"]), float(r["Requests/s"]), _num(r["99%"]))
                )
    if not rows:
        return []
    t0 = rows[0][0]
    steps: dict[int, list] = {}
    for t, users, rps, p99 in rows:
        steps.setdefault(int((t - t0) // step_seconds), []).append((t - t0, users, rps, p99))
    out = []
    for k, pts in sorted(steps.items()):
        settled = [p for p in pts if p[0] >= k * step_seconds + step_seconds / 4] or pts
        p99 = statistics.median(p[3] for p in settled)
        out.append(
            {
                "step": k + 1,
                "users": max(p[1] for p in pts),
                "per_s": round(statistics.median(p[2] for p in settled), 1),
                "p99_ms": p99,
                "within_target": not max_read_p99_ms or p99 <= max_read_p99_ms,
            }
        )
    return out


def plot_steps(table: list[dict], max_read_p99_ms: float, out_dir: Path) -> Path:
    """steps.png and steps.html: requests/s and p99 per step, the target as a line."""
    import base64

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5), dpi=100)
    users = [r["users"] for r in table]
    ax.plot(users, [r["p99_ms"] for r in table], marker="o", color="#e45756", label="p99 (ms)")
    if max_read_p99_ms:
        ax.axhline(max_read_p99_ms, color="#333", linestyle=":", label=f"target p99 {max_read_p99_ms:g} ms")
    ax.set_xlabel("users")
    ax.set_ylabel("p99 (ms)")
    ax2 = ax.twinx()
    ax2.plot(users, [r["per_s"] for r in table], marker="s", color="#4c78a8", label="requests/s")
    ax2.set_ylabel("requests/s")
    fig.legend(loc="upper left")
    ax.set_title("step load: where the read target stops holding")
    fig.tight_layout()
    png = out_dir / "steps.png"
    fig.savefig(png)
    plt.close(fig)
    (out_dir / "steps.html").write_text(
        render_page("load_steps.html.j2", png=base64.b64encode(png.read_bytes()).decode(), table=table)
    )
    return png


def main(argv: list[str] | None = None) -> int:
    settings = get_settings()
    p = argparse.ArgumentParser(prog=command_name("app_sim.load"), description=__doc__.splitlines()[0])
    p.add_argument(
        "--host", default=api_url(settings), help="API base URL (default: settings api_host:api_port)"
    )
    p.add_argument("--out", type=Path, default=Path(settings.reports_dir) / "load")
    p.add_argument("--steps", action="store_true", help="a step load (app_sim/locustfile_steps.py), plotted")
    p.add_argument("locust_args", nargs="*", help="Locust options, after --")
    a = p.parse_args(argv)
    if not api_is_up(a.host):
        raise Unreachable("the API", f"{a.host}/v1/health; start the stack first: make up")
    locustfile = STEPS_LOCUSTFILE if a.steps else LOCUSTFILE
    print(f"locust ({locustfile.name}, locust.conf) against {a.host} ...", file=sys.stderr)
    code, summary = run_configured(a.host, a.out, locustfile, a.locust_args)
    if summary is None:
        print(f"error: locust exited {code} without a summary", file=sys.stderr)
        return code or 1
    if a.steps:
        target = summary["target"]["max_read_p99_ms"]
        step_seconds = int(os.environ.get("LOCUST_STEP_SECONDS", "20"))
        if "--step-seconds" in a.locust_args:
            step_seconds = int(a.locust_args[a.locust_args.index("--step-seconds") + 1])
        table = step_table(a.out / "load_stats_history.csv", step_seconds, target)
        holding = [r["users"] for r in table if r["within_target"]]
        summary["steps"] = table
        summary["target_holds_up_to_users"] = max(holding) if holding else 0
        (a.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        if table:
            print(f"-> {plot_steps(table, target, a.out)}, {a.out / 'steps.html'}")
        print(f"the reads' p99 target holds up to {summary['target_holds_up_to_users']} users")
    print(render(summary))
    verdict = summary["target"]
    print("serving target " + ("met" if verdict["met"] else "MISSED: " + "; ".join(verdict["misses"])))
    print(f"-> {a.out / 'report.html'}, {a.out}/load_*.csv, {a.out / 'summary.json'}")
    from infra.reports import write_index

    print(f"-> {write_index(settings)}")
    return code


if __name__ == "__main__":
    sys.exit(run_main(main, "app_sim.load"))
