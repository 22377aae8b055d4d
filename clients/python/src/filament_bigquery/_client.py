"""Client, Run and Execution: the gateway's HTTP API with the behaviour of a good extractor
(bodies split and numbered, compression, retries that are safe to repeat, redelivery)."""

from __future__ import annotations

import base64
import contextvars
import ipaddress
import json as jsonlib
import logging
import random
import re
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, cast
from urllib.parse import quote, urlsplit

import requests

from ._bodies import COMPRESSIONS, ArrowData, Body, bodies
from ._errors import (
    CommitStillRunning,
    Conflict,
    ExecutionFailed,
    FilamentError,
    GatewayUnreachable,
    NotFound,
    ProblemError,
    problem_from_response,
)
from ._tracing import inject_trace_context
from ._types import (
    TERMINAL_STATES,
    CheckpointResponse,
    ExecutionView,
    MetadataColumn,
    Receipt,
    ResourceView,
    RunListItem,
    RunView,
    WriteMode,
)

__all__ = ["Client", "Run", "Execution", "RetryPolicy", "Stats", "WriteResult", "ARROW_STREAM"]

ARROW_STREAM = "application/vnd.apache.arrow.stream"
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
# The gateway's rules for run and execution ids and a principal's `run_id_prefix`
# (src/model/ids.rs, src/principals/file.rs).
MAX_ID_CHARS = 64
MAX_RUN_ID_PREFIX_CHARS = 36
_RUN_ID_PREFIX = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_RUN_ID_PREFIX_CHARS}}}")
log = logging.getLogger("filament_bigquery")


@dataclass(frozen=True)
class RetryPolicy:
    """How one request is retried.

    429 `backpressure` waits `Retry-After` (or the backoff) and is retried until `deadline`
    seconds have passed since the first attempt; 503 (waiting at least `Retry-After` when the
    gateway sends one: a draining replica, an unreachable owner) and connection errors
    (including a lost response) are retried with exponential backoff and jitter, at most
    `max_attempts` attempts in all, within the same deadline. Every retry of a batch carries the same `seq`
    and body.
    """

    max_attempts: int = 10
    initial_backoff: float = 0.5
    max_backoff: float = 30.0
    deadline: float = 900.0

    def backoff(self, attempt: int) -> float:
        base: float = min(self.max_backoff, self.initial_backoff * (2 ** max(0, attempt - 1)))
        return base * random.uniform(0.5, 1.0)


@dataclass
class Stats:
    """Counters of one Client (all its runs and executions), for logs and tests."""

    requests: int = 0
    backpressure_retries: int = 0
    unavailable_retries: int = 0
    connection_retries: int = 0
    bodies_sent: int = 0
    rows_sent: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, name: str, amount: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + amount)


@dataclass(frozen=True)
class WriteResult:
    """What one `write` sent: the receipts of its bodies, in `seq` order."""

    resource: str
    receipts: list[Receipt]
    rows: int
    bodies: int
    bytes_sent: int


def _new_id() -> str:
    return uuid.uuid4().hex


def _segment(value: str) -> str:
    return quote(value, safe="")


