"""The client against the real gateway binary, Postgres and bqemulator."""

from __future__ import annotations

import datetime as dt
import time
import uuid
from typing import Iterator

import pyarrow as pa
import pytest

from conftest import PROJECT, TOKEN, Gateway, LossyProxy, query, spawn_gateway
from filament_bigquery import (
    Backpressure,
    Client,
    Conflict,
    Execution,
    ExecutionFailed,
    FilamentError,
    GatewayUnreachable,
    InvalidInput,
    NotFound,
    ProblemError,
    RetryPolicy,
    Unauthorized,
    geography_field,
    mark,
    range_field,
)


def users(start: int, count: int) -> pa.Table:
    ids = list(range(start, start + count))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f"user-{i}" for i in ids], pa.string()),
            "signed_up": pa.array([dt.date(2024, 1, 1) + dt.timedelta(days=i % 1000) for i in ids], pa.date32()),
        }
    )


def wide(start: int, count: int) -> pa.Table:
    ids = list(range(start, start + count))
    return pa.table({"id": pa.array(ids, pa.int64()), "text": pa.array([f"{i:06d}-" + "x" * 90 for i in ids])})


def count_and_sum(dataset: str, table: str, column: str = "id") -> tuple[int, int]:
    row = query(f"SELECT COUNT(*) AS n, SUM({column}) AS s FROM `{PROJECT}.{dataset}.{table}`")[0]
    return int(row["n"]), int(row["s"] or 0)


@pytest.fixture
def client(gateway: Gateway) -> Iterator[Client]:
    with Client(gateway.url, token=TOKEN, retry=RetryPolicy(deadline=120.0)) as c:
        yield c


def test_round_trip_of_two_resources(client: Client, dataset: str) -> None:
    run = client.create_run(project=PROJECT, dataset=dataset, run_id=f"rt_{uuid.uuid4().hex[:8]}")
    run.declare("public.users", write_mode="full_append")
    run.declare("public.orders", write_mode="incremental_append", table="orders")
    orders = pa.table({"order_id": pa.array(range(100), pa.int64()), "user_id": pa.array([i % 7 for i in range(100)])})
    with run.execution() as ex:
        first = ex.write("public.users", users(0, 200))
        second = ex.write("public.users", users(200, 100).to_batches())
        third = ex.write("public.orders", orders.to_reader())
        ex.checkpoint({"lsn": 42})
    assert [r["seq"] for r in first.receipts + second.receipts] == [0, 1]
    assert third.receipts[0]["seq"] == 0 and third.rows == 100
    assert ex.result is not None and ex.result["state"] == "committed"
    assert ex.delivery == 1 and ex.result["execution_id"] == ex.execution_id
    by_resource = {r["resource"]: r for r in ex.result["resources"]}
    assert by_resource["public.users"]["rows_received"] == 300
    assert by_resource["public.orders"]["publication"]["state"] == "done"  # type: ignore[index]
    assert count_and_sum(dataset, "public_users") == (300, sum(range(300)))
    assert count_and_sum(dataset, "orders", "order_id") == (100, sum(range(100)))
    names = query(f"SELECT name FROM `{PROJECT}.{dataset}.public_users` WHERE id = 257")
    assert names == [{"name": "user-257"}]
    assert run.durable_checkpoint == {"lsn": 42}
    # Creating the same run again is idempotent and returns the same run.
    assert client.create_run(project=PROJECT, dataset=dataset, run_id=run.run_id).run_id == run.run_id


