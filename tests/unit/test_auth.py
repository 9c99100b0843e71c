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
