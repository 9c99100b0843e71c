"""Crypto-shredding: per-user data keys, and personal fields sealed with them (docs/erasure.md).

The log is immutable and kept whole, so a user's personal data cannot be deleted from it. It is
therefore never written there in plaintext by our producers: the API and the generator seal every
personal field of an event (``contract.personal_fields``: handle, display name, post, status and
message texts) with the data key of the event's user, and erasing the user deletes that key. Every
copy of every value sealed with it (Kafka segments, the bronze archive and its old Delta versions,
the quarantine, views, Redis, checkpoints, reports) becomes unreadable at that moment, without
rewriting any of them.

- A sealed value (``contract.SEALED_PREFIX``): ``sealed:v1:<user id>:<base64url(nonce | AES-256-GCM
  ciphertext | tag)>``, the field's name as associated data (a sealed handle cannot be passed off
  as a post text). Nonces never repeat within a process and almost surely not across (``_nonces``).
- :class:`KeyStore`: one SQLite file per event topic under ``var/keys/`` (a world of user ids per
  topic), ``secure_delete`` on, rollback journal (no WAL), so a deleted key's bytes are overwritten
  in the file at the commit. An erased user keeps a tombstone row (``erased``): no new key is ever
  made for them, so nothing written after the erasure can be read either.
- :class:`Sealer`: seals an event's personal fields (only values that meet the field's plaintext
  rule: a producer checks before it seals, the log checks only the seal's form) and opens them on
  read (``None`` when the key is gone).

Backups of the key store must honour erasures: a restored copy is older than some erasures, so
``python -m contract.keys honour-erasures`` (run after any restore) deletes the keys of every user
the served views list as erased.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import itertools
import json
import os
import re
import sqlite3
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

import contract
from infra.cli import command_name, run_main
from infra.settings import Settings, get_settings

PREFIX = contract.SEALED_PREFIX
KEY_BYTES = 32  # AES-256
NONCE_BYTES = 12


class Erased(LookupError):
    """The user is erased: their key is gone for good and no new one is made."""


def store_path(settings: Settings) -> Path:
    """The key store of the settings' event topic."""
    return Path(settings.keys_dir) / f"{settings.events_topic}.sqlite3"


class KeyStore:
    """Data keys by user id in one SQLite file; safe to share between processes."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA secure_delete = ON")  # freed cells (deleted keys) are zeroed
        self._db.execute("PRAGMA journal_mode = DELETE")  # no WAL copy of a page outlives a commit
        self._db.execute("PRAGMA synchronous = FULL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS keys (user_id INTEGER PRIMARY KEY, key BLOB NOT NULL, created_ms INTEGER)"
        )
        self._db.execute("CREATE TABLE IF NOT EXISTS erased (user_id INTEGER PRIMARY KEY, erased_ms INTEGER)")
        os.chmod(self.path, 0o600)

    @classmethod
    def for_settings(cls, settings: Settings) -> KeyStore:
        return cls(store_path(settings))

    def close(self) -> None:
        self._db.close()

    def get(self, user_id: int) -> bytes | None:
        row = self._db.execute("SELECT key FROM keys WHERE user_id = ?", (user_id,)).fetchone()
        return row[0] if row else None

    def get_many(self, user_ids: Iterable[int]) -> dict[int, bytes]:
        ids = sorted(set(user_ids))
        out: dict[int, bytes] = {}
        for i in range(0, len(ids), 500):  # SQLite's bound-variable limit
            part = ids[i : i + 500]
            q = f"SELECT user_id, key FROM keys WHERE user_id IN ({','.join('?' * len(part))})"
            out.update(self._db.execute(q, part).fetchall())
        return out

    def erased(self) -> set[int]:
        return {u for (u,) in self._db.execute("SELECT user_id FROM erased")}

    def ensure(self, user_ids: Iterable[int]) -> dict[int, bytes]:
        """The keys of ``user_ids``, making the missing ones (one transaction); :class:`Erased`
        when one of them is erased."""
        ids = sorted(set(user_ids))
        now = int(time.time() * 1000)
        self._db.execute("BEGIN IMMEDIATE")
        try:
            gone = self.erased().intersection(ids)
            if gone:
                raise Erased(f"user {min(gone)} is erased: no data key is made for them again")
            self._db.executemany(
                "INSERT OR IGNORE INTO keys (user_id, key, created_ms) VALUES (?, ?, ?)",
                ((u, os.urandom(KEY_BYTES), now) for u in ids),
            )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return self.get_many(ids)

    def erase(self, user_id: int) -> bool:
        """Delete the user's key and keep a tombstone; True when a key was deleted."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            deleted = self._db.execute("DELETE FROM keys WHERE user_id = ?", (user_id,)).rowcount
            self._db.execute(
                "INSERT OR IGNORE INTO erased (user_id, erased_ms) VALUES (?, ?)",
                (user_id, int(time.time() * 1000)),
            )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return bool(deleted)

    def counts(self) -> dict[str, int]:
        (keys,) = self._db.execute("SELECT count(*) FROM keys").fetchone()
        (erased,) = self._db.execute("SELECT count(*) FROM erased").fetchone()
        return {"keys": keys, "erased": erased}