def test_the_commit_shows_its_priced_plan_and_the_run_its_byte_budgets(client: Client, dataset: str) -> None:
    run = client.create_run(
        project=PROJECT,
        dataset=dataset,
        run_id=f"plan_{uuid.uuid4().hex[:8]}",
        maximum_bytes_billed=1 << 40,
        maximum_bytes_billed_per_execution=1 << 41,
    )
    assert run.view is not None
    assert run.view.get("maximum_bytes_billed") == 1 << 40
    assert run.view.get("maximum_bytes_billed_per_execution") == 1 << 41
    run.declare("public.users", write_mode="incremental_upsert", primary_key=["id"])
    with run.execution() as ex:
        ex.write("public.users", users(0, 50))
    assert ex.result is not None and ex.result["state"] == "committed"
    plan = ex.result.get("plan")
    assert plan is not None and plan["delivery"] == 1
    [planned] = plan["publications"]
    assert (planned["resource"], planned["table"]) == ("public.users", "public_users")
    assert (planned["path"], planned["statement"], planned["query_jobs"]) == ("staging_query", "merge", 1)
    # The emulator's dry runs answer 0 bytes (the REST double's tests price real figures).
    assert planned.get("bytes_processed") == 0 and plan["estimated_cost_usd"] == 0
    assert count_and_sum(dataset, "public_users") == (50, sum(range(50)))


def test_a_held_commit_shows_its_plan_and_publishes_on_the_next_commit(client: Client, dataset: str) -> None:
    run = client.create_run(project=PROJECT, dataset=dataset, run_id=f"held_{uuid.uuid4().hex[:8]}")
    run.declare("public.users", write_mode="full_append")
    ex = run.execution()
    ex.write("public.users", users(0, 30))
    staged = ex.commit(hold=True)
    assert staged["state"] == "staged" and "staged_at" in staged and ex.result is None
    plan = staged.get("plan")
    assert plan is not None and [p["table"] for p in plan["publications"]] == ["public_users"]
    assert count_and_sum(dataset, "public_users") == (0, 0)
    committed = ex.commit()
    assert committed["state"] == "committed" and ex.result is not None
    assert count_and_sum(dataset, "public_users") == (30, sum(range(30)))
    # Held inside the context manager, it stays held on a clean exit.
    with run.execution() as held:
        held.write("public.users", users(30, 5))
        assert held.commit(hold=True)["state"] == "staged"
    assert held.get()["state"] == "staged"
    assert count_and_sum(dataset, "public_users") == (30, sum(range(30)))
    held.abort()


def test_an_atomic_run_publishes_every_table_in_one_job(client: Client, dataset: str) -> None:
    run = client.create_run(project=PROJECT, dataset=dataset, run_id=f"atomic_{uuid.uuid4().hex[:8]}", atomic=True)
    assert run.view is not None and run.view.get("atomic") is True
    run.declare("public.users", write_mode="full_append")
    run.declare("public.orders", write_mode="full_append", table="orders_atomic")
    with run.execution() as ex:
        ex.write("public.users", users(0, 20))
        ex.write("public.orders", users(0, 10))
    assert ex.result is not None and ex.result["state"] == "committed" and ex.result.get("atomic") is True
    jobs = {r["publication"]["job_id"] for r in ex.result["resources"]}  # type: ignore[index]
    # `filament_<run>_<execution>_<dataset>_atomic_<tag>`: one job for both tables.
    assert len(jobs) == 1 and next(iter(jobs)).rsplit("_", 1)[0].endswith(f"_{dataset}_atomic")
    assert count_and_sum(dataset, "public_users") == (20, sum(range(20)))
    assert count_and_sum(dataset, "orders_atomic") == (10, sum(range(10)))


