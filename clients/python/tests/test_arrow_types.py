"""The typed-column helpers and field metadata in encoded bodies (no gateway)."""

from __future__ import annotations

import datetime as dt
from typing import Any, Callable, Iterator

import pyarrow as pa
import pytest

from conftest import decode_body
from filament_bigquery import bodies, geography_field, json_field, mark, range_field

EXT = b"ARROW:extension:name"
BQ = b"bigquery_type"

POINT_WKB = bytes.fromhex("0101000000000000000000f03f0000000000000040")  # POINT (1 2)


def test_json_field() -> None:
    field = json_field("payload")
    assert field.name == "payload" and field.type == pa.utf8() and field.nullable
    assert field.metadata == {EXT: b"arrow.json"}
    assert not json_field("payload", nullable=False).nullable


@pytest.mark.parametrize(
    "encoding, arrow_type, metadata",
    [
        ("wkb", pa.binary(), {EXT: b"geoarrow.wkb"}),
        ("wkt", pa.utf8(), {EXT: b"geoarrow.wkt"}),
        ("text", pa.utf8(), {BQ: b"GEOGRAPHY"}),
    ],
)
def test_geography_field(encoding: str, arrow_type: pa.DataType, metadata: dict[bytes, bytes]) -> None:
    field = geography_field("shape", encoding)
    assert field.name == "shape" and field.type == arrow_type and field.nullable
    assert field.metadata == metadata
    assert not geography_field("shape", encoding, nullable=False).nullable


def test_geography_field_defaults_to_wkb() -> None:
    assert geography_field("shape").equals(geography_field("shape", "wkb"), check_metadata=True)


@pytest.mark.parametrize("encoding", ["geojson", "WKB", ""])
def test_geography_field_refuses_other_encodings(encoding: str) -> None:
    with pytest.raises(ValueError) as refused:
        geography_field("shape", encoding)
    for allowed in ("wkb", "wkt", "text"):
        assert f"'{allowed}'" in str(refused.value)


@pytest.mark.parametrize(
    "element",
    [pa.date32(), pa.timestamp("us"), pa.timestamp("ns"), pa.timestamp("us", tz="UTC"), pa.timestamp("s", tz="+02:00")],
)
def test_range_field(element: pa.DataType) -> None:
    field = range_field("validity", element)
    assert field.name == "validity" and field.nullable
    assert field.type == pa.struct([pa.field("start", element), pa.field("end", element)])
    assert [child.nullable for child in field.type] == [True, True]
    assert field.metadata == {BQ: b"RANGE"}
    assert not range_field("validity", element, nullable=False).nullable


@pytest.mark.parametrize("element", [pa.date64(), pa.int64(), pa.utf8(), pa.time64("us"), "date32"])
def test_range_field_refuses_other_elements(element: Any) -> None:
    with pytest.raises(ValueError, match="date32 or a timestamp"):
        range_field("validity", element)


def geo_table() -> pa.Table:
    """A table as GeoPandas/DuckDB hand it over: a WKB column with its own metadata, plain
    strings for JSON and GeoJSON, schema metadata."""
    schema = pa.schema(
        [
            pa.field("id", pa.int64()),
            pa.field("first name", pa.binary(), metadata={"crs": "OGC:CRS84", "origin": "duckdb"}),
            pa.field("Größe", pa.utf8()),
        ],
        metadata={"pandas": "{}"},
    )
    return pa.table([[1, 2], [POINT_WKB, None], ['{"a": 1}', None]], schema=schema)


def check_marked(marked: Any, data: Any) -> None:
    assert type(marked) is type(data)
    assert marked.equals(data)
    assert marked.schema.field("first name").metadata == {
        b"crs": b"OGC:CRS84",
        b"origin": b"duckdb",
        BQ: b"GEOGRAPHY",
    }
    assert marked.schema.field("Größe").metadata == {BQ: b"JSON"}
    assert marked.schema.field("id").metadata is None
    assert marked.schema.metadata == {b"pandas": b"{}"}
    # The input is left as it was.
    assert data.schema.equals(geo_table().schema, check_metadata=True)


def test_mark_table_keeps_other_metadata() -> None:
    data = geo_table()
    marked = mark(mark(data, "first name", "GEOGRAPHY"), "Größe", "json")
    check_marked(marked, data)


def test_mark_record_batch_keeps_other_metadata() -> None:
    data = geo_table().to_batches()[0]
    marked = mark(mark(data, "first name", "geography"), "Größe", "JSON")
    check_marked(marked, data)


def test_mark_reader_marks_schema_and_batches() -> None:
    table = pa.concat_tables([geo_table(), geo_table()])
    reader = pa.RecordBatchReader.from_batches(table.schema, table.to_batches())
    marked = mark(reader, "Größe", "JSON")
    assert isinstance(marked, pa.RecordBatchReader)
    assert marked.schema.field("Größe").metadata == {BQ: b"JSON"}
    batches = list(marked)
    assert len(batches) == 2
    assert all(batch.schema.field("Größe").metadata == {BQ: b"JSON"} for batch in batches)
    assert pa.Table.from_batches(batches).equals(table)


def test_mark_replaces_an_earlier_bigquery_type() -> None:
    marked = mark(mark(geo_table(), "Größe", "JSON"), "Größe", "Geography")
    assert marked.schema.field("Größe").metadata == {BQ: b"GEOGRAPHY"}


@pytest.mark.parametrize("bigquery_type", ["STRING", "INTERVAL", "RANGE<DATE>", ""])
def test_mark_refuses_other_types(bigquery_type: str) -> None:
    with pytest.raises(ValueError) as refused:
        mark(geo_table(), "Größe", bigquery_type)
    for allowed in ("JSON", "GEOGRAPHY", "RANGE"):
        assert f"'{allowed}'" in str(refused.value)


