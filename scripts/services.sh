#!/usr/bin/env bash
# Provisions the local services the gateway and its tests run against, under build/:
#   - a throwaway PostgreSQL cluster (only when DATABASE_URL is not set), via initdb/pg_ctl,
#     installing Debian's `postgresql` package when the binaries are missing; one cluster per
#     checkout, shared by the environments (run, test, bench): the one that started it stops
#     it, the others only borrow it;
#   - the bqemulator BigQuery emulator in its own pinned virtualenv (offline-safe install:
#     the DuckDB spatial extension comes from PyPI, not from a download at start-up);
#   - a tools virtualenv (pyarrow, requests, openapi-spec-validator, ...) for the example
#     extractor and the checks, with grpcio for the ZetaSQL analyzer's client and
#     google-api-python-client, whose package ships BigQuery's REST discovery document;
#   - Google's GoogleSQL analyzer (ZetaSQL's local service, scripts/zetasql.sh), on a random port,
#     one per environment, judging the SQL the gateway generates (scripts/zetasql_analyze.py).
#
# Usage: scripts/services.sh start <env-file> [fixed|random]   writes export lines to <env-file>
#        scripts/services.sh stop  <env-file>
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/build"
BQEMULATOR_VERSION=1.4.0
DUCKDB_VERSION=1.5.5
EMULATOR_VENV="$BUILD/venv-bqemulator"
TOOLS_VENV="$BUILD/venv-tools"
GRPCIO_VERSION=1.85.1
GOOGLE_API_CLIENT_VERSION=2.202.0
PYTHON="${PYTHON:-python3}"

log() { printf '[services] %s\n' "$*" >&2; }

free_port() {
  "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

port_is_free() {
  "$PYTHON" -c 'import socket,sys; s=socket.socket(); s.bind(("127.0.0.1",int(sys.argv[1])))' "$1" 2>/dev/null
}

wait_for_port() { # host port seconds
  local deadline=$((SECONDS + $3))
  until "$PYTHON" -c 'import socket,sys; socket.create_connection((sys.argv[1],int(sys.argv[2])),1)' "$1" "$2" 2>/dev/null; do
    if ((SECONDS > deadline)); then return 1; fi
    sleep 0.3
  done
}

as_pg_user() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

find_pg_bin() {
  local dir
  if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
    dirname "$(readlink -f "$(command -v initdb)")"
    return
  fi
  # shellcheck disable=SC2012 # version directories: sort -V needs the names, not find's order
  dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -n "$dir" ] && [ -x "$dir/initdb" ]; then echo "$dir"; return; fi
  return 1
}

ensure_pg_binaries() {
  if find_pg_bin >/dev/null; then return; fi
  log "PostgreSQL binaries not found: installing Debian's postgresql package"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq postgresql >/dev/null
}

# The cluster's directory: build/pg, or, as root in a checkout the postgres user cannot reach
# (one under a private directory, such as `mktemp -d` makes), a directory of this checkout's
# own under /var/tmp (named by a hash of its path, so checkouts still get one cluster each).
pg_dir() {
  mkdir -p "$BUILD"
  if [ "$(id -u)" != 0 ] || runuser -u postgres -- test -x "$BUILD" 2>/dev/null; then
    echo "$BUILD/pg"
  else
    echo "/var/tmp/filament-pg-$(printf '%s' "$ROOT" | sha256sum | cut -c1-16)"
  fi
}

start_postgres() { # env-file
  ensure_pg_binaries
  local bin data port pg
  bin=$(find_pg_bin)
  pg=$(pg_dir)
  data="$pg/data"
  mkdir -p "$pg"
  if [ "$(id -u)" = 0 ]; then chown postgres "$pg"; fi
  if [ ! -f "$data/PG_VERSION" ]; then
    log "initdb $data"
    as_pg_user "$bin/initdb" -D "$data" -U postgres --auth=trust -E UTF8 --no-sync >"$pg/initdb.log"
  fi
  if as_pg_user "$bin/pg_ctl" -D "$data" status >/dev/null 2>&1; then
    # Another environment (make run, make test, make bench) started the cluster: it stops it.
    port=$(cat "$pg/port")
    echo "export FILAMENT_LOCAL_PG_BORROWED=1" >>"$1"
  else
    port=$(free_port)
    echo "$port" >"$pg/port"
    as_pg_user "$bin/pg_ctl" -D "$data" -l "$pg/server.log" -w -t 60 \
      -o "-p $port -k $pg -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c max_connections=300" \
      start >/dev/null
  fi
  log "postgres on 127.0.0.1:$port (data in $data)"
  echo "export DATABASE_URL=postgres://postgres@127.0.0.1:$port/postgres" >>"$1"
  echo "export FILAMENT_LOCAL_PG_DATA=$data FILAMENT_LOCAL_PG_BIN=$bin" >>"$1"
}