def test_geography_range_interval_and_flexible_names_load_through_the_client(client: Client, dataset: str) -> None:
    run = client.create_run(project=PROJECT, dataset=dataset)
    run.declare("places", write_mode="incremental_upsert", primary_key=["first name"])
    schema = pa.schema(
        [
            pa.field("first name", pa.string()),
            pa.field("Größe", pa.int64()),
            geography_field("shape", encoding="wkb"),
            pa.field("outline", pa.string()),
            range_field("stay", pa.date32()),
            pa.field("wait", pa.month_day_nano_interval()),
        ]
    )
    point = bytes.fromhex("0101000000000000000000f03f0000000000000040")
    table = pa.table(
        [
            ["ann", "bob", "ann"],
            [1, 2, 3],
            [point, point, point],
            ["POINT(3 4)", '{"type": "Point", "coordinates": [5, 6]}', "POINT(7 8)"],
            [{"start": dt.date(2024, 1, 1), "end": None}] * 3,
            [pa.scalar((1, 2, 3_000), pa.month_day_nano_interval())] * 3,
        ],
        schema=schema,
    )
    with run.execution() as ex:
        ex.write("places", mark(table, "outline", "geography"))
    rows = query(
        f"SELECT `first name` AS name, `Größe` AS size, ST_ASTEXT(shape) AS shape, ST_ASTEXT(outline) AS outline, "
        f"CAST(RANGE_START(stay) AS STRING) AS start, RANGE_END(stay) IS NULL AS open, "
        f"CAST(DATETIME '2000-01-01 00:00:00' + wait AS STRING) AS after "
        f"FROM `{PROJECT}.{dataset}.places` ORDER BY `first name`"
    )
    assert [(r["name"], r["size"], r["shape"], r["outline"]) for r in rows] == [
        ("ann", "3", "POINT (1 2)", "POINT (7 8)"),
        ("bob", "2", "POINT (1 2)", "POINT (5 6)"),
    ]
    assert {(r["start"], str(r["open"]).lower(), r["after"]) for r in rows} == {
        ("2024-01-01", "true", "2000-02-03 00:00:00.000003")
    }


def test_keyed_mode_last_write_wins(client: Client, dataset: str) -> None:
    run = client.create_run(project=PROJECT, dataset=dataset)
    run.declare("accounts", write_mode="incremental_upsert", primary_key=["id"])
    with run.execution() as ex:
        ex.write("accounts", pa.table({"id": [1, 2, 3, 1], "balance": [10, 20, 30, 11]}))
        ex.write("accounts", pa.table({"id": [2, 4], "balance": [22, 40]}))
    rows = query(f"SELECT id, balance FROM `{PROJECT}.{dataset}.accounts` ORDER BY id")
    assert [(int(r["id"]), int(r["balance"])) for r in rows] == [(1, 11), (2, 22), (3, 30), (4, 40)]
    # A second execution upserts on top of the first.
    with run.execution() as ex2:
        ex2.write("accounts", pa.table({"id": [3, 3], "balance": [31, 33]}))
    rows = query(f"SELECT balance FROM `{PROJECT}.{dataset}.accounts` WHERE id = 3")
    assert rows == [{"balance": "33"}]


def test_metadata_columns_name_the_run_and_execution_of_each_row(client: Client, dataset: str) -> None:
    run = client.create_run(project=PROJECT, dataset=dataset)
    view = run.declare("events", write_mode="full_append", metadata_columns=["execution_id", "run_id", "loaded_at"])
    assert view["metadata_columns"] == ["loaded_at", "run_id", "execution_id"]
    with run.execution("first") as ex:
        ex.write("events", pa.table({"id": [1, 2]}))
    rows = query(
        f"SELECT id, _filament_run_id AS run_id, _filament_execution_id AS execution_id, "
        f"_filament_loaded_at IS NOT NULL AS loaded FROM `{PROJECT}.{dataset}.events` ORDER BY id"
    )
    assert [(r["id"], r["run_id"], r["execution_id"], r["loaded"]) for r in rows] == [
        ("1", run.run_id, "first", "true"),
        ("2", run.run_id, "first", "true"),
    ]


def test_order_by_keeps_the_newest_change_and_soft_deletes_keep_the_row(client: Client, dataset: str) -> None:
    run = client.create_run(project=PROJECT, dataset=dataset)
    view = run.declare("accounts", write_mode="cdc_merge", primary_key=["id"], order_by="lsn", deletes="soft")
    assert (view["order_by"], view["deletes"]) == (["lsn"], "soft")
    ops = ["insert", "insert"]
    with run.execution() as ex:
        ex.write("accounts", pa.table({"id": [1, 2], "v": ["a", "b"], "lsn": [10, 10], "_filament_op": ops}))
    with run.execution() as ex:
        # The update is older than the row; the delete is newer.
        late = {"id": [1, 2], "v": ["late", None], "lsn": [5, 20], "_filament_op": ["update", "delete"]}
        ex.write("accounts", pa.table(late))
    rows = query(
        f"SELECT id, v, lsn, _filament_deleted_at IS NOT NULL AS deleted "
        f"FROM `{PROJECT}.{dataset}.accounts` ORDER BY id"
    )
    assert [(r["id"], r["v"], r["lsn"], r["deleted"]) for r in rows] == [
        ("1", "a", "10", "false"),
        ("2", "b", "20", "true"),
    ]


