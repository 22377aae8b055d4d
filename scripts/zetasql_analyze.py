#!/usr/bin/env python3
"""A client of Google's GoogleSQL analyzer (ZetaSQL's local gRPC service, which
scripts/zetasql.sh installs and starts) that judges the SQL the gateway generates.

Run it with the tools virtualenv's python (scripts/services.sh installs grpcio and
grpcio-tools there and exports FILAMENT_TOOLS_PYTHON and FILAMENT_ZETASQL_CHECKER).

Why Python and not Rust: the service's protos are 32 files with deep imports (the resolved
AST alone is 234 messages in 5,000 lines); compiling them into the gateway crate
would put protoc and their compile time into every build for a client only the tests use,
whereas grpcio-tools bundles protoc and the Python stubs are generated once, at first use,
into build/zetasql/py/ (cached, keyed by the package and grpcio-tools versions).

Protocol: JSON Lines on stdin and stdout, one request per line, one answer per line in the
same order, flushed after each, until EOF, so one test process can keep a client open for
thousands of statements.

  request  {"id": "any string",
            "tables": [{"project": "my-project", "dataset": "raw", "table": "users",
                        "fields": [<TableFieldSchema JSON as tables.insert takes it>],
                        "default_collation": "und:ci"}],          (optional, see below)
            "sql": "MERGE `my-project`.`raw`.`users` AS T USING (...) ...",
            "mode": "statement" | "script"}                       (default "statement")
  answer   {"id": "...", "ok": true | false, "statements": <statements analyzed without error>,
            "errors": ["statement 2 (byte 120): <ZetaSQL's message>", ...]}

- "statement" analyzes one statement (a trailing `;` is allowed); "script" analyzes a
  sequence of statements one at a time through AnalyzeRequest.parse_resume_location, looping on
  the returned resume byte until only whitespace and comments remain, so
  `BEGIN TRANSACTION; TRUNCATE TABLE t; INSERT ...; COMMIT TRANSACTION;` is four statements.
  ZetaSQL cannot resume after an error, so a script's answer has at most one error, naming
  the statement (1-based) and the byte offset where it starts; ZetaSQL's own `[at line:col]`
  counts from the start of the whole request's sql.
- A request that is not valid JSON, lacks "sql", names an unknown BigQuery type, etc. gets
  `"ok": false` with an error starting "malformed request:" and `"malformed": true`.
- If the analyzer itself cannot be reached (not started, crashed), the client writes the
  reason to stderr and exits with status 3 rather than answer: a missing judge must never
  look like a refusal.

Catalog: project -> dataset -> table nested catalogs, so three-part names such as
`my-project`.`raw`.`users` (a project id may hold '-', ':' and '.') resolve; a whole path in
one pair of backticks (`my-project.raw.users`), which BigQuery splits, resolves too. Fields
convert as BigQuery types them: INT64/INTEGER, FLOAT64/FLOAT, NUMERIC/DECIMAL,
BIGNUMERIC/BIGDECIMAL, BOOL/BOOLEAN, STRING, BYTES, DATE, DATETIME, TIME, TIMESTAMP, JSON,
GEOGRAPHY, INTERVAL, RANGE (rangeElementType), RECORD/STRUCT (nested "fields"); mode REPEATED
makes an ARRAY. A field's "collation" (or, for STRING fields without one, the table's
optional "default_collation", BigQuery's defaultCollation) becomes ZetaSQL's collation
annotation. ZetaSQL's builtin functions are in the catalog, under the same language options.
Column, table and catalog names are looked up case-insensitively (BigQuery: columns are
case-insensitive, dataset and table names are case-sensitive; ZetaSQL's simple catalog
cannot be made case-sensitive).

Language options, as close to BigQuery as this ZetaSQL build allows:
- every LanguageFeature that ZetaSQL marks released and ideally enabled (its "maximum
  features", read from the enum's options in the generated descriptors, not a hard-coded list:
  the same set GetLanguageOptions(maximum_features) answers);
- plus the features BigQuery has released that this build still marks in_development: those
  of this build's in_development features that Google's own BigQuery language options enable
  (GoogleCloudPlatform/zetasql-toolkit, BigQueryLanguageOptions.java, written for a later
  build), plus this build's spelling of the set-operation modes (the toolkit's
  CORRESPONDING_FULL) and the five marked (*), which BigQuery documents:
    V_1_3_COLLATION_SUPPORT         COLLATE(x, 'und:ci'), column collations (without it
                                    COLLATE is "Function not found")
    V_1_4_COLLATION_IN_WITH_RECURSIVE, V_1_4_COLLATION_IN_EXPLICIT_CAST,
    V_1_4_PRESERVE_ANNOTATION_IN_IMPLICIT_CAST_IN_SCAN
                                    how BigQuery propagates collation
    INTERVAL_TYPE                   the INTERVAL type and its functions
    TIME_BUCKET_FUNCTIONS           TIMESTAMP_BUCKET, DATE_BUCKET, DATETIME_BUCKET
    INVERSE_TRIG_FUNCTIONS          CSC, SEC, COT, CSCH, SECH, COTH
    V_1_4_GROUPING_SETS, V_1_4_GROUPING_BUILTIN
                                    GROUP BY GROUPING SETS / CUBE, GROUPING()
    V_1_4_LIKE_ANY_SOME_ALL_ARRAY, V_1_4_LIKE_ANY_SOME_ALL_SUBQUERY
                                    quantified LIKE over UNNEST(array) and subqueries
    V_1_4_SET_OPERATION_COLUMN_PROPAGATION_MODE, V_1_4_CORRESPONDING_BY
                                    FULL/LEFT [OUTER] set operations, CORRESPONDING [BY (...)]
                                    (this build has no BY NAME spelling yet)
    ALTER_COLUMN_SET_DATA_TYPE      ALTER TABLE ... ALTER COLUMN ... SET DATA TYPE
    CREATE_TABLE_CLONE              CREATE TABLE ... CLONE
    CREATE_EXTERNAL_TABLE_WITH_PARTITION_COLUMNS, CREATE_TABLE_WITH_CONNECTION (*)
                                    BigLake / external table DDL
    CREATE_VIEWS_WITH_COLUMN_OPTIONS (*), ALTER_VIEWS_ALTER_COLUMN_SET_OPTIONS (*)
                                    view column descriptions
    V_1_4_REMOTE_MODEL, V_1_4_CREATE_MODEL_WITH_ALIASED_QUERY_LIST
                                    BigQuery ML's CREATE MODEL forms
    V_1_4_CREATE_FUNCTION_LANGUAGE_WITH_CONNECTION, NON_SQL_PROCEDURE (*)
                                    Python UDFs, Spark stored procedures
    DIFFERENTIAL_PRIVACY (*)        SELECT WITH DIFFERENTIAL_PRIVACY
  ((*): not in the toolkit's list; BigQuery documents them. The toolkit enables the older
  ANONYMIZATION spelling instead of DIFFERENTIAL_PRIVACY.)
  JSON, BIGNUMERIC, NUMERIC, QUALIFY, PIVOT/UNPIVOT, MERGE's WHEN NOT MATCHED BY SOURCE, DML
  and the rest are already released in this build, so the maximum set has them. Left out on
  purpose: in-development features BigQuery does not document (SQL macros and sequence
  arguments, which the toolkit enables all the same; Spanner's TTL and ordered primary keys,
  CLONE DATA, protos in external mode, EXTERNAL SECURITY for procedures, the older
  ANONYMIZATION syntax) and the "ideally disabled" restrictions (DISALLOW_GROUP_BY_FLOAT etc.:
  BigQuery groups by FLOAT64).
- product mode EXTERNAL (BigQuery's: no protos, no UINT/INT32/FLOAT32 types);
- QUALIFY is not a reserved keyword (BigQuery does not reserve it), so ZetaSQL applies
  BigQuery's rule that a QUALIFY needs a WHERE, GROUP BY or HAVING clause (`WHERE TRUE`);
- the statement kinds the toolkit lists for BigQuery (query, DML, MERGE, TRUNCATE,
  BEGIN/COMMIT/ROLLBACK, DDL, ASSERT, EXPORT DATA, LOAD DATA, CALL, EXECUTE IMMEDIATE, ...);
  scripting statements (DECLARE, SET, IF, loops, BEGIN...END blocks) are not statements
  ZetaSQL's analyzer resolves (its parser knows them; BigQuery's script engine runs them);
- BigQuery's system variables (@@project_id, @@dataset_id, @@time_zone, ...) and its default
  time zone, UTC.

Speed: a table set seen twice is registered with the server (RegisterCatalog) and later
requests over it name it by id instead of sending the catalog, so the server does not reload
the builtin functions each time (about 2 ms a MERGE instead of 5); --cached-catalogs N
(default 4, 0 to disable) bounds how many stay registered (about 0.7 MB of server memory
each); they are unregistered when evicted and at EOF or SIGTERM.

Other commands: --prepare generates the stubs and exits (scripts/services.sh runs it, so
parallel tests do not race to do it), --describe prints the language options in effect.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NotRequired, TypeAlias, TypedDict

import grpc

ROOT = Path(__file__).resolve().parent.parent
ZETASQL_DIR = Path(os.environ.get("FILAMENT_ZETASQL_DIR", ROOT / "build" / "zetasql"))
PROTO_DIR = ZETASQL_DIR / "protos"

# BigQuery features this build still marks in_development (see the header); names this build
# does not know are skipped, so a newer package only needs the list reviewed.
BIGQUERY_IN_DEVELOPMENT_FEATURES = [
    "FEATURE_V_1_3_COLLATION_SUPPORT",
    "FEATURE_V_1_4_COLLATION_IN_WITH_RECURSIVE",
    "FEATURE_V_1_4_COLLATION_IN_EXPLICIT_CAST",
    "FEATURE_V_1_4_PRESERVE_ANNOTATION_IN_IMPLICIT_CAST_IN_SCAN",
    "FEATURE_INTERVAL_TYPE",
    "FEATURE_TIME_BUCKET_FUNCTIONS",
    "FEATURE_INVERSE_TRIG_FUNCTIONS",
    "FEATURE_V_1_4_GROUPING_SETS",
    "FEATURE_V_1_4_GROUPING_BUILTIN",
    "FEATURE_V_1_4_LIKE_ANY_SOME_ALL_ARRAY",
    "FEATURE_V_1_4_LIKE_ANY_SOME_ALL_SUBQUERY",
    "FEATURE_V_1_4_SET_OPERATION_COLUMN_PROPAGATION_MODE",
    "FEATURE_V_1_4_CORRESPONDING_BY",
    "FEATURE_ALTER_COLUMN_SET_DATA_TYPE",
    "FEATURE_CREATE_TABLE_CLONE",
    "FEATURE_CREATE_EXTERNAL_TABLE_WITH_PARTITION_COLUMNS",
    "FEATURE_CREATE_TABLE_WITH_CONNECTION",
    "FEATURE_CREATE_VIEWS_WITH_COLUMN_OPTIONS",
    "FEATURE_ALTER_VIEWS_ALTER_COLUMN_SET_OPTIONS",
    "FEATURE_V_1_4_REMOTE_MODEL",
    "FEATURE_V_1_4_CREATE_MODEL_WITH_ALIASED_QUERY_LIST",
    "FEATURE_V_1_4_CREATE_FUNCTION_LANGUAGE_WITH_CONNECTION",
    "FEATURE_NON_SQL_PROCEDURE",
    "FEATURE_DIFFERENTIAL_PRIVACY",
]

# The statement kinds BigQuery runs (the toolkit's list, less those this build lacks).
BIGQUERY_STATEMENT_KINDS = [
    "RESOLVED_QUERY_STMT",
    "RESOLVED_INSERT_STMT",
    "RESOLVED_UPDATE_STMT",
    "RESOLVED_DELETE_STMT",
    "RESOLVED_MERGE_STMT",
    "RESOLVED_TRUNCATE_STMT",
    "RESOLVED_BEGIN_STMT",
    "RESOLVED_COMMIT_STMT",
    "RESOLVED_ROLLBACK_STMT",
    "RESOLVED_ASSERT_STMT",
    "RESOLVED_CALL_STMT",
    "RESOLVED_EXECUTE_IMMEDIATE_STMT",
    "RESOLVED_ASSIGNMENT_STMT",
    "RESOLVED_EXPORT_DATA_STMT",
    "RESOLVED_EXPORT_MODEL_STMT",
    "RESOLVED_AUX_LOAD_DATA_STMT",
    "RESOLVED_CREATE_TABLE_STMT",
    "RESOLVED_CREATE_TABLE_AS_SELECT_STMT",
    "RESOLVED_CREATE_EXTERNAL_TABLE_STMT",
    "RESOLVED_CREATE_SNAPSHOT_TABLE_STMT",
    "RESOLVED_CREATE_VIEW_STMT",
    "RESOLVED_CREATE_MATERIALIZED_VIEW_STMT",
    "RESOLVED_CREATE_SCHEMA_STMT",
    "RESOLVED_CREATE_FUNCTION_STMT",
    "RESOLVED_CREATE_TABLE_FUNCTION_STMT",
    "RESOLVED_CREATE_PROCEDURE_STMT",
    "RESOLVED_CREATE_MODEL_STMT",
    "RESOLVED_CREATE_INDEX_STMT",
    "RESOLVED_CREATE_ROW_ACCESS_POLICY_STMT",
    "RESOLVED_CREATE_ENTITY_STMT",
    "RESOLVED_ALTER_TABLE_STMT",
    "RESOLVED_ALTER_VIEW_STMT",
    "RESOLVED_ALTER_MATERIALIZED_VIEW_STMT",
    "RESOLVED_ALTER_SCHEMA_STMT",
    "RESOLVED_ALTER_MODEL_STMT",
    "RESOLVED_ALTER_ENTITY_STMT",
    "RESOLVED_DROP_STMT",
    "RESOLVED_DROP_MATERIALIZED_VIEW_STMT",
    "RESOLVED_DROP_SNAPSHOT_TABLE_STMT",
    "RESOLVED_DROP_FUNCTION_STMT",
    "RESOLVED_DROP_TABLE_FUNCTION_STMT",
    "RESOLVED_DROP_ROW_ACCESS_POLICY_STMT",
    "RESOLVED_GRANT_STMT",
    "RESOLVED_REVOKE_STMT",
]

# BigQuery's system variables readable in a statement (scripting's @@script.* and @@error.*
# only exist inside a script, which the analyzer does not model).
BIGQUERY_SYSTEM_VARIABLES = {
    "current_job_id": "STRING",
    "dataset_id": "STRING",
    "dataset_project_id": "STRING",
    "last_job_id": "STRING",
    "location": "STRING",
    "project_id": "STRING",
    "query_label": "STRING",
    "reservation": "STRING",
    "row_count": "INT64",
    "session_id": "STRING",
    "time_zone": "STRING",
}


# A message of the analyzer's protos. Their Python modules are generated at run time
# (ensure_stubs) and have no type stubs, so mypy sees them as Any (scripts/mypy.ini).
Message: TypeAlias = Any


class Verdict(TypedDict):
    """An answer, less its "id" (see the module's docstring)."""

    ok: bool
    statements: int
    errors: list[str]
    malformed: NotRequired[bool]


class MalformedRequest(Exception):
    """The request itself is wrong (not the SQL in it)."""


class AnalyzerUnavailable(Exception):
    """The analyzer server cannot be reached or failed in a way unrelated to the SQL."""


# --- stubs ---------------------------------------------------------------------------------


def installed_version() -> str:
    stamps = sorted(ZETASQL_DIR.glob(".installed-*"))
    if not stamps or not PROTO_DIR.is_dir():
        sys.exit(f"zetasql_analyze: no analyzer install in {ZETASQL_DIR} (run scripts/zetasql.sh install)")
    return stamps[-1].name[len(".installed-"):]


def ensure_stubs() -> Path:
    """Generates the Python gRPC stubs from the package's protos once (atomically, so
    concurrent first uses do not see half a directory) and puts them on sys.path."""
    import grpc_tools  # the venv's grpcio-tools, which bundles protoc and google/protobuf/*.proto
    from grpc_tools import protoc

    from importlib.metadata import version

    tools_version = version("grpcio-tools")
    target = ZETASQL_DIR / "py" / f"zetasql-{installed_version()}-grpcio-tools-{tools_version}"
    if not (target / "local_service_pb2_grpc.py").is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".gen-", dir=target.parent))
        try:
            protos = sorted(str(p.relative_to(PROTO_DIR)) for p in PROTO_DIR.rglob("*.proto"))
            well_known = Path(grpc_tools.__file__).parent / "_proto"
            args = ["grpc_tools.protoc", f"-I{PROTO_DIR}", f"-I{well_known}",
                    f"--python_out={scratch}", f"--grpc_python_out={scratch}", *protos]
            # protoc warns about an unused import in the package's protos: keep its stderr
            # (a C-level stream) aside and show it only on failure.
            with tempfile.TemporaryFile() as captured:
                saved = os.dup(2)
                os.dup2(captured.fileno(), 2)
                try:
                    status = protoc.main(args)
                finally:
                    os.dup2(saved, 2)
                    os.close(saved)
                if status != 0:
                    captured.seek(0)
                    sys.stderr.write(captured.read().decode(errors="replace"))
                    sys.exit(f"zetasql_analyze: protoc failed on {PROTO_DIR}")
            try:
                scratch.rename(target)
            except OSError:
                if not (target / "local_service_pb2_grpc.py").is_file():
                    raise
                # Another process generated the same stubs first: use theirs.
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    sys.path.insert(0, str(target))
    return target


