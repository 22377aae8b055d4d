"""Exceptions: one per problem+json family, so callers catch what they can act on."""

from __future__ import annotations

from typing import Any, Optional

import requests


class FilamentError(Exception):
    """Base of every exception this package raises."""


class GatewayUnreachable(FilamentError):
    """The gateway could not be reached (connection errors or timeouts) within the retry policy."""


class CommitStillRunning(FilamentError):
    """`commit(wait=True)` stopped waiting (the client's `commit_timeout` passed) while the
    execution was still committing. Nothing was cancelled: a commit, once asked, runs to its end
    at the gateway (`committed` or `failed`). Learn the outcome under the same execution id
    (`Run.wait_for_commit`, or `Run.deliver` with the same `execution_id`, which sends nothing
    again once it committed); a new execution id would load the rows a second time.
    """

    def __init__(self, run_id: str, execution_id: str, state: str) -> None:
        super().__init__(
            f"execution {execution_id} of run {run_id} still {state} at the client's commit deadline; the commit goes "
            f"on at the gateway: ask for its outcome (or retry) with execution_id={execution_id!r}"
        )
        self.run_id = run_id
        self.execution_id = execution_id
        self.state = state

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.run_id, self.execution_id, self.state))


class ProblemError(FilamentError):
    """A gateway answer with an error status, parsed from its `application/problem+json` body.

    `status`, `code`, `detail` and `hint` come from the body (the `code` is stable, see the
    contract); `response` is the answer as received (status, headers, body, url; None for a
    failed execution read from its view), detached from its request so that no credential
    rides on the exception (`response.request` is None); `problem` the whole parsed body.
    """

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        hint: Optional[str] = None,
        response: Optional[requests.Response] = None,
        problem: Optional[dict[str, Any]] = None,
    ) -> None:
        self.status = status
        self.code = code
        self.detail = detail
        self.hint = hint
        self.response = detached(response) if response is not None else None
        self.problem: dict[str, Any] = problem if problem is not None else {}
        message = f"{status} {code}: {detail}"
        if hint:
            message += f" (hint: {hint})"
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled as the arguments of `__init__` (Exception's default pickles the message only,
        # which `__init__` cannot take back) and the attributes.
        return (type(self), (self.status, self.code, self.detail, self.hint, None, self.problem), self.__dict__)

    @property
    def retry_after(self) -> Optional[float]:
        """Seconds of the `Retry-After` header, when the gateway sent one."""
        if self.response is None:
            return None
        return parse_retry_after(self.response.headers.get("Retry-After"))


class InvalidInput(ProblemError):
    """400, 413, 415, 422: the request (often the data) is wrong; sending it again will not help."""


class Unauthorized(ProblemError):
    """401: missing or wrong bearer token."""


class NotFound(ProblemError):
    """404: no such run, execution or resource (declare resources before writing them)."""


class Conflict(ProblemError):
    """409: the state or an earlier request disagrees (`run_conflict`, `resource_conflict`,
    `batch_conflict`, `execution_not_extracting`, `replay_mismatch`, ...)."""


class Backpressure(ProblemError):
    """429 `backpressure`, raised only once the retry policy is exhausted."""


class Unavailable(ProblemError):
    """502, 503: BigQuery or the gateway is failing or overloaded (retried for 503 first)."""


class ExecutionFailed(ProblemError):
    """The execution ended `failed` (its `error` is this problem), e.g. `publication_failed`, or
    `gateway_restarted`: deliver it again (see `redeliverable` and `Run.deliver`).

    `execution` is the execution view that carried the error.
    """

    def __init__(self, execution: dict[str, Any]) -> None:
        error: dict[str, Any] = execution.get("error") or {}
        super().__init__(
            status=int(error.get("status") or 0),
            code=str(error.get("code") or "failed"),
            detail=str(error.get("detail") or f"execution {execution.get('execution_id')} failed"),
            hint=error.get("hint"),
            problem=error,
        )
        self.execution = execution

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.execution,), self.__dict__)

    @property
    def redeliverable(self) -> bool:
        """True when a new delivery of the same execution id is the fix (`gateway_restarted`,
        `upload_failed`, `pending_stream_expired`, BigQuery unavailable)."""
        return self.code in REDELIVERABLE_CODES


REDELIVERABLE_CODES = frozenset(
    {
        "gateway_restarted",
        "upload_failed",
        "pending_stream_expired",
        "bigquery_unavailable",
        "row_count_mismatch",
        "quota_exceeded",
    }
)


def detached(response: requests.Response) -> requests.Response:
    """A copy of `response` without what leads back to its request: no `request` (whose
    `Authorization` header holds the caller's token), no `history`, no connection. Safe to
    keep on an exception, log, or pickle."""
    if response.request is None and not response.history and response.raw is None:
        return response
    copy = requests.Response()
    copy.status_code = response.status_code
    copy.headers = requests.structures.CaseInsensitiveDict(response.headers)
    copy._content = response.content
    copy.encoding = response.encoding
    copy.reason = response.reason
    copy.url = response.url
    copy.elapsed = response.elapsed
    return copy


def parse_retry_after(value: Optional[str]) -> Optional[float]:
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return max(0.0, seconds)


def problem_from_response(response: requests.Response) -> ProblemError:
    """The exception for an error response (a problem+json body, or any other body)."""
    body: dict[str, Any] = {}
    try:
        parsed = response.json()
        if isinstance(parsed, dict):
            body = parsed
    except ValueError:
        pass
    status = response.status_code
    code = str(body.get("code") or f"http_{status}")
    detail = str(body.get("detail") or response.text[:500] or response.reason or "")
    hint = body.get("hint")
    cls: type[ProblemError]
    if status == 401:
        cls = Unauthorized
    elif status == 404:
        cls = NotFound
    elif status == 409:
        cls = Conflict
    elif status == 429:
        cls = Backpressure
    elif status in (502, 503):
        cls = Unavailable
    elif status in (400, 413, 415, 422):
        cls = InvalidInput
    else:
        cls = ProblemError
    return cls(status, code, detail, hint if isinstance(hint, str) else None, response, body)