_URLSAFE = bytes.maketrans(b"+/", b"-_")


def _b64(raw: bytes) -> str:
    # one pass: the URL-safe alphabet, the padding deleted (the fastest spelling in CPython)
    return binascii.b2a_base64(raw, newline=False).translate(_URLSAFE, b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _nonces() -> Callable[[], bytes]:
    """Unique 96-bit nonces: a random start per process, then a counter (NIST SP 800-38D's
    deterministic construction in spirit; two processes collide only if their random starts
    fall within one run's length of each other, about 2**-60 for a billion values each). The
    start leaves 2**64 values before the counter could pass 2**96."""
    counter = itertools.count(int.from_bytes(os.urandom(NONCE_BYTES), "big") % ((1 << 96) - (1 << 64)))
    return lambda: next(counter).to_bytes(NONCE_BYTES, "big")


_nonce = _nonces()


def key_id(value: str) -> int | None:
    """The user id whose key sealed ``value`` (None for a plaintext value)."""
    if not contract.is_sealed(value):
        return None
    return int(value[len(PREFIX) :].partition(":")[0])


def open_value(key: bytes | None, field: str, value: str) -> str | None:
    """The plaintext of a sealed ``value`` (None when the key is gone or does not open it)."""
    if key is None:
        return None
    try:  # a value cut short (a truncated statistic, a log line) is not base64 any more: no plaintext
        blob = _unb64(value[len(PREFIX) :].partition(":")[2])
        return (
            AESGCM(key).decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], field.encode("ascii")).decode("utf-8")
        )
    except (InvalidTag, ValueError, binascii.Error):
        return None


_PERSONAL: dict[str, tuple[contract.FieldSpec, ...]] = {
    t: tuple(contract.field_spec(t, f) for f in contract.personal_fields(t)) for t in contract.EVENT_TYPES
}
_PATTERNS = {
    s.pattern: re.compile(s.pattern).search for specs in _PERSONAL.values() for s in specs if s.pattern
}
# what the seal checks per field before it seals: (name, associated data, max len, min len, pattern)
_PLANS: dict[str, tuple[tuple, ...]] = {
    t: tuple(
        (
            s.name,
            s.name.encode("ascii"),
            s.max_length,
            s.min_length,
            _PATTERNS[s.pattern] if s.pattern else None,
        )
        for s in specs
    )
    for t, specs in _PERSONAL.items()
    if specs
}


