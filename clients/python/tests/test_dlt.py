"""The dlt destination against the real gateway, Postgres and bqemulator, judged by dlt's own
duckdb destination loading the same source: the BigQuery tables must hold the same rows."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import requests

from conftest import PREFIXED_TOKEN, PROJECT, RUN_ID_PREFIX, TOKEN, Gateway, LossyProxy, query

dlt = pytest.importorskip("dlt")
duckdb = pytest.importorskip("duckdb")
import filament_bigquery.dlt as filament_dlt  # noqa: E402 - after the importorskip
from filament_bigquery import Client, Execution, GatewayUnreachable  # noqa: E402


def shop(version: int) -> Any:
    """Three resources, one per write disposition. Version 2 appends events, replaces every
    order (fewer, with other items), updates accounts, shrinks one's tags and deletes one."""

    @dlt.resource(write_disposition="append", primary_key=())
    def events() -> Iterator[dict[str, Any]]:
        start = 0 if version == 1 else 100
        for i in range(start, start + 40):
            yield {
                "event_id": i,
                "kind": "click" if i % 2 else "view",
                "payload": {"n": i, "tags": ["a", "b"][: i % 3]},
                "happened_at": dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(minutes=i, microseconds=i),
                "happened_on": dt.date(2024, 1, 1) + dt.timedelta(days=i),
                "score": i / 4,
            }

    @dlt.resource(write_disposition="replace")
    def orders() -> Iterator[dict[str, Any]]:
        count = 12 if version == 1 else 7
        for i in range(count):
            items = [{"sku": f"sku-{version}-{i}-{j}", "qty": j + 1} for j in range(i % 4)]
            yield {"order_id": i, "total": decimal.Decimal(f"{i}.{version}5"), "items": items}

    @dlt.resource(
        write_disposition={"disposition": "merge", "strategy": "upsert"},
        primary_key="account_id",
        columns={"deleted": {"data_type": "bool", "hard_delete": True}},
    )
    def accounts() -> Iterator[dict[str, Any]]:
        ids = range(10) if version == 1 else range(5, 13)
        for i in ids:
            yield {
                "account_id": i,
                "name": f"account-{i}-v{version}",
                "active": i % 2 == 0,
                "deleted": version == 2 and i == 6,
                "tags": [f"t{k}" for k in range(i % 3 if version == 2 and i == 8 else 3)],
            }

    @dlt.source(name="shop", max_table_nesting=1)
    def source() -> Any:
        return events(), orders(), accounts()

    src = source()
    src.events.apply_hints(columns={"payload": {"data_type": "json"}})
    return src


def filament_destination(gateway: Gateway, **options: Any) -> Any:
    return filament_dlt.filament(url=gateway.url, token=TOKEN, project=PROJECT, **options)


def new_pipeline(tmp_path: Path, name: str, destination: Any, dataset: str) -> Any:
    return dlt.pipeline(
        pipeline_name=name, destination=destination, dataset_name=dataset, pipelines_dir=str(tmp_path / "pipelines")
    )


# What each table is compared by: its data columns, and for nested tables the parent's key
# and the list position (the `_dlt_id`, `_dlt_parent_id` and `_dlt_root_id` values are random
# per destination for append and replace tables, and `_dlt_load_id` differs per pipeline).
COMPARED: dict[str, tuple[str, list[str]]] = {
    "events": (
        "SELECT event_id, kind, payload, happened_at, happened_on, score FROM {t}",
        ["int", "str", "json", "timestamp", "date", "float"],
    ),
    "orders": ("SELECT order_id, total FROM {t}", ["int", "decimal"]),
    "orders__items": (
        "SELECT p.order_id, c._dlt_list_idx, c.sku, c.qty FROM {t} c JOIN {orders} p ON c._dlt_parent_id = p._dlt_id",
        ["int", "int", "str", "int"],
    ),
    "accounts": ("SELECT account_id, name, active, deleted, _dlt_id FROM {t}", ["int", "str", "bool", "bool", "str"]),
    "accounts__tags": (
        "SELECT p.account_id, c._dlt_list_idx, c.value, c._dlt_id FROM {t} c JOIN {accounts} p ON c._dlt_root_id = p._dlt_id",
        ["int", "int", "str", "str"],
    ),
}


