"""A dlt destination that loads through the filament-bigquery gateway (extra `dlt`:
`pip install 'filament-bigquery[dlt]'`).

    import dlt
    import filament_bigquery.dlt

    pipeline = dlt.pipeline(
        pipeline_name="shop",
        destination=filament_bigquery.dlt.filament(url="http://127.0.0.1:8080", token="...", project="my-project"),
        dataset_name="shop_raw",
    )
    pipeline.run(source)

Layout: `_factory` (the `filament` destination and its capabilities), `_configuration` (its
settings), `_job_client` (a load package -> one gateway execution), `_mapping` (ids, write
modes and Arrow schemas: pure functions)."""

try:
    import dlt as _dlt  # noqa: F401 - only to say what is missing
except ImportError as missing:  # pragma: no cover - depends on the environment
    raise ImportError("the dlt destination needs dlt: pip install 'filament-bigquery[dlt]'") from missing

from ._configuration import FilamentClientConfiguration, FilamentCredentials
from ._factory import filament
from ._mapping import UnsupportedHint, execution_id_for, run_id_for

__all__ = [
    "FilamentClientConfiguration",
    "FilamentCredentials",
    "UnsupportedHint",
    "execution_id_for",
    "filament",
    "run_id_for",
]