ensure_emulator_venv() {
  local stamp="$EMULATOR_VENV/.installed-$BQEMULATOR_VERSION-$DUCKDB_VERSION"
  if [ ! -f "$stamp" ]; then
    log "installing bqemulator $BQEMULATOR_VERSION into $EMULATOR_VENV"
    rm -rf "$EMULATOR_VENV"
    "$PYTHON" -m venv "$EMULATOR_VENV"
    "$EMULATOR_VENV/bin/pip" install -q --disable-pip-version-check \
      "bqemulator==$BQEMULATOR_VERSION" numpy "duckdb==$DUCKDB_VERSION" "duckdb-extension-spatial==$DUCKDB_VERSION"
    touch "$stamp"
  fi
  # DuckDB loads extensions from $HOME/.duckdb; give the emulator its own HOME under build/
  # so that nothing outside the project is touched.
  local ext_dir="$BUILD/bqemulator-home/.duckdb/extensions/v$DUCKDB_VERSION/linux_amd64"
  if [ ! -f "$ext_dir/spatial.duckdb_extension" ]; then
    mkdir -p "$ext_dir"
    cp "$EMULATOR_VENV"/lib/python3*/site-packages/duckdb_extension_spatial/extensions/v$DUCKDB_VERSION/spatial.duckdb_extension "$ext_dir/"
  fi
}

ensure_tools_venv() {
  local stamp="$TOOLS_VENV/.installed-4" discovery
  if [ ! -f "$stamp" ]; then
    log "installing the tools virtualenv into $TOOLS_VENV"
    rm -rf "$TOOLS_VENV"
    "$PYTHON" -m venv "$TOOLS_VENV"
    "$TOOLS_VENV/bin/pip" install -q --disable-pip-version-check -r "$ROOT/examples/requirements.txt" "openapi-spec-validator==0.9.0" "kubernetes-validate==1.37.0" "yamllint==1.38.0" "schemathesis==4.32.5" \
      "grpcio==$GRPCIO_VERSION" "grpcio-tools==$GRPCIO_VERSION" "google-api-python-client==$GOOGLE_API_CLIENT_VERSION"
    touch "$stamp"
  fi
  # BigQuery's REST discovery document (the API's schemas: TableFieldSchema, Job, ...), as
  # google-api-python-client ships it.
  discovery=$("$TOOLS_VENV/bin/python" -c 'import googleapiclient, os; print(os.path.join(os.path.dirname(googleapiclient.__file__), "discovery_cache", "documents", "bigquery.v2.json"))')
  if [ ! -f "$discovery" ]; then
    log "google-api-python-client $GOOGLE_API_CLIENT_VERSION ships no $discovery"
    exit 1
  fi
  {
    echo "export FILAMENT_TOOLS_PYTHON=$TOOLS_VENV/bin/python"
    echo "export FILAMENT_BIGQUERY_DISCOVERY=$discovery"
    echo "export FILAMENT_ZETASQL_CHECKER=$ROOT/scripts/zetasql_analyze.py"
  } >>"$1"
}

start_zetasql() { # env-file (after ensure_tools_venv)
  "$ROOT/scripts/zetasql.sh" start "$1"
  # The client's gRPC stubs, generated now rather than raced for by parallel tests.
  "$TOOLS_VENV/bin/python" "$ROOT/scripts/zetasql_analyze.py" --prepare
}