# --- language and analyzer options -------------------------------------------------------


class Options:
    """The analyzer options for BigQuery, built once from the generated descriptors."""

    def __init__(self) -> None:
        from zetasql.proto import options_pb2 as proto_options
        from zetasql.public import options_pb2 as public_options
        from zetasql.public import type_pb2
        from zetasql.resolved_ast import resolved_node_kind_pb2

        self.public = public_options
        feature_enum = public_options.DESCRIPTOR.enum_types_by_name["LanguageFeature"]
        extension = public_options.language_feature_options
        maximum: list[str] = []
        for value in feature_enum.values:
            if value.number <= 0 or value.name.startswith("__"):
                continue  # the "switch must have a default" sentinel
            options = value.GetOptions().Extensions[extension]
            if options.ideally_enabled and not options.in_development:
                maximum.append(value.name)
        known = set(feature_enum.values_by_name)
        self.maximum_features = maximum
        self.bigquery_features = [f for f in BIGQUERY_IN_DEVELOPMENT_FEATURES if f in known and f not in maximum]
        self.unknown_features = [f for f in BIGQUERY_IN_DEVELOPMENT_FEATURES if f not in known]
        features = [feature_enum.values_by_name[f].number for f in maximum + self.bigquery_features]

        kind_enum = resolved_node_kind_pb2.ResolvedNodeKind
        self.statement_kinds = [k for k in BIGQUERY_STATEMENT_KINDS if k in kind_enum.keys()]
        self.language = proto_options.LanguageOptionsProto(
            name_resolution_mode=public_options.NAME_RESOLUTION_DEFAULT,
            product_mode=public_options.PRODUCT_EXTERNAL,
            error_on_deprecated_syntax=False,
            enabled_language_features=features,
            supported_statement_kinds=[kind_enum.Value(k) for k in self.statement_kinds],
            # Empty: QUALIFY (ZetaSQL's one reservable keyword in this build) is not reserved.
            reserved_keywords=[],
        )
        analyzer = proto_options.AnalyzerOptionsProto(
            language_options=self.language,
            error_message_mode=public_options.ERROR_MESSAGE_ONE_LINE,
            default_timezone="UTC",
            parameter_mode=public_options.PARAMETER_NAMED,
        )
        for name, type_name in BIGQUERY_SYSTEM_VARIABLES.items():
            kind = type_pb2.TYPE_STRING if type_name == "STRING" else type_pb2.TYPE_INT64
            analyzer.system_variables.add(name_path=[name], type=type_pb2.TypeProto(type_kind=kind))
        self.analyzer = analyzer
        self.builtins = proto_options.ZetaSQLBuiltinFunctionOptionsProto(language_options=self.language)

    def describe(self) -> dict[str, object]:
        return {
            "maximum_features": len(self.maximum_features),
            "bigquery_in_development_features": self.bigquery_features,
            "unknown_feature_names": self.unknown_features,
            "product_mode": "PRODUCT_EXTERNAL",
            "reserved_keywords": [],
            "statement_kinds": self.statement_kinds,
            "system_variables": sorted(BIGQUERY_SYSTEM_VARIABLES),
            "default_timezone": "UTC",
        }


