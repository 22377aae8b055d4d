"""Arrow fields the gateway loads as BigQuery JSON, GEOGRAPHY and RANGE columns.

The gateway reads the BigQuery type from field metadata: the canonical extension names
(`ARROW:extension:name`: `arrow.json`, `geoarrow.wkb`, `geoarrow.wkt`) or `bigquery_type`.
INTERVAL needs nothing: `pa.month_day_nano_interval()` and `pa.duration(unit)` columns are
INTERVAL as they are."""

from __future__ import annotations

from typing import Union

import pyarrow as pa

__all__ = ["GEOGRAPHY_ENCODINGS", "MARKABLE_TYPES", "geography_field", "json_field", "mark", "range_field"]

EXTENSION_NAME = "ARROW:extension:name"
BIGQUERY_TYPE = "bigquery_type"

# `geography_field` encodings: WKB bytes, WKT strings, or strings holding WKT or GeoJSON.
GEOGRAPHY_ENCODINGS = ("wkb", "wkt", "text")
# What `mark` sets as `bigquery_type`.
MARKABLE_TYPES = ("JSON", "GEOGRAPHY", "RANGE")

# What `mark` accepts and returns.
Markable = Union["pa.Table", "pa.RecordBatch", "pa.RecordBatchReader"]


def json_field(name: str, nullable: bool = True) -> pa.Field:
    """A utf8 field of the canonical `arrow.json` extension: a BigQuery JSON column. Each value
    must be one JSON document."""
    return pa.field(name, pa.utf8(), nullable=nullable, metadata={EXTENSION_NAME: "arrow.json"})


def geography_field(name: str, encoding: str = "wkb", nullable: bool = True) -> pa.Field:
    """A BigQuery GEOGRAPHY field, longitude/latitude (WGS84). `encoding`: `"wkb"`, binary
    `geoarrow.wkb`; `"wkt"`, utf8 `geoarrow.wkt`; `"text"`, utf8 with `bigquery_type=GEOGRAPHY`
    whose values are WKT or GeoJSON (a value starting with `{`)."""
    if encoding == "wkb":
        return pa.field(name, pa.binary(), nullable=nullable, metadata={EXTENSION_NAME: "geoarrow.wkb"})
    if encoding == "wkt":
        return pa.field(name, pa.utf8(), nullable=nullable, metadata={EXTENSION_NAME: "geoarrow.wkt"})
    if encoding == "text":
        return pa.field(name, pa.utf8(), nullable=nullable, metadata={BIGQUERY_TYPE: "GEOGRAPHY"})
    raise ValueError(f"encoding must be one of {GEOGRAPHY_ENCODINGS}, not {encoding!r}")


def range_field(name: str, element: pa.DataType, nullable: bool = True) -> pa.Field:
    """A BigQuery RANGE field: a struct of `start` and `end`, both of `element`, marked
    `bigquery_type=RANGE`. `element`: `pa.date32()` (RANGE<DATE>), a timestamp without a time
    zone (RANGE<DATETIME>) or with one (RANGE<TIMESTAMP>). A null bound is unbounded."""
    if not isinstance(element, pa.DataType) or not (pa.types.is_date32(element) or pa.types.is_timestamp(element)):
        raise ValueError(f"a RANGE element must be date32 or a timestamp, not {element}")
    children = [pa.field("start", element), pa.field("end", element)]
    return pa.field(name, pa.struct(children), nullable=nullable, metadata={BIGQUERY_TYPE: "RANGE"})


def mark(data: Markable, column: str, bigquery_type: str) -> Markable:
    """`data` (a Table, RecordBatch or RecordBatchReader) with the field metadata of the
    top-level column `column` gaining `bigquery_type` (`JSON`, `GEOGRAPHY` or `RANGE`, any
    case): for data from GeoPandas, DuckDB or Polars that cannot set it. The field's other
    metadata is kept; the column's type is checked by the gateway, not here."""
    wanted = bigquery_type.upper()
    if wanted not in MARKABLE_TYPES:
        raise ValueError(f"bigquery_type must be one of {MARKABLE_TYPES}, not {bigquery_type!r}")
    if not isinstance(data, (pa.Table, pa.RecordBatch, pa.RecordBatchReader)):
        raise TypeError(f"mark() takes a pyarrow Table, RecordBatch or RecordBatchReader, not {type(data).__name__}")
    schema = data.schema
    indices = [i for i, name in enumerate(schema.names) if name == column]
    if len(indices) != 1:
        problem = "no column" if not indices else f"{len(indices)} columns"
        raise ValueError(f"{problem} named {column!r} (columns: {schema.names})")
    index = indices[0]
    field = schema.field(index)
    metadata = dict(field.metadata or {})
    metadata[BIGQUERY_TYPE.encode()] = wanted.encode()
    marked = schema.set(index, field.with_metadata(metadata))
    if isinstance(data, pa.Table):
        return pa.Table.from_arrays(data.columns, schema=marked)
    if isinstance(data, pa.RecordBatch):
        return pa.RecordBatch.from_arrays(data.columns, schema=marked)
    batches = (pa.RecordBatch.from_arrays(batch.columns, schema=marked) for batch in data)
    return pa.RecordBatchReader.from_batches(marked, batches)
