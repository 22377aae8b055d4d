#!/usr/bin/env python3
"""Proves the ZetaSQL judge (scripts/zetasql_analyze.py) works and can fail: statements it must
refuse (among them the two gateway bugs it caught), statements shaped like the gateway's
publications it must accept, BigQuery features this build lacks (known differences, expected
refused so that a newer analyzer that gains them is noticed), and the JSON Lines protocol
itself. Prints PASS or FAIL per case and exits non-zero on any unexpected result.

It speaks to the client exactly as the tests do (a subprocess, one JSON line each way), so it
tests the client's protocol and catalog conversion as well as the analyzer.

Usage (with the tools virtualenv's python):
  scripts/zetasql_selftest.py [--addr HOST:PORT] [--bench N]
Without --addr or $FILAMENT_ZETASQL_ADDR it starts an analyzer of its own with
scripts/zetasql.sh (installing it if needed) and stops it at the end. --bench N also times N
gateway-shaped MERGE statements through one client and prints statements per second.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeAlias

ROOT = Path(__file__).resolve().parent.parent
CLIENT = ROOT / "scripts" / "zetasql_analyze.py"

PROJECT, DATASET = "p-1", "d"
DEST = f"`{PROJECT}`.`{DATASET}`.`dest`"
STAGING = f"`{PROJECT}`.`{DATASET}`.`staging`"

# A TableFieldSchema, a table of a request's "tables", an answer of the client (JSON).
Field: TypeAlias = dict[str, object]
Table: TypeAlias = dict[str, object]
Answer: TypeAlias = dict[str, Any]


def field(name: str, type_: str, mode: str | None = None, fields: list[Field] | None = None, **extra: str) -> Field:
    f: Field = {"name": name, "type": type_}
    if mode:
        f["mode"] = mode
    if fields:
        f["fields"] = fields
    f.update(extra)
    return f


# The destination as the gateway creates it and its staging table (everything staged as the
# Storage Write API can carry it: NUMERIC, BIGNUMERIC, TIME and JSON as STRING).
DEST_FIELDS = [
    field("id", "INTEGER", "REQUIRED"),
    field("k", "NUMERIC"),
    field("t", "STRING"),
    field("name", "STRING"),
    field("tenant", "STRING", collation="und:ci"),
    field("at", "TIME"),
    field("balance", "BIGNUMERIC"),
    field("updated_at", "TIMESTAMP"),
    field("amounts", "BIGNUMERIC", "REPEATED"),
    field("shipment", "RECORD", fields=[
        field("carrier", "STRING"),
        field("at", "TIME"),
        field("lines", "RECORD", "REPEATED", fields=[field("sku", "STRING"), field("price", "NUMERIC")]),
    ]),
    field("payload", "JSON"),
    field("tags", "STRING", "REPEATED"),
]
STAGING_FIELDS = [
    field("id", "INT64"),
    field("k", "STRING"),
    field("t", "STRING"),
    field("name", "STRING"),
    field("tenant", "STRING"),
    field("at", "STRING"),
    field("balance", "STRING"),
    field("updated_at", "TIMESTAMP"),
    field("amounts", "STRING", "REPEATED"),
    field("shipment", "RECORD", fields=[
        field("carrier", "STRING"),
        field("at", "STRING"),
        field("lines", "RECORD", "REPEATED", fields=[field("sku", "STRING"), field("price", "STRING")]),
    ]),
    field("payload", "STRING"),
    field("tags", "STRING", "REPEATED"),
    field("_filament_seq", "INT64"),
    field("_filament_op", "STRING"),
]
TABLES: list[Table] = [
    {"project": PROJECT, "dataset": DATASET, "table": "dest", "fields": DEST_FIELDS},
    {"project": PROJECT, "dataset": DATASET, "table": "staging", "fields": STAGING_FIELDS},
]
SMALL_T: list[Table] = [
    {"project": PROJECT, "dataset": DATASET, "table": "t", "fields": [field("x", "INT64"), field("s", "STRING")]},
]

# The gateway's conversion of a nested staged value, as src/publish/sql.rs writes it.
SHIPMENT = (
    "IF(_filament_staged.`shipment` IS NULL, NULL, STRUCT("
    "_filament_staged.`shipment`.`carrier` AS `carrier`, "
    "CAST(_filament_staged.`shipment`.`at` AS TIME) AS `at`, "
    "ARRAY(SELECT IF(_filament_e0 IS NULL, NULL, STRUCT(_filament_e0.`sku` AS `sku`, "
    "PARSE_NUMERIC(_filament_e0.`price`) AS `price`)) "
    "FROM UNNEST(_filament_staged.`shipment`.`lines`) AS _filament_e0 WITH OFFSET AS _filament_o0 "
    "ORDER BY _filament_o0) AS `lines`))"
)
AMOUNTS = ("ARRAY(SELECT PARSE_BIGNUMERIC(_filament_e0) FROM UNNEST(_filament_staged.`amounts`) AS _filament_e0 "
           "WITH OFFSET AS _filament_o0 ORDER BY _filament_o0)")

INSERT_ALL = (
    f"INSERT INTO {DEST} (`id`, `k`, `t`, `name`, `tenant`, `at`, `balance`, `updated_at`, `amounts`, `shipment`, "
    "`payload`, `tags`)\n"
    "SELECT _filament_staged.`id` AS `id`, PARSE_NUMERIC(_filament_staged.`k`) AS `k`, _filament_staged.`t` AS `t`, "
    "_filament_staged.`name` AS `name`, _filament_staged.`tenant` AS `tenant`, "
    "CAST(_filament_staged.`at` AS TIME) AS `at`, PARSE_BIGNUMERIC(_filament_staged.`balance`) AS `balance`, "
    f"_filament_staged.`updated_at` AS `updated_at`, {AMOUNTS} AS `amounts`, {SHIPMENT} AS `shipment`, "
    "PARSE_JSON(_filament_staged.`payload`) AS `payload`, _filament_staged.`tags` AS `tags`\n"
    f"FROM {STAGING} AS _filament_staged"
)


def merge(partition: str = "PARSE_NUMERIC(_filament_staged.`k`)", extra_select: str = "", on_extra: str = "",
          clauses: list[str] | None = None) -> str:
    """A keyed publication shaped like the gateway's (src/publish/sql.rs `merge`)."""
    clauses = clauses or [
        "WHEN MATCHED THEN UPDATE SET `t` = _filament_source.`t`, `name` = _filament_source.`name`",
        "WHEN NOT MATCHED THEN INSERT (`id`, `k`, `t`, `name`) VALUES (_filament_source.`id`, _filament_source.`k`, "
        "_filament_source.`t`, _filament_source.`name`)",
    ]
    return (
        f"MERGE {DEST} AS _filament_target\nUSING (\n"
        "  SELECT _filament_staged.`id` AS `id`, PARSE_NUMERIC(_filament_staged.`k`) AS `k`, "
        f"_filament_staged.`t` AS `t`, _filament_staged.`name` AS `name`{extra_select}\n"
        f"  FROM {STAGING} AS _filament_staged\n  WHERE TRUE\n"
        f"  QUALIFY ROW_NUMBER() OVER (PARTITION BY {partition} ORDER BY _filament_staged.`_filament_seq` DESC) = 1\n"
        f") AS _filament_source\nON _filament_target.`id` = _filament_source.`id`{on_extra}\n" + "\n".join(clauses)
    )