def test_a_table_larger_than_one_body_is_split(gateway: Gateway, dataset: str) -> None:
    data = wide(0, 30_000)  # about 3 MiB of Arrow
    with Client(gateway.url, token=TOKEN, max_body_bytes=256 * 1024, compression="gzip") as client:
        run = client.create_run(project=PROJECT, dataset=dataset)
        run.declare("big", write_mode="full_replace")
        with run.execution() as ex:
            result = ex.write("big", data.to_reader(max_chunksize=7_000))
    assert result.bodies >= 10
    assert [r["seq"] for r in result.receipts] == list(range(result.bodies))
    assert all(r["uncompressed_bytes"] <= 256 * 1024 for r in result.receipts)
    assert sum(r["rows"] for r in result.receipts) == 30_000
    assert count_and_sum(dataset, "big") == (30_000, sum(range(30_000)))


def test_backpressure_is_retried_after_retry_after() -> None:
    # A request that waits for the budget makes the lanes send what they hold, so only a wait
    # shorter than one acknowledgement (1 ms) is sure to end in 429.
    gateway = spawn_gateway(
        {"FILAMENT_MAX_BUFFERED_BYTES": str(1024 * 1024), "FILAMENT_BACKPRESSURE_WAIT_MS": "1"}
    )
    dataset = f"client_{uuid.uuid4().hex[:10]}"
    try:
        with Client(gateway.url, token=TOKEN, max_body_bytes=200 * 1024, retry=RetryPolicy(deadline=120.0)) as client:
            run = client.create_run(project=PROJECT, dataset=dataset, batching={"flush_interval_ms": 1000})
            run.declare("pressed", write_mode="full_append")
            with run.execution() as ex:
                result = ex.write("pressed", wide(0, 20_000))
            assert client.stats.backpressure_retries >= 1
        assert gateway.metric_value("filament_backpressure_rejections_total") >= 1
        assert [r["seq"] for r in result.receipts] == list(range(result.bodies))
        assert count_and_sum(dataset, "pressed") == (20_000, sum(range(20_000)))
    finally:
        gateway.kill()


def test_backpressure_surfaces_when_the_deadline_passes() -> None:
    gateway = spawn_gateway(
        {"FILAMENT_MAX_BUFFERED_BYTES": str(1024 * 1024), "FILAMENT_BACKPRESSURE_WAIT_MS": "1"}
    )
    try:
        with Client(gateway.url, token=TOKEN, max_body_bytes=200 * 1024, retry=RetryPolicy(deadline=0.5)) as client:
            run = client.create_run(project=PROJECT, dataset=f"client_{uuid.uuid4().hex[:10]}")
            run.declare("pressed", write_mode="full_append")
            ex = run.execution()
            with pytest.raises(Backpressure) as raised:
                ex.write("pressed", wide(0, 20_000))
            assert raised.value.status == 429 and raised.value.code == "backpressure"
            assert raised.value.retry_after is not None and raised.value.response is not None
            ex.abort()
    finally:
        gateway.kill()


def test_503_and_a_lost_response_are_retried_with_the_same_seq(gateway: Gateway, dataset: str) -> None:
    proxy = LossyProxy(gateway.url, drop=1, unavailable=2)
    try:
        retry = RetryPolicy(initial_backoff=0.1, deadline=60.0)
        with Client(proxy.url, token=TOKEN, retry=retry, compression="zstd") as client:
            run = client.create_run(project=PROJECT, dataset=dataset)
            run.declare("lossy", write_mode="full_append")
            with run.execution() as ex:
                result = ex.write("lossy", [b for t in (users(0, 50), users(50, 50)) for b in t.to_batches()])
                more = ex.write("lossy", users(100, 25))
            assert proxy.dropped == 1
            assert client.stats.connection_retries == 1
            assert client.stats.unavailable_retries == 2
            # The retried first body reached the gateway twice and was answered with the receipt.
            assert proxy.forwarded_batches == 3
        assert [r["seq"] for r in result.receipts + more.receipts] == [0, 1]
        assert count_and_sum(dataset, "lossy") == (125, sum(range(125)))
    finally:
        proxy.close()


