"""The ID-token credential (Workload Identity): fetched for the audience, refreshed before it
expires, sent as the bearer token (no gateway: a fake fetcher and clock)."""

from __future__ import annotations

import base64
import json

import pytest

from filament_bigquery import Client, IdTokenCredential


def jwt(exp: float) -> str:
    def part(value: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'RS256', 'kid': 'k'})}.{part({'exp': exp, 'aud': 'a'})}.signature"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_token_is_fetched_for_the_audience_and_reused_until_near_expiry() -> None:
    clock, fetched = Clock(), []

    def fetch(audience: str) -> str:
        fetched.append(audience)
        return jwt(clock.now + 3600)

    credential = IdTokenCredential("https://gw", fetch, refresh_margin=300, clock=clock)
    first = credential.token()
    assert credential.token() == first and fetched == ["https://gw"]
    clock.now += 3600 - 301
    assert credential.token() == first, "still more than the margin left"
    clock.now += 2
    assert credential.token() != first and fetched == ["https://gw", "https://gw"], "refreshed before expiry"


def test_a_token_without_exp_is_refused() -> None:
    credential = IdTokenCredential("a", lambda _: "not-a-jwt")
    with pytest.raises(ValueError, match="exp"):
        credential.token()


def test_the_client_takes_a_token_or_an_audience_not_both() -> None:
    with pytest.raises(ValueError):
        Client("http://127.0.0.1:1", token="t", id_token_audience="a")
    with pytest.raises(ValueError):
        Client("http://127.0.0.1:1")
    client = Client("http://127.0.0.1:1", id_token_audience="a", id_token_fetch=lambda _: jwt(4_000_000_000))
    assert client._transport.credential.token().count(".") == 2  # noqa: SLF001