REFUSED, ACCEPTED, DIFFERENCE = "refused", "accepted", "known difference (refused)"

# (name, expectation, sql, mode, substring the refusal must contain / statements when accepted)
Case: TypeAlias = tuple[str, str, str, str, str | int]
CASES: list[Case] = [
    # --- must be refused -----------------------------------------------------------------
    ("misspelled function PARSE_NUMERC", REFUSED,
     f"SELECT PARSE_NUMERC(_filament_staged.`k`) AS `k` FROM {STAGING} AS _filament_staged",
     "statement", "Function not found: PARSE_NUMERC"),
    ("MERGE ON comparing INT64 with STRING", REFUSED,
     f"MERGE {DEST} AS T USING {STAGING} AS S ON T.id = S.name WHEN MATCHED THEN DELETE",
     "statement", "No matching signature for operator ="),
    ("QUALIFY without WHERE, GROUP BY or HAVING", REFUSED,
     f"SELECT * FROM `{PROJECT}`.`{DATASET}`.`t` QUALIFY ROW_NUMBER() OVER (ORDER BY x) = 1",
     "statement", "QUALIFY clause must be used in conjunction with WHERE or GROUP BY or HAVING"),
    ("gateway bug (a): QUALIFY's `k` is the NUMERIC alias", REFUSED,
     f"SELECT PARSE_NUMERIC(`k`) AS `k`, `_filament_seq` FROM {STAGING} WHERE TRUE "
     "QUALIFY ROW_NUMBER() OVER (PARTITION BY PARSE_NUMERIC(`k`) ORDER BY `_filament_seq` DESC) = 1",
     "statement", "No matching signature for function PARSE_NUMERIC for argument types: NUMERIC"),
    ("gateway bug (b): SET `t` names the row aliased T", REFUSED,
     f"MERGE {DEST} AS T USING (SELECT `id`, `t` FROM {STAGING}) AS S ON T.`id` = S.`id` "
     "WHEN MATCHED THEN UPDATE SET `t` = S.`t` WHEN NOT MATCHED THEN INSERT (`id`, `t`) VALUES (S.`id`, S.`t`)",
     "statement", "UPDATE ... SET does not support updating the entire row"),
    ("unknown column", REFUSED,
     f"SELECT _filament_staged.`nope` FROM {STAGING} AS _filament_staged", "statement", "nope"),
    ("unknown table", REFUSED, f"SELECT 1 FROM `{PROJECT}`.`{DATASET}`.`missing`", "statement", "Table not found"),
    ("INSERT of a STRING into a NUMERIC column", REFUSED,
     f"INSERT INTO {DEST} (`id`, `k`) SELECT `id`, `k` FROM {STAGING}", "statement", "k"),
    ("UPDATE without WHERE (BigQuery requires one)", REFUSED,
     f"UPDATE {DEST} SET `t` = 'x'", "statement", "UPDATE must have a WHERE clause"),
    ("script: the error is in statement 3", REFUSED,
     f"BEGIN TRANSACTION;\nTRUNCATE TABLE {DEST};\nINSERT INTO {DEST} (`id`) SELECT `nope` FROM {STAGING};\n"
     "COMMIT TRANSACTION;", "script", "statement 3 (byte "),
    # --- must be accepted ----------------------------------------------------------------
    ("bug (a) fixed: table-qualified references", ACCEPTED,
     f"SELECT PARSE_NUMERIC(_filament_staged.`k`) AS `k`, _filament_staged.`_filament_seq` "
     f"FROM {STAGING} AS _filament_staged WHERE TRUE QUALIFY ROW_NUMBER() OVER "
     "(PARTITION BY PARSE_NUMERIC(_filament_staged.`k`) ORDER BY _filament_staged.`_filament_seq` DESC) = 1",
     "statement", 1),
    ("bug (b) fixed: target _filament_target, source _filament_source", ACCEPTED,
     f"MERGE {DEST} AS _filament_target USING (SELECT _filament_staged.`id` AS `id`, _filament_staged.`t` AS `t` "
     f"FROM {STAGING} AS _filament_staged) AS _filament_source ON _filament_target.`id` = _filament_source.`id` "
     "WHEN MATCHED THEN UPDATE SET `t` = _filament_source.`t` "
     "WHEN NOT MATCHED THEN INSERT (`id`, `t`) VALUES (_filament_source.`id`, _filament_source.`t`)",
     "statement", 1),
    ("full_replace: a four-statement script", ACCEPTED,
     f"BEGIN TRANSACTION;\nTRUNCATE TABLE {DEST};\n{INSERT_ALL};\nCOMMIT TRANSACTION;", "script", 4),
    ("upsert MERGE (fold, bound, update, insert)", ACCEPTED,
     merge(on_extra=" AND _filament_target.`id` BETWEEN 3 AND 97"), "statement", 1),
    ("MERGE folding keys under COLLATE(`tenant`, 'und:ci')", ACCEPTED,
     merge(partition="COLLATE(_filament_staged.`tenant`, 'und:ci'), _filament_staged.`id`",
           extra_select=", _filament_staged.`tenant` AS `tenant`",
           on_extra=" AND _filament_target.`tenant` = _filament_source.`tenant`"), "statement", 1),
    ("MERGE with PARTITION BY COLLATE(`k`, 'und:ci') unqualified", ACCEPTED,
     f"MERGE {DEST} AS _filament_target USING (SELECT `tenant`, `id` FROM {STAGING} WHERE TRUE "
     "QUALIFY ROW_NUMBER() OVER (PARTITION BY COLLATE(`tenant`, 'und:ci') ORDER BY `_filament_seq` DESC) = 1) "
     "AS _filament_source ON _filament_target.`tenant` = _filament_source.`tenant` "
     "WHEN MATCHED THEN UPDATE SET `id` = _filament_source.`id`", "statement", 1),
    ("cdc_merge: operation guards and a string range with a quote", ACCEPTED,
     merge(extra_select=", _filament_staged.`_filament_op`",
           on_extra=" AND _filament_target.`name` BETWEEN 'acme' AND 'o\\'hara'",
           clauses=[
               "WHEN MATCHED AND _filament_source.`_filament_op` = 'delete' THEN DELETE",
               "WHEN MATCHED THEN UPDATE SET `t` = _filament_source.`t`",
               "WHEN NOT MATCHED AND _filament_source.`_filament_op` != 'delete' THEN INSERT (`id`, `t`) "
               "VALUES (_filament_source.`id`, _filament_source.`t`)",
           ]), "statement", 1),
    ("MERGE ... WHEN NOT MATCHED BY SOURCE THEN DELETE", ACCEPTED,
     merge(clauses=["WHEN MATCHED THEN UPDATE SET `t` = _filament_source.`t`",
                    "WHEN NOT MATCHED BY TARGET THEN INSERT (`id`) VALUES (_filament_source.`id`)",
                    "WHEN NOT MATCHED BY SOURCE THEN DELETE"]), "statement", 1),
    ("STRUCT/ARRAY conversions (PARSE_BIGNUMERIC over UNNEST WITH OFFSET, nested STRUCT)", ACCEPTED,
     INSERT_ALL, "statement", 1),
    ("ARRAY(SELECT PARSE_NUMERIC(e) FROM UNNEST(col) AS e WITH OFFSET AS o ORDER BY o)", ACCEPTED,
     f"SELECT ARRAY(SELECT PARSE_NUMERIC(e) FROM UNNEST(`tags`) AS e WITH OFFSET AS o ORDER BY o) AS a FROM {STAGING}",
     "statement", 1),
    ("TRUNCATE TABLE", ACCEPTED, f"TRUNCATE TABLE {DEST}", "statement", 1),
    ("DELETE and UPDATE with WHERE", ACCEPTED,
     f"DELETE FROM {DEST} WHERE `id` = 1;\nUPDATE {DEST} SET `t` = 'x' WHERE TRUE", "script", 2),
    ("BEGIN TRANSACTION / ROLLBACK TRANSACTION", ACCEPTED, "BEGIN TRANSACTION; ROLLBACK TRANSACTION;", "script", 2),
    ("dashed project unquoted, one-backtick path, any case", ACCEPTED,
     "SELECT x FROM p-1.d.t; SELECT x FROM `p-1.d.t`; SELECT X FROM `p-1`.`d`.`t`", "script", 3),
    ("BigQuery features released in BigQuery, in development in ZetaSQL", ACCEPTED,
     "SELECT DATE_BUCKET(DATE '2020-01-01', INTERVAL 7 DAY), COT(1.0), "
     "CAST('P1D' AS INTERVAL), COLLATE('a', 'und:ci') = 'A'", "statement", 1),
    ("JSON, BIGNUMERIC, SAFE., system variables", ACCEPTED,
     "SELECT JSON_VALUE(PARSE_JSON('{\"a\": 1}'), '$.a'), SAFE.PARSE_BIGNUMERIC('x'), @@project_id, @@row_count",
     "statement", 1),
    # --- BigQuery has these, this ZetaSQL build does not: expected refused ------------------
    ("CONTAINS_SUBSTR (BigQuery-only function)", DIFFERENCE,
     "SELECT CONTAINS_SUBSTR('abc', 'B')", "statement", "Function not found: CONTAINS_SUBSTR"),
    ("MAX_BY / MIN_BY", DIFFERENCE, f"SELECT MAX_BY(x, s) FROM `{PROJECT}`.`{DATASET}`.`t`", "statement",
     "Function not found: MAX_BY"),
    ("JSON_KEYS", DIFFERENCE, "SELECT JSON_KEYS(JSON '{}')", "statement", "Function not found: JSON_KEYS"),
    ("EDIT_DISTANCE", DIFFERENCE, "SELECT EDIT_DISTANCE('a', 'b')", "statement", "Function not found: EDIT_DISTANCE"),
    ("UNION ALL BY NAME (newer syntax)", DIFFERENCE,
     f"SELECT x FROM `{PROJECT}`.`{DATASET}`.`t` UNION ALL BY NAME SELECT x FROM `{PROJECT}`.`{DATASET}`.`t`",
     "statement", "Syntax error"),
    ("INFORMATION_SCHEMA views", DIFFERENCE,
     f"SELECT * FROM `{PROJECT}`.`{DATASET}`.INFORMATION_SCHEMA.COLUMNS", "statement", "Table not found"),
    ("_PARTITIONTIME pseudo-column", DIFFERENCE,
     f"SELECT _PARTITIONTIME FROM `{PROJECT}`.`{DATASET}`.`t`", "statement", "Unrecognized name: _PARTITIONTIME"),
    ("scripting: DECLARE", DIFFERENCE, "DECLARE v INT64 DEFAULT 1; SELECT v", "script", "Unexpected keyword DECLARE"),
    ("scripting: BEGIN ... END block", DIFFERENCE, "BEGIN\n  SELECT 1;\nEND", "script", "Syntax error"),
]