def test_503_waits_the_retry_after_the_gateway_sends(gateway: Gateway, dataset: str) -> None:
    # Two 503s with `Retry-After: 1`; the client's own backoff would be 10 ms.
    proxy = LossyProxy(gateway.url, drop=0, unavailable=2, retry_after=1)
    try:
        retry = RetryPolicy(initial_backoff=0.01, max_backoff=0.02, deadline=60.0)
        with Client(proxy.url, token=TOKEN, retry=retry) as client:
            run = client.create_run(project=PROJECT, dataset=dataset)
            run.declare("shed", write_mode="full_append")
            with run.execution() as ex:
                started = time.monotonic()
                ex.write("shed", users(0, 10))
                waited = time.monotonic() - started
            assert client.stats.unavailable_retries == 2
        assert waited >= 2.0, f"the client waited {waited:.2f} s, not the 2 x 1 s the gateway asked for"
        assert count_and_sum(dataset, "shed") == (10, sum(range(10)))
    finally:
        proxy.close()


def test_an_exception_aborts_the_execution(client: Client, dataset: str) -> None:
    run = client.create_run(project=PROJECT, dataset=dataset)
    run.declare("aborted", write_mode="full_append")
    with pytest.raises(RuntimeError, match="source went away"):
        with run.execution() as ex:
            ex.write("aborted", users(0, 10))
            raise RuntimeError("source went away")
    assert ex.get()["state"] == "aborted"
    assert ex.result is not None and ex.result["state"] == "aborted"
    with pytest.raises(Conflict) as raised:
        ex.write("aborted", users(10, 10))
    assert raised.value.code == "execution_not_extracting"
    assert run.durable_checkpoint is None


def test_problems_map_to_exceptions(client: Client, gateway: Gateway, dataset: str) -> None:
    with pytest.raises(InvalidInput) as invalid:
        client.create_run(project=PROJECT, dataset="not-a-dataset")
    assert invalid.value.status == 422 and invalid.value.code == "invalid_dataset_id"
    assert invalid.value.hint and invalid.value.response is not None
    assert invalid.value.response.headers["Content-Type"].startswith("application/problem+json")

    run = client.create_run(project=PROJECT, dataset=dataset)
    with pytest.raises(Conflict) as conflict:
        client.create_run(project=PROJECT, dataset=dataset + "_other", run_id=run.run_id)
    assert conflict.value.status == 409 and conflict.value.code == "run_conflict"

    with pytest.raises(InvalidInput) as keyless:
        run.declare("keyed", write_mode="full_upsert")
    assert keyless.value.code == "primary_key_required"

    run.declare("typed", write_mode="full_append")
    ex = run.execution()
    with pytest.raises(NotFound):
        ex.write("undeclared", users(0, 1))
    ex.write("typed", users(0, 5))
    with pytest.raises(InvalidInput) as mismatch:
        ex.write("typed", pa.table({"other": [1]}))
    assert mismatch.value.code == "schema_mismatch" and isinstance(mismatch.value, ProblemError)

    with Client(gateway.url, token="wrong-token-0123456789") as bad:
        with pytest.raises(Unauthorized):
            bad.get_run(run.run_id)
    ex.abort()


