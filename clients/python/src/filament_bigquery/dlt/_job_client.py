"""A dlt load package -> one gateway execution.

dlt hands a destination one file per job and calls `complete_load` once every job of the
package is done. The gateway's unit of exactly-once is the execution, and a new delivery of an
execution starts from nothing, so the jobs here only check that their table maps to a write
mode; `complete_load` sends the whole package (every file of every table, plus dlt's
`_dlt_loads` row and, when the schema changed, its `_dlt_version` row) in one execution whose
id is the load id, and commits it. A load dlt retries (after a crash, an error, a failed
commit) is the same execution delivered again with the same bodies: a committed one is found
committed and not sent again, and one the gateway had begun publishing is matched by its
fingerprint instead of being published twice."""

from __future__ import annotations

import json
import logging
import os
from types import TracebackType
from typing import Any, Iterable, Iterator, Optional, Type

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from dlt.common.configuration.container import Container
from dlt.common.destination import DestinationCapabilitiesContext
from dlt.common.destination.client import JobClientBase, LoadJob
from dlt.common.destination.exceptions import DestinationTerminalException, DestinationTransientException
from dlt.common.destination.typing import PreparedTableSchema
from dlt.common.schema import Schema
from dlt.common.storages.load_package import (
    LoadPackageStateInjectableContext,
    PackageStorage,
    ParsedLoadJobFileName,
)
from dlt.destinations.job_impl import FinalizedLoadJob

from .._client import Client, Execution, RetryPolicy, Run
from .._errors import (
    CommitStillRunning,
    ExecutionFailed,
    FilamentError,
    GatewayUnreachable,
    Unavailable,
)
from ._configuration import FilamentClientConfiguration
from ._mapping import (
    LOADS_TABLE,
    VERSION_TABLE,
    TablePlan,
    UnsupportedHint,
    conform,
    execution_id_for,
    plan_table,
    rows_table,
    run_id_for,
    table_arrow_schema,
    tables_of_load,
)

log = logging.getLogger("filament_bigquery.dlt")

OP_COLUMN = "_filament_op"
PARQUET_ROWS_PER_READ = 64 * 1024