class Client:
    def __init__(self, python: str, addr: str) -> None:
        self.process = subprocess.Popen([python, str(CLIENT), "--addr", addr], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, bufsize=1)
        # Both asked for as pipes above, so both are there.
        assert self.process.stdin is not None and self.process.stdout is not None
        self.stdin: IO[str] = self.process.stdin
        self.stdout: IO[str] = self.process.stdout
        self.next_id = 0

    def raw(self, line: str) -> Answer:
        self.stdin.write(line + "\n")
        self.stdin.flush()
        answer = self.stdout.readline()
        if not answer:
            raise SystemExit(f"FAIL the client exited (status {self.process.wait()})")
        decoded = json.loads(answer)
        if not isinstance(decoded, dict):
            raise SystemExit(f"FAIL the client answered {answer!r}, not a JSON object")
        return decoded

    def analyze(self, tables: list[Table], sql: str, mode: str) -> Answer:
        self.next_id += 1
        answer = self.raw(json.dumps({"id": str(self.next_id), "tables": tables, "sql": sql, "mode": mode}))
        assert answer["id"] == str(self.next_id), answer
        return answer

    def close(self) -> int:
        self.stdin.close()
        return self.process.wait(timeout=30)


def check_case(client: Client, name: str, expectation: str, sql: str, mode: str, expected: str | int) -> bool:
    tables = TABLES + SMALL_T
    answer = client.analyze(tables, sql, mode)
    errors = "; ".join(answer["errors"])
    if expectation == ACCEPTED:
        good = answer["ok"] and answer["statements"] == expected and not answer["errors"]
        detail = f"{answer['statements']} statement(s)" if good else f"refused: {errors or answer}"
    else:
        good = not answer["ok"] and isinstance(expected, str) and expected in errors and not answer.get("malformed")
        detail = errors if good else (f"accepted ({answer['statements']} statement(s))" if answer["ok"]
                                      else f"refused for another reason: {errors}")
    print(f"{'PASS' if good else 'FAIL'}  [{expectation}] {name}\n      {detail}")
    return good