# --- catalog -------------------------------------------------------------------------------


class Catalogs:
    """BigQuery table schemas to ZetaSQL's SimpleCatalogProto."""

    def __init__(self, options: Options) -> None:
        from zetasql.proto import simple_catalog_pb2
        from zetasql.public import annotation_pb2, simple_table_pb2, simple_value_pb2, type_pb2

        self.options = options
        self.catalog_pb2 = simple_catalog_pb2
        self.table_pb2 = simple_table_pb2
        self.annotation_pb2 = annotation_pb2
        self.value_pb2 = simple_value_pb2
        self.type_pb2 = type_pb2
        t = type_pb2
        self.simple_types = {
            "INT64": t.TYPE_INT64, "INTEGER": t.TYPE_INT64,
            "FLOAT64": t.TYPE_DOUBLE, "FLOAT": t.TYPE_DOUBLE,
            "NUMERIC": t.TYPE_NUMERIC, "DECIMAL": t.TYPE_NUMERIC,
            "BIGNUMERIC": t.TYPE_BIGNUMERIC, "BIGDECIMAL": t.TYPE_BIGNUMERIC,
            "BOOL": t.TYPE_BOOL, "BOOLEAN": t.TYPE_BOOL,
            "STRING": t.TYPE_STRING, "BYTES": t.TYPE_BYTES,
            "DATE": t.TYPE_DATE, "DATETIME": t.TYPE_DATETIME, "TIME": t.TYPE_TIME,
            "TIMESTAMP": t.TYPE_TIMESTAMP, "JSON": t.TYPE_JSON, "GEOGRAPHY": t.TYPE_GEOGRAPHY,
            "INTERVAL": t.TYPE_INTERVAL,
        }
        # ZetaSQL's AnnotationKind::kCollation.
        self.collation_annotation_id = 0

    def build(self, tables: object) -> Message:
        """The SimpleCatalogProto of a request's "tables"."""
        if not isinstance(tables, list):
            raise MalformedRequest('"tables" must be a list')
        projects: dict[str, dict[str, list[Message]]] = {}
        root_tables: list[Message] = []
        seen: set[str] = set()
        for index, table in enumerate(tables):
            if not isinstance(table, dict):
                raise MalformedRequest(f"tables[{index}] must be an object")
            names = []
            for key in ("project", "dataset", "table"):
                value = table.get(key)
                if not isinstance(value, str) or not value:
                    raise MalformedRequest(f'tables[{index}].{key} must be a non-empty string')
                names.append(value)
            project, dataset, name = names
            full_name = f"{project}.{dataset}.{name}"
            if full_name.lower() in seen:
                raise MalformedRequest(f"table {full_name} is given twice")
            seen.add(full_name.lower())
            default_collation = table.get("default_collation", table.get("defaultCollation"))
            if default_collation is not None and not isinstance(default_collation, str):
                raise MalformedRequest(f"tables[{index}].default_collation must be a string")
            columns = self.columns(table.get("fields"), f"tables[{index}]", default_collation)
            projects.setdefault(project, {}).setdefault(dataset, []).append(
                self.table_pb2.SimpleTableProto(name=name, column=columns, full_name=full_name))
            # `project.dataset.table` in one pair of backticks: BigQuery splits it, ZetaSQL looks
            # the whole string up in the root catalog.
            root_tables.append(self.table_pb2.SimpleTableProto(name=full_name, column=columns, full_name=full_name))
        root = self.catalog_pb2.SimpleCatalogProto(name="bigquery", table=root_tables)
        root.builtin_function_options.CopyFrom(self.options.builtins)
        for project, datasets in projects.items():
            project_catalog = root.catalog.add(name=project)
            for dataset, dataset_tables in datasets.items():
                project_catalog.catalog.add(name=dataset, table=dataset_tables)
        return root

    def columns(self, fields: object, where: str, default_collation: str | None) -> list[Message]:
        """The SimpleColumnProtos of a table's TableFieldSchema list."""
        if not isinstance(fields, list):
            raise MalformedRequest(f"{where}.fields must be a list of TableFieldSchema objects")
        columns: list[Message] = []
        seen: set[str] = set()
        for index, field in enumerate(fields):
            type_proto, annotations, name = self.field(field, f"{where}.fields[{index}]", default_collation)
            if name.lower() in seen:
                raise MalformedRequest(f"{where}: duplicate column {name} (BigQuery column names are case-insensitive)")
            seen.add(name.lower())
            column = self.table_pb2.SimpleColumnProto(name=name, type=type_proto)
            if annotations is not None:
                column.annotation_map.CopyFrom(annotations)
            columns.append(column)
        return columns

    def field(
        self, field: object, where: str, default_collation: str | None
    ) -> tuple[Message, Message | None, str]:
        """(TypeProto, AnnotationMapProto or None, name) of one TableFieldSchema."""
        if not isinstance(field, dict):
            raise MalformedRequest(f"{where} must be an object")
        name = field.get("name")
        if not isinstance(name, str) or not name:
            raise MalformedRequest(f"{where}.name must be a non-empty string")
        type_name = field.get("type")
        if not isinstance(type_name, str):
            raise MalformedRequest(f"{where} ({name}): type must be a string")
        type_name = type_name.upper()
        mode = str(field.get("mode") or "NULLABLE").upper()
        if mode not in ("NULLABLE", "REQUIRED", "REPEATED"):
            raise MalformedRequest(f"{where} ({name}): unknown mode {mode}")
        t = self.type_pb2
        annotations: Message | None = None
        if type_name in ("RECORD", "STRUCT"):
            subfields = field.get("fields")
            if not isinstance(subfields, list) or not subfields:
                raise MalformedRequest(f"{where} ({name}): a {type_name} needs a non-empty fields list")
            element = t.TypeProto(type_kind=t.TYPE_STRUCT)
            struct_annotations: list[Message | None] = []
            for index, subfield in enumerate(subfields):
                sub_type, sub_annotations, sub_name = self.field(subfield, f"{where}.fields[{index}]", default_collation)
                element.struct_type.field.add(field_name=sub_name, field_type=sub_type)
                struct_annotations.append(sub_annotations)
            if any(a is not None for a in struct_annotations):
                annotations = self.annotation_pb2.AnnotationMapProto(struct_fields=[
                    a if a is not None else self.annotation_pb2.AnnotationMapProto() for a in struct_annotations])
        elif type_name == "RANGE":
            element_type = str((field.get("rangeElementType") or {}).get("type", "")).upper()
            if element_type not in ("DATE", "DATETIME", "TIMESTAMP"):
                raise MalformedRequest(f"{where} ({name}): RANGE needs rangeElementType DATE, DATETIME or TIMESTAMP")
            element = t.TypeProto(type_kind=t.TYPE_RANGE)
            element.range_type.element_type.CopyFrom(t.TypeProto(type_kind=self.simple_types[element_type]))
        elif type_name in self.simple_types:
            element = t.TypeProto(type_kind=self.simple_types[type_name])
            collation = field["collation"] if "collation" in field else default_collation
            if collation is not None and not isinstance(collation, str):
                raise MalformedRequest(f"{where} ({name}): collation must be a string")
            if collation and type_name == "STRING":
                annotations = self.annotation_pb2.AnnotationMapProto(annotations=[self.annotation_pb2.AnnotationProto(
                    id=self.collation_annotation_id, value=self.value_pb2.SimpleValueProto(string_value=collation))])
            elif field.get("collation") and type_name != "STRING":
                raise MalformedRequest(f"{where} ({name}): only STRING fields take a collation")
        else:
            raise MalformedRequest(f"{where} ({name}): unknown BigQuery type {type_name}")
        if mode == "REPEATED":
            array = t.TypeProto(type_kind=t.TYPE_ARRAY)
            array.array_type.element_type.CopyFrom(element)
            if annotations is not None:
                annotations = self.annotation_pb2.AnnotationMapProto(array_element=annotations)
            return array, annotations, name
        return element, annotations, name