class FilamentJobClient(JobClientBase):
    def __init__(
        self,
        schema: Schema,
        config: FilamentClientConfiguration,
        capabilities: DestinationCapabilitiesContext,
    ) -> None:
        super().__init__(schema, config, capabilities)
        self.config: FilamentClientConfiguration = config
        credentials = config.credentials
        if credentials is None or not credentials.url or not credentials.token:
            raise DestinationTerminalException(
                "the filament destination needs the gateway's url and a token: filament(url=..., token=...) or "
                "destination.filament.credentials.url / .token in the dlt configuration"
            )
        if not config.project:
            raise DestinationTerminalException("the filament destination needs the BigQuery project: filament(project=...)")
        self.project: str = config.project
        self.dataset: str = config.normalize_dataset_name(schema)
        try:
            self.gateway = Client(
                credentials.url,
                token=str(credentials.token),
                timeout=config.request_timeout,
                commit_timeout=config.commit_timeout,
                max_body_bytes=config.max_body_bytes,
                compression=config.compression,
                retry=RetryPolicy(),
                allow_insecure_http=config.allow_insecure_http,
                run_id_prefix=config.run_id_prefix,
            )
        except ValueError as refused:
            raise DestinationTerminalException(f"the filament destination: {refused}") from None

    # -- what dlt asks of every destination ------------------------------------------------

    def initialize_storage(self, truncate_tables: Optional[Iterable[str]] = None) -> None:
        """Nothing to do: the gateway creates the dataset and the tables, and a replaced table
        is emptied by its load's `full_replace` publication, atomically with its new rows.
        Emptying any other table (dlt's `refresh="drop_data"`) has no gateway equivalent."""
        for table in truncate_tables or ():
            if self._plan(table).write_mode != "full_replace":
                raise DestinationTerminalException(
                    f"table {table}: dlt asks to empty it before the load (refresh), which the gateway cannot do for "
                    "a table that is not replaced; load it with write_disposition='replace' instead"
                )

    def is_storage_initialized(self) -> bool:
        return True

    def drop_storage(self) -> None:
        raise DestinationTerminalException("the filament destination never drops a dataset (the gateway runs no DDL)")

    def create_load_job(
        self, table: PreparedTableSchema, file_path: str, load_id: str, restore: bool = False
    ) -> LoadJob:
        """Checks that the table maps to a gateway write mode (a failure names the table and
        the hint); the file itself is sent by `complete_load`, with the rest of the package."""
        self._plan(str(table["name"]))
        if not file_path.endswith(".parquet"):
            raise DestinationTerminalException(f"{os.path.basename(file_path)}: the filament destination reads parquet files only")
        return FinalizedLoadJob.from_file_path(file_path, status="completed")

    def _plan(self, table: str) -> TablePlan:
        try:
            return plan_table(self.schema, table)
        except UnsupportedHint as unsupported:
            raise DestinationTerminalException(str(unsupported)) from unsupported

    def complete_load(self, load_id: str) -> None:
        storage = Container()[LoadPackageStateInjectableContext].storage
        try:
            _PackageLoad(self, storage, load_id).deliver()
        except UnsupportedHint as unsupported:
            raise DestinationTerminalException(str(unsupported)) from unsupported
        except (GatewayUnreachable, Unavailable, CommitStillRunning) as passing:
            raise DestinationTransientException(f"load {load_id}: {passing}") from passing
        except ExecutionFailed as failed:
            error = DestinationTransientException if failed.redeliverable else DestinationTerminalException
            raise error(f"load {load_id}: {failed}") from failed
        except FilamentError as other:
            raise DestinationTerminalException(f"load {load_id}: {other}") from other

    def __enter__(self) -> "FilamentJobClient":
        return self

    def __exit__(
        self, exc_type: Optional[Type[BaseException]], exc_val: Optional[BaseException], exc_tb: Optional[TracebackType]
    ) -> None:
        self.gateway.close()

    # -- ids --------------------------------------------------------------------------------

    def run_id(self, load_id: str) -> str:
        prefix = self.gateway.run_id_prefix
        return run_id_for(_pipeline_name(self.schema), self.project, self.dataset, load_id, prefix)