def check_protocol(client: Client) -> list[bool]:
    """The answers to what a test might get wrong in its request."""
    results: list[bool] = []

    def expect(name: str, line: str, predicate: Callable[[Answer], object]) -> None:
        answer = client.raw(line)
        good = bool(predicate(answer))
        print(f"{'PASS' if good else 'FAIL'}  [protocol] {name}\n      {json.dumps(answer)}")
        results.append(good)

    expect("not JSON", "{not json", lambda a: not a["ok"] and a.get("malformed") and a["id"] is None)
    expect("no sql", json.dumps({"id": "p1", "tables": []}),
           lambda a: a["id"] == "p1" and not a["ok"] and a.get("malformed"))
    expect("unknown BigQuery type", json.dumps({"id": "p2", "sql": "SELECT 1", "tables": [
        {"project": "p", "dataset": "d", "table": "t", "fields": [{"name": "x", "type": "UINT64"}]}]}),
        lambda a: not a["ok"] and a.get("malformed") and "UINT64" in a["errors"][0])
    expect("unknown mode", json.dumps({"id": "p3", "sql": "SELECT 1", "mode": "batch"}),
           lambda a: not a["ok"] and a.get("malformed"))
    expect("script with a trailing comment and blank lines",
           json.dumps({"id": "p4", "sql": "SELECT 1;\n-- done\n\n", "mode": "script"}),
           lambda a: a["ok"] and a["statements"] == 1)
    expect("two statements in statement mode are refused",
           json.dumps({"id": "p5", "sql": "SELECT 1; SELECT 2"}),
           lambda a: not a["ok"] and not a.get("malformed"))
    expect("byte offsets count UTF-8 bytes", json.dumps({"id": "p6", "sql": "SELECT 'é';\nSELECT nope", "mode": "script"}),
           lambda a: not a["ok"] and a["statements"] == 1 and a["errors"][0].startswith("statement 2 (byte 13):"))
    expect("REPEATED RECORD, RANGE and collations convert", json.dumps({"id": "p7", "tables": [{
        "project": "example.com:p", "dataset": "d", "table": "t", "default_collation": "und:ci", "fields": [
            {"name": "r", "type": "RANGE", "rangeElementType": {"type": "DATE"}},
            {"name": "s", "type": "STRING"},
            {"name": "l", "type": "RECORD", "mode": "REPEATED", "fields": [{"name": "v", "type": "STRING"}]}]}],
        "sql": "SELECT RANGE_START(r), s, l[SAFE_OFFSET(0)].v FROM `example.com:p`.`d`.`t`"}),
        lambda a: a["ok"])
    return results


