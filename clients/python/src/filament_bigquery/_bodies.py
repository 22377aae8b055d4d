"""Turning Arrow data into batch bodies: Arrow IPC streams of at most `max_body_bytes`,
compressed for the wire. Streams a RecordBatchReader, or any object that exports an Arrow
stream through the Arrow PyCapsule interface (Polars, DuckDB, nanoarrow, ...), batch by batch
(never materialised, never converted through pandas or Python rows)."""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional, Protocol, Union, runtime_checkable

import pyarrow as pa


@runtime_checkable
class ArrowStreamExportable(Protocol):
    """Any object that exports its data as an Arrow C stream: the Arrow PyCapsule interface
    (https://arrow.apache.org/docs/format/CDataInterface/PyCapsuleInterface.html), which Polars
    DataFrames, DuckDB relations, nanoarrow streams, pyarrow and pandas through pyarrow have."""

    def __arrow_c_stream__(self, requested_schema: Optional[object] = None) -> object: ...


# What `Execution.write` accepts.
ArrowData = Union[
    "pa.Table", "pa.RecordBatch", "pa.RecordBatchReader", ArrowStreamExportable, Iterable["pa.RecordBatch"]
]

COMPRESSIONS = ("zstd", "gzip", "none")


@dataclass(frozen=True)
class Body:
    """One batch request body: the IPC stream as sent (after compression)."""

    payload: bytes
    content_encoding: Optional[str]
    rows: int
    ipc_bytes: int


def record_batches(data: ArrowData) -> tuple[Optional[Any], Iterator[Any]]:
    """(schema or None when unknown yet, an iterator of record batches) of any accepted input."""
    if isinstance(data, pa.Table):
        return data.schema, iter(data.to_batches())
    if isinstance(data, pa.RecordBatch):
        return data.schema, iter([data])
    if isinstance(data, pa.RecordBatchReader):
        return data.schema, iter(data)
    if isinstance(data, ArrowStreamExportable):
        # The producer's own stream, imported without a copy and read batch by batch.
        reader = pa.RecordBatchReader.from_stream(data)
        return reader.schema, iter(reader)
    if isinstance(data, (str, bytes, dict)):
        raise TypeError(
            "write() takes a pyarrow Table, RecordBatch, RecordBatchReader, list of RecordBatches, or any object "
            "with __arrow_c_stream__ (Polars, DuckDB, nanoarrow)"
        )
    batches = iter(data)
    return None, batches


def _split(batch: Any, cap: int) -> Iterator[Any]:
    """Slices of `batch` whose IPC size is at most `cap` (a single row may exceed it)."""
    size = pa.ipc.get_record_batch_size(batch)
    if size <= cap or batch.num_rows <= 1:
        yield batch
        return
    rows = max(1, int(batch.num_rows * cap / size * 0.9))
    for offset in range(0, batch.num_rows, rows):
        yield from _split(batch.slice(offset, rows), cap)


def _encode(schema: Any, batches: list[Any]) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def compress(ipc: bytes, compression: str) -> tuple[bytes, Optional[str]]:
    if compression == "zstd":
        return bytes(pa.compress(ipc, codec="zstd", asbytes=True)), "zstd"
    if compression == "gzip":
        return gzip.compress(ipc, compresslevel=6), "gzip"
    if compression == "none":
        return ipc, None
    raise ValueError(f"compression must be one of {COMPRESSIONS}, not {compression!r}")


def bodies(data: ArrowData, max_body_bytes: int, compression: str) -> Iterator[Body]:
    """The bodies of `data`, in row order, each an IPC stream of at most `max_body_bytes`
    (before compression) unless a single row is larger. Empty batches are skipped; no rows, no
    bodies."""
    if max_body_bytes < 1024:
        raise ValueError("max_body_bytes must be at least 1024")
    schema, batches = record_batches(data)
    pending: list[Any] = []
    pending_rows = 0
    pending_size = 0
    overhead = 0
    for batch in batches:
        if not isinstance(batch, pa.RecordBatch):
            raise TypeError(f"expected pyarrow.RecordBatch items, got {type(batch).__name__}")
        if schema is None:
            schema = batch.schema
        elif not batch.schema.equals(schema):
            raise ValueError("every record batch of one write must have the same schema")
        if not overhead:
            # Schema message, end-of-stream marker and some slack for message framing.
            overhead = len(schema.serialize()) + 64
        if batch.num_rows == 0:
            continue
        for piece in _split(batch, max(1, max_body_bytes - overhead)):
            size = pa.ipc.get_record_batch_size(piece) + 16
            if pending and overhead + pending_size + size > max_body_bytes:
                yield _body(schema, pending, pending_rows, compression)
                pending, pending_rows, pending_size = [], 0, 0
            pending.append(piece)
            pending_rows += piece.num_rows
            pending_size += size
    if pending:
        yield _body(schema, pending, pending_rows, compression)


def _body(schema: Any, batches: list[Any], rows: int, compression: str) -> Body:
    ipc = _encode(schema, batches)
    payload, encoding = compress(ipc, compression)
    return Body(payload=payload, content_encoding=encoding, rows=rows, ipc_bytes=len(ipc))
