"""What a dlt load becomes at the gateway: run and execution ids, one resource per table (and
its write mode), and the Arrow schema each table is sent with. Pure functions of dlt's schema,
so they are tested without a gateway."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence

import pyarrow as pa
from dlt.common.schema import Schema, TColumnSchema, TTableSchema
from dlt.common.schema.utils import get_columns_names_with_prop, get_nested_tables, get_root_table, is_nested_table

from .._types import WriteMode
from ..arrow_types import EXTENSION_NAME

# dlt's own tables: its loads, its schema versions and the pipeline state (which comes as a
# file of the package like any table).
LOADS_TABLE = "_dlt_loads"
VERSION_TABLE = "_dlt_version"
# The suffix of the resource that deletes the nested rows of the keys a merge rewrites.
STALE_NESTED_SUFFIX = ".stale_nested_rows"

_ID_MAX = 64
_PREFIX_MAX = 36
_ID_ALLOWED = re.compile(r"[^A-Za-z0-9_-]")


class UnsupportedHint(ValueError):
    """A dlt table hint the gateway has no faithful mapping for (the message names the table,
    the hint and what to do)."""


def execution_id_for(load_id: str) -> str:
    """The execution id of a dlt load: its load id (`1733290000.123456`) in the gateway's id
    alphabet (`1733290000_123456`). A retried load is therefore a redelivery of the same
    execution."""
    return _fit(_ID_ALLOWED.sub("_", load_id), load_id)


def run_id_for(pipeline_name: str, project: str, dataset: str, load_id: str, prefix: str = "") -> str:
    """One run per dlt load: `<prefix>dlt_<pipeline>_<hash of pipeline, project, dataset>_<load id>`.

    A run per load (rather than one run per pipeline) because `full_replace` replaces only in
    a run's first committed execution: every dlt `replace` load must replace. The hash keeps
    two pipelines (or two datasets of one pipeline) apart whatever their names. `prefix` (the
    principal's `run_id_prefix`, at most 36 characters of the id alphabet) is kept whole; the
    rest is shortened to fit the gateway's 64 characters."""
    if prefix and (len(prefix) > _PREFIX_MAX or _ID_ALLOWED.search(prefix)):
        raise ValueError(f"run_id_prefix must be 1 to {_PREFIX_MAX} letters, digits, - or _, not {prefix!r}")
    digest = hashlib.sha256("\0".join((pipeline_name, project, dataset)).encode()).hexdigest()[:10]
    readable = _ID_ALLOWED.sub("_", pipeline_name)[:20]
    rest = f"dlt_{readable}_{digest}_{execution_id_for(load_id)}"
    return prefix + _fit(rest, f"{pipeline_name}\0{dataset}\0{load_id}", _ID_MAX - len(prefix))


def _fit(candidate: str, original: str, limit: int = _ID_MAX) -> str:
    if len(candidate) <= limit:
        return candidate
    return candidate[: limit - 17] + "_" + hashlib.sha256(original.encode()).hexdigest()[:16]


@dataclass
class TablePlan:
    """One destination table of a load and the gateway resource(s) that write it."""

    table: str
    write_mode: WriteMode
    primary_key: list[str] = field(default_factory=list)
    # `merge` with a `hard_delete` column: `cdc_merge`, each row's `_filament_op` from it.
    hard_delete_column: Optional[str] = None
    # Nested table of a merge: the rows of every key the load rewrites are first deleted by
    # `_dlt_root_id` (a second resource, `<table>.stale_nested_rows`, `incremental_delete`).
    deletes_stale_nested_rows: bool = False
    files: list[str] = field(default_factory=list)

    @property
    def resource(self) -> str:
        return self.table

    @property
    def stale_resource(self) -> str:
        return self.table + STALE_NESTED_SUFFIX


def plan_table(schema: Schema, table_name: str) -> TablePlan:
    """The gateway write mode of one dlt table, from its root table's write disposition.

    `append` -> `incremental_append`; `replace` -> `full_replace` (nested tables too: dlt
    replaces a table chain); `merge` (dlt's `upsert` strategy, the only one this destination
    offers) -> `incremental_upsert` on the primary key, or `cdc_merge` when a column carries
    the `hard_delete` hint; the nested tables of a merge table are appended after their
    rewritten keys' rows are deleted by `_dlt_root_id`. dlt's own tables are appended."""
    tables = schema.tables
    if table_name in (LOADS_TABLE, VERSION_TABLE):
        return TablePlan(table_name, "incremental_append")
    table = tables[table_name]
    root = get_root_table(tables, table_name)
    disposition = root.get("write_disposition", "append")
    if disposition in ("append", "skip"):
        return TablePlan(table_name, "incremental_append")
    if disposition == "replace":
        return TablePlan(table_name, "full_replace")
    if disposition != "merge":
        raise UnsupportedHint(f"table {table_name}: write disposition {disposition!r} has no gateway write mode")
    _refuse_unmapped_merge_hints(root)
    strategy = root.get("x-merge-strategy", "upsert")
    if strategy != "upsert":
        raise UnsupportedHint(
            f"table {root['name']}: merge strategy {strategy!r} is not supported by the filament destination "
            "(only 'upsert', the gateway's keyed MERGE); declare write_disposition={'disposition': 'merge', "
            "'strategy': 'upsert'} or leave the strategy unset"
        )
    if is_nested_table(table):
        if "_dlt_root_id" not in table.get("columns", {}):
            raise UnsupportedHint(
                f"table {table_name}: a nested table of merge table {root['name']} has no _dlt_root_id column, so its "
                "rows of a rewritten key cannot be found"
            )
        return TablePlan(table_name, "incremental_append", deletes_stale_nested_rows=True)
    primary_key = get_columns_names_with_prop(table, "primary_key")
    if not primary_key:
        raise UnsupportedHint(
            f"table {table_name}: merge needs a primary_key (the gateway's upsert matches rows by key); set "
            "primary_key= on the resource, or use write_disposition='append' or 'replace'"
        )
    hard_delete = get_columns_names_with_prop(table, "hard_delete")
    if len(hard_delete) > 1:
        raise UnsupportedHint(f"table {table_name}: more than one hard_delete column ({hard_delete})")
    if hard_delete:
        return TablePlan(table_name, "cdc_merge", primary_key=primary_key, hard_delete_column=hard_delete[0])
    return TablePlan(table_name, "incremental_upsert", primary_key=primary_key)


def _refuse_unmapped_merge_hints(root: TTableSchema) -> None:
    name = root["name"]
    for hint, why in (
        ("merge_key", "the gateway's keyed modes match by primary key only; use primary_key"),
        ("dedup_sort", "the gateway keeps the last row of each key in load order; drop the hint"),
        ("row_key", "a user row_key replaces dlt's key hash of the primary key, which nested rows rely on"),
    ):
        columns = [c for c in get_columns_names_with_prop(root, hint) if not c.startswith("_dlt")]
        if columns:
            raise UnsupportedHint(f"table {name}: the {hint} hint ({', '.join(columns)}) has no gateway mapping: {why}")


def tables_of_load(schema: Schema, tables_with_files: Iterable[str]) -> list[str]:
    """Every table a load writes, parents before their nested tables: the tables with files,
    the whole nested chain of a `replace` root that has files (dlt empties a replaced chain's
    tables that got no rows) and of a `merge` root (their rows of rewritten keys go)."""
    tables = schema.tables
    with_files = set(tables_with_files)
    ordered: list[str] = []
    for name in sorted(with_files, key=lambda t: (is_nested_table(tables[t]) if t in tables else False, t)):
        if name not in tables:
            continue
        root = get_root_table(tables, name)
        chain = [name]
        if root.get("write_disposition") in ("replace", "merge"):
            chain = [str(t["name"]) for t in get_nested_tables(tables, str(root["name"]))]
        for member in chain:
            if member not in ordered and (member in with_files or _has_seen_data(tables[member])):
                ordered.append(member)
    return ordered


def _has_seen_data(table: TTableSchema) -> bool:
    normalizer: Any = table.get("x-normalizer") or {}
    return bool(normalizer.get("seen-data"))


# -- Arrow ------------------------------------------------------------------------------------

JSON_METADATA = {EXTENSION_NAME: "arrow.json"}


def arrow_field(name: str, column: Optional[TColumnSchema], data_type: Optional[pa.DataType] = None) -> pa.Field:
    """The Arrow field the gateway gets for a dlt column: `data_type` as dlt's file wrote it
    (or, without a file, the type dlt's column type names), with the adjustments the gateway
    needs: JSON columns marked `arrow.json`, timestamps and times in microseconds."""
    kind = (column or {}).get("data_type")
    if data_type is None:
        data_type = _arrow_type(column or {"name": name})
    if kind == "json":
        return pa.field(name, pa.string(), metadata=JSON_METADATA)
    if pa.types.is_timestamp(data_type) and data_type.unit != "us":
        data_type = pa.timestamp("us", tz=data_type.tz)
    if pa.types.is_time(data_type) and data_type.unit == "ns":
        data_type = pa.time64("us")
    return pa.field(name, data_type)


def _arrow_type(column: TColumnSchema) -> pa.DataType:
    kind = column.get("data_type")
    if kind == "bigint":
        return pa.int64()
    if kind == "double":
        return pa.float64()
    if kind == "bool":
        return pa.bool_()
    if kind == "timestamp":
        return pa.timestamp("us", tz=None if column.get("timezone") is False else "UTC")
    if kind == "date":
        return pa.date32()
    if kind == "time":
        return pa.time64("us")
    if kind == "binary":
        return pa.binary()
    if kind == "decimal":
        return pa.decimal128(column.get("precision") or 38, column.get("scale") or 9)
    if kind == "wei":
        return pa.decimal256(76, 0)
    return pa.string()  # text, json and columns without a type yet


def table_arrow_schema(
    columns: Mapping[str, TColumnSchema], file_schemas: Sequence[pa.Schema] = ()
) -> pa.Schema:
    """One schema for every body of a table in a load: dlt rotates files when columns are
    added, and the gateway wants one schema per resource and execution. Columns in the order
    of dlt's schema, each typed as its files wrote it (dlt's type for a column no file has)."""
    written: dict[str, pa.DataType] = {}
    for file_schema in file_schemas:
        for f in file_schema:
            written.setdefault(f.name, f.type)
    names = [n for n in columns if n in written or not file_schemas]
    names += [n for n in written if n not in columns]
    return pa.schema([arrow_field(n, columns.get(n), written.get(n)) for n in names])


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """`batch` in `schema`: missing columns null, types cast (units, JSON text), metadata set."""
    arrays = []
    for target in schema:
        index = batch.schema.get_field_index(target.name)
        if index < 0:
            arrays.append(pa.nulls(batch.num_rows, target.type))
            continue
        array = batch.column(index)
        if not array.type.equals(target.type):
            array = _to_json_text(array) if target.metadata == _metadata_bytes(JSON_METADATA) else array.cast(target.type)
        arrays.append(array)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _metadata_bytes(metadata: Mapping[str, str]) -> dict[bytes, bytes]:
    return {k.encode(): v.encode() for k, v in metadata.items()}


def _to_json_text(array: pa.Array) -> pa.Array:
    """A JSON column dlt wrote as something other than text (a struct, a list): each value as
    one JSON document."""
    import json

    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        return array.cast(pa.string())
    values: list[Optional[str]] = [None if v is None else json.dumps(v, default=str) for v in array.to_pylist()]
    return pa.array(values, pa.string())


def rows_table(schema_columns: Mapping[str, TColumnSchema], rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """A small table of dlt's own rows (`_dlt_loads`, `_dlt_version`) typed by its dlt columns."""
    schema = table_arrow_schema(schema_columns)
    return pa.Table.from_pylist([dict(r) for r in rows], schema=schema)
