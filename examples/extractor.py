#!/usr/bin/env python3
"""A minimal Filament extractor: creates a run, declares two resources, posts several Arrow IPC
batches per resource (one gzip-compressed), records a checkpoint and commits.

Usage: examples/extractor.py --gateway http://127.0.0.1:8080 --token TOKEN [--project demo]
                             [--dataset filament_example] [--run-id example_run]
Prints the committed execution as JSON. Needs pyarrow and requests (examples/requirements.txt).
"""
import argparse
import datetime as dt
import gzip
import json
import sys

import pyarrow as pa
import requests

ARROW_STREAM = "application/vnd.apache.arrow.stream"


def ipc_stream(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


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
    parser.add_argument("--project", default="demo")
    parser.add_argument("--dataset", default="filament_example")
    parser.add_argument("--run-id", default="example_run")
    parser.add_argument("--execution-id", default="example_execution_1")
    args = parser.parse_args()

    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {args.token}"

    def call(method: str, path: str, **kwargs) -> dict:
        response = session.request(method, args.gateway + path, timeout=120, **kwargs)
        if response.status_code >= 300:
            sys.exit(f"{method} {path}: {response.status_code} {response.text}")
        return response.json()

    run = f"/v1/runs/{args.run_id}"
    call("POST", "/v1/runs", json={"run_id": args.run_id, "destination": {"project": args.project, "dataset": args.dataset}})
    call("PUT", f"{run}/resources/public.users", json={"write_mode": "full_append"})
    call("PUT", f"{run}/resources/public.orders", json={"table": "orders", "write_mode": "incremental_append"})
    execution = call("POST", f"{run}/executions", json={"execution_id": args.execution_id})
    batches = f"{run}/executions/{execution['execution_id']}/resources"

    for seq, start in enumerate([0, 100, 200]):
        receipt = call(
            "POST", f"{batches}/public.users/batches?seq={seq}",
            data=ipc_stream(users(start, 100)), headers={"Content-Type": ARROW_STREAM},
        )
        print(f"users seq={receipt['seq']} rows={receipt['rows']} sha256={receipt['arrow_ipc_sha256'][:12]}...", file=sys.stderr)
    for seq, start in enumerate([0, 50]):
        # The second orders batch goes gzip-compressed, as extractors on slow links would send it.
        body = ipc_stream(orders(start, 50))
        headers = {"Content-Type": ARROW_STREAM}
        if seq == 1:
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
        receipt = call("POST", f"{batches}/public.orders/batches?seq={seq}", data=body, headers=headers)
        print(f"orders seq={receipt['seq']} rows={receipt['rows']}", file=sys.stderr)

    call("POST", f"{run}/executions/{execution['execution_id']}/checkpoints", json={"checkpoint": {"cursor": "2024-03-01"}})
    committed = call("POST", f"{run}/executions/{execution['execution_id']}/commit?wait=true")
    print(json.dumps(committed, indent=2))
    return 0 if committed["state"] == "committed" else 1


if __name__ == "__main__":
    sys.exit(main())