class _PackageLoad:
    """Sends one load package as one execution and commits it."""

    def __init__(self, job_client: FilamentJobClient, storage: PackageStorage, load_id: str) -> None:
        self.job_client = job_client
        self.schema = job_client.schema
        self.storage = storage
        self.load_id = load_id
        self.files = self._files_by_table()
        self.plans = [self._plan(name) for name in tables_of_load(self.schema, self.files)]
        self.plans += self._own_tables()

    def deliver(self) -> None:
        client = self.job_client
        run_id = client.run_id(self.load_id)
        execution_id = execution_id_for(self.load_id)
        run = client.gateway.create_run(
            project=client.project, dataset=client.dataset, run_id=run_id, location=client.config.location
        )
        # An earlier delivery of this load (a process that died or stopped waiting during the
        # commit leaves the gateway committing: the commit runs to its end) decides whether
        # anything is sent again; the retry is always the same execution id.
        earlier = run.wait_for_commit(execution_id)
        if earlier is not None and earlier["state"] == "committed":
            log.info("load %s is committed already (run %s): nothing to send", self.load_id, run_id)
            return
        self._declare(run)
        log.info("load %s: run %s, execution %s, %d tables", self.load_id, run_id, execution_id, len(self.plans))
        run.deliver(self._send, execution_id, max_deliveries=client.config.max_deliveries)

    # -- the package ------------------------------------------------------------------------

    def _files_by_table(self) -> dict[str, list[str]]:
        by_table: dict[str, list[str]] = {}
        for state, job in sorted(self.storage.list_all_jobs_with_states(self.load_id), key=lambda s: s[1].file_name()):
            if state != PackageStorage.COMPLETED_JOBS_FOLDER:
                raise DestinationTerminalException(
                    f"load {self.load_id}: job {job.file_name()} is {state}, not completed; nothing was sent"
                )
            by_table.setdefault(job.table_name, []).append(self._path(state, job))
        return by_table

    def _path(self, state: str, job: ParsedLoadJobFileName) -> str:
        relative = self.storage.get_job_file_path(self.load_id, state, job.file_name())  # type: ignore[arg-type]
        return str(self.storage.storage.make_full_path(relative))

    def _plan(self, table: str) -> TablePlan:
        plan = plan_table(self.schema, table)
        plan.files = self.files.get(table, [])
        return plan

    def _own_tables(self) -> list[TablePlan]:
        own = [TablePlan(LOADS_TABLE, "incremental_append")]
        if self._schema_changed():
            own.append(TablePlan(VERSION_TABLE, "incremental_append"))
        return own

    def _schema_changed(self) -> bool:
        package = self.storage.get_package_path(self.load_id)
        applied = os.path.join(package, PackageStorage.APPLIED_SCHEMA_UPDATES_FILE_NAME)
        if not self.storage.storage.has_file(applied):
            return True
        return bool(json.loads(self.storage.storage.load(applied)))

    def _created_at(self) -> Any:
        """When dlt created the package: the time of its `_dlt_loads` and `_dlt_version` rows,
        the same in every delivery (a redelivery must send the same bytes)."""
        return self.storage.get_load_package_state(self.load_id)["created_at"]

    # -- the execution ----------------------------------------------------------------------

    def _declare(self, run: Run) -> None:
        # Declaration order is publication order within a table: the deletes of a merged
        # key's nested rows publish before its new nested rows are appended.
        for plan in self.plans:
            if plan.deletes_stale_nested_rows:
                run.declare(plan.stale_resource, write_mode="incremental_delete", primary_key=["_dlt_root_id"], table=plan.table)
            run.declare(
                plan.resource,
                write_mode=plan.write_mode,
                primary_key=plan.primary_key or None,
                table=plan.table,
            )

    def _send(self, ex: Execution) -> None:
        root_ids, deleted_root_ids = self._merged_root_ids()
        for plan in self.plans:
            schema = self._arrow_schema(plan)
            if plan.table == LOADS_TABLE:
                ex.write(plan.resource, self._loads_row())
            elif plan.table == VERSION_TABLE:
                ex.write(plan.resource, self._version_row())
            else:
                # Nested rows of a key the load deletes (dlt's `hard_delete`) are not kept.
                dropped = deleted_root_ids.get(self._root_name(plan.table), set()) if plan.deletes_stale_nested_rows else set()
                for path in plan.files:
                    ex.write(plan.resource, self._read(path, schema, plan, dropped))
            if plan.deletes_stale_nested_rows:
                ids = root_ids.get(self._root_name(plan.table), [])
                ex.write(plan.stale_resource, _stale_rows(ids, schema if plan.files else None))

    def _arrow_schema(self, plan: TablePlan) -> pa.Schema:
        columns = self.schema.tables[plan.table].get("columns", {}) if plan.table in self.schema.tables else {}
        schema = table_arrow_schema(columns, [pq.read_schema(path) for path in plan.files])
        if plan.hard_delete_column is not None:
            schema = schema.append(pa.field(OP_COLUMN, pa.string()))
        return schema

    def _read(
        self, path: str, schema: pa.Schema, plan: TablePlan, dropped_root_ids: set[str]
    ) -> pa.RecordBatchReader:
        data_schema = schema.remove(schema.get_field_index(OP_COLUMN)) if plan.hard_delete_column else schema

        def batches() -> Iterator[pa.RecordBatch]:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=PARQUET_ROWS_PER_READ):
                conformed = conform(batch, data_schema)
                if dropped_root_ids:
                    root_id = conformed.column(conformed.schema.get_field_index("_dlt_root_id"))
                    keep = pc.invert(pc.is_in(root_id, value_set=pa.array(sorted(dropped_root_ids), pa.string())))
                    conformed = conformed.filter(keep)
                if plan.hard_delete_column is not None:
                    conformed = _with_operation(conformed, plan.hard_delete_column, schema)
                yield conformed

        return pa.RecordBatchReader.from_batches(schema, batches())

    def _root_name(self, table: str) -> str:
        from dlt.common.schema.utils import get_root_table

        return str(get_root_table(self.schema.tables, table)["name"])

    def _merged_root_ids(self) -> tuple[dict[str, list[str]], dict[str, set[str]]]:
        """Per merge root table in the package: the `_dlt_id` of every row (dlt's hash of the
        row's primary key, so also the `_dlt_root_id` of the nested rows the key had), and of
        the rows its `hard_delete` column deletes."""
        roots = {self._root_name(p.table) for p in self.plans if p.deletes_stale_nested_rows}
        ids: dict[str, list[str]] = {}
        deleted: dict[str, set[str]] = {}
        for root in sorted(roots):
            hard_delete = plan_table(self.schema, root).hard_delete_column
            ids[root], deleted[root] = [], set()
            for path in self.files.get(root, []):
                columns = ["_dlt_id"] + ([hard_delete] if hard_delete else [])
                for row in pq.read_table(path, columns=columns).to_pylist():
                    ids[root].append(row["_dlt_id"])
                    flag = row.get(hard_delete) if hard_delete else None
                    if flag is True or (flag is not None and not isinstance(flag, bool)):
                        deleted[root].add(row["_dlt_id"])
        return ids, deleted

    def _loads_row(self) -> pa.Table:
        row = {
            "load_id": self.load_id,
            "schema_name": self.schema.name,
            "status": 0,
            "inserted_at": self._created_at(),
            "schema_version_hash": self.schema.version_hash,
        }
        return rows_table(self.schema.tables[LOADS_TABLE]["columns"], [row])

    def _version_row(self) -> pa.Table:
        stored = self.schema.to_dict()
        row = {
            "version": self.schema.version,
            "engine_version": stored["engine_version"],
            "inserted_at": self._created_at(),
            "schema_name": self.schema.name,
            "version_hash": self.schema.version_hash,
            "schema": json.dumps(stored, sort_keys=True),
        }
        return rows_table(self.schema.tables[VERSION_TABLE]["columns"], [row])


