#!/usr/bin/env python3
"""Writes the checked-in seed corpus of the `ingest` fuzz target (fuzz/corpus/ingest/).

Each seed is one byte of chunk-size hint followed by an Arrow IPC stream. Run with the tools
virtualenv (pyarrow): build/venv-tools/bin/python fuzz/make_corpus.py
"""
import datetime as dt
import pathlib

import pyarrow as pa

OUT = pathlib.Path(__file__).parent / "corpus" / "ingest"


def stream(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


SEEDS = {
    "common_types": pa.table({
        "id": pa.array([1, 2, None], pa.int64()),
        "flag": pa.array([True, None, False]),
        "small": pa.array([1, -2, 3], pa.int8()),
        "ratio": pa.array([0.5, None, 2.0], pa.float32()),
        "name": pa.array(["a", None, "ccc"]),
        "blob": pa.array([b"\x00", b"", None]),
        "day": pa.array([dt.date(2024, 1, 1), None, dt.date(1970, 1, 1)]),
        "at": pa.array([dt.datetime(2024, 1, 1), None, dt.datetime(2000, 2, 2)], pa.timestamp("us", tz="UTC")),
        "local": pa.array([dt.datetime(2024, 1, 1), None, None], pa.timestamp("ms")),
    }),
    "dictionary": pa.table({"tag": pa.array(["x", "y", "x"]).dictionary_encode()}),
    "nanoseconds": pa.table({"at": pa.array([1_000, 1_001], pa.timestamp("ns"))}),
    "large_and_view": pa.table({"s": pa.array(["a" * 300, "b"], pa.large_string()), "b": pa.array([b"x", b"y"], pa.large_binary())}),
    "date64": pa.table({"d": pa.array([86_400_000, 1], pa.date64())}),
    "unsupported": pa.table({"l": pa.array([[1, 2], []], pa.list_(pa.int64()))}),
    "empty": pa.table({"id": pa.array([], pa.int64())}),
}

OUT.mkdir(parents=True, exist_ok=True)
for name, table in SEEDS.items():
    for hint in (1, 255):
        (OUT / f"{name}_{hint}").write_bytes(bytes([hint]) + stream(table))
print(f"wrote {len(SEEDS) * 2} seeds to {OUT}")
