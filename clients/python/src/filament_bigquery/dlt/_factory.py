"""`filament(...)`: the dlt destination factory (dlt's `Destination` interface, as the
destinations in `dlt.destinations.impl` implement it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Type

from dlt.common.destination import Destination, DestinationCapabilitiesContext

from ._configuration import FilamentClientConfiguration, FilamentCredentials

if TYPE_CHECKING:
    from ._job_client import FilamentJobClient


class filament(Destination[FilamentClientConfiguration, "FilamentJobClient"]):
    """Loads a dlt pipeline into BigQuery through a filament-bigquery gateway:

        pipeline = dlt.pipeline("shop", destination=filament(url=..., token=..., project=...),
                                dataset_name="shop_raw")

    Each load package is one gateway run and execution (its id: the load id), committed when
    dlt completes the load; see docs/clients.md for the write modes and types. A principal with
    a `run_id_prefix` needs the same `run_id_prefix=` here: every run id starts with it."""

    spec = FilamentClientConfiguration

    def _raw_capabilities(self) -> DestinationCapabilitiesContext:
        caps = DestinationCapabilitiesContext.generic_capabilities(
            preferred_loader_file_format="parquet",
            # The gateway's keyed MERGE is an upsert: dlt's `upsert` strategy hashes the primary
            # key into `_dlt_id`, which nested rows of a rewritten key are found by.
            supported_merge_strategies=["upsert"],
        )
        caps.supported_loader_file_formats = ["parquet"]
        caps.supported_replace_strategies = ["truncate-and-insert"]
        caps.has_case_sensitive_identifiers = False  # BigQuery column names are not
        caps.max_identifier_length = 1024  # table names
        caps.max_column_identifier_length = 300
        caps.decimal_precision = (38, 9)  # NUMERIC
        caps.wei_precision = (76, 38)  # BIGNUMERIC
        caps.timestamp_precision = 6
        caps.supports_ddl_transactions = False
        caps.supports_transactions = False
        return caps

    @property
    def client_class(self) -> Type["FilamentJobClient"]:
        from ._job_client import FilamentJobClient

        return FilamentJobClient

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        project: Optional[str] = None,
        location: Optional[str] = None,
        run_id_prefix: Optional[str] = None,
        credentials: Optional[FilamentCredentials] = None,
        destination_name: Optional[str] = None,
        environment: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        if credentials is None and (url is not None or token is not None):
            credentials = FilamentCredentials(url=url, token=token)
        super().__init__(
            credentials=credentials,
            project=project,
            location=location,
            run_id_prefix=run_id_prefix,
            destination_name=destination_name,
            environment=environment,
            **kwargs,
        )


filament.register()
