"""Where the client sends its credential, and that no exception carries it (issue 54): plain
HTTP only to this machine unless asked for, and no token in an exception's attributes, its
repr or its pickled form, whatever the failure."""

from __future__ import annotations

import collections
import logging
import pickle
import socket
import types
import uuid
from typing import Any, Iterator

import pyarrow as pa
import pytest
import requests

from conftest import PROJECT, TOKEN, Gateway, LossyProxy
from filament_bigquery import (
    Client,
    GatewayUnreachable,
    InvalidInput,
    ProblemError,
    RetryPolicy,
    Unauthorized,
    Unavailable,
)


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:8080", "http://127.9.9.9", "http://localhost:8080/", "http://api.localhost", "http://[::1]:8080",
     "https://gateway.example.com", "https://10.0.0.7:8443"],
)
def test_https_and_loopback_http_are_accepted(url: str) -> None:
    assert Client(url, token=TOKEN).base_url == url.rstrip("/")


@pytest.mark.parametrize("url", ["http://gateway.example.com", "http://10.0.0.7:8080", "http://[2001:db8::1]:8080",
                                 "http://localhost.example.com", "http://127.0.0.1.nip.io"])
def test_plain_http_to_another_host_is_refused_unless_allowed(url: str, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ValueError, match="clear text.*allow_insecure_http=True"):
        Client(url, token=TOKEN)
    with caplog.at_level(logging.WARNING, logger="filament_bigquery"):
        Client(url, token=TOKEN, allow_insecure_http=True)
    assert "plain HTTP" in caplog.text and TOKEN not in caplog.text


@pytest.mark.parametrize("url", ["ftp://127.0.0.1", "127.0.0.1:8080", "https://", "https://user:secret@gateway.example.com"])
def test_a_url_that_is_not_http_or_carries_credentials_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="base_url"):
        Client(url, token=TOKEN)


def reachable_text(root: object) -> Iterator[str | bytes]:
    """Every str and bytes reachable from `root` through attributes, containers, exception
    arguments, causes and contexts (not through frames: the stack is not the exception)."""
    opaque = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
              types.FrameType, types.TracebackType, types.CodeType, socket.socket)
    seen: set[int] = set()
    stack: list[Any] = [root]
    while stack:
        obj = stack.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, (str, bytes, bytearray)):
            yield bytes(obj) if isinstance(obj, bytearray) else obj
            continue
        if isinstance(obj, opaque):
            continue
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
            continue
        if isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
            stack.extend(obj)
            continue
        if isinstance(obj, BaseException):
            stack.extend([obj.args, obj.__cause__, obj.__context__])
        attributes = getattr(obj, "__dict__", None)
        if isinstance(attributes, dict):
            stack.append(attributes)
        for slot in getattr(type(obj), "__slots__", ()):
            stack.append(getattr(obj, slot, None))


def assert_holds_no_credential(raised: BaseException, token: str) -> None:
    assert token not in str(raised) and token not in repr(raised)
    leaks = [text for text in reachable_text(raised) if (token if isinstance(text, str) else token.encode()) in text]
    assert leaks == [], f"{type(raised).__name__} holds the token: {[t[:120] for t in leaks]}"
    pickled = pickle.dumps(raised)
    assert token.encode() not in pickled
    again = pickle.loads(pickled)
    assert type(again) is type(raised) and str(again) == str(raised)
    if isinstance(raised, ProblemError):
        assert (again.status, again.code, again.detail) == (raised.status, raised.code, raised.detail)


def secret() -> str:
    return f"secret-{uuid.uuid4().hex}"


def test_a_refused_token_is_not_on_the_exception(gateway: Gateway) -> None:
    token = secret()
    with Client(gateway.url, token=token) as client:
        with pytest.raises(Unauthorized) as raised:
            client.get_run("anything")
    assert raised.value.response is not None and raised.value.response.request is None
    assert raised.value.response.headers["Content-Type"].startswith("application/problem+json")
    assert_holds_no_credential(raised.value, token)


def test_a_problem_answer_keeps_its_response_without_the_request(gateway: Gateway) -> None:
    with Client(gateway.url, token=TOKEN) as client:
        with pytest.raises(InvalidInput) as raised:
            client.create_run(project=PROJECT, dataset="not-a-dataset")
    assert raised.value.code == "invalid_dataset_id" and raised.value.response is not None
    assert raised.value.response.status_code == 422 and raised.value.response.json()["code"] == "invalid_dataset_id"
    assert_holds_no_credential(raised.value, TOKEN)


def test_an_unreachable_gateway_is_reported_without_the_request() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    token = secret()
    with Client(f"http://127.0.0.1:{port}", token=token, retry=RetryPolicy(max_attempts=2, initial_backoff=0.01)) as client:
        with pytest.raises(GatewayUnreachable) as raised:
            client.get_run("anything")
    assert "ConnectionError" in str(raised.value)
    assert raised.value.__cause__ is None and raised.value.__context__ is None
    assert_holds_no_credential(raised.value, token)


def test_a_503_after_the_last_attempt_is_reported_without_the_request(gateway: Gateway, dataset: str) -> None:
    proxy = LossyProxy(gateway.url, drop=0, unavailable=5)
    try:
        with Client(proxy.url, token=TOKEN, retry=RetryPolicy(max_attempts=2, initial_backoff=0.01)) as client:
            run = client.create_run(project=PROJECT, dataset=dataset)
            run.declare("t", write_mode="full_append")
            ex = run.execution()
            with pytest.raises(Unavailable) as raised:
                ex.write("t", pa.table({"id": [1]}))
            ex.abort()
        assert raised.value.retry_after is None and raised.value.status == 503
        assert_holds_no_credential(raised.value, TOKEN)
    finally:
        proxy.close()


def test_the_checker_finds_a_token_where_requests_leaves_it() -> None:
    """The check above can fail: requests' own exceptions hold the Authorization header."""
    token = secret()
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(requests.ConnectionError) as raised:
        requests.get(f"http://127.0.0.1:{port}/", headers={"Authorization": f"Bearer {token}"}, timeout=5)
    with pytest.raises(AssertionError, match="holds the token"):
        assert_holds_no_credential(raised.value, token)