def bench(client: Client, count: int) -> None:
    sql = merge(on_extra=" AND _filament_target.`id` BETWEEN 3 AND 97")
    client.analyze(TABLES, sql, "statement")  # warm up
    started = time.perf_counter()
    for _ in range(count):
        answer = client.analyze(TABLES, sql, "statement")
        assert answer["ok"], answer
    elapsed = time.perf_counter() - started
    script = f"BEGIN TRANSACTION;\nTRUNCATE TABLE {DEST};\n{INSERT_ALL};\nCOMMIT TRANSACTION;"
    started = time.perf_counter()
    for _ in range(count // 4):
        assert client.analyze(TABLES, script, "script")["ok"]
    script_elapsed = time.perf_counter() - started
    print(f"BENCH {count} MERGE statements in {elapsed:.2f}s: {count / elapsed:.0f} statements/s, "
          f"{1000 * elapsed / count:.1f} ms each; {count // 4} four-statement scripts in {script_elapsed:.2f}s: "
          f"{4 * (count // 4) / script_elapsed:.0f} statements/s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--addr", default=os.environ.get("FILAMENT_ZETASQL_ADDR"))
    parser.add_argument("--bench", type=int, default=0, metavar="N")
    args = parser.parse_args()

    env_file = None
    addr: str | None = args.addr
    if not addr:
        descriptor, env_file = tempfile.mkstemp(prefix="zetasql-selftest-", suffix=".env")
        os.close(descriptor)
        subprocess.run([str(ROOT / "scripts" / "zetasql.sh"), "start", env_file], check=True)
        for line in Path(env_file).read_text().splitlines():
            for word in line.split():
                if word.startswith("FILAMENT_ZETASQL_ADDR="):
                    addr = word.split("=", 1)[1]
    try:
        if not addr:
            raise SystemExit(f"FAIL scripts/zetasql.sh start wrote no FILAMENT_ZETASQL_ADDR into {env_file}")
        client = Client(sys.executable, addr)
        results = [check_case(client, *case) for case in CASES]
        results += check_protocol(client)
        if args.bench:
            bench(client, args.bench)
        status = client.close()
        results.append(status == 0)
        if status != 0:
            print(f"FAIL  the client exited with status {status} at EOF")
    finally:
        if env_file:
            subprocess.run([str(ROOT / "scripts" / "zetasql.sh"), "stop", env_file], check=False)
            os.unlink(env_file)
    failed = results.count(False)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
