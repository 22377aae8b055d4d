"""Arrow data of other producers, through the Arrow PyCapsule stream interface
(`__arrow_c_stream__`), against the real gateway (issue 55): Polars DataFrames and DuckDB
relations load with exactly their values, without pandas or Python rows on the way."""

from __future__ import annotations

import datetime as dt
import decimal
import sys
from typing import Any, Iterator, Optional

import pyarrow as pa
import pytest

from conftest import PROJECT, TOKEN, Gateway, query
from filament_bigquery import ArrowStreamExportable, Client, bodies

pl = pytest.importorskip("polars")
duckdb = pytest.importorskip("duckdb")


@pytest.fixture(autouse=True)
def no_pandas(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any `import pandas` fails in these tests: no conversion goes through it."""
    monkeypatch.setitem(sys.modules, "pandas", None)


class StreamOnly:
    """An object with nothing but `__arrow_c_stream__` (what nanoarrow or any other producer
    may hand over), counting the exports."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.exports = 0

    def __arrow_c_stream__(self, requested_schema: Optional[object] = None) -> object:
        self.exports += 1
        return self._inner.__arrow_c_stream__(requested_schema)


@pytest.fixture
def client(gateway: Gateway) -> Iterator[Client]:
    with Client(gateway.url, token=TOKEN) as c:
        yield c


def timestamp_micros(value: Optional[str]) -> Optional[int]:
    """A TIMESTAMP as the REST API answers it: seconds (`1.7E9`, BigQuery) or microseconds
    (the emulator) since the epoch, as text."""
    if value is None:
        return None
    if value.lstrip("-").isdigit():
        return int(value)
    return int(decimal.Decimal(value) * 1_000_000)


def values(dataset: str, table: str, columns: str) -> list[dict[str, Any]]:
    return query(f"SELECT {columns} FROM `{PROJECT}.{dataset}.{table}` ORDER BY id")


def test_a_polars_dataframe_loads_exactly(client: Client, dataset: str) -> None:
    at = dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=dt.timezone.utc)
    frame = pl.DataFrame(
        {
            "id": pl.Series([-1, 2**62, 3], dtype=pl.Int64),
            "name": ["Grüße ✓", None, ""],
            "score": [0.1, -2.5e-300, None],
            "active": [True, False, None],
            "day": [dt.date(1, 1, 1), dt.date(2024, 2, 29), dt.date(9999, 12, 31)],
            "happened_at": pl.Series([at, None, at], dtype=pl.Datetime("us", "UTC")),
            "amount": pl.Series(
                [decimal.Decimal("12345678901234567890.123456789"), decimal.Decimal("-0.000000001"), None],
                dtype=pl.Decimal(38, 9),
            ),
            "tags": [[1, 2**40], [], None],
        }
    )
    # Polars exports strings as Utf8View and lists as LargeList: sent as exported.
    exported = pa.RecordBatchReader.from_stream(frame).schema
    assert exported.field("name").type == pa.string_view() and pa.types.is_large_list(exported.field("tags").type)
    assert isinstance(frame, ArrowStreamExportable)

    run = client.create_run(project=PROJECT, dataset=dataset)
    run.declare("polars", write_mode="full_append")
    with run.execution() as ex:
        result = ex.write("polars", frame)
    assert result.rows == 3
    got = values(
        dataset,
        "polars",
        "id, name, score, active, CAST(day AS STRING) AS day, happened_at, CAST(amount AS STRING) AS amount, tags",
    )
    assert [(int(r["id"]), r["name"]) for r in got] == [(-1, "Grüße ✓"), (3, ""), (2**62, None)]
    assert [None if r["score"] is None else float(r["score"]) for r in got] == [0.1, None, -2.5e-300]
    assert [r["active"] for r in got] == ["true", None, "false"]
    assert [r["day"] for r in got] == ["0001-01-01", "9999-12-31", "2024-02-29"]
    micros = (at - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) // dt.timedelta(microseconds=1)
    assert [timestamp_micros(r["happened_at"]) for r in got] == [micros, micros, None]
    assert [None if r["amount"] is None else decimal.Decimal(r["amount"]) for r in got] == [
        decimal.Decimal("12345678901234567890.123456789"), None, decimal.Decimal("-0.000000001")
    ]
    # A null list is written as an empty array (docs/type-mapping.md).
    assert [[int(v["v"]) for v in r["tags"]] for r in got] == [[1, 2**40], [], []]


