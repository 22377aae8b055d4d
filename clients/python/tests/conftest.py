"""Test support: the real gateway binary against Postgres and bqemulator, an emulator query
helper and a proxy that can lose a response.

Needs FILAMENT_GATEWAY_BIN (the gateway binary), DATABASE_URL (a Postgres superuser URL),
BIGQUERY_EMULATOR_HOST and BIGQUERY_STORAGE_EMULATOR_HOST (a running bqemulator)."""

from __future__ import annotations

import glob
import gzip
import hashlib
import http.client
import http.server
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from typing import Any, Iterator, Optional
from urllib.parse import urlsplit, urlunsplit

import pyarrow as pa
import pytest
import requests

TOKEN = "client-tests-token-0123456789"
PROJECT = "filament-demo"
START_DEADLINE_S = 60.0
# A second principal of the session's gateway, which may create only runs whose id starts
# with its `run_id_prefix` (docs/security.md).
PREFIXED_TOKEN = "client-tests-prefixed-token-0123456789"
RUN_ID_PREFIX = "team-a-"


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} must be set (scripts/client-checks.sh sets it up)", pytrace=False)
    return value


def _psql() -> str:
    found = shutil.which("psql")
    if found:
        return found
    candidates = []
    if os.environ.get("FILAMENT_LOCAL_PG_BIN"):
        candidates.append(os.path.join(os.environ["FILAMENT_LOCAL_PG_BIN"], "psql"))
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin/psql"), reverse=True)
    for candidate in candidates:
        if os.access(candidate, os.X_OK):
            return candidate
    pytest.fail("psql not found", pytrace=False)


def create_database() -> str:
    admin = _env("DATABASE_URL")
    name = f"fbq_client_{uuid.uuid4().hex[:12]}"
    subprocess.run(
        [_psql(), admin, "-v", "ON_ERROR_STOP=1", "-q", "-c", f"CREATE DATABASE {name}"],
        check=True,
        timeout=60,
        capture_output=True,
    )
    parts = urlsplit(admin)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


class Gateway:
    """One gateway process on its own database; `restart` keeps the database and the port."""

    def __init__(self, database_url: str, extra_env: Optional[dict[str, str]] = None) -> None:
        self.bin = _env("FILAMENT_GATEWAY_BIN")
        self.database_url = database_url
        self.extra_env = dict(extra_env or {})
        self.listen = "127.0.0.1:0"
        self.url = ""
        self.process: Optional[subprocess.Popen[str]] = None
        self.log_path = f"/tmp/fbq-client-gateway-{uuid.uuid4().hex[:8]}.log"

    def start(self) -> None:
        env = dict(os.environ)
        env.update(
            {
                "FILAMENT_LISTEN": self.listen,
                "DATABASE_URL": self.database_url,
                "FILAMENT_API_TOKENS": TOKEN,
                "BIGQUERY_EMULATOR_HOST": _env("BIGQUERY_EMULATOR_HOST"),
                "BIGQUERY_STORAGE_EMULATOR_HOST": _env("BIGQUERY_STORAGE_EMULATOR_HOST"),
                "RUST_LOG": env.get("RUST_LOG", "warn"),
            }
        )
        env.update(self.extra_env)
        log = open(self.log_path, "a")
        self.process = subprocess.Popen(
            [self.bin, "serve"], env=env, stdout=subprocess.PIPE, stderr=log, text=True
        )
        log.close()
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.process.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(START_DEADLINE_S)
        prefix = "filament-bigquery listening on "
        if not line or not line[0].startswith(prefix):
            self.kill()
            with open(self.log_path) as f:
                tail = f.read()[-3000:]
            raise RuntimeError(f"gateway did not start: {line!r}\n{tail}")
        self.url = line[0][len(prefix) :].strip()
        self.listen = urlsplit(self.url).netloc
        # Drain stdout so the process never blocks on a full pipe.
        threading.Thread(target=lambda: self.process.stdout.read(), daemon=True).start()  # type: ignore[union-attr]

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None

    def restart(self) -> None:
        """A crash (SIGKILL) and a start on the same port and database."""
        self.kill(signal.SIGKILL)
        deadline = time.monotonic() + 20
        while True:
            try:
                self.start()
                return
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def metrics(self) -> str:
        response = requests.get(self.url + "/metrics", timeout=10)
        response.raise_for_status()
        return response.text

    def metric_value(self, name: str) -> float:
        total = 0.0
        for line in self.metrics().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total


def spawn_gateway(extra_env: Optional[dict[str, str]] = None) -> Gateway:
    gateway = Gateway(create_database(), extra_env)
    gateway.start()
    return gateway


def principals_file() -> str:
    """A principals file with the prefixed principal (the `default` one comes from
    FILAMENT_API_TOKENS beside it)."""
    path = f"/tmp/fbq-client-principals-{uuid.uuid4().hex[:8]}.toml"
    digest = hashlib.sha256(PREFIXED_TOKEN.encode()).hexdigest()
    with open(path, "w") as f:
        f.write(
            "[[principal]]\n"
            'name = "prefixed"\n'
            f'token_sha256 = ["{digest}"]\n'
            f'destinations = ["{PROJECT}.*"]\n'
            f'run_id_prefix = "{RUN_ID_PREFIX}"\n'
        )
    return path


