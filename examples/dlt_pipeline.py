#!/usr/bin/env python3
"""A dlt pipeline loading into BigQuery through the gateway (`filament_bigquery.dlt`).

The source is inline and offline, shaped like a public API's answers (a repository's issues
with their labels, its releases and a snapshot of its stars): `issues` is merged on its id,
its labels become the nested table `issues__labels`; `releases` is appended; `stargazers` is
replaced at every load.

Usage: examples/dlt_pipeline.py --gateway http://127.0.0.1:8080 --token TOKEN
                                [--project filament-demo] [--dataset github_example]
                                [--pipelines-dir DIR]
Needs `pip install 'filament-bigquery[dlt]'` (dlt, pyarrow, requests). Prints dlt's load info.
"""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any, Iterator

import dlt

import filament_bigquery.dlt

ISSUES = [
    {"id": 101, "title": "Crash on empty input", "state": "open", "labels": [{"name": "bug"}, {"name": "p1"}]},
    {"id": 102, "title": "Document the retry policy", "state": "closed", "labels": [{"name": "docs"}]},
    {"id": 103, "title": "Support zstd bodies", "state": "open", "labels": []},
]


@dlt.resource(write_disposition="merge", primary_key="id")
def issues() -> Iterator[dict[str, Any]]:
    yield from ISSUES


@dlt.resource(write_disposition="append")
def releases() -> Iterator[dict[str, Any]]:
    yield {"tag": "v0.1.0", "published_at": dt.datetime(2024, 3, 1, 12, 0, tzinfo=dt.timezone.utc)}


@dlt.resource(write_disposition="replace")
def stargazers() -> Iterator[dict[str, Any]]:
    yield from ({"login": f"user{i}", "starred_on": dt.date(2024, 1, 1 + i)} for i in range(5))


@dlt.source(name="github")
def github() -> Any:
    return issues(), releases(), stargazers()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gateway", default="http://127.0.0.1:8080")
    parser.add_argument("--token", required=True)
    parser.add_argument("--project", default="filament-demo")
    parser.add_argument("--dataset", default="github_example")
    parser.add_argument("--pipelines-dir", default=None, help="where dlt keeps the pipeline's state (default: ~/.dlt)")
    args = parser.parse_args()
    pipeline = dlt.pipeline(
        pipeline_name="github_example",
        destination=filament_bigquery.dlt.filament(url=args.gateway, token=args.token, project=args.project),
        dataset_name=args.dataset,
        pipelines_dir=args.pipelines_dir,
    )
    print(pipeline.run(github()))


if __name__ == "__main__":
    main()
