"""Schemathesis hooks for filament-bigquery: a serializer for Arrow IPC stream bodies.

Generated batch bodies are arbitrary bytes; the gateway must answer them with a documented
status (typically 400 invalid_arrow_ipc or 404 for unknown ids), never a 5xx.
"""
import schemathesis


@schemathesis.serializer("application/vnd.apache.arrow.stream")
def arrow_stream(ctx, value):
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    return repr(value).encode()
