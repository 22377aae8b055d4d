"""The benchmark's peer: what an extractor gets by writing to BigQuery itself with Google's
Python client (google-cloud-bigquery-storage): Arrow record batches appended to PENDING streams
(one per thread) with gzip on the gRPC channel, then finalized and committed. Run by
benches/ingest.rs against the same null sink as the gateway; prints {"rows", "bytes", "seconds"}.
"""

import argparse
import glob
import json
import sys
import threading
import time

import grpc
import pyarrow as pa
from google.api_core import client_options
from google.auth.credentials import AnonymousCredentials
from google.cloud.bigquery_storage_v1 import types, writer
from google.cloud.bigquery_storage_v1.services.big_query_write import BigQueryWriteClient
from google.cloud.bigquery_storage_v1.services.big_query_write.transports import BigQueryWriteGrpcTransport

PARENT = "projects/bench/datasets/peer/tables/t{}"


def client(endpoint):
    channel = grpc.insecure_channel(
        endpoint,
        compression=grpc.Compression.Gzip,
        options=[("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)],
    )
    return BigQueryWriteClient(
        transport=BigQueryWriteGrpcTransport(channel=channel, credentials=AnonymousCredentials()),
        client_options=client_options.ClientOptions(api_endpoint=endpoint),
    )


def load_batches(directory):
    """Each body's record batches, serialized as the Storage Write API wants them."""
    bodies = []
    for path in sorted(glob.glob(f"{directory}/body*.arrows")):
        with open(path, "rb") as f:
            raw = f.read()
        reader = pa.ipc.open_stream(raw)
        schema = reader.schema.serialize().to_pybytes()
        batches = [(b.num_rows, b.serialize().to_pybytes()) for b in reader]
        bodies.append((len(raw), schema, batches))
    return bodies


def write_stream(bq, index, bodies, count, totals, lock):
    stream = bq.create_write_stream(
        parent=PARENT.format(index), write_stream=types.WriteStream(type_=types.WriteStream.Type.PENDING)
    )
    template = types.AppendRowsRequest(
        write_stream=stream.name,
        arrow_rows=types.AppendRowsRequest.ArrowData(writer_schema=types.ArrowSchema(serialized_schema=bodies[0][1])),
    )
    appender = writer.AppendRowsStream(bq, template)
    futures, offset, rows, size = [], 0, 0, 0
    for i in range(count):
        body_bytes, _, batches = bodies[(index + i) % len(bodies)]
        size += body_bytes
        for batch_rows, serialized in batches:
            request = types.AppendRowsRequest(
                offset=offset,
                arrow_rows=types.AppendRowsRequest.ArrowData(
                    rows=types.ArrowRecordBatch(serialized_record_batch=serialized)
                ),
            )
            futures.append(appender.send(request))
            offset += batch_rows
            rows += batch_rows
    for future in futures:
        future.result()
    appender.close()
    bq.finalize_write_stream(name=stream.name)
    bq.batch_commit_write_streams(
        types.BatchCommitWriteStreamsRequest(parent=PARENT.format(index), write_streams=[stream.name])
    )
    with lock:
        totals["rows"] += rows
        totals["bytes"] += size


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--bodies", required=True)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--bodies-per-stream", type=int, required=True)
    args = parser.parse_args()
    bodies = load_batches(args.bodies)
    bq = client(args.endpoint)
    totals, lock, errors = {"rows": 0, "bytes": 0}, threading.Lock(), []

    def run(index):
        try:
            write_stream(bq, index, bodies, args.bodies_per_stream, totals, lock)
        except Exception as e:  # reported, and the run fails
            errors.append(repr(e))

    started = time.monotonic()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(args.streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.monotonic() - started
    if errors:
        print(errors[0], file=sys.stderr)
        sys.exit(1)
    print(json.dumps({**totals, "seconds": seconds}))


if __name__ == "__main__":
    main()
