"""The gateway's JSON shapes (see openapi/openapi.json), as TypedDicts: views are plain dicts."""

from __future__ import annotations

from typing import Any, List, Literal, NotRequired, Optional, TypedDict

WriteMode = Literal[
    "full_replace",
    "full_append",
    "full_upsert",
    "incremental_append",
    "incremental_upsert",
    "incremental_delete",
    "cdc_append",
    "cdc_merge",
    "history",
]
MetadataColumn = Literal["loaded_at", "run_id", "execution_id"]
"""A load metadata column the publication sets: `_filament_loaded_at`, `_filament_run_id`,
`_filament_execution_id`."""
ExecutionState = Literal["extracting", "paused", "committing", "staged", "committed", "failed", "aborted"]
TERMINAL_STATES = ("committed", "failed", "aborted")


class Problem(TypedDict):
    type: str
    title: str
    status: int
    detail: str
    code: str
    hint: NotRequired[Optional[str]]


class Receipt(TypedDict):
    resource: str
    seq: int
    rows: int
    uncompressed_bytes: int
    arrow_ipc_sha256: str
    state: str


class PublicationView(TypedDict):
    job_id: str
    state: str
    rows_affected: NotRequired[Optional[int]]
    error: NotRequired[Optional[Problem]]


class ExecutionResourceView(TypedDict):
    resource: str
    table: str
    write_mode: WriteMode
    batches: int
    rows_received: int
    bytes_received: int
    rows_acknowledged: int
    publication: NotRequired[Optional[PublicationView]]


class PlannedPublicationView(TypedDict):
    """One publication of the plan a commit records at its barrier (docs/cost.md)."""

    resource: str
    table: str
    path: Literal["staging_query", "direct_append"]
    statement: Literal["none", "insert", "truncate_insert", "truncate", "merge", "history", "delete"]
    query_jobs: int
    bytes_processed: NotRequired[Optional[int]]
    """What the dry run says the statement processes; None when it could not be dry-run."""
    unpriced: NotRequired[Optional[str]]
    estimated_cost_usd: NotRequired[Optional[float]]


class PlanView(TypedDict):
    """The priced plan of an execution's commit: every statement dry-run before publication."""

    delivery: int
    planned_at: str
    price_per_tib_usd: float
    bytes_processed: int
    estimated_cost_usd: float
    query_jobs: int
    unpriced: int
    publications: List[PlannedPublicationView]
    over_budget: NotRequired[str]
    """On a `staged` execution over the run's byte budgets: why its commit would fail."""


class ExecutionView(TypedDict):
    run_id: str
    execution_id: str
    delivery: int
    state: ExecutionState
    atomic: NotRequired[bool]
    resources: List[ExecutionResourceView]
    created_at: str
    updated_at: str
    error: NotRequired[Optional[Problem]]
    plan: NotRequired[Optional[PlanView]]
    staged_at: NotRequired[str]
    """When a commit asked to hold staged it (`commit(hold=True)`)."""


class ResourceView(TypedDict):
    resource: str
    table: str
    write_mode: WriteMode
    primary_key: List[str]
    table_options: NotRequired[dict[str, Any]]
    metadata_columns: NotRequired[List[MetadataColumn]]
    order_by: NotRequired[List[str]]
    deletes: NotRequired[Literal["hard", "soft"]]
    delete_missing: NotRequired[bool]
    widen_columns: NotRequired[bool]
    layout_mismatch: NotRequired[List[dict[str, Any]]]


class RunView(TypedDict):
    run_id: str
    destination: dict[str, Any]
    batching: dict[str, Any]
    resources: List[ResourceView]
    executions: List[dict[str, Any]]
    created_at: str
    durable_checkpoint: NotRequired[Optional[Any]]
    durable_checkpoint_execution_id: NotRequired[Optional[str]]
    maximum_bytes_billed: NotRequired[Optional[int]]
    maximum_bytes_billed_per_execution: NotRequired[Optional[int]]
    atomic: NotRequired[bool]


class LatestExecution(TypedDict):
    execution_id: str
    state: ExecutionState
    created_at: str
    rows_received: int
    rows_acknowledged: int
    bytes_received: int
    error: NotRequired[dict[str, str]]


class RunListItem(TypedDict):
    """One run of `GET /v1/runs`."""

    run_id: str
    destination: dict[str, str]
    principal: str
    created_at: str
    updated_at: str
    latest_execution: Optional[LatestExecution]


class CheckpointResponse(TypedDict):
    checkpoint_seq: int
    flushed_rows: int
