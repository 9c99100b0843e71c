"""A headless Chromium for the dashboard's browser test: Debian's ``chromium-headless-shell``.

Playwright (a dev dependency from PyPI) drives it through ``executable_path``: Playwright's own
browser download comes from a CDN outside the package registries these machines reach, Debian's
package comes through apt like the stack's Redis. ``ensure_chromium`` takes a Chromium from PATH
(``chromium-headless-shell``, ``chromium``) or installs Debian's headless shell with apt-get (as
root, as ``make setup`` installs redis-server); ``make test`` runs it before its tiers
(``social ensure-chromium``).
"""

from __future__ import annotations

import os
import shutil
import subprocess

from infra.processes import StackError

PACKAGE = "chromium-headless-shell"  # Debian's (bookworm-security: 156); no X server, no GTK
NAMES = ("chromium-headless-shell", "chromium", "chromium-browser")


def binary() -> str | None:
    """The first Chromium on PATH, else None."""
    return next((found for name in NAMES if (found := shutil.which(name))), None)


def ensure_chromium() -> str:
    """Path of a headless Chromium, installing Debian's ``chromium-headless-shell`` if none is on PATH."""
    found = binary()
    if found:
        return found
    if not shutil.which("apt-get"):
        raise StackError(f"no Chromium on PATH and no apt-get here: install {PACKAGE} (or chromium)")
    if os.geteuid() != 0:
        raise StackError(f"no Chromium on PATH: run `sudo apt-get install -y {PACKAGE}` (needs root)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", PACKAGE],
    ):
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            last = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["(no output)"]
            raise StackError(f"`{' '.join(cmd)}` failed: {last[0]}")
    found = binary()
    if not found:
        raise StackError(f"apt-get installed {PACKAGE} but no Chromium is on PATH")
    return found