def _normal(value: Any, kind: str) -> Any:
    if value is None:
        return None
    if kind == "int":
        return int(value)
    if kind == "decimal":
        return decimal.Decimal(str(value)).normalize()
    if kind == "bool":
        return value if isinstance(value, bool) else str(value).lower() == "true"
    if kind == "float":
        return float(value)
    if kind == "timestamp":  # the REST answer: microseconds (or seconds, `1.7E9`) since the epoch, as text
        if isinstance(value, str):
            number = decimal.Decimal(value)
            micros = int(number if value.isdigit() else (number * 1_000_000).to_integral_value())
            return dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=micros)
        return value.astimezone(dt.timezone.utc)
    if kind == "date":
        return value if isinstance(value, dt.date) else dt.date.fromisoformat(value)
    if kind == "json":
        return json.loads(value) if isinstance(value, str) else value
    return str(value)


def rows_of(run_sql: Callable[[str], list[tuple[Any, ...]]], table: str, name: Callable[[str], str]) -> list[tuple[Any, ...]]:
    sql, kinds = COMPARED[table]
    rows = run_sql(sql.format(t=name(table), orders=name("orders"), accounts=name("accounts")))
    return sorted((tuple(_normal(v, k) for v, k in zip(row, kinds)) for row in rows), key=repr)


def bigquery_rows(dataset: str) -> Callable[[str], list[tuple[Any, ...]]]:
    def run(sql: str) -> list[tuple[Any, ...]]:
        return [tuple(r.values()) for r in query(sql)]

    return run


def bq_name(dataset: str) -> Callable[[str], str]:
    return lambda table: f"`{PROJECT}.{dataset}.{table}`"


def column_types(dataset: str, table: str) -> dict[str, str]:
    host = os.environ["BIGQUERY_EMULATOR_HOST"]
    url = f"http://{host}/bigquery/v2/projects/{PROJECT}/datasets/{dataset}/tables/{table}"
    response = requests.get(url, timeout=30)
    assert response.status_code == 200, response.text[:500]
    legacy = {"INTEGER": "INT64", "FLOAT": "FLOAT64", "BOOLEAN": "BOOL"}
    return {f["name"]: legacy.get(f["type"], f["type"]) for f in response.json()["schema"]["fields"]}


def count(dataset: str, table: str) -> int:
    return int(query(f"SELECT COUNT(*) AS n FROM `{PROJECT}.{dataset}.{table}`")[0]["n"])


def test_a_nested_source_loads_like_duckdb_through_two_loads(gateway: Gateway, tmp_path: Path) -> None:
    dataset = f"dlt_{uuid.uuid4().hex[:10]}"
    through_gateway = new_pipeline(tmp_path, f"shop_{uuid.uuid4().hex[:6]}", filament_destination(gateway), dataset)
    duck_file = str(tmp_path / "reference.duckdb")  # not named as the dataset (DuckDB binder)
    reference = new_pipeline(tmp_path, "shop_reference", dlt.destinations.duckdb(duck_file), "shop")
    for version in (1, 2):
        through_gateway.run(shop(version))
        reference.run(shop(version))

    con = duckdb.connect(duck_file, read_only=True)

    def duck(sql: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in con.execute(sql).fetchall()]

    for table in COMPARED:
        expected = rows_of(duck, table, lambda t: f"shop.{t}")
        actual = rows_of(bigquery_rows(dataset), table, bq_name(dataset))
        assert expected and actual == expected, table
    # The second load did what each disposition says.
    assert count(dataset, "events") == 80
    assert count(dataset, "orders") == 7
    assert {r[0] for r in rows_of(duck, "accounts", lambda t: f"shop.{t}")} == set(range(13)) - {6}
    # dlt's own tables: one _dlt_loads row per load, the schema versions, the pipeline state.
    loads = query(f"SELECT load_id, schema_name, status FROM `{PROJECT}.{dataset}._dlt_loads` ORDER BY load_id")
    assert [r["load_id"] for r in loads] == sorted(through_gateway.list_completed_load_packages())
    assert {r["schema_name"] for r in loads} == {"shop"} and {r["status"] for r in loads} == {"0"}
    hashes = query(f"SELECT version_hash FROM `{PROJECT}.{dataset}._dlt_version`")
    assert through_gateway.default_schema.version_hash in {r["version_hash"] for r in hashes}
    for table in ("_dlt_loads", "_dlt_pipeline_state"):
        assert count(dataset, table) == duck(f"SELECT COUNT(*) FROM shop.{table}")[0][0], table
    # The BigQuery types dlt's column types became.
    assert column_types(dataset, "events") == {
        "event_id": "INT64", "kind": "STRING", "payload": "JSON", "happened_at": "TIMESTAMP",
        "happened_on": "DATE", "score": "FLOAT64", "_dlt_load_id": "STRING", "_dlt_id": "STRING",
    }
    assert column_types(dataset, "orders")["total"] == "NUMERIC"
    assert column_types(dataset, "accounts")["active"] == "BOOL"
    # JSON stayed JSON (a BigQuery JSON column, queried as such).
    kinds = query(f"SELECT JSON_VALUE(payload, '$.n') AS n FROM `{PROJECT}.{dataset}.events` WHERE event_id = 7")
    assert kinds == [{"n": "7"}]


