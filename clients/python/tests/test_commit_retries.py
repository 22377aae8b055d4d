"""A commit runs to its end once asked: a caller that stops waiting cancels nothing, and its
retry, under the same execution id, finds the outcome and loads nothing twice (issue 55)."""

from __future__ import annotations

import datetime as dt
import uuid
from urllib.parse import urlsplit

import pyarrow as pa

from conftest import PROJECT, TOKEN, Gateway, LossyProxy, query
from filament_bigquery import Client, Execution, RetryPolicy


def rows(start: int, count: int) -> pa.Table:
    ids = list(range(start, start + count))
    return pa.table({"id": pa.array(ids, pa.int64()), "day": [dt.date(2024, 1, 1)] * count})


def count_and_sum(dataset: str, table: str) -> tuple[int, int]:
    row = query(f"SELECT COUNT(*) AS n, SUM(id) AS s FROM `{PROJECT}.{dataset}.{table}`")[0]
    return int(row["n"]), int(row["s"] or 0)


def test_a_commit_whose_wait_times_out_is_retried_under_the_same_execution_id(gateway: Gateway, dataset: str) -> None:
    # The proxy gives up the first commit's wait once the gateway shows it committing and
    # leaves the client without an answer past its read timeout (2 s).
    proxy = LossyProxy(gateway.url, drop=0, abandon_commits=1, hold_seconds=4.0)
    try:
        retry = RetryPolicy(initial_backoff=0.1, deadline=120.0)
        with Client(proxy.url, token=TOKEN, retry=retry) as client:
            run = client.create_run(project=PROJECT, dataset=dataset)
            run.declare("events", write_mode="incremental_append")
            ex = run.execution(execution_id="nightly-2024-01-01")
            ex.write("events", rows(0, 500))
            result = ex.commit(timeout=2.0)
            assert client.stats.connection_retries >= 1, "the client's wait timed out and was retried"
        assert proxy.states_when_abandoned == ["committing"], "the first wait was given up during the commit"
        paths = {urlsplit(path).path for path in proxy.commit_paths}
        assert len(proxy.commit_paths) >= 2 and paths == {f"/v1/runs/{run.run_id}/executions/nightly-2024-01-01/commit"}
        assert (result["state"], result["delivery"]) == ("committed", 1)
        assert count_and_sum(dataset, "events") == (500, sum(range(500)))
    finally:
        proxy.close()


def test_deliver_again_under_the_same_id_finds_the_commit_and_sends_nothing(gateway: Gateway, dataset: str) -> None:
    extracted: list[int] = []

    def extract(ex: Execution) -> None:
        extracted.append(ex.delivery)
        ex.write("events", rows(0, 300))

    with Client(gateway.url, token=TOKEN) as client:
        run = client.create_run(project=PROJECT, dataset=dataset)
        run.declare("events", write_mode="incremental_append")
        first = run.deliver(extract, execution_id="batch-7")
        # The caller lost the outcome (a crash, a timeout) and retries, as it must, with the id.
        again = run.deliver(extract, execution_id="batch-7")
    assert extracted == [1], "the committed execution was not extracted or sent again"
    assert first.result is not None and again.result is not None
    assert (again.result["state"], again.result["delivery"], again.execution_id) == ("committed", 1, "batch-7")
    assert again.result["resources"] == first.result["resources"]
    assert count_and_sum(dataset, "events") == (300, sum(range(300)))


def test_a_retry_under_a_new_execution_id_loads_the_rows_again(gateway: Gateway) -> None:
    """Why the id matters (documented, not prevented): a new execution id is a new load."""
    dataset = f"client_{uuid.uuid4().hex[:10]}"

    def extract(ex: Execution) -> None:
        ex.write("events", rows(0, 10))

    with Client(gateway.url, token=TOKEN) as client:
        run = client.create_run(project=PROJECT, dataset=dataset)
        run.declare("events", write_mode="incremental_append")
        for _ in range(2):
            run.deliver(extract)
    assert count_and_sum(dataset, "events") == (20, 2 * sum(range(10)))
