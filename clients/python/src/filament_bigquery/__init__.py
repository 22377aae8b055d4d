"""Python client of the filament-bigquery ingestion gateway.

    from filament_bigquery import Client
    client = Client("http://127.0.0.1:8080", token="...")
    run = client.create_run(project="p", dataset="d")
    run.declare("public.users", write_mode="full_append")
    with run.execution() as ex:
        ex.write("public.users", table)  # pyarrow, Polars, DuckDB, ...: any Arrow stream
        ex.checkpoint({"lsn": 42})
    print(ex.result)
"""

from ._bodies import ArrowData, ArrowStreamExportable, Body, bodies
from ._client import ARROW_STREAM, Client, Execution, IdTokenCredential, RetryPolicy, Run, Stats, WriteResult
from ._errors import (
    Backpressure,
    CommitStillRunning,
    Conflict,
    ExecutionFailed,
    FilamentError,
    GatewayUnreachable,
    InvalidInput,
    NotFound,
    ProblemError,
    Unauthorized,
    Unavailable,
)
from ._types import (
    CheckpointResponse,
    ExecutionResourceView,
    ExecutionState,
    ExecutionView,
    LatestExecution,
    MetadataColumn,
    PlannedPublicationView,
    PlanView,
    Problem,
    PublicationView,
    Receipt,
    ResourceView,
    RunListItem,
    RunView,
    WriteMode,
)
from .arrow_types import GEOGRAPHY_ENCODINGS, MARKABLE_TYPES, geography_field, json_field, mark, range_field

__version__ = "0.1.0"

__all__ = [
    "IdTokenCredential",
    "ARROW_STREAM",
    "ArrowData",
    "ArrowStreamExportable",
    "Backpressure",
    "Body",
    "CheckpointResponse",
    "Client",
    "CommitStillRunning",
    "Conflict",
    "Execution",
    "ExecutionFailed",
    "ExecutionResourceView",
    "ExecutionState",
    "ExecutionView",
    "FilamentError",
    "GatewayUnreachable",
    "GEOGRAPHY_ENCODINGS",
    "InvalidInput",
    "NotFound",
    "PlannedPublicationView",
    "PlanView",
    "Problem",
    "ProblemError",
    "PublicationView",
    "Receipt",
    "ResourceView",
    "RetryPolicy",
    "Run",
    "RunView",
    "RunListItem",
    "LatestExecution",
    "MARKABLE_TYPES",
    "MetadataColumn",
    "Stats",
    "Unauthorized",
    "Unavailable",
    "WriteMode",
    "WriteResult",
    "__version__",
    "bodies",
    "geography_field",
    "json_field",
    "mark",
    "range_field",
]