start_emulator() { # env-file mode
  ensure_emulator_venv
  local rest grpc
  if [ "$2" = fixed ] && port_is_free 9050 && port_is_free 9060; then
    rest=9050 grpc=9060
  else
    rest=$(free_port) grpc=$(free_port)
  fi
  mkdir -p "$BUILD/bqemulator"
  HOME="$BUILD/bqemulator-home" nohup "$EMULATOR_VENV/bin/python" "$ROOT/scripts/bqemulator_launch.py" start \
    --rest-port "$rest" --grpc-port "$grpc" --project filament-demo --log-level warning \
    >"$BUILD/bqemulator/emulator-$rest.log" 2>&1 &
  echo $! >"$BUILD/bqemulator/pid-$rest"
  if ! wait_for_port 127.0.0.1 "$rest" 60 || ! wait_for_port 127.0.0.1 "$grpc" 30; then
    log "bqemulator did not start; its log:"
    tail -n 30 "$BUILD/bqemulator/emulator-$rest.log" >&2
    exit 1
  fi
  log "bqemulator REST on 127.0.0.1:$rest, gRPC on 127.0.0.1:$grpc"
  {
    echo "export BIGQUERY_EMULATOR_HOST=127.0.0.1:$rest BIGQUERY_STORAGE_EMULATOR_HOST=127.0.0.1:$grpc"
    echo "export FILAMENT_EMULATOR_PID=$(cat "$BUILD/bqemulator/pid-$rest")"
    # The suite's emulator watch (tests/it/support/emulator_watch.rs) restarts a crashed
    # emulator on the same ports: it appends to the log, rewrites the pid file (which `stop`
    # kills) and reports each crash in the crash log `make test` prints.
    echo "export FILAMENT_EMULATOR_LOG=$BUILD/bqemulator/emulator-$rest.log FILAMENT_EMULATOR_PIDFILE=$BUILD/bqemulator/pid-$rest FILAMENT_EMULATOR_CRASH_LOG=$BUILD/bqemulator/crashes-$rest.log"
    # Tests that may leave an emulator in a bad state (cut connections) start their own.
    echo "export FILAMENT_BQEMULATOR_PYTHON=$EMULATOR_VENV/bin/python FILAMENT_BQEMULATOR_LAUNCH=$ROOT/scripts/bqemulator_launch.py FILAMENT_BQEMULATOR_HOME=$BUILD/bqemulator-home"
  } >>"$1"
}

cmd_start() {
  local env_file="$1" mode="${2:-random}"
  mkdir -p "$BUILD"
  : >"$env_file"
  if [ -n "${DATABASE_URL:-}" ]; then
    log "using DATABASE_URL from the environment"
    echo "export DATABASE_URL=$DATABASE_URL" >>"$env_file"
  else
    start_postgres "$env_file"
  fi
  ensure_tools_venv "$env_file"
  start_zetasql "$env_file"
  # Should a later step fail, no trap of the caller's would stop the analyzer: stop it here.
  # shellcheck disable=SC2064 # expanded now, on purpose
  trap "[ \$? = 0 ] || '$ROOT/scripts/zetasql.sh' stop '$env_file'" EXIT
  start_emulator "$env_file" "$mode"
}

cmd_stop() {
  local env_file="$1"
  [ -f "$env_file" ] || return 0
  unset FILAMENT_LOCAL_PG_BORROWED
  # shellcheck disable=SC1090
  source "$env_file"
  if [ -n "${FILAMENT_EMULATOR_PIDFILE:-}" ] && [ -f "$FILAMENT_EMULATOR_PIDFILE" ]; then
    kill "$(cat "$FILAMENT_EMULATOR_PIDFILE")" 2>/dev/null || true
  fi
  if [ -n "${FILAMENT_EMULATOR_PID:-}" ]; then kill "$FILAMENT_EMULATOR_PID" 2>/dev/null || true; fi
  "$ROOT/scripts/zetasql.sh" stop "$env_file"
  if [ -n "${FILAMENT_LOCAL_PG_DATA:-}" ] && [ -z "${FILAMENT_LOCAL_PG_BORROWED:-}" ]; then
    as_pg_user "$FILAMENT_LOCAL_PG_BIN/pg_ctl" -D "$FILAMENT_LOCAL_PG_DATA" -m fast stop >/dev/null 2>&1 || true
  fi
}

case "${1:-}" in
  start) cmd_start "$2" "${3:-random}" ;;
  stop) cmd_stop "$2" ;;
  *) echo "usage: $0 start|stop <env-file> [fixed|random]" >&2; exit 2 ;;
esac
