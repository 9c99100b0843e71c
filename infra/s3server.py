"""A real S3-compatible server for the tests of the S3 lake: Versity's S3 gateway (versitygw).

versitygw serves the S3 API over a local folder (its ``posix`` backend: a bucket is a folder, an
object a file, metadata in extended attributes) and honours conditional PUTs (``If-None-Match: *``,
what the lake's LogStore relies on). It is Apache-2.0, a Go module on the module proxy, built by
``make setup`` (``social ensure-s3server``) with ``go install`` at the pinned version into
``.tools/bin``, with its module and build caches under ``.tools/go`` (a rebuild after ``make clean``
takes seconds). MinIO, the usual choice, is AGPL-3.0: not used here.

Nothing in the stack starts it: the lake on an object store is always "your own" (docs/running.md,
"Your own object store"); the tests start one per test on a free port (:func:`start`).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from infra.cli import command_name, run_main
from infra.settings import REPO_ROOT, get_settings

MODULE = "github.com/versity/versitygw"
VERSION = "v1.8.0"
PACKAGE = f"{MODULE}/cmd/versitygw"
BIN_DIR = REPO_ROOT / ".tools" / "bin"
GO_CACHE = REPO_ROOT / ".tools" / "go"


class S3ServerError(RuntimeError):
    """versitygw could not be built or started (one line saying why)."""


def binary_path(bin_dir: Path = BIN_DIR) -> Path:
    return bin_dir / "versitygw"


def _go_env(bin_dir: Path) -> dict[str, str]:
    return {
        **os.environ,
        "GOBIN": str(bin_dir),
        "GOMODCACHE": str(GO_CACHE / "mod"),
        "GOCACHE": str(GO_CACHE / "cache"),
        "GOFLAGS": "-modcacherw",  # a module cache `rm -rf` can remove
        "GOTOOLCHAIN": "local",
        "GOWORK": "off",
    }


def built_version(binary: Path) -> str | None:
    """The module version ``binary`` was built from (``go version -m``), None if unknown."""
    go = shutil.which("go")
    if go is None or not binary.exists():
        return None
    out = subprocess.run([go, "version", "-m", str(binary)], capture_output=True, text=True, timeout=30)
    found = re.search(rf"^\s*mod\s+{re.escape(MODULE)}\s+(\S+)", out.stdout, re.MULTILINE)
    return found[1] if found else None


def ensure(bin_dir: Path = BIN_DIR) -> tuple[Path, float | None]:
    """The pinned versitygw, built with ``go install`` when missing or another version; returns
    (its path, the seconds the build took, None when it was there)."""
    binary = binary_path(bin_dir)
    go = shutil.which("go")
    if binary.exists() and (go is None or built_version(binary) == VERSION):
        return binary, None
    if go is None:
        raise S3ServerError(
            f"`go` not found on PATH: install Go >= 1.25 to build {PACKAGE}@{VERSION} "
            "(the S3-compatible server of the S3 lake's tests)"
        )
    bin_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    done = subprocess.run(
        [go, "install", "-trimpath", f"{PACKAGE}@{VERSION}"],
        env=_go_env(bin_dir),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if done.returncode != 0 or not binary.exists():
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise S3ServerError(f"go install {PACKAGE}@{VERSION} failed ({done.returncode}): {last[0]}")
    return binary, time.monotonic() - started


@dataclass
class S3Server:
    """A running versitygw: its endpoint, credentials and process."""

    endpoint: str
    access_key: str
    secret_key: str
    root: Path
    process: subprocess.Popen

    def bucket(self, name: str) -> None:
        """Create a bucket (a folder under the root, which is what the posix backend serves)."""
        (self.root / name).mkdir(parents=True, exist_ok=True)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start(
    root: Path, port: int, access_key: str, secret_key: str, log: Path, timeout_s: float = 20
) -> S3Server:
    """Start versitygw serving ``root`` on 127.0.0.1:``port``; returns once it answers."""
    binary = binary_path()
    if not binary.exists():
        raise S3ServerError(f"{binary} is missing: run `make setup` (social ensure-s3server)")
    root.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "ROOT_ACCESS_KEY": access_key, "ROOT_SECRET_KEY": secret_key}
    with log.open("ab") as out:
        process = subprocess.Popen(
            [str(binary), "--port", f"127.0.0.1:{port}", "--quiet", "posix", str(root)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise S3ServerError(f"versitygw exited with {process.returncode} at start (log: {log})")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return S3Server(f"http://127.0.0.1:{port}", access_key, secret_key, root, process)
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise S3ServerError(f"versitygw did not listen on 127.0.0.1:{port} within {timeout_s:.0f} s (log: {log})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=command_name("infra.s3server"), description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    get_settings()  # a bad setting in the environment is one line here too, as in every command
    if shutil.which("go") is None and not binary_path().exists():
        # Go is needed by `make test` only (README): `make setup` goes on without the server
        print(
            f"s3 server: skipped (no `go` on PATH to build {PACKAGE}@{VERSION}; the S3 lake's tests need it)"
        )
        return 0
    try:
        binary, seconds = ensure()
    except S3ServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    how = f"built in {seconds:.0f} s" if seconds is not None else "already built"
    print(f"s3 server: {binary} ({PACKAGE}@{VERSION}, {how})")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "infra.s3server"))
