"""Which version of the views is live (blue/green): one pointer, switched atomically.

The pointer lives in ``<lake_dir>/ACTIVE`` (for jobs) and in Redis key ``active_namespace``
(for the API, which must switch without a restart). ``SOCIAL_VIEWS_NAMESPACE`` overrides both.
"""

from __future__ import annotations

from pathlib import Path

from infra.lake_store import ObjectPath, write_atomically
from infra.settings import Settings

DEFAULT = "v1"
REDIS_KEY = "active_namespace"


def _pointer(settings: Settings) -> Path | ObjectPath:
    return settings.lake_dir / "ACTIVE"


def active(settings: Settings) -> str:
    if settings.views_namespace:
        return settings.views_namespace
    p = _pointer(settings)
    return p.read_text().strip() if p.exists() else DEFAULT


def switch(settings: Settings, namespace: str, redis_client=None) -> str | None:
    """Make ``namespace`` the live one; returns the previous one."""
    previous = active(settings)
    write_atomically(_pointer(settings), namespace + "\n")  # a rename on a disk, one PUT on a store
    if redis_client is not None:
        redis_client.set(REDIS_KEY, namespace)
    return previous
