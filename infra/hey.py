"""``hey`` (github.com/rakyll/hey): an HTTP load generator in Go, beside Locust in ``make bench``.

Locust is Python on the same two cores as the API it measures: its own CPU caps the reads/s it
can drive. ``hey`` costs a fraction of that per request, so the serving section's ``hey_*``
figures are what the API itself sustains. It is built from the Go module proxy on first use, at
the pinned version, into ``.cache/bin`` (``go install``; needs Go, no Docker), and reused after.

:func:`parse_summary` reads hey's default summary (not ``-o csv``, which prints one line per
request): total seconds, the latency percentiles and the status and error counts. hey's own
``Requests/sec`` counts every request, failed ones too; :func:`parse_summary` counts the 2xx.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import time
from pathlib import Path

from infra.settings import REPO_ROOT

HEY_MODULE = "github.com/rakyll/hey"
HEY_VERSION = "v0.1.4"
BIN_DIR = REPO_ROOT / ".cache" / "bin"


class HeyError(RuntimeError):
    """hey could not be built or run (one line saying why)."""


def _built_version(binary: Path, go: str | None) -> str | None:
    """The module version ``binary`` was built from (``go version -m``), None if unknown."""
    if go is None:
        return None
    out = subprocess.run([go, "version", "-m", str(binary)], capture_output=True, text=True, timeout=30)
    found = re.search(rf"^\s*mod\s+{re.escape(HEY_MODULE)}\s+(\S+)", out.stdout, re.MULTILINE)
    return found[1] if found else None


def require_hey(bin_dir: Path = BIN_DIR) -> Path:
    """Path of the pinned ``hey``, built with ``go install`` into ``bin_dir`` if missing or another version."""
    binary = bin_dir / "hey"
    go = shutil.which("go")
    if binary.exists() and (go is None or _built_version(binary, go) == HEY_VERSION):
        return binary
    if go is None:
        raise HeyError(
            f"`go` not found on PATH: install Go >= 1.16 to build {HEY_MODULE}@{HEY_VERSION} "
            "(e.g. `apt-get install -y golang-go`)"
        )
    bin_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GOBIN": str(bin_dir), "GOFLAGS": "-mod=mod"}
    proc = subprocess.run(
        [go, "install", f"{HEY_MODULE}@{HEY_VERSION}"], env=env, capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0 or not binary.exists():
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise HeyError(f"go install {HEY_MODULE}@{HEY_VERSION} failed ({proc.returncode}): {last[0]}")
    return binary


_TOTAL = re.compile(r"^\s*Total:\s+([\d.]+) secs", re.MULTILINE)
_PERCENTILE = re.compile(r"^\s*(\d+)% in ([\d.]+) secs", re.MULTILINE)
_SECTION = re.compile(r"^(Status code distribution|Error distribution):\n((?:[ \t]+\[.*\n?)*)", re.MULTILINE)
_STATUS = re.compile(r"\[(\d{3})\]\s+(\d+) responses")
_ERROR = re.compile(r"\[(\d+)\]\s+(.*)")


def parse_summary(text: str) -> dict:
    """hey's default summary as figures: reads/s (2xx responses over hey's total time), p50/p99 ms.

    hey's percentiles cover every response that came back (any status), not transport errors;
    ``failures`` counts the non-2xx responses and the errors, ``errors`` holds the latter by message.
    """
    total = _TOTAL.search(text)
    if total is None:
        raise HeyError(f"no summary in hey's output: {text.strip()[-300:]!r}")
    seconds = float(total[1])
    percentiles = {int(p): float(s) * 1000 for p, s in _PERCENTILE.findall(text)}
    statuses: dict[int, int] = {}
    errors: dict[str, int] = {}
    for name, body in _SECTION.findall(text):
        if name.startswith("Status"):
            statuses = {int(code): int(n) for code, n in _STATUS.findall(body)}
        else:
            errors = {msg.strip(): int(n) for n, msg in _ERROR.findall(body)}
    ok = sum(n for code, n in statuses.items() if 200 <= code < 300)
    requests = sum(statuses.values()) + sum(errors.values())
    return {
        "seconds": round(seconds, 2),
        "requests": requests,
        "ok": ok,
        "failures": requests - ok,
        "reads_per_s": round(ok / seconds, 1) if seconds else 0.0,
        "p50_ms": round(percentiles[50], 1) if 50 in percentiles else None,
        "p99_ms": round(percentiles[99], 1) if 99 in percentiles else None,
        "status_codes": {str(code): n for code, n in sorted(statuses.items())},
        "errors": errors,
    }


def run_hey(url: str, *, seconds: int, connections: int, headers: dict[str, str] | None = None) -> dict:
    """``hey -z <seconds>s -c <connections>`` GETs of ``url``: :func:`parse_summary`'s figures, plus
    the CPU seconds hey itself spent (it shares the machine with what it measures)."""
    cmd = [str(require_hey()), "-z", f"{seconds}s", "-c", str(connections)]
    for name, value in (headers or {}).items():
        cmd += ["-H", f"{name}: {value}"]
    cmd.append(url)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)  # hey is the only child reaped in between
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    except subprocess.TimeoutExpired:
        raise HeyError(f"hey did not finish {seconds + 60} s after a {seconds} s run") from None
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    out, err = proc.stdout, proc.stderr
    if proc.returncode != 0:
        raise HeyError(f"hey failed ({proc.returncode}): {(err or out).strip()[-300:]}")
    result = parse_summary(out)
    result["connections"] = connections
    result["wall_s"] = round(wall, 1)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    result["hey_cpu_s"] = round(cpu, 1)
    return result
