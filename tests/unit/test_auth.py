"""Bearer tokens: round trip, forgery and tampering refused, the secret generated once and reused."""

from __future__ import annotations

import dataclasses

import pytest

from app_sim.auth import InvalidToken, TokenSigner, load_secret, secret_file
from infra.settings import Settings


def test_a_token_names_its_user():
    signer = TokenSigner(b"s3cret")
    assert signer.verify(signer.issue(382421824798990336)) == 382421824798990336


@pytest.mark.parametrize("token", ["", "123", "abc.def", "1.", ".sig", "ünïcode.x"])
def test_malformed_tokens_are_refused(token):
    with pytest.raises(InvalidToken):
        TokenSigner(b"s3cret").verify(token)


def test_a_token_signed_with_another_secret_is_refused():
    with pytest.raises(InvalidToken):
        TokenSigner(b"s3cret").verify(TokenSigner(b"other").issue(1))


def test_another_users_id_under_a_valid_signature_is_refused():
    signer = TokenSigner(b"s3cret")
    _user, _, sig = signer.issue(1).partition(".")
    with pytest.raises(InvalidToken):
        signer.verify(f"2.{sig}")


def test_the_configured_secret_wins(tmp_path):
    settings = Settings(var_dir=tmp_path, api_secret="configured")
    assert load_secret(settings) == b"configured"
    assert not secret_file(settings).exists()


def test_the_secret_is_generated_once_private_and_reused(tmp_path):
    settings = dataclasses.replace(Settings(), var_dir=tmp_path, api_secret="")
    first = load_secret(settings)
    assert len(first) == 64
    assert secret_file(settings).stat().st_mode & 0o777 == 0o600
    assert load_secret(settings) == first  # a restart (or another worker) signs the same tokens


def _alternate_spellings(token: str) -> list[str]:
    """Other base64url spellings of the same signature bytes (the last character's unused bits)."""
    import base64

    user, _, sig = token.partition(".")
    raw = base64.urlsafe_b64decode(sig + "=" * (-len(sig) % 4))
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    out = []
    for c in alphabet:
        other = sig[:-1] + c
        if other != sig and base64.urlsafe_b64decode(other + "=" * (-len(other) % 4)) == raw:
            out.append(f"{user}.{other}")
    return out


def test_only_the_canonical_spelling_of_a_token_is_accepted():
    """Issue 17: base64 spellings that decode to the same signature bytes are refused, and so is a
    user id with leading zeros; the token issue() spells is the only one that passes."""
    signer = TokenSigner(b"s3cret")
    token = signer.issue(7)
    alternates = _alternate_spellings(token)
    assert len(alternates) == 3  # 32 signature bytes = 43 characters, 2 unused bits: 4 spellings
    for other in alternates + [f"{token}=", "0" + token]:
        with pytest.raises(InvalidToken):
            signer.verify(other)
    assert signer.verify(token) == 7


def test_a_verified_token_is_remembered_and_a_refused_one_is_not():
    signer = TokenSigner(b"s3cret")
    token = signer.issue(7)
    assert signer.verify(token) == signer.verify(token) == 7
    assert signer._verified == {token: 7}
    for _ in range(2):
        with pytest.raises(InvalidToken):
            signer.verify(token + "x")
    assert signer._verified == {token: 7}