def test_an_interrupted_load_retried_by_dlt_lands_exactly_once(
    gateway: Gateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset = f"dlt_{uuid.uuid4().hex[:10]}"
    # Small bodies: the events file goes out in several batch requests.
    pipeline = new_pipeline(
        tmp_path, f"retry_{uuid.uuid4().hex[:6]}", filament_destination(gateway, max_body_bytes=1024), dataset
    )
    original_post = Execution._post_body
    posted: list[str] = []

    def failing_post(self: Execution, resource: str, seq: int, body: Any) -> Any:
        if len(posted) == 3:
            raise GatewayUnreachable("injected: the connection to the gateway broke")
        posted.append(resource)
        return original_post(self, resource, seq, body)

    monkeypatch.setattr(Execution, "_post_body", failing_post)
    with pytest.raises(Exception, match="injected"):
        pipeline.run(shop(1))
    monkeypatch.setattr(Execution, "_post_body", original_post)
    (pending,) = pipeline.list_normalized_load_packages()

    # The retry fails after the commit went through: the answer is lost, not the load.
    original_commit = Execution.commit

    def commit_then_fail(self: Execution, *args: Any, **kwargs: Any) -> Any:
        original_commit(self, *args, **kwargs)
        raise GatewayUnreachable("injected: the commit's answer was lost")

    monkeypatch.setattr(Execution, "commit", commit_then_fail)
    with pytest.raises(Exception, match="commit's answer was lost"):
        pipeline.run()
    monkeypatch.setattr(Execution, "commit", original_commit)
    assert pipeline.list_normalized_load_packages() == [pending]

    # dlt retries the same load id: the committed execution is recognised, nothing twice.
    pipeline.run()
    assert pipeline.list_normalized_load_packages() == []
    assert pipeline.list_completed_load_packages() == [pending]
    assert count(dataset, "events") == 40
    assert count(dataset, "orders") == 12
    assert count(dataset, "accounts") == 10
    assert count(dataset, "accounts__tags") == 30
    assert count(dataset, "_dlt_loads") == 1
    assert count(dataset, "orders__items") == sum(i % 4 for i in range(12))
    # At the gateway: the interrupted delivery, then the committed one; the last retry found
    # it committed and delivered nothing.
    run_id = filament_dlt.run_id_for(pipeline.pipeline_name, PROJECT, dataset, pending)
    with Client(gateway.url, token=TOKEN) as client:
        execution = client.run(run_id).get_execution(filament_dlt.execution_id_for(pending))
    assert (execution["state"], execution["delivery"]) == ("committed", 2)


def numbers(count: int) -> Any:
    @dlt.resource(write_disposition="append", table_name="numbers")
    def rows() -> Iterator[dict[str, Any]]:
        for i in range(count):
            yield {"n": i, "label": f"n-{i}"}

    return rows()


def test_a_principal_with_a_run_id_prefix_loads_under_it(gateway: Gateway, tmp_path: Path) -> None:
    dataset = f"dlt_{uuid.uuid4().hex[:10]}"
    unprefixed = filament_dlt.filament(url=gateway.url, token=PREFIXED_TOKEN, project=PROJECT)
    refused = new_pipeline(tmp_path, f"pfx_refused_{uuid.uuid4().hex[:6]}", unprefixed, dataset)
    with pytest.raises(Exception, match="run_id_not_permitted"):
        refused.run(numbers(5))

    prefixed = filament_dlt.filament(url=gateway.url, token=PREFIXED_TOKEN, project=PROJECT, run_id_prefix=RUN_ID_PREFIX)
    pipeline = new_pipeline(tmp_path, f"pfx_{uuid.uuid4().hex[:6]}", prefixed, dataset)
    pipeline.run(numbers(25))
    (load_id,) = pipeline.list_completed_load_packages()
    run_id = filament_dlt.run_id_for(pipeline.pipeline_name, PROJECT, dataset, load_id, RUN_ID_PREFIX)
    assert run_id.startswith(RUN_ID_PREFIX + "dlt_pfx_")
    with Client(gateway.url, token=PREFIXED_TOKEN) as client:
        execution = client.run(run_id).get_execution(filament_dlt.execution_id_for(load_id))
        assert execution["state"] == "committed"
        assert client.get_run(run_id)["principal"] == "prefixed"
    assert count(dataset, "numbers") == 25


def test_a_load_whose_commit_wait_times_out_is_retried_under_its_execution_id(gateway: Gateway, tmp_path: Path) -> None:
    # The proxy gives up the first commit's wait during the commit and answers nothing for
    # longer than the destination's commit timeout: the client stops waiting and asks again.
    proxy = LossyProxy(gateway.url, drop=0, abandon_commits=1, hold_seconds=4.0)
    try:
        dataset = f"dlt_{uuid.uuid4().hex[:10]}"
        destination = filament_dlt.filament(url=proxy.url, token=TOKEN, project=PROJECT, commit_timeout=2.0)
        pipeline = new_pipeline(tmp_path, f"slow_{uuid.uuid4().hex[:6]}", destination, dataset)
        pipeline.run(numbers(40))
        (load_id,) = pipeline.list_completed_load_packages()
        execution_id = filament_dlt.execution_id_for(load_id)
        assert proxy.states_when_abandoned == ["committing"]
        assert len(proxy.commit_paths) >= 2
        assert all(f"/executions/{execution_id}/commit" in path for path in proxy.commit_paths)
        run_id = filament_dlt.run_id_for(pipeline.pipeline_name, PROJECT, dataset, load_id)
        with Client(gateway.url, token=TOKEN) as client:
            execution = client.run(run_id).get_execution(execution_id)
        assert (execution["state"], execution["delivery"]) == ("committed", 1)
        assert count(dataset, "numbers") == 40 and count(dataset, "_dlt_loads") == 1
    finally:
        proxy.close()


def test_plain_http_to_another_host_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    destination = filament_dlt.filament(url="http://gateway.invalid:8080", token=TOKEN, project=PROJECT)
    pipeline = new_pipeline(tmp_path, f"http_{uuid.uuid4().hex[:6]}", destination, "dlt_refused")
    with pytest.raises(Exception, match="clear text") as raised:
        pipeline.run(numbers(1))
    assert TOKEN not in str(raised.value)


def test_a_merge_key_is_refused_with_the_table_and_hint(gateway: Gateway, tmp_path: Path) -> None:
    @dlt.resource(write_disposition={"disposition": "merge", "strategy": "upsert"}, primary_key="id", merge_key="day")
    def daily() -> Iterator[dict[str, Any]]:
        yield {"id": 1, "day": "2024-01-01"}

    pipeline = new_pipeline(tmp_path, f"mk_{uuid.uuid4().hex[:6]}", filament_destination(gateway), "dlt_refused")
    with pytest.raises(Exception, match=r"table daily: the merge_key hint \(day\) has no gateway mapping"):
        pipeline.run(daily())



# -- the mapping alone (no gateway) -------------------------------------------------------------


def _schema(*tables: Any) -> Any:
    from dlt.common.schema.utils import new_table

    schema = dlt.Schema("s")
    for name, options in tables:
        schema.update_table(new_table(name, **options), normalize_identifiers=False)
    return schema


def test_ids_of_a_load_are_stable_and_in_the_gateway_alphabet() -> None:
    assert filament_dlt.execution_id_for("1733290000.123456") == "1733290000_123456"
    run = filament_dlt.run_id_for("my pipeline/prod", "proj", "raw", "1733290000.123456")
    assert run == filament_dlt.run_id_for("my pipeline/prod", "proj", "raw", "1733290000.123456")
    assert run.startswith("dlt_my_pipeline_prod_") and run.endswith("_1733290000_123456")
    assert run != filament_dlt.run_id_for("my pipeline/prod", "proj", "raw2", "1733290000.123456")
    long_run = filament_dlt.run_id_for("p" * 200, "proj", "raw", "9" * 80)
    assert len(long_run) <= 64 and all(c.isalnum() or c in "_-" for c in long_run)
    # A principal's run_id_prefix starts the id, kept whole; the rest still tells loads apart.
    prefixed = filament_dlt.run_id_for("my pipeline/prod", "proj", "raw", "1733290000.123456", "team-a-")
    assert prefixed == "team-a-" + run
    longest = "p" * 36
    first = filament_dlt.run_id_for("p" * 200, "proj", "raw", "9" * 80, longest)
    second = filament_dlt.run_id_for("p" * 200, "proj", "raw", "9" * 79 + "8", longest)
    assert first.startswith(longest) and len(first) == 64 and first != second
    with pytest.raises(ValueError, match="run_id_prefix"):
        filament_dlt.run_id_for("p", "proj", "raw", "1", "no spaces")


def test_write_dispositions_map_to_write_modes_and_unmapped_hints_are_named() -> None:
    from filament_bigquery.dlt._mapping import plan_table

    key = {"name": "id", "data_type": "bigint", "primary_key": True}
    schema = _schema(
        ("a", {"write_disposition": "append", "columns": [{"name": "x", "data_type": "text"}]}),
        ("r", {"write_disposition": "replace", "columns": [{"name": "x", "data_type": "text"}]}),
        ("m", {"write_disposition": "merge", "columns": [key]}),
        ("d", {"write_disposition": "merge", "columns": [key, {"name": "gone", "data_type": "bool", "hard_delete": True}]}),
        ("nokey", {"write_disposition": "merge", "columns": [{"name": "x", "data_type": "text"}]}),
        ("mk", {"write_disposition": "merge", "columns": [key, {"name": "day", "data_type": "date", "merge_key": True}]}),
    )
    assert plan_table(schema, "a").write_mode == "incremental_append"
    assert plan_table(schema, "r").write_mode == "full_replace"
    upsert = plan_table(schema, "m")
    assert (upsert.write_mode, upsert.primary_key) == ("incremental_upsert", ["id"])
    cdc = plan_table(schema, "d")
    assert (cdc.write_mode, cdc.primary_key, cdc.hard_delete_column) == ("cdc_merge", ["id"], "gone")
    assert plan_table(schema, "_dlt_loads").write_mode == "incremental_append"
    with pytest.raises(filament_dlt.UnsupportedHint, match="table nokey: merge needs a primary_key"):
        plan_table(schema, "nokey")
    with pytest.raises(filament_dlt.UnsupportedHint, match=r"table mk: the merge_key hint \(day\)"):
        plan_table(schema, "mk")


def test_json_columns_are_marked_and_timestamps_sent_in_microseconds() -> None:
    import pyarrow as pa

    from filament_bigquery.dlt._mapping import conform, table_arrow_schema

    columns: Any = {
        "doc": {"name": "doc", "data_type": "json"},
        "at": {"name": "at", "data_type": "timestamp"},
        "late": {"name": "late", "data_type": "text"},
    }
    written = pa.schema([pa.field("doc", pa.string()), pa.field("at", pa.timestamp("ns", tz="UTC"))])
    schema = table_arrow_schema(columns, [written])
    assert schema.names == ["doc", "at"]
    assert schema.field("doc").metadata == {b"ARROW:extension:name": b"arrow.json"}
    assert schema.field("at").type == pa.timestamp("us", tz="UTC")
    batch = pa.RecordBatch.from_pydict({"at": pa.array([1_000], pa.timestamp("ns", tz="UTC"))})
    conformed = conform(batch, schema)
    assert conformed.schema.equals(schema, check_metadata=True)
    assert conformed.column(0).null_count == 1
    # A column no file of the load has (a nested table with no rows) takes dlt's type.
    assert table_arrow_schema(columns).field("late").type == pa.string()
