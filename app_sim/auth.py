"""Bearer tokens of the app API: the user id, signed with a server secret (HMAC-SHA256).

Registration (``POST /v1/users``) returns ``token = issue(user_id)``; every other authenticated
request sends ``Authorization: Bearer <token>`` and the API learns the caller's id from
``verify(token)``: a token is valid iff its signature matches and it is spelled exactly as
``issue`` spells it (no alternate base64 spelling, no leading zeros), and its user is not revoked.
Tokens do not expire; rotating the secret invalidates all. Erasing a user (``DELETE
/v1/users/me``, ``social-erase``) revokes its tokens: the user id goes into the Redis set
``api:revoked`` (:func:`revoke`) right after the ``user_erased`` event is in the log, and the API
also refuses a user in the served namespace's ``erased`` set (:func:`revoked`), so a crash between
the append and the revocation is covered as soon as the speed layer applies the erasure.

The secret is ``SOCIAL_API_SECRET``, or, when that is empty, 32 random bytes generated once under
``<var_dir>/api/secret`` (created exclusively, mode 0600) and reused by every API process and
restart, so tokens survive ``make down && make up``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from pathlib import Path

from itsdangerous import BadSignature, Signer

from infra.settings import Settings

SALT = "social-api-token-v1"  # a token of this API is useless as a signature anywhere else
VERIFIED_CACHE = 100_000  # verified tokens remembered per process (~20 MB at most)
REVOKED_KEY = "api:revoked"  # user ids whose tokens no longer work (erased users), kept forever


class InvalidToken(ValueError):
    """Missing, malformed or forged token."""


def secret_file(settings: Settings) -> Path:
    return Path(settings.var_dir) / "api" / "secret"


def load_secret(settings: Settings) -> bytes:
    """The configured secret, else the one under var/ (generated on first use, race-free)."""
    if settings.api_secret:
        return settings.api_secret.encode()
    path = secret_file(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        # O_EXCL: when several API workers start at once, exactly one creates it, the rest read it
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        for _ in range(50):  # the creator may not have written it yet
            value = path.read_bytes().strip()
            if value:
                return value
            time.sleep(0.02)
        raise RuntimeError(f"{path} exists but is empty; delete it to generate a new secret") from None
    value = secrets.token_hex(32).encode()
    with os.fdopen(fd, "wb") as f:
        f.write(value + b"\n")
    return value


class TokenSigner:
    """``issue(user_id) -> token`` and ``verify(token) -> user_id``."""

    def __init__(self, secret: bytes):
        self._signer = Signer(secret, salt=SALT, digest_method=hashlib.sha256)
        # token -> user id of the tokens that verified: a token's verdict depends on the secret
        # alone, so the two HMACs of verify() are paid once per token, not on every request
        # (revocation is not cached: revoked() asks Redis every time)
        self._verified: dict[str, int] = {}

    def issue(self, user_id: int) -> str:
        return self._signer.sign(str(user_id)).decode("ascii")

    def verify(self, token: str) -> int:
        user_id = self._verified.get(token)
        if user_id is not None:
            return user_id
        user_id = self._verify(token)
        if len(self._verified) >= VERIFIED_CACHE:  # one entry per user seen; bounded all the same
            self._verified.clear()
        self._verified[token] = user_id
        return user_id

    def _verify(self, token: str) -> int:
        try:
            raw = self._signer.unsign(token.encode("ascii"))
        except (BadSignature, UnicodeEncodeError):
            raise InvalidToken("token signature does not match") from None
        if not raw.isdigit():  # signed by us, so this only happens with a leaked secret
            raise InvalidToken("token does not name a user")
        user_id = int(raw)
        if user_id < 1:
            raise InvalidToken("token does not name a user")
        # One spelling per user: base64 has alternate spellings of the same bytes (the unused low
        # bits of the last character, padding), and "007" names user 7. Only issue()'s form passes.
        if not hmac.compare_digest(self.issue(user_id), token):
            raise InvalidToken("token is not in canonical form")
        return user_id


def revoke_commands(user_id: int) -> list[tuple]:
    """Redis commands that revoke a user's tokens and drop the API's hint that the user exists."""
    return [("sadd", REVOKED_KEY, user_id), ("delete", f"api:recent:user:{user_id}")]


async def revoke(client, user_id: int) -> None:
    """Revoke every token of ``user_id`` (asyncio Redis client)."""
    pipe = client.pipeline(transaction=False)
    for name, *args in revoke_commands(user_id):
        getattr(pipe, name)(*args)
    await pipe.execute()


def revoked_commands(user_id: int, store) -> list[tuple]:
    """Redis commands whose replies say whether ``user_id``'s tokens are revoked: any true one
    (``store``: the read model, :func:`contract.serving.reader`, which knows where the user's
    erasure is kept)."""
    return [("sismember", REVOKED_KEY, user_id), ("sismember", store.key_for(user_id, "erased"), user_id)]


async def revoked(client, user_id: int, store) -> bool:
    """True if the user's tokens are revoked, or the served views hold the user as erased."""
    pipe = client.pipeline(transaction=False)
    for name, *args in revoked_commands(user_id, store):
        getattr(pipe, name)(*args)
    return any(await pipe.execute())