@pytest.fixture(scope="session")
def gateway() -> Iterator[Gateway]:
    gw = spawn_gateway({"FILAMENT_PRINCIPALS_FILE": principals_file()})
    yield gw
    gw.kill(signal.SIGTERM)


@pytest.fixture
def dataset() -> str:
    return f"client_{uuid.uuid4().hex[:10]}"


def query(sql: str) -> list[dict[str, Any]]:
    """Rows of `sql` run on the emulator (values as the REST API returns them: strings)."""
    host = _env("BIGQUERY_EMULATOR_HOST")
    response = requests.post(
        f"http://{host}/bigquery/v2/projects/{PROJECT}/queries",
        json={"query": sql, "useLegacySql": False},
        timeout=60,
    )
    assert response.status_code == 200, f"{sql}: {response.status_code} {response.text[:1000]}"
    body = response.json()
    assert body.get("jobComplete", True), body
    assert not body.get("errors"), f"{sql}: {body['errors']}"  # the emulator answers 200 with errors
    names = [f["name"] for f in body.get("schema", {}).get("fields", [])]
    return [dict(zip(names, (cell["v"] for cell in row["f"]))) for row in body.get("rows", [])]


class LossyProxy:
    """An HTTP proxy in front of the gateway that answers the first `unavailable` batch POSTs
    with 503 itself, then, for the next `drop` batch POSTs, forwards the request, reads the
    gateway's whole answer and closes the connection without answering: the client sees a
    lost response."""

    def __init__(
        self,
        upstream: str,
        drop: int = 1,
        unavailable: int = 0,
        retry_after: Optional[int] = None,
        abandon_commits: int = 0,
        hold_seconds: float = 0.0,
    ) -> None:
        self.upstream = urlsplit(upstream).netloc
        self.remaining = drop
        self.unavailable = unavailable
        self.retry_after = retry_after
        self.dropped = 0
        self.forwarded_batches = 0
        # The first `abandon_commits` commit requests are forwarded, their wait given up once
        # the gateway shows the execution committing (the connection to the gateway closed),
        # and the client left without an answer for `hold_seconds`, then disconnected.
        self.abandon_commits = abandon_commits
        self.hold_seconds = hold_seconds
        self.commit_paths: list[str] = []
        self.states_when_abandoned: list[str] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if self.command == "POST" and "/batches" in self.path:
                    with proxy.lock:
                        shed = proxy.unavailable > 0
                        proxy.unavailable -= int(shed)
                    if shed:  # answered without forwarding, like an overloaded gateway
                        problem = b'{"type":"about:blank","title":"Overloaded","status":503,"detail":"shed","code":"overloaded"}'
                        self.send_response(503)
                        if proxy.retry_after is not None:
                            self.send_header("Retry-After", str(proxy.retry_after))
                        self.send_header("Content-Type", "application/problem+json")
                        self.send_header("Content-Length", str(len(problem)))
                        self.end_headers()
                        self.wfile.write(problem)
                        return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                is_commit = self.command == "POST" and urlsplit(self.path).path.endswith("/commit")
                with proxy.lock:
                    if is_commit:
                        proxy.commit_paths.append(self.path)
                    abandon = is_commit and proxy.abandon_commits > 0
                    proxy.abandon_commits -= int(abandon)
                conn = http.client.HTTPConnection(proxy.upstream, timeout=120)
                conn.request(self.command, self.path, body=body, headers=headers)
                if abandon:
                    proxy._abandon(conn, self.path, headers)
                    self.close_connection = True
                    return
                upstream = conn.getresponse()
                payload = upstream.read()
                conn.close()
                is_batch = self.command == "POST" and "/batches" in self.path
                with proxy.lock:
                    if is_batch:
                        proxy.forwarded_batches += 1
                    drop = is_batch and proxy.remaining > 0 and upstream.status < 300
                    if drop:
                        proxy.remaining -= 1
                        proxy.dropped += 1
                if drop:
                    self.close_connection = True
                    return
                self.send_response(upstream.status)
                for key, value in upstream.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _abandon(self, conn: http.client.HTTPConnection, commit_path: str, headers: dict[str, str]) -> None:
        """Gives up the commit's wait once the execution is committing (or has ended), as a
        caller that stops waiting does; the client gets no answer for `hold_seconds`."""
        execution_path = urlsplit(commit_path).path.removesuffix("/commit")
        auth = {"Authorization": headers.get("Authorization", headers.get("authorization", ""))}
        deadline = time.monotonic() + 60
        state = "extracting"
        while state == "extracting" and time.monotonic() < deadline:
            response = requests.get(f"http://{self.upstream}{execution_path}", headers=auth, timeout=10)
            state = response.json()["state"]
            if state == "extracting":
                time.sleep(0.01)
        conn.close()
        with self.lock:
            self.states_when_abandoned.append(state)
        time.sleep(self.hold_seconds)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def decode_body(body: Any) -> pa.Table:
    """The Arrow table a client body (`filament_bigquery.Body`) carries, decompressed as its
    `content_encoding` says; the decompressed stream is `ipc_bytes` long."""
    payload = body.payload
    if body.content_encoding == "zstd":
        payload = pa.decompress(payload, decompressed_size=body.ipc_bytes, codec="zstd", asbytes=True)
    elif body.content_encoding == "gzip":
        payload = gzip.decompress(payload)
    else:
        assert body.content_encoding is None
    assert len(payload) == body.ipc_bytes
    return pa.ipc.open_stream(payload).read_all()