class Sealer:
    """Seals events' personal fields with their users' keys (keys cached per process).

    With ``cache`` (the generator, the only writer for its users) keys stay in memory and
    :meth:`erase` drops one; without (the API, whose users another process may erase) every
    event reads its key from the store. Readers use :func:`open_fields`, which asks the store
    every time, so an erasure is seen by every reader at once.
    """

    def __init__(self, store: KeyStore, *, cache: bool = True, shred_erased: bool = False):
        self.store = store
        self.cache = cache  # False: read the key from the store for every event (the API)
        # an erased user's event: Erased (the API refuses it), or sealed with a throwaway key
        # that no one keeps (the generator, whose simulated users keep turning up after erasure)
        self.shred_erased = shred_erased
        # user id -> (the user's AEAD, the sealed prefix "<PREFIX><user id>:"), made once per user
        self._sealing: dict[int, tuple[AESGCM, str]] = {}

    def prepare(self, user_ids: Iterable[int]) -> None:
        """Make (or load) the keys of ``user_ids`` in one transaction."""
        missing = [u for u in user_ids if u not in self._sealing]
        if missing and self.shred_erased:
            gone = self.store.erased()
            missing = [u for u in missing if u not in gone]
        if missing:
            for u, key in self.store.ensure(missing).items():
                self._sealing[u] = (AESGCM(key), f"{PREFIX}{u}:")

    def erase(self, user_id: int) -> None:
        """Delete the user's key in the store and in this process."""
        self.store.erase(user_id)
        self._sealing.pop(user_id, None)

    def seal(self, event: dict) -> dict:
        """Seal ``event``'s personal fields in place (a dict that is not a valid event is left as is
        where its fields break their plaintext rule); returns it."""
        etype = event.get("type")
        plans = _PLANS.get(etype) if type(etype) is str else None
        if not plans:
            return event
        user_id = event.get("user_id")
        if type(user_id) is not int or user_id < 1:
            return event
        sealing = self._sealing.get(user_id)
        for name, aad, max_len, min_len, rx in plans:
            value = event.get(name)
            if (
                type(value) is not str
                or (max_len is not None and len(value) > max_len)
                or (min_len is not None and len(value) < min_len)
                or (rx is not None and rx(value) is None)
                or (value.startswith(PREFIX) and contract.is_sealed(value))
            ):
                continue  # not a plaintext this field allows: left for the log to reject
            if sealing is None:
                sealing = self._load(user_id)
            nonce = _nonce()
            event[name] = sealing[1] + _b64(nonce + sealing[0].encrypt(nonce, value.encode("utf-8"), aad))
        return event

    def _load(self, user_id: int) -> tuple[AESGCM, str]:
        key = None if self.cache else self.store.get(user_id)  # a read: no write lock when it exists
        if key is None:
            try:
                key = self.store.ensure([user_id])[user_id]
            except Erased:
                if not self.shred_erased:
                    raise
                key = AESGCM.generate_key(bit_length=256)
        sealing = (AESGCM(key), f"{PREFIX}{user_id}:")
        if self.cache:
            self._sealing[user_id] = sealing
        return sealing


PERSONAL_FIELDS: tuple[str, ...] = tuple(
    sorted({f for t in contract.EVENT_TYPES for f in contract.personal_fields(t)})
)


def still_opens(store: KeyStore, value: str) -> bool:
    """Whether a sealed ``value`` of any personal field still opens with the store's keys."""
    uid = key_id(value)
    if uid is None:  # plaintext: no key opens it
        return False
    key = store.get(uid)
    return any(open_value(key, f, value) is not None for f in PERSONAL_FIELDS)


def open_fields(store: KeyStore, items: list[dict], field: str) -> list[dict]:
    """``items`` with ``item[field]`` opened where sealed (None where its key is gone); one store
    read for all their keys."""
    values = [it.get(field) for it in items]
    owners = {uid for v in values if type(v) is str and (uid := key_id(v)) is not None}
    keys = store.get_many(owners) if owners else {}
    for it in items:
        value = it.get(field)
        if type(value) is str and (uid := key_id(value)) is not None:
            it[field] = open_value(keys.get(uid), field, value)
    return items


# --- the CLI ------------------------------------------------------------------------------------


def honour_erasures(settings: Settings) -> dict:
    """Delete the key of every user the served views list as erased (run after a restore)."""
    from contract import namespaces
    from infra import clients

    client = clients.redis_client(settings.redis_url, decode_responses=True)
    ns = settings.views_namespace or client.get(namespaces.REDIS_KEY) or namespaces.active(settings)
    erased = [int(u) for u in client.smembers(f"{ns}:erased")]
    store = KeyStore.for_settings(settings)
    deleted = sum(store.erase(u) for u in erased)
    return {"namespace": ns, "erased_users": len(erased), "keys_deleted": deleted, **store.counts()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog=command_name("contract.keys"),
        description="The data-key store of crypto-shredding (docs/erasure.md).",
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("stats", help="keys and erased users in the store of SOCIAL_EVENTS_TOPIC")
    sub.add_parser("honour-erasures", help="after restoring a key store backup: delete erased users' keys")
    args = p.parse_args(argv)
    settings = get_settings()
    if args.cmd == "stats":
        out = {"store": str(store_path(settings)), **KeyStore.for_settings(settings).counts()}
    else:
        out = honour_erasures(settings)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "contract.keys"))
