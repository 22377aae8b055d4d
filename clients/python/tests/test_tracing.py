"""traceparent: every request carries the caller's OpenTelemetry trace (the `otel` extra)."""

from __future__ import annotations

import http.server
import importlib
import json
import sys
import threading
from typing import Any, Iterator

import pyarrow as pa
import pytest

from filament_bigquery import Client, RetryPolicy

trace = pytest.importorskip("opentelemetry.trace")
sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")


class HeaderRecorder:
    """A tiny HTTP server answering every request with a run view, keeping its headers."""

    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                payload = self.rfile.read(length) if length else b""
                recorder.headers.append({k.lower(): v for k, v in self.headers.items()})
                body = b'{"run_id": "r1", "destination": {}, "batching": {}, "resources": [], "executions": [], "created_at": ""}'
                if self.path.endswith("/executions"):  # open: an execution view
                    body = json.dumps({"run_id": "r1", "execution_id": "e1", "delivery": 1, "state": "extracting"}).encode()
                elif "/batches?seq=" in self.path:  # a batch: its receipt
                    rows = pa.ipc.open_stream(payload).read_all().num_rows
                    seq = int(self.path.rsplit("=", 1)[1])
                    body = json.dumps({"resource": "r", "seq": seq, "rows": rows, "state": "queued"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def recorder() -> Iterator[HeaderRecorder]:
    r = HeaderRecorder()
    yield r
    r.close()


def test_requests_carry_the_current_span_as_traceparent(recorder: HeaderRecorder) -> None:
    tracer = sdk_trace.TracerProvider().get_tracer("extractor")
    client = Client(recorder.url, token="t" * 20, retry=RetryPolicy(max_attempts=1))
    with tracer.start_as_current_span("extract users") as span:
        client.create_run(project="p", dataset="d", run_id="r1")
        client.get_run("r1")
    context = span.get_span_context()
    trace_id = format(context.trace_id, "032x")
    span_id = format(context.span_id, "016x")
    flags = format(context.trace_flags, "02x")
    assert len(recorder.headers) == 2
    for headers in recorder.headers:
        assert headers["traceparent"] == f"00-{trace_id}-{span_id}-{flags}"
    # Outside a span there is no trace to carry, and nothing else changes.
    client.get_run("r1")
    assert "traceparent" not in recorder.headers[-1]
    assert recorder.headers[-1]["authorization"] == "Bearer " + "t" * 20


def test_tracestate_travels_with_the_trace(recorder: HeaderRecorder) -> None:
    parent = trace.SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=trace.TraceFlags(1),
        trace_state=trace.TraceState([("vendor", "value")]),
    )
    client = Client(recorder.url, token="t" * 20, retry=RetryPolicy(max_attempts=1))
    with trace.use_span(trace.NonRecordingSpan(parent)):
        client.get_run("r1")
    headers = recorder.headers[-1]
    assert headers["traceparent"] == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert headers["tracestate"] == "vendor=value"


def test_background_writes_carry_the_trace_of_the_caller(recorder: HeaderRecorder) -> None:
    tracer = sdk_trace.TracerProvider().get_tracer("extractor")
    client = Client(recorder.url, token="t" * 20, compression="none", max_in_flight=2)
    run = client.run("r1")
    with tracer.start_as_current_span("extract") as span:
        ex = run.execution("e1")
        futures = [ex.submit(name, pa.table({"id": [1, 2, 3]})) for name in ("users", "orders")]
        ex.flush()
    assert [f.result().rows for f in futures] == [3, 3]
    trace_id = format(span.get_span_context().trace_id, "032x")
    batch_headers = recorder.headers[1:]
    assert len(batch_headers) == 2
    assert all(h["traceparent"].split("-")[1] == trace_id for h in batch_headers)


def test_without_opentelemetry_nothing_is_added(recorder: HeaderRecorder, monkeypatch: pytest.MonkeyPatch) -> None:
    from filament_bigquery import _tracing

    tracer = sdk_trace.TracerProvider().get_tracer("extractor")
    monkeypatch.setitem(sys.modules, "opentelemetry.propagate", None)  # as if not installed
    try:
        importlib.reload(_tracing)
        assert not _tracing.tracing_available()
        headers: dict[str, str] = {}
        with tracer.start_as_current_span("extract"):
            _tracing.inject_trace_context(headers)
        assert headers == {}
    finally:
        monkeypatch.undo()
        importlib.reload(_tracing)
    assert _tracing.tracing_available()