def test_a_duckdb_relation_streams_in_bodies_and_loads_exactly(client: Client, dataset: str) -> None:
    con = duckdb.connect()
    sql = (
        "SELECT i::BIGINT AS id, 'row-' || i AS name, i * 0.25 AS score, DATE '2024-01-01' + i::INTEGER AS day, "
        "(i::DECIMAL(18, 3) / 8)::DECIMAL(18, 3) AS amount, [i, i + 1] AS pair, "
        "TIMESTAMPTZ '2024-01-01 00:00:00+00' + i * INTERVAL 1 SECOND AS happened_at FROM range(20000) t(i)"
    )
    relation = con.sql(sql)
    assert isinstance(relation, ArrowStreamExportable)
    run = client.create_run(project=PROJECT, dataset=dataset)
    run.declare("duck", write_mode="full_append")
    with run.execution(max_body_bytes=128 * 1024) as ex:
        result = ex.write("duck", relation)
    assert result.rows == 20_000 and result.bodies > 1
    totals = query(
        f"SELECT COUNT(*) AS n, SUM(id) AS ids, SUM(score) AS scores, CAST(SUM(amount) AS STRING) AS amounts, "
        f"SUM(pair[OFFSET(1)]) AS seconds, MAX(day) AS last, MAX(happened_at) AS latest FROM `{PROJECT}.{dataset}.duck`"
    )[0]
    n = 20_000
    assert (int(totals["n"]), int(totals["ids"]), int(totals["seconds"])) == (n, n * (n - 1) // 2, n * (n + 1) // 2)
    assert float(totals["scores"]) == sum(i * 0.25 for i in range(n))
    expected_amounts = sum((decimal.Decimal(i) / 8).quantize(decimal.Decimal("0.001")) for i in range(n))
    assert decimal.Decimal(totals["amounts"]) == expected_amounts
    assert totals["last"] == str(dt.date(2024, 1, 1) + dt.timedelta(days=n - 1))
    latest = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=n - 1)
    assert timestamp_micros(totals["latest"]) == latest.timestamp() * 1_000_000
    (one,) = query(f"SELECT name, CAST(amount AS STRING) AS amount, pair FROM `{PROJECT}.{dataset}.duck` WHERE id = 12345")
    assert (one["name"], decimal.Decimal(one["amount"])) == ("row-12345", decimal.Decimal("1543.125"))
    assert [int(v["v"]) for v in one["pair"]] == [12_345, 12_346]


def test_an_object_with_only_the_stream_interface_is_read_through_it(client: Client, dataset: str) -> None:
    frame = pl.DataFrame({"id": list(range(1000)), "text": [f"{i:06d}" for i in range(1000)]})
    stream = StreamOnly(frame)
    # Batch by batch into bodies, without materialising the frame through any other API.
    sent = list(bodies(StreamOnly(frame), 4096, "none"))
    assert len(sent) > 1 and sum(b.rows for b in sent) == 1000
    run = client.create_run(project=PROJECT, dataset=dataset)
    run.declare("stream", write_mode="full_append")
    with run.execution() as ex:
        ex.write("stream", stream)
    assert stream.exports == 1
    got = query(f"SELECT COUNT(*) AS n, SUM(id) AS s, MAX(text) AS m FROM `{PROJECT}.{dataset}.stream`")[0]
    assert (int(got["n"]), int(got["s"]), got["m"]) == (1000, sum(range(1000)), "000999")


def test_pandas_is_not_importable_here() -> None:
    """The guard of this file works: a conversion through pandas would fail the tests above."""
    with pytest.raises(ImportError):
        import pandas  # noqa: F401
