"""W3C trace context on every request, from the caller's OpenTelemetry context.

With `opentelemetry-api` installed (`pip install 'filament-bigquery[otel]'`), each request the
client sends carries `traceparent` (and `tracestate` when there is one) injected by the
globally configured propagator (W3C trace context by default) from the context current in
the calling thread, so the gateway's spans join the extractor's trace. Without the package
nothing is added and nothing fails."""

from __future__ import annotations

from typing import Callable, MutableMapping, Optional

_inject: Optional[Callable[[MutableMapping[str, str]], None]]
try:
    from opentelemetry.propagate import inject as _otel_inject
except ImportError:  # the optional extra is not installed
    _inject = None
else:

    def _inject_headers(headers: MutableMapping[str, str]) -> None:
        _otel_inject(headers)

    _inject = _inject_headers


def tracing_available() -> bool:
    """Whether `opentelemetry-api` is installed (requests then carry the current trace)."""
    return _inject is not None


def inject_trace_context(headers: MutableMapping[str, str]) -> None:
    """Adds `traceparent` / `tracestate` of the current OpenTelemetry context to `headers`
    (nothing when there is no active span, or no `opentelemetry-api`)."""
    if _inject is not None:
        _inject(headers)