def _with_operation(batch: pa.RecordBatch, hard_delete_column: str, schema: pa.Schema) -> pa.RecordBatch:
    """`_filament_op` for `cdc_merge`: `delete` where dlt's `hard_delete` column says so (a true
    bool, or any non-null value of another type), `upsert` elsewhere."""
    flags = batch.column(batch.schema.get_field_index(hard_delete_column))
    if pa.types.is_boolean(flags.type):
        deleted = [bool(v) for v in flags.to_pylist()]
    else:
        deleted = [v is not None for v in flags.to_pylist()]
    ops = pa.array(["delete" if d else "upsert" for d in deleted], pa.string())
    return pa.RecordBatch.from_arrays([*batch.columns, ops], schema=schema)


def _stale_rows(root_ids: list[str], schema: Optional[pa.Schema]) -> pa.Table:
    """The delete rows of `<table>.stale_nested_rows`: one per merged root key. With the
    table's full schema when the load also has nested rows (so that whichever of the two
    resources creates the table creates all its columns), else only `_dlt_root_id`."""
    if schema is None:
        schema = pa.schema([pa.field("_dlt_root_id", pa.string())])
    arrays = [
        pa.array(root_ids, f.type) if f.name == "_dlt_root_id" else pa.nulls(len(root_ids), f.type) for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def _pipeline_name(schema: Schema) -> str:
    """The running pipeline's name (dlt's context during a load), or the schema's."""
    try:
        import dlt

        return str(dlt.current.pipeline().pipeline_name)
    except Exception:  # noqa: BLE001 - outside a pipeline (a destination used on its own)
        return str(schema.name)
