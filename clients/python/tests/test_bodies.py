"""Splitting and encoding of batch bodies (no gateway)."""

from __future__ import annotations

from typing import Iterator

import pyarrow as pa
import pytest

from conftest import decode_body
from filament_bigquery import bodies


def table(rows: int, start: int = 0) -> pa.Table:
    ids = list(range(start, start + rows))
    return pa.table({"id": pa.array(ids, pa.int64()), "name": pa.array([f"name-{i:08d}" * 4 for i in ids])})


@pytest.mark.parametrize("compression", ["none", "gzip", "zstd"])
def test_split_keeps_order_and_limit(compression: str) -> None:
    data = table(20_000)
    out = list(bodies(data, 64 * 1024, compression))
    assert len(out) > 5
    ipc_sizes = [b.ipc_bytes for b in out]
    assert max(ipc_sizes) <= 64 * 1024
    decoded = pa.concat_tables([decode_body(b) for b in out])
    assert decoded.equals(data)
    assert sum(b.rows for b in out) == 20_000
    assert all(b.content_encoding == (None if compression == "none" else compression) for b in out)


def test_small_batches_are_coalesced_and_empty_ones_skipped() -> None:
    batches = [b for i in range(50) for b in table(10, i * 10).to_batches()]
    batches.insert(3, batches[0].slice(0, 0))
    out = list(bodies(batches, 1 << 20, "none"))
    assert len(out) == 1 and out[0].rows == 500
    assert list(bodies([], 1 << 20, "none")) == []


def test_reader_is_streamed_not_materialised() -> None:
    produced: list[int] = []
    schema = table(1).schema

    def generate() -> Iterator[pa.RecordBatch]:
        for i in range(40):
            produced.append(i)
            yield table(1000, i * 1000).to_batches()[0]

    reader = pa.RecordBatchReader.from_batches(schema, generate())
    stream = bodies(reader, 100 * 1024, "none")
    first = next(stream)
    # Only as many source batches as the first body needed were pulled from the reader.
    assert first.rows < 40_000 and len(produced) < 40
    rest = list(stream)
    assert first.rows + sum(b.rows for b in rest) == 40_000


def test_mixed_schemas_are_refused() -> None:
    with pytest.raises(ValueError):
        list(bodies([table(2).to_batches()[0], pa.record_batch({"x": [1]})], 1 << 20, "none"))
