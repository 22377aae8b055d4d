#!/usr/bin/env python3
"""A minimal Filament extractor on the Python client (clients/python, `filament_bigquery`):
creates a run, declares two resources, writes their rows (the client splits them into batch
bodies, numbers `seq`, compresses and retries), records a checkpoint and commits.

Usage: examples/extractor.py --gateway http://127.0.0.1:8080 --token TOKEN [--project filament-demo]
                             [--dataset filament_example] [--run-id example_run]
                             [--execution-id example_execution_1]
Prints the committed execution as JSON. Needs pyarrow and requests (examples/requirements.txt);
uses the installed filament-bigquery package, or else the one in clients/python/src.
"""
import argparse
import datetime as dt
import json
import sys
from pathlib import Path

import pyarrow as pa

try:
    import filament_bigquery
except ImportError:  # not installed: use the source tree next to this example
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "clients" / "python" / "src"))
    import filament_bigquery


def users(start: int, count: int) -> pa.Table:
    ids = list(range(start, start + count))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f"user-{i}" for i in ids], pa.string()),
            "active": pa.array([i % 2 == 0 for i in ids], pa.bool_()),
            "score": pa.array([i * 1.5 for i in ids], pa.float64()),
            "signed_up": pa.array([dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in ids], pa.date32()),
            "updated_at": pa.array(
                [dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=i) for i in ids],
                pa.timestamp("us", tz="UTC"),
            ),
        }
    )


def orders(start: int, count: int) -> pa.Table:
    ids = list(range(start, start + count))
    return pa.table(
        {
            "order_id": pa.array(ids, pa.int64()),
            "user_id": pa.array([i % 7 for i in ids], pa.int64()),
            "note": pa.array([None if i % 3 == 0 else f"note {i}" for i in ids], pa.string()),
            "payload": pa.array([bytes([i % 256]) * 4 for i in ids], pa.binary()),
            "placed_at": pa.array([dt.datetime(2024, 2, 1) + dt.timedelta(minutes=i) for i in ids], pa.timestamp("us")),
        }
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gateway", default="http://127.0.0.1:8080")
    parser.add_argument("--token", required=True)
    parser.add_argument("--project", default="filament-demo")
    parser.add_argument("--dataset", default="filament_example")
    parser.add_argument("--run-id", default="example_run")
    parser.add_argument("--execution-id", default="example_execution_1")
    args = parser.parse_args()

    with filament_bigquery.Client(args.gateway, token=args.token) as client:
        try:
            run = client.create_run(project=args.project, dataset=args.dataset, run_id=args.run_id)
            run.declare("public.users", write_mode="full_append")
            run.declare("public.orders", write_mode="incremental_append", table="orders")
            # Commits (waiting for the outcome) when the block ends; an exception aborts instead.
            with run.execution(execution_id=args.execution_id) as ex:
                # Three writes: three batch bodies, seq 0, 1, 2 (zstd-compressed by default).
                for start in (0, 100, 200):
                    result = ex.write("public.users", users(start, 100))
                    receipt = result.receipts[0]
                    print(f"users seq={receipt['seq']} rows={receipt['rows']} sha256={receipt['arrow_ipc_sha256'][:12]}...", file=sys.stderr)
                # A table, then a stream of record batches (read as they are sent) gzip-compressed,
                # as extractors on slow links would send it.
                result = ex.write("public.orders", orders(0, 50))
                print(f"orders seq={result.receipts[0]['seq']} rows={result.rows}", file=sys.stderr)
                reader = pa.RecordBatchReader.from_batches(orders(0, 1).schema, iter(orders(50, 50).to_batches()))
                result = ex.write("public.orders", reader, compression="gzip")
                print(f"orders seq={result.receipts[0]['seq']} rows={result.rows} (gzip)", file=sys.stderr)
                ex.checkpoint({"cursor": "2024-03-01"})
        except filament_bigquery.FilamentError as error:
            sys.exit(f"{type(error).__name__}: {error}")
    print(f"run {run.run_id} execution {ex.execution_id} delivery {ex.delivery}", file=sys.stderr)
    print(json.dumps(ex.result, indent=2))
    return 0 if ex.result is not None and ex.result["state"] == "committed" else 1


if __name__ == "__main__":
    sys.exit(main())
