#!/usr/bin/env python3
"""Runs a GoogleSQL query against the local bqemulator (BIGQUERY_EMULATOR_HOST) and prints rows.

Usage: examples/query.py "SELECT COUNT(*) FROM filament_example.public_users" [--project filament-demo]
"""
import argparse
import json
import os
import sys

import requests


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("sql", nargs="?", default="SELECT COUNT(*) AS users FROM filament_example.public_users")
    parser.add_argument("--project", default="filament-demo")
    parser.add_argument("--host", default=os.environ.get("BIGQUERY_EMULATOR_HOST", "127.0.0.1:9050"))
    args = parser.parse_args()
    response = requests.post(
        f"http://{args.host}/bigquery/v2/projects/{args.project}/queries",
        json={"query": args.sql, "useLegacySql": False},
        timeout=60,
    )
    body = response.json()
    if response.status_code != 200:
        print(json.dumps(body, indent=2), file=sys.stderr)
        return 1
    names = [f["name"] for f in body.get("schema", {}).get("fields", [])]
    print("\t".join(names))
    for row in body.get("rows", []):
        print("\t".join("NULL" if c.get("v") is None else str(c["v"]) for c in row["f"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
