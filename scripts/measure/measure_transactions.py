"""Postgres transactions per batch at K=8, and how many of them the execution timeline adds.

Usage (after `scripts/services.sh start build/dev.env random`, `source build/dev.env` and a
debug build): create an empty database, then
    build/venv-client/bin/python scripts/measure/measure_transactions.py postgres://.../that_database
One execution of 8 resources x 16 batches of 20,000 rows against the emulator, counted from
pg_stat_database (the script's own few psql calls included).
"""
import os, subprocess, sys
import pyarrow as pa
from filament_bigquery import Client

url_db = sys.argv[1]
def sql(q):
    return subprocess.run(["psql", url_db, "-tAc", q], capture_output=True, text=True, check=True).stdout.strip()
env = dict(os.environ, DATABASE_URL=url_db, FILAMENT_LISTEN="127.0.0.1:0", FILAMENT_API_TOKENS="timeline-cost-token-0123", RUST_LOG="warn")
gw = subprocess.Popen(["target/debug/filament-bigquery", "serve"], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
base = gw.stdout.readline().strip().split(" on ")[1]
stat = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
try:
    with Client(base, token="timeline-cost-token-0123") as client:
        run = client.create_run(project="filament-demo", dataset="timeline_cost")
        names = [f"r{k}" for k in range(8)]
        for name in names:
            run.declare(name, write_mode="full_append")
        sql("SELECT pg_stat_force_next_flush()")
        before = int(sql(stat))
        ex = run.execution()
        for b in range(16):
            for name in names:
                ex.write(name, pa.table({"id": pa.array(range(b * 20000, (b + 1) * 20000), pa.int64())}))
        ex.commit()
        sql("SELECT pg_stat_force_next_flush()")
        import time; time.sleep(1)
        after = int(sql(stat))
    batches = int(sql("SELECT count(*) FROM batches"))
    events = int(sql("SELECT coalesce(sum(count), 0) FROM execution_events"))
    rows = int(sql("SELECT count(*) FROM execution_events"))
    total = after - before
    print(f"batches {batches}; transactions {total} ({total / batches:.2f} per batch); timeline writes {events} in {rows} rows ({events / batches:.2f} per batch, {100 * events / (total - events):.1f}% more than without)")
finally:
    gw.terminate(); gw.wait()