def test_mark_refuses_a_missing_or_ambiguous_column() -> None:
    with pytest.raises(ValueError, match="no column named 'groesse'"):
        mark(geo_table(), "groesse", "JSON")
    twice = pa.table([[1], ["{}"], ["[]"]], names=["id", "doc", "doc"])
    with pytest.raises(ValueError, match="2 columns named 'doc'"):
        mark(twice, "doc", "JSON")


def test_mark_refuses_other_inputs() -> None:
    with pytest.raises(TypeError):
        mark({"Größe": ['{"a": 1}']}, "Größe", "JSON")


# Encoded bodies keep field metadata and flexible column names, for every accepted input.

TIMESTAMP_RANGE = pa.struct([pa.field("start", pa.timestamp("us", "UTC")), pa.field("end", pa.timestamp("us", "UTC"))])
NAMES = ["id", "Größe", "first name", "revenue-2024", "a&b", "validity", "opened", "wait", "took"]


def typed_table(rows: int) -> pa.Table:
    """One column of each typed kind, under flexible column names, in several chunks."""
    day = dt.date(2024, 1, 1)
    at = dt.datetime(2024, 1, 1, 12, 0)
    chunks = []
    for start in range(0, rows, 100):
        ids = range(start, min(rows, start + 100))
        columns = {
            "id": pa.array(ids, pa.int64()),
            "Größe": pa.array([f'{{"n": {i}, "pad": "{"x" * 40}"}}' for i in ids]),
            "first name": pa.array([POINT_WKB] * len(ids)),
            "revenue-2024": pa.array(
                [f"POINT({i % 180} 1)" if i % 2 else '{"type": "Point", "coordinates": [1, 2]}' for i in ids]
            ),
            "a&b": pa.array([f"LINESTRING(0 0, {i % 90} 1)" for i in ids]),
            "validity": pa.array(
                [{"start": day, "end": None if i % 3 == 0 else day + dt.timedelta(days=i)} for i in ids],
                pa.struct([pa.field("start", pa.date32()), pa.field("end", pa.date32())]),
            ),
            "opened": pa.array(
                [{"start": None, "end": at + dt.timedelta(minutes=i)} for i in ids],
                TIMESTAMP_RANGE,
            ),
            "wait": pa.array([pa.MonthDayNano([i % 12, i % 28, i * 1000]) for i in ids], pa.month_day_nano_interval()),
            "took": pa.array([dt.timedelta(seconds=i) for i in ids], pa.duration("us")),
        }
        chunks.append(pa.table(columns))
    table = pa.concat_tables(chunks)
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            json_field("Größe"),
            geography_field("first name", "wkb"),
            geography_field("revenue-2024", "text"),
            pa.field("a&b", pa.utf8(), metadata={"note": "kept"}),
            range_field("validity", pa.date32()),
            pa.field("opened", TIMESTAMP_RANGE),
            pa.field("wait", pa.month_day_nano_interval()),
            pa.field("took", pa.duration("us")),
        ],
        metadata={"source": "test"},
    )
    table = table.cast(schema)
    table = mark(mark(table, "a&b", "geography"), "opened", "RANGE")
    assert isinstance(table, pa.Table) and table.num_rows == rows
    return table


def as_sent(table: pa.Table) -> pa.Table:
    """`table` with extension types pyarrow recognised when reading (`arrow.json`) turned back
    into their storage type and the `ARROW:extension:name` field metadata they came from."""
    fields, columns = [], []
    for field, column in zip(table.schema, table.columns, strict=True):
        if isinstance(field.type, pa.BaseExtensionType):
            metadata = dict(field.metadata or {})
            metadata[EXT] = field.type.extension_name.encode()
            column = pa.chunked_array([chunk.storage for chunk in column.chunks], field.type.storage_type)
            field = pa.field(field.name, field.type.storage_type, field.nullable, metadata)
        fields.append(field)
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=pa.schema(fields, metadata=table.schema.metadata))


INPUTS: dict[str, Callable[[pa.Table], Any]] = {
    "table": lambda t: t,
    "record_batch": lambda t: t.combine_chunks().to_batches()[0],
    "reader": lambda t: pa.RecordBatchReader.from_batches(t.schema, t.to_batches()),
    "batch_list": lambda t: t.to_batches(),
    "batch_generator": lambda t: (b for b in t.to_batches()),
}


@pytest.mark.parametrize("compression", ["none", "gzip", "zstd"])
@pytest.mark.parametrize("kind", sorted(INPUTS))
def test_bodies_keep_field_metadata_and_names(kind: str, compression: str) -> None:
    table = typed_table(1000)
    out = list(bodies(INPUTS[kind](table), 32 * 1024, compression))
    assert len(out) > 1  # every body carries the schema, not only the first
    decoded = [as_sent(decode_body(body)) for body in out]
    for part in decoded:
        assert part.schema.names == NAMES
        assert part.schema.equals(table.schema, check_metadata=True), part.schema
    assert pa.concat_tables(decoded).equals(table, check_metadata=True)


def test_bodies_keep_metadata_of_a_marked_reader() -> None:
    table = geo_table()

    def generate() -> Iterator[pa.RecordBatch]:
        yield from table.to_batches()

    reader = mark(pa.RecordBatchReader.from_batches(table.schema, generate()), "Größe", "JSON")
    (body,) = bodies(reader, 1 << 20, "zstd")
    sent = decode_body(body)
    assert sent.schema.field("Größe").metadata == {BQ: b"JSON"}
    assert sent.schema.field("first name").metadata == {b"crs": b"OGC:CRS84", b"origin": b"duckdb"}
    assert sent.equals(table)