def test_redelivery_after_a_gateway_restart() -> None:
    gateway = spawn_gateway()
    dataset = f"client_{uuid.uuid4().hex[:10]}"
    try:
        retry = RetryPolicy(initial_backoff=0.2, max_attempts=20, deadline=60.0)
        with Client(gateway.url, token=TOKEN, retry=retry) as client:
            run = client.create_run(project=PROJECT, dataset=dataset)
            run.declare("redelivered", write_mode="full_append")
            ex = run.execution(execution_id="nightly")
            ex.write("redelivered", users(0, 40))
            gateway.restart()
            with pytest.raises(ExecutionFailed) as failed:
                ex.write("redelivered", users(40, 40))
            assert failed.value.code == "gateway_restarted" and failed.value.redeliverable

            deliveries: list[int] = []

            def extract(ex: Execution) -> None:
                deliveries.append(ex.delivery)
                ex.write("redelivered", users(0, 40))
                ex.write("redelivered", users(40, 40))

            done = run.deliver(extract, execution_id="nightly")
            assert deliveries == [2] and done.execution_id == "nightly"
            assert done.result is not None and done.result["state"] == "committed"
            assert done.result["delivery"] == 2
        assert count_and_sum(dataset, "redelivered") == (80, sum(range(80)))
    finally:
        gateway.kill()


def test_concurrent_writes_across_resources(gateway: Gateway, dataset: str) -> None:
    with Client(gateway.url, token=TOKEN, max_in_flight=2, max_body_bytes=64 * 1024) as client:
        run = client.create_run(project=PROJECT, dataset=dataset)
        for name in ("left", "right"):
            run.declare(name, write_mode="full_append")
        with run.execution() as ex:
            futures = [ex.submit(name, wide(start, 2_000)) for start in (0, 2_000) for name in ("left", "right")]
            ex.checkpoint({"done": True})  # waits for the submitted writes first
            assert all(f.done() for f in futures)
        seqs = {name: [r["seq"] for f in futures for r in f.result().receipts if r["resource"] == name] for name in ("left", "right")}
        assert seqs["left"] == list(range(len(seqs["left"]))) and len(seqs["left"]) >= 4
    for name in ("left", "right"):
        assert count_and_sum(dataset, name) == (4_000, sum(range(4_000)))


def test_an_unknown_outcome_stops_the_resource(gateway: Gateway, dataset: str) -> None:
    proxy = LossyProxy(gateway.url, drop=100)
    try:
        retry = RetryPolicy(max_attempts=2, initial_backoff=0.05, deadline=30.0)
        with Client(proxy.url, token=TOKEN, retry=retry) as client:
            run = client.create_run(project=PROJECT, dataset=dataset)
            run.declare("unknown", write_mode="full_append")
            ex = run.execution()
            with pytest.raises(GatewayUnreachable):
                ex.write("unknown", users(0, 10))
            assert proxy.dropped == 2
            # seq 0 may have been accepted: no other content may go out under it.
            with pytest.raises(FilamentError, match="outcome of seq 0 is unknown"):
                ex.write("unknown", users(10, 10))
            assert proxy.forwarded_batches == 2
            ex.abort()
    finally:
        proxy.close()


def test_list_runs_pages_through_the_runs_newest_first(client: Client, dataset: str) -> None:
    prefix = f"ls_{uuid.uuid4().hex[:6]}"
    for n in range(5):
        client.create_run(project=PROJECT, dataset=dataset, run_id=f"{prefix}_{n}")
    run = client.run(f"{prefix}_4")
    run.declare("t", write_mode="full_append")
    ex = run.execution()
    ex.write("t", users(0, 3))
    ex.commit()
    listed = [item["run_id"] for item in client.list_runs(dataset=dataset, page_size=2)]
    assert listed == [f"{prefix}_{n}" for n in reversed(range(5))], "every run once, newest first, over three pages"
    committed = list(client.list_runs(dataset=dataset, state="committed"))
    assert [item["run_id"] for item in committed] == [f"{prefix}_4"]
    latest = committed[0]["latest_execution"]
    assert latest is not None and latest["rows_acknowledged"] == 3
    with pytest.raises(InvalidInput):
        list(client.list_runs(state="sleeping"))
    timeline, cursor = client.events(f"{prefix}_4", ex.execution_id)
    assert [event["kind"] for event in timeline][-1] == "ended"
    assert timeline[-1]["detail"]["state"] == "committed"
    assert client.events(f"{prefix}_4", ex.execution_id, after=cursor) == ([], cursor)
