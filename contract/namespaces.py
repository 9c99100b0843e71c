"""Which version of the views is live (blue/green): one pointer, switched atomically.

The pointer lives in ``<lake_dir>/ACTIVE`` (for jobs) and in Redis key ``active_namespace``
(for the API, which must switch without a restart). ``SOCIAL_VIEWS_NAMESPACE`` overrides both.
"""

from __future__ import annotations

import os
from pathlib import Path

from infra.settings import Settings

DEFAULT = "v1"
REDIS_KEY = "active_namespace"


def _pointer(settings: Settings) -> Path:
    return Path(settings.lake_dir) / "ACTIVE"


def active(settings: Settings) -> str:
    if settings.views_namespace:
        return settings.views_namespace
    p = _pointer(settings)
    return p.read_text().strip() if p.exists() else DEFAULT


def switch(settings: Settings, namespace: str, redis_client=None) -> str | None:
    """Make ``namespace`` the live one; returns the previous one."""
    previous = active(settings)
    p = _pointer(settings)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(namespace + "\n")
    os.replace(tmp, p)  # atomic on POSIX
    if redis_client is not None:
        redis_client.set(REDIS_KEY, namespace)
    return previous