class IdTokenCredential:
    """A Google ID token for `audience`, fetched with `fetch` (by default
    `google.oauth2.id_token.fetch_id_token`: the metadata server on GKE with Workload Identity,
    or the service-account key of `GOOGLE_APPLICATION_CREDENTIALS`), and fetched again
    `refresh_margin` seconds before it expires."""

    def __init__(
        self,
        audience: str,
        fetch: Optional[Callable[[str], str]] = None,
        refresh_margin: float = 300.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.audience = audience
        self._fetch = fetch if fetch is not None else _fetch_google_id_token
        self._refresh_margin = refresh_margin
        self._clock = clock
        self._token: Optional[str] = None
        self._expires_at = 0.0
        self._lock = threading.Lock()

    def token(self) -> str:
        with self._lock:
            if self._token is None or self._clock() >= self._expires_at - self._refresh_margin:
                self._token = self._fetch(self.audience)
                self._expires_at = _jwt_expiry(self._token)
            return self._token


def _fetch_google_id_token(audience: str) -> str:
    try:
        import google.auth.transport.requests
        import google.oauth2.id_token
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError("ID tokens need google-auth: pip install 'filament-bigquery[gcp]'") from exc
    token: str = google.oauth2.id_token.fetch_id_token(google.auth.transport.requests.Request(), audience)
    return token


def _jwt_expiry(token: str) -> float:
    """The `exp` claim of a JWT (read, not verified: the gateway verifies it)."""
    try:
        payload = token.split(".")[1]
        claims = jsonlib.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return float(claims["exp"])
    except (IndexError, ValueError, KeyError, TypeError) as exc:
        raise ValueError("the ID token is not a JWT with an exp claim") from exc


def checked_base_url(base_url: str, allow_insecure_http: bool) -> str:
    """`base_url` without its trailing `/`, once it is safe to send a credential to: `https://`,
    or `http://` to a loopback address (`localhost`, 127.0.0.0/8, `::1`). Plain HTTP to any other
    host carries the bearer token in clear text, so it is refused unless `allow_insecure_http`
    (a network the caller trusts: a service mesh with mutual TLS, a private link), and then
    logged at WARNING. Credentials in the URL itself are refused: they would show in logs."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"base_url must be an http:// or https:// URL with a host, not {base_url!r}")
    if parts.username is not None or parts.password is not None:
        raise ValueError("base_url must not carry credentials (user:password@): pass token= instead")
    if parts.scheme == "http" and not _is_loopback(parts.hostname):
        if not allow_insecure_http:
            raise ValueError(
                f"base_url {base_url!r} is plain HTTP to a host that is not this machine: the bearer token would "
                "cross the network in clear text. Use https:// (the gateway behind a TLS load balancer, or "
                "FILAMENT_TLS_CERT_FILE), or pass allow_insecure_http=True on a network you trust"
            )
        log.warning("sending credentials over plain HTTP to %s (allow_insecure_http=True)", parts.hostname)
    return base_url.rstrip("/")


def _is_loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True  # RFC 6761: always the loopback interface
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: not resolved here (what it resolves to can change)


class _Transport:
    def __init__(
        self,
        base_url: str,
        token: "str | IdTokenCredential",
        timeout: float,
        retry: RetryPolicy,
        session: Optional[requests.Session],
        stats: Stats,
    ) -> None:
        self.base_url = base_url
        self.timeout = timeout
        self.retry = retry
        self.stats = stats
        self.session = session if session is not None else requests.Session()
        adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=64, max_retries=0)
        if session is None:
            self.session.mount("http://", adapter)
            self.session.mount("https://", adapter)
        self.credential = token
        self.headers = {"User-Agent": "filament-bigquery-python/0.1.0"}

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        data: Optional[bytes] = None,
        headers: Optional[Mapping[str, str]] = None,
        params: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
        retry: bool = True,
    ) -> requests.Response:
        url = self.base_url + path
        all_headers = dict(self.headers)
        bearer = self.credential if isinstance(self.credential, str) else self.credential.token()
        all_headers["Authorization"] = f"Bearer {bearer}"
        if headers:
            all_headers.update(headers)
        # The caller's trace (W3C `traceparent`), when opentelemetry-api is installed; retries
        # of this request carry the same one.
        inject_trace_context(all_headers)
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            self.stats.add("requests")
            response: Optional[requests.Response] = None
            failure = ""
            try:
                response = self.session.request(
                    method,
                    url,
                    json=json,
                    data=data,
                    headers=all_headers,
                    params=params,
                    timeout=(10.0, timeout if timeout is not None else self.timeout),
                )
            except (requests.ConnectionError, requests.Timeout) as exc:
                # Only its text leaves this block: requests' exception holds the prepared
                # request, `Authorization` header included.
                failure = f"{type(exc).__name__}: {exc}"
            if response is None:
                wait = self.retry.backoff(attempt)
                if not retry or attempt >= self.retry.max_attempts or self._past(started, wait):
                    # Raised outside the `except`: no `__context__` leads back to the request.
                    raise GatewayUnreachable(f"{method} {path}: {failure}")
                self.stats.add("connection_retries")
                log.warning("%s %s: %s; retrying in %.1f s (attempt %d)", method, path, failure, wait, attempt)
                time.sleep(wait)
                continue
            if response.status_code < 400:
                return response
            error = problem_from_response(response)
            if not retry or response.status_code not in (429, 503):
                raise error
            retry_after = error.retry_after
            if response.status_code == 429:
                wait = retry_after if retry_after is not None else self.retry.backoff(attempt)
                counter = "backpressure_retries"
            else:
                # `Retry-After` is the least a 503 asks for; the backoff keeps growing past it.
                wait = max(retry_after or 0.0, self.retry.backoff(attempt))
                counter = "unavailable_retries"
                if attempt >= self.retry.max_attempts:
                    raise error
            if self._past(started, wait):
                raise error
            self.stats.add(counter)
            log.info("%s %s: %s; retrying in %.1f s", method, path, error, wait)
            time.sleep(wait)

    def _past(self, started: float, wait: float) -> bool:
        return time.monotonic() + wait - started > self.retry.deadline

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.request(method, path, **kwargs).json()


class Client:
    """The gateway at `base_url`, authenticated with `token` (a principal's bearer token), or,
    with `id_token_audience`, with Google ID tokens for that audience (Workload Identity; see
    docs/security.md), refreshed before they expire.

    `base_url` is `https://`, or `http://` to this machine (loopback); plain HTTP to another
    host is refused unless `allow_insecure_http=True` (the token would cross the network in
    clear text). `run_id_prefix` starts every run id the client generates (a principal with a
    `run_id_prefix` may create only such runs; see docs/security.md).

    Defaults for the executions it opens: `max_body_bytes` of Arrow IPC per batch request,
    `compression` of the bodies (`zstd`, `gzip` or `none`), `max_in_flight` concurrent writes
    (across resources, with `Execution.submit`). `timeout` is the read timeout of one request;
    `commit_timeout` how long `commit(wait=True)` waits for the outcome (the commit goes on at
    the gateway after that: see `CommitStillRunning`).
    """

    def __init__(
        self,
        base_url: str,
        token: Optional[str] = None,
        *,
        id_token_audience: Optional[str] = None,
        id_token_fetch: Optional[Callable[[str], str]] = None,
        timeout: float = 300.0,
        retry: Optional[RetryPolicy] = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        compression: str = "zstd",
        max_in_flight: int = 1,
        commit_timeout: float = 3600.0,
        session: Optional[requests.Session] = None,
        allow_insecure_http: bool = False,
        run_id_prefix: Optional[str] = None,
    ) -> None:
        base_url = checked_base_url(base_url, allow_insecure_http)
        if run_id_prefix is not None and not _RUN_ID_PREFIX.fullmatch(run_id_prefix):
            raise ValueError(
                f"run_id_prefix must be 1 to {MAX_RUN_ID_PREFIX_CHARS} letters, digits, - or _, not {run_id_prefix!r}"
            )
        self.run_id_prefix = run_id_prefix or ""
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}")
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        credential: "str | IdTokenCredential"
        if id_token_audience is not None:
            if token is not None:
                raise ValueError("pass token or id_token_audience, not both")
            credential = IdTokenCredential(id_token_audience, id_token_fetch)
        elif token is not None:
            credential = token
        else:
            raise ValueError("pass a token or an id_token_audience")
        self.stats = Stats()
        self._transport = _Transport(base_url, credential, timeout, retry or RetryPolicy(), session, self.stats)
        self.max_body_bytes = max_body_bytes
        self.compression = compression
        self.max_in_flight = max_in_flight
        self.commit_timeout = commit_timeout

    @property
    def base_url(self) -> str:
        return self._transport.base_url

    def close(self) -> None:
        self._transport.session.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create_run(
        self,
        project: str,
        dataset: str,
        run_id: Optional[str] = None,
        location: Optional[str] = None,
        batching: Optional[Mapping[str, int]] = None,
        maximum_bytes_billed: Optional[int] = None,
        maximum_bytes_billed_per_execution: Optional[int] = None,
        atomic: bool = False,
    ) -> Run:
        """Creates the run (or finds the same one again: creating is idempotent). Without
        `run_id` the client generates one (starting with the client's `run_id_prefix`), so that
        a retried request cannot create two runs. `maximum_bytes_billed` bounds each publication
        job, `maximum_bytes_billed_per_execution` all of one execution's together: a commit whose
        priced plan exceeds either fails with `publication_too_expensive` before publishing.
        With `atomic`, each execution publishes every table in one transaction (all or none)."""
        run_id = run_id or (self.run_id_prefix + _new_id())[:MAX_ID_CHARS]
        destination: dict[str, Any] = {"project": project, "dataset": dataset}
        if location is not None:
            destination["location"] = location
        body: dict[str, Any] = {"run_id": run_id, "destination": destination}
        if batching is not None:
            body["batching"] = dict(batching)
        if maximum_bytes_billed is not None:
            body["maximum_bytes_billed"] = maximum_bytes_billed
        if maximum_bytes_billed_per_execution is not None:
            body["maximum_bytes_billed_per_execution"] = maximum_bytes_billed_per_execution
        if atomic:
            body["atomic"] = True
        view = cast(RunView, self._transport.json("POST", "/v1/runs", json=body))
        return Run(self, view["run_id"], view)

    def run(self, run_id: str) -> Run:
        """A handle on an existing run (no request is made)."""
        return Run(self, run_id, None)

    def get_run(self, run_id: str) -> RunView:
        return cast(RunView, self._transport.json("GET", f"/v1/runs/{_segment(run_id)}"))

    def list_runs(
        self,
        *,
        state: Optional[str] = None,
        dataset: Optional[str] = None,
        principal: Optional[str] = None,
        created_after: Optional[str] = None,
        created_before: Optional[str] = None,
        page_size: int = 50,
    ) -> Iterator[RunListItem]:
        """`GET /v1/runs`: the runs this principal may read, newest first, page after page.

        `state` is the latest execution's; `created_after`/`created_before` are RFC 3339.
        Pages are fetched as the iteration reaches them (`page_size` runs each, at most 500).
        """
        filters = {
            "state": state,
            "dataset": dataset,
            "principal": principal,
            "created_after": created_after,
            "created_before": created_before,
        }
        params = {name: value for name, value in filters.items() if value is not None}
        params["limit"] = str(page_size)
        while True:
            page = self._transport.json("GET", "/v1/runs", params=params)
            yield from cast(list[RunListItem], page["runs"])
            token = page.get("next_page_token")
            if token is None:
                return
            params["page_token"] = token

    def events(self, run_id: str, execution_id: str, after: int = 0) -> tuple[list[dict[str, Any]], int]:
        """`GET .../events`: the execution's timeline after event `after`, oldest first.

        Returns the events and the cursor to pass as `after` next time (poll for new events).
        """
        path = f"/v1/runs/{_segment(run_id)}/executions/{_segment(execution_id)}/events"
        page = self._transport.json("GET", path, params={"after": str(after), "limit": "1000"})
        return cast(list[dict[str, Any]], page["events"]), int(page["next_after"])

    def test_connection(self, project: str, location: Optional[str] = None) -> dict[str, Any]:
        """`POST /v1/connections/test`: can the gateway reach BigQuery for `project`?"""
        body: dict[str, Any] = {"project": project}
        if location is not None:
            body["location"] = location
        return cast(dict[str, Any], self._transport.json("POST", "/v1/connections/test", json=body, retry=False))

    def ready(self) -> bool:
        """`GET /readyz`: Postgres and BigQuery reachable."""
        try:
            self._transport.request("GET", "/readyz", retry=False, timeout=10.0)
            return True
        except (ProblemError, GatewayUnreachable):
            return False


class Run:
    """One run: a destination dataset, its declared resources, its executions."""

    def __init__(self, client: Client, run_id: str, view: Optional[RunView]) -> None:
        self.client = client
        self.run_id = run_id
        self.view = view

    @property
    def _path(self) -> str:
        return f"/v1/runs/{_segment(self.run_id)}"

    def get(self) -> RunView:
        self.view = self.client.get_run(self.run_id)
        return self.view

    @property
    def durable_checkpoint(self) -> Any:
        """The last checkpoint of the last committed execution (None before any), fetched now."""
        return self.get().get("durable_checkpoint")

    def declare(
        self,
        resource: str,
        write_mode: WriteMode | str = "full_append",
        primary_key: Optional[Sequence[str]] = None,
        table: Optional[str] = None,
        *,
        table_options: Optional[Mapping[str, Any]] = None,
        metadata_columns: Optional[Sequence[MetadataColumn | str]] = None,
        order_by: Optional[str | Sequence[str]] = None,
        deletes: Optional[str] = None,
        delete_missing: Optional[bool] = None,
        widen_columns: Optional[bool] = None,
    ) -> ResourceView:
        """Declares (idempotently) `resource`, loaded into `table` (default: the resource name
        with other characters than letters, digits and `_` replaced by `_`) with `write_mode`.
        Upsert, delete and merge modes need `primary_key`. `table_options` lays out a table the
        gateway creates; `metadata_columns` (`loaded_at`, `run_id`, `execution_id`) are set on
        every row each publication writes. Keyed modes: `order_by` (a column or a list) orders
        the changes, the largest value winning, so a late or replayed change never rolls a row
        back; `deletes="soft"` keeps deleted rows, marked in `_filament_deleted_at`.
        `full_upsert`: `delete_missing=True` makes the run a snapshot, whose first execution
        committed without a pause deletes the keys the run did not send. `widen_columns=True`
        lets the gateway widen an existing narrower numeric column to the type the batches send
        (INT64 to NUMERIC, say) instead of failing: the one DDL it submits, off by default."""
        body: dict[str, Any] = {"write_mode": write_mode}
        if primary_key is not None:
            body["primary_key"] = list(primary_key)
        if table is not None:
            body["table"] = table
        if table_options is not None:
            body["table_options"] = dict(table_options)
        if metadata_columns is not None:
            body["metadata_columns"] = list(metadata_columns)
        if order_by is not None:
            body["order_by"] = order_by if isinstance(order_by, str) else list(order_by)
        if deletes is not None:
            body["deletes"] = deletes
        if delete_missing is not None:
            body["delete_missing"] = delete_missing
        if widen_columns is not None:
            body["widen_columns"] = widen_columns
        return cast(
            ResourceView, self.client._transport.json("PUT", f"{self._path}/resources/{_segment(resource)}", json=body)
        )

    def get_execution(self, execution_id: str) -> ExecutionView:
        """The execution `execution_id` of this run as it stands (`NotFound` when there is
        none), without starting a delivery."""
        return cast(
            ExecutionView, self.client._transport.json("GET", f"{self._path}/executions/{_segment(execution_id)}")
        )

    def execution(
        self,
        execution_id: Optional[str] = None,
        *,
        max_body_bytes: Optional[int] = None,
        compression: Optional[str] = None,
        max_in_flight: Optional[int] = None,
        atomic: Optional[bool] = None,
    ) -> Execution:
        """Opens an execution (`POST .../executions`). An existing `execution_id` starts a new
        delivery of it (`Execution.delivery` is then 2, 3, ...): everything the previous
        delivery sent is discarded. Use it as a context manager: a clean exit commits (waiting
        for the outcome), an exception aborts. `atomic` (default: the run's) publishes every
        table of the execution in one transaction."""
        execution_id = execution_id or _new_id()
        body: dict[str, Any] = {"execution_id": execution_id}
        if atomic is not None:
            body["atomic"] = atomic
        view = cast(ExecutionView, self.client._transport.json("POST", f"{self._path}/executions", json=body))
        client = self.client
        return Execution(
            self,
            view,
            max_body_bytes=max_body_bytes or client.max_body_bytes,
            compression=compression or client.compression,
            max_in_flight=max_in_flight or client.max_in_flight,
        )

    def wait_for_commit(self, execution_id: str) -> Optional[ExecutionView]:
        """The execution `execution_id` once no commit of it is running, or None when there is
        none. A commit under way (asked by an earlier process, or by a call that stopped waiting)
        is waited for, up to the client's `commit_timeout` (then `CommitStillRunning`): it runs
        to its end whoever waits."""
        deadline = time.monotonic() + self.client.commit_timeout
        try:
            view = self.get_execution(execution_id)
        except NotFound:
            return None
        pause = 0.2
        # A staged execution (a commit held at the barrier) runs no commit: it is answered.
        while view["state"] == "committing":
            if time.monotonic() > deadline:
                raise CommitStillRunning(self.run_id, execution_id, view["state"])
            time.sleep(pause)
            pause = min(5.0, pause * 2)
            view = self.get_execution(execution_id)
        return view

    def deliver(
        self,
        extract: Callable[[Execution], None],
        execution_id: Optional[str] = None,
        *,
        max_deliveries: int = 3,
        **options: Any,
    ) -> Execution:
        """Runs `extract(ex)` in an execution and commits it; when the execution fails with a
        redeliverable error (`gateway_restarted`, ...), delivers the same execution id again,
        up to `max_deliveries` times. Returns the committed execution (`ex.result`).

        Retries stay exactly once only under the same `execution_id`: pass one the caller can
        name again (a date, a batch number) and call `deliver` again with it after any failure,
        including a lost answer or `CommitStillRunning`. An execution of that id that is
        committing is waited for (`wait_for_commit`); one that committed is returned as it is,
        `extract` not called and nothing sent again."""
        if execution_id is not None:
            earlier = self.wait_for_commit(execution_id)
            if earlier is not None and earlier["state"] == "committed":
                log.info("execution %s of run %s is committed already: nothing to send", execution_id, self.run_id)
                return Execution.finished(self, earlier)
        execution_id = execution_id or _new_id()
        for delivery in range(1, max_deliveries + 1):
            try:
                with self.execution(execution_id, **options) as ex:
                    extract(ex)
                return ex
            except ExecutionFailed as failed:
                if not failed.redeliverable or delivery == max_deliveries:
                    raise
                log.warning("execution %s failed (%s); delivering it again", execution_id, failed.code)
        raise AssertionError("unreachable")


class Execution:
    """One delivery of an execution: write resources, checkpoint, commit or abort."""

    def __init__(
        self,
        run: Run,
        view: ExecutionView,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        compression: str = "zstd",
        max_in_flight: int = 1,
    ) -> None:
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}")
        self.run = run
        self.view = view
        self.execution_id: str = view["execution_id"]
        self.delivery: int = view["delivery"]
        self.max_body_bytes = max_body_bytes
        self.compression = compression
        self.max_in_flight = max_in_flight
        self.result: Optional[ExecutionView] = None
        self._transport = run.client._transport
        self._next_seq: dict[str, int] = {}
        self._unknown_outcome: dict[str, int] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._queues: dict[str, ThreadPoolExecutor] = {}
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self._futures: list[Future[WriteResult]] = []

    @classmethod
    def finished(cls, run: Run, view: ExecutionView) -> Execution:
        """A handle on an execution that ended (`view`), its `result`."""
        execution = cls(run, view)
        execution.result = view
        return execution

    def __repr__(self) -> str:
        return f"Execution(run_id={self.run.run_id!r}, execution_id={self.execution_id!r}, delivery={self.delivery})"

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def _path(self) -> str:
        return f"{self.run._path}/executions/{_segment(self.execution_id)}"

    def _lock(self, resource: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(resource, threading.Lock())

    # -- writing ----------------------------------------------------------------------------

    def write(
        self,
        resource: str,
        data: ArrowData,
        *,
        compression: Optional[str] = None,
        max_body_bytes: Optional[int] = None,
    ) -> WriteResult:
        """Sends `data` (a pyarrow Table, RecordBatch, list of RecordBatches or
        RecordBatchReader, or any object that exports an Arrow stream with
        `__arrow_c_stream__`: a Polars DataFrame, a DuckDB relation, a nanoarrow stream; read
        batch by batch, never through pandas) to `resource`, in bodies of at most
        `max_body_bytes` of Arrow IPC numbered with the next `seq` values; returns when every
        body has its receipt. Retried bodies keep their `seq` and bytes. `compression` and
        `max_body_bytes` override the execution's for this write."""
        with self._lock(resource):
            if resource in self._unknown_outcome:
                raise FilamentError(
                    f"{resource}: the outcome of seq {self._unknown_outcome[resource]} is unknown (the gateway could "
                    "not be reached), so this delivery cannot go on safely; deliver the execution again"
                )
            receipts: list[Receipt] = []
            rows = sent = 0
            for body in bodies(data, max_body_bytes or self.max_body_bytes, compression or self.compression):
                seq = self._next_seq.get(resource, 0)
                receipt = self._post_body(resource, seq, body)
                self._next_seq[resource] = seq + 1
                receipts.append(receipt)
                rows += body.rows
                sent += len(body.payload)
            return WriteResult(resource, receipts, rows, len(receipts), sent)

    def submit(
        self,
        resource: str,
        data: ArrowData,
        *,
        compression: Optional[str] = None,
        max_body_bytes: Optional[int] = None,
    ) -> Future[WriteResult]:
        """Like `write`, in the background: writes of different resources run concurrently (at
        most `max_in_flight` at once), writes of one resource one after the other in submission
        order. `checkpoint`, `commit` and `flush` wait for them first. The write runs in the
        caller's context (its OpenTelemetry span: the requests carry the caller's trace)."""
        with self._locks_guard:
            queue = self._queues.get(resource)
            if queue is None:
                queue = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"filament-{resource}")
                self._queues[resource] = queue

        def task() -> WriteResult:
            with self._slots:
                return self.write(resource, data, compression=compression, max_body_bytes=max_body_bytes)

        future = queue.submit(contextvars.copy_context().run, task)
        self._futures.append(future)
        return future

    def flush(self) -> list[WriteResult]:
        """Waits for every submitted write; raises the first failure."""
        futures, self._futures = self._futures, []
        results: list[WriteResult] = []
        first_error: Optional[BaseException] = None
        for future in futures:
            error = future.exception()
            if error is not None:
                first_error = first_error or error
            else:
                results.append(future.result())
        if first_error is not None:
            raise first_error
        return results

    def _post_body(self, resource: str, seq: int, body: Body) -> Receipt:
        headers = {"Content-Type": ARROW_STREAM}
        if body.content_encoding:
            headers["Content-Encoding"] = body.content_encoding
        path = f"{self._path}/resources/{_segment(resource)}/batches"
        try:
            response = self._transport.request("POST", path, data=body.payload, headers=headers, params={"seq": str(seq)})
        except GatewayUnreachable:
            # The body may or may not have been accepted: its seq must never carry other content.
            self._unknown_outcome[resource] = seq
            raise
        except Conflict as conflict:
            if conflict.code == "execution_not_extracting":
                self._raise_if_failed()
            raise
        receipt = cast(Receipt, response.json())
        if receipt.get("seq") != seq or receipt.get("rows") != body.rows:
            raise FilamentError(f"{resource} seq {seq}: unexpected receipt {receipt} for {body.rows} rows")
        self._transport.stats.add("bodies_sent")
        self._transport.stats.add("rows_sent", body.rows)
        return receipt

    def _raise_if_failed(self) -> None:
        view = self.get()
        if view["state"] == "failed":
            raise ExecutionFailed(cast(dict[str, Any], view))

    # -- state ------------------------------------------------------------------------------

    def get(self) -> ExecutionView:
        self.view = cast(ExecutionView, self._transport.json("GET", self._path))
        return self.view

    @property
    def state(self) -> str:
        return self.view["state"]

    def checkpoint(self, value: Any) -> CheckpointResponse:
        """Records `value` (any JSON) after everything written so far; it becomes the run's
        durable checkpoint when this execution commits."""
        self.flush()
        try:
            return cast(
                CheckpointResponse,
                self._transport.json("POST", f"{self._path}/checkpoints", json={"checkpoint": value}),
            )
        except Conflict as conflict:
            if conflict.code == "execution_not_extracting":
                self._raise_if_failed()
            raise

    def pause(self) -> ExecutionView:
        self.flush()
        self.view = cast(ExecutionView, self._transport.json("POST", f"{self._path}/pause"))
        return self.view

    def abort(self) -> ExecutionView:
        self._cancel_pending()
        self.view = cast(ExecutionView, self._transport.json("POST", f"{self._path}/abort"))
        self.result = self.view
        return self.view

    def commit(self, wait: bool = True, timeout: Optional[float] = None, hold: bool = False) -> ExecutionView:
        """Commits: with `wait`, returns the terminal execution (also as `result`) and raises
        `ExecutionFailed` when it failed; without, returns the `committing` view.

        With `hold`, the commit stops at the barrier: every stream staged and the priced plan
        recorded (the view's `plan`), nothing published, the execution `staged` (what `wait`
        returns then). A later `commit()` publishes it as planned; `abort()` discards it.

        Once asked, a commit runs to its end at the gateway: a wait that ends early (the
        answer lost, the read timed out) is retried on this execution id, and past `timeout`
        (default: the client's `commit_timeout`) `CommitStillRunning` is raised with the commit
        still going on. `abort` cancels an execution only until its publication starts."""
        self.flush()
        timeout = timeout if timeout is not None else self.run.client.commit_timeout
        deadline = time.monotonic() + timeout
        params = self._commit_params(wait, hold)
        try:
            view = cast(
                ExecutionView,
                self._transport.json("POST", f"{self._path}/commit", params=params or None, timeout=timeout),
            )
        except GatewayUnreachable:
            view = self.get()
        except Conflict as conflict:
            # A retried commit may find the execution committing, staged or already finished.
            view = self.get()
            if view["state"] not in ("committing", "staged", "committed", "failed"):
                raise conflict
        if wait:
            view = self._wait_terminal(view, deadline, hold)
        self.view = view
        if view["state"] in TERMINAL_STATES:
            self.result = view
        if view["state"] == "failed":
            raise ExecutionFailed(cast(dict[str, Any], view))
        return view

    @staticmethod
    def _commit_params(wait: bool, hold: bool) -> dict[str, str]:
        params = {"wait": "true"} if wait else {}
        if hold:
            params["hold"] = "true"
        return params

    def _wait_terminal(self, view: ExecutionView, deadline: float, hold: bool = False) -> ExecutionView:
        pause = 0.2
        while view["state"] not in TERMINAL_STATES and not (hold and view["state"] == "staged"):
            if time.monotonic() > deadline:
                raise CommitStillRunning(self.run_id, self.execution_id, view["state"])
            if view["state"] in ("extracting", "paused", "staged"):
                # The commit request never arrived (its connection failed): send it again.
                remaining = max(1.0, deadline - time.monotonic())
                view = cast(
                    ExecutionView,
                    self._transport.json(
                        "POST", f"{self._path}/commit", params=self._commit_params(True, hold), timeout=remaining
                    ),
                )
                continue
            time.sleep(pause)
            pause = min(5.0, pause * 2)
            view = self.get()
        return view

    def _cancel_pending(self) -> None:
        for future in self._futures:
            future.cancel()
        for future in self._futures:
            try:
                future.exception()
            except BaseException:  # noqa: BLE001 - cancelled futures raise here
                pass
        self._futures = []

    def close(self) -> None:
        for queue in self._queues.values():
            queue.shutdown(wait=True, cancel_futures=True)
        self._queues.clear()

    def __enter__(self) -> Execution:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            if exc is None:
                # A commit held at the barrier (`commit(hold=True)`) stays staged: a later
                # commit() publishes it, abort() discards it.
                if self.view["state"] != "staged":
                    self.commit(wait=True)
                return
            if isinstance(exc, ExecutionFailed):
                return  # already terminal
            try:
                self.abort()
            except FilamentError as abort_error:
                log.warning("abort of execution %s failed: %s", self.execution_id, abort_error)
        finally:
            self.close()
