"""The destination's settings, resolvable like any dlt destination's (arguments of
`filament(...)`, `destination.filament.*` in config.toml / secrets.toml, or environment
variables such as `DESTINATION__FILAMENT__CREDENTIALS__TOKEN`)."""

from __future__ import annotations

import dataclasses
from typing import Final, Optional

from dlt.common.configuration import configspec
from dlt.common.configuration.specs import CredentialsConfiguration
from dlt.common.destination.client import DestinationClientDwhConfiguration
from dlt.common.typing import TSecretStrValue

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


@configspec
class FilamentCredentials(CredentialsConfiguration):
    """Where the gateway listens and the bearer token of a principal allowed to write there."""

    url: Optional[str] = None
    token: Optional[TSecretStrValue] = None

    def __str__(self) -> str:
        return self.url or ""  # never the token


@configspec
class FilamentClientConfiguration(DestinationClientDwhConfiguration):
    destination_type: Final[str] = dataclasses.field(  # type: ignore[misc]
        default="filament", init=False, repr=False, compare=False
    )
    credentials: FilamentCredentials = None  # type: ignore[assignment]
    project: Optional[str] = None
    """The Google Cloud project of the BigQuery dataset (`dataset_name` of the pipeline)."""
    location: Optional[str] = None
    """The dataset's location, when the gateway creates it (BigQuery's default otherwise)."""
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    """Arrow IPC bytes per batch request (before compression)."""
    compression: str = "zstd"
    """`zstd`, `gzip` or `none` (`Content-Encoding` of the batch requests)."""
    max_deliveries: int = 3
    """How often one load is delivered within one `complete_load` when the gateway fails it for
    a passing reason (`gateway_restarted`, ...); a later `pipeline.run()` delivers it again."""
    run_id_prefix: Optional[str] = None
    """Starts every run id the destination creates: the `run_id_prefix` of the principal whose
    token it uses, when it has one (such a principal may create no other run ids)."""
    allow_insecure_http: bool = False
    """Send the token over plain `http://` to a host that is not this machine (refused
    otherwise): only on a network you trust."""
    request_timeout: float = 300.0
    commit_timeout: float = 3600.0
    """How long one `complete_load` waits for its commit; past it the load fails for dlt to
    retry (the commit goes on at the gateway, and the retry waits for its outcome under the
    same execution id, sending nothing twice)."""

    def fingerprint(self) -> str:
        """What tells two destinations apart in dlt's pipeline state: the gateway's url."""
        return (self.credentials.url or "") if self.credentials else ""