# --- analysis ------------------------------------------------------------------------------

# What may follow the last statement of a script: whitespace and comments (#, --, /* */).
TRAILER = re.compile(rb"\A(?:\s+|#[^\n]*|--[^\n]*|/\*.*?\*/)*\Z", re.S)
LEADING = re.compile(rb"\A(?:\s+|#[^\n]*|--[^\n]*|/\*.*?\*/)*", re.S)


def leading_bytes(data: bytes) -> int:
    """How many bytes of whitespace and comments `data` starts with."""
    match = LEADING.match(data)
    return match.end() if match else 0


# gRPC codes that carry the analyzer's verdict on the SQL; any other means the judge failed.
SQL_ERROR_CODES = {"INVALID_ARGUMENT", "UNIMPLEMENTED", "OUT_OF_RANGE", "FAILED_PRECONDITION",
                   "NOT_FOUND", "ALREADY_EXISTS", "INTERNAL"}


@dataclass
class CachedCatalog:
    """A table set's SimpleCatalogProto and, once registered with the server, its id."""

    catalog: Message
    registered_id: int | None = None


class Analyzer:
    """Analyze RPCs for requests. A table set seen twice is registered with the server
    (RegisterCatalog), so later statements over it skip re-sending the catalog and re-loading
    the builtin functions (about 3.5 ms a statement inline, 1.9 ms registered); at most
    `cached_catalogs` are kept (about 0.7 MB of server memory each), unregistered when evicted
    and at exit."""

    def __init__(self, address: str, cached_catalogs: int = 4) -> None:
        import local_service_pb2
        import local_service_pb2_grpc
        from zetasql.public import parse_resume_location_pb2

        self.service = local_service_pb2
        self.resume_pb2 = parse_resume_location_pb2
        self.address = address
        self.channel = grpc.insecure_channel(address, options=[
            ("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 256 << 20)])
        self.stub = local_service_pb2_grpc.ZetaSqlLocalServiceStub(self.channel)
        self.options = Options()
        self.catalogs = Catalogs(self.options)
        self.cached_catalogs = cached_catalogs
        # Keyed by the request's tables as canonical JSON, oldest first.
        self.catalog_cache: dict[str, CachedCatalog] = {}

    def wait_ready(self, seconds: float) -> None:
        try:
            grpc.channel_ready_future(self.channel).result(timeout=seconds)
        except grpc.FutureTimeoutError:
            raise AnalyzerUnavailable(f"no ZetaSQL analyzer answers at {self.address} "
                                      "(scripts/zetasql.sh start; make test starts it)") from None

    def rpc(self, method: Callable[..., Message], request: Message) -> Message:
        """One RPC, retrying a server that is momentarily unavailable."""
        for attempt in range(3):
            try:
                return method(request, timeout=60)
            except grpc.RpcError as error:
                if error.code() == grpc.StatusCode.UNAVAILABLE and attempt < 2:
                    time.sleep(0.5 * (attempt + 1))
                    continue
                raise
        raise AssertionError("unreachable")

    def call(self, request: Message) -> tuple[Message, str | None]:
        """One Analyze RPC: (response, None), or (None, the analyzer's message) when it
        refuses the SQL; AnalyzerUnavailable when the judge itself failed."""
        try:
            return self.rpc(self.stub.Analyze, request), None
        except grpc.RpcError as error:
            code = error.code().name if error.code() else "UNKNOWN"
            message = error.details() or code
            if code in SQL_ERROR_CODES:
                return None, message if code == "INVALID_ARGUMENT" else f"{code}: {message}"
            raise AnalyzerUnavailable(f"Analyze RPC to {self.address} failed: {code}: {message}") from None

    def catalog_for(self, tables: object) -> CachedCatalog:
        """The catalog of a request's tables, registered with the server once seen twice."""
        key = json.dumps(tables, sort_keys=True, separators=(",", ":"))
        entry = self.catalog_cache.pop(key, None)
        if entry is None:
            entry = CachedCatalog(self.catalogs.build(tables))
        elif entry.registered_id is None and self.cached_catalogs > 0:
            try:
                registered = self.rpc(self.stub.RegisterCatalog,
                                      self.service.RegisterCatalogRequest(simple_catalog=entry.catalog))
                entry.registered_id = registered.registered_id
            except grpc.RpcError:
                pass  # not fatal: analyze with the catalog inline
        self.catalog_cache[key] = entry  # now the newest
        while len(self.catalog_cache) > max(self.cached_catalogs, 1):
            oldest = next(iter(self.catalog_cache))
            self.unregister(self.catalog_cache.pop(oldest).registered_id)
        return entry

    def unregister(self, registered_id: int | None) -> None:
        if registered_id is None:
            return
        try:
            self.stub.UnregisterCatalog(self.service.UnregisterRequest(registered_id=registered_id), timeout=10)
        except grpc.RpcError:
            pass

    def close(self) -> None:
        for entry in self.catalog_cache.values():
            self.unregister(entry.registered_id)
        self.catalog_cache.clear()
        self.channel.close()

    def analyze(self, request: dict[str, Any]) -> Verdict:
        sql = request.get("sql")
        if not isinstance(sql, str) or not sql.strip():
            raise MalformedRequest('"sql" must be a non-empty string')
        mode = request.get("mode", "statement")
        if mode not in ("statement", "script"):
            raise MalformedRequest('"mode" must be "statement" or "script"')
        entry = self.catalog_for(request.get("tables", []))
        try:
            return self.analyze_with(sql, mode, entry.catalog, entry.registered_id)
        except CatalogGone:
            # The server lost the registration (restarted): forget it, analyze inline.
            entry.registered_id = None
            return self.analyze_with(sql, mode, entry.catalog, None)

    def analyze_with(self, sql: str, mode: str, catalog: Message, registered_id: int | None) -> Verdict:
        if registered_id is None:
            base = self.service.AnalyzeRequest(options=self.options.analyzer, simple_catalog=catalog)
        else:
            base = self.service.AnalyzeRequest(options=self.options.analyzer, registered_catalog_id=registered_id)

        def call(analyze: Message) -> tuple[Message, str | None]:
            response, error = self.call(analyze)
            if error is not None and registered_id is not None and re.fullmatch(
                    r"Registered catalog \d+ unknown\.?", error):
                raise CatalogGone()
            return response, error

        if mode == "statement":
            analyze = self.service.AnalyzeRequest()
            analyze.CopyFrom(base)
            analyze.sql_statement = sql
            _, error = call(analyze)
            start = leading_bytes(sql.encode())
            if error is None:
                return {"ok": True, "statements": 1, "errors": []}
            return {"ok": False, "statements": 0, "errors": [f"statement 1 (byte {start}): {error}"]}
        data = sql.encode()
        position, count = 0, 0
        while True:
            start = position + leading_bytes(data[position:])
            analyze = self.service.AnalyzeRequest()
            analyze.CopyFrom(base)
            analyze.parse_resume_location.CopyFrom(
                self.resume_pb2.ParseResumeLocationProto(input=sql, byte_position=position, allow_resume=True))
            response, error = call(analyze)
            if error is not None:
                return {"ok": False, "statements": count, "errors": [f"statement {count + 1} (byte {start}): {error}"]}
            count += 1
            if response.resume_byte_position <= position:
                return {"ok": False, "statements": count,
                        "errors": [f"statement {count + 1} (byte {start}): the analyzer did not advance"]}
            position = response.resume_byte_position
            if position >= len(data) or TRAILER.match(data[position:]):
                return {"ok": True, "statements": count, "errors": []}


class CatalogGone(Exception):
    """A registered catalog the server no longer knows."""


def answer_line(analyzer: Analyzer, line: str) -> dict[str, object]:
    request_id = None
    try:
        try:
            request = json.loads(line)
        except json.JSONDecodeError as error:
            raise MalformedRequest(f"not JSON: {error}") from None
        if not isinstance(request, dict):
            raise MalformedRequest("a request is a JSON object")
        request_id = request.get("id")
        verdict = analyzer.analyze(request)
    except MalformedRequest as error:
        verdict = {"ok": False, "statements": 0, "errors": [f"malformed request: {error}"], "malformed": True}
    return {"id": request_id, **verdict}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--addr", default=os.environ.get("FILAMENT_ZETASQL_ADDR"),
                        help="host:port of the analyzer (default $FILAMENT_ZETASQL_ADDR)")
    parser.add_argument("--prepare", action="store_true", help="generate the gRPC stubs and exit")
    parser.add_argument("--describe", action="store_true", help="print the language options in effect and exit")
    parser.add_argument("--cached-catalogs", type=int, default=4, metavar="N",
                        help="table sets kept registered with the server (default 4, 0: send every catalog inline)")
    args = parser.parse_args()

    ensure_stubs()
    if args.prepare:
        return 0
    if args.describe:
        try:
            print(json.dumps(Options().describe(), indent=2))
        except BrokenPipeError:
            pass
        return 0
    if not args.addr:
        print("zetasql_analyze: no analyzer address (--addr or FILAMENT_ZETASQL_ADDR)", file=sys.stderr)
        return 2
    analyzer = Analyzer(args.addr, args.cached_catalogs)
    # Killed politely (SIGTERM, SIGINT) or at EOF: unregister this client's catalogs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        analyzer.wait_ready(30)
        for line in sys.stdin:
            if not line.strip():
                continue
            sys.stdout.write(json.dumps(answer_line(analyzer, line)) + "\n")
            sys.stdout.flush()
    except AnalyzerUnavailable as error:
        print(f"zetasql_analyze: {error}", file=sys.stderr)
        return 3
    except (BrokenPipeError, KeyboardInterrupt):
        return 0
    finally:
        analyzer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
