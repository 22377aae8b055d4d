#!/usr/bin/env bash
# Google's GoogleSQL analyzer (ZetaSQL's local gRPC service) as a judge of the SQL the gateway
# generates (scripts/zetasql_analyze.py is its client, docs/testing.md says how tests use it).
#
# The analyzer comes from the npm package @fivetrandevelopers/zetasql (MIT), which ships a
# Linux x86-64 build of ZetaSQL's `remote_server` (an ELF executable named remote_server.so)
# with the .proto files of its service. `install` fetches the pinned tarball once with
# `npm pack` (no Node needed at run time, npm's cache kept in a temporary directory), checks
# its SHA-256 and keeps only the server and the protos under build/zetasql/; after that the
# commands below work offline.
#
# Usage: scripts/zetasql.sh install              fetch and unpack once (stamp file)
#        scripts/zetasql.sh start <env-file>     start on a free port of 127.0.0.1, append
#                                                `export FILAMENT_ZETASQL_ADDR=... FILAMENT_ZETASQL_PID=...`
#        scripts/zetasql.sh stop  <env-file>     stop the server that <env-file> names
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/build"
ZETASQL_PACKAGE=@fivetrandevelopers/zetasql
ZETASQL_VERSION=1.13.0
# sha256sum of fivetrandevelopers-zetasql-1.13.0.tgz as the registry serves it.
ZETASQL_SHA256=37db9c6dacd1d8f70b82428659fc716785d352705c9ac417ed96c66239a56796
ZETASQL_DIR="$BUILD/zetasql"
SERVER="$ZETASQL_DIR/bin/remote_server.so"
STAMP="$ZETASQL_DIR/.installed-$ZETASQL_VERSION"
START_SECONDS="${FILAMENT_ZETASQL_START_SECONDS:-60}"
STARTED_PID=
PYTHON="${PYTHON:-python3}"

log() { printf '[zetasql] %s\n' "$*" >&2; }

free_port() {
  "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

port_accepts() { # port
  "$PYTHON" -c 'import socket,sys; socket.create_connection(("127.0.0.1",int(sys.argv[1])),1)' "$1" 2>/dev/null
}

installed() { [ -f "$STAMP" ] && [ -x "$SERVER" ]; }

cmd_install() {
  if installed; then return 0; fi
  mkdir -p "$BUILD"
  # Two environments starting at once install once: the second waits, then finds the stamp.
  # (The lock's descriptor is closed before any server starts, which would inherit it.)
  exec 9>"$BUILD/zetasql-install.lock"
  flock 9
  if ! installed; then install_locked; fi
  exec 9>&-
}

install_locked() {
  if ! command -v npm >/dev/null 2>&1; then
    log "npm is needed once to fetch $ZETASQL_PACKAGE@$ZETASQL_VERSION (apt-get install npm); it is not on PATH"
    exit 1
  fi
  local tmp tarball sum
  tmp=$(mktemp -d "$BUILD/zetasql-install.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" EXIT
  log "fetching $ZETASQL_PACKAGE@$ZETASQL_VERSION (about 110 MB) with npm pack"
  (cd "$tmp" && npm pack --silent --cache "$tmp/npm-cache" "$ZETASQL_PACKAGE@$ZETASQL_VERSION" >/dev/null)
  tarball=$(ls "$tmp"/*.tgz)
  sum=$(sha256sum "$tarball" | cut -d' ' -f1)
  if [ "$sum" != "$ZETASQL_SHA256" ]; then
    log "$tarball: SHA-256 $sum, expected $ZETASQL_SHA256"
    exit 1
  fi
  # Only the Linux x86-64 server, the protos and the package's metadata (its licence is MIT).
  tar -xzf "$tarball" -C "$tmp" package/package.json package/lib/zetasql/remote_server.so package/lib/zetasql/protos
  mkdir -p "$tmp/zetasql/bin"
  mv "$tmp/package/lib/zetasql/remote_server.so" "$tmp/zetasql/bin/"
  mv "$tmp/package/lib/zetasql/protos" "$tmp/zetasql/protos"
  mv "$tmp/package/package.json" "$tmp/zetasql/"
  chmod 755 "$tmp/zetasql/bin/remote_server.so"
  touch "$tmp/zetasql/.installed-$ZETASQL_VERSION"
  # Replace the whole directory at once, so a concurrent reader never sees half an install
  # (the client's generated stubs under py/ are regenerated from the new protos).
  rm -rf "$ZETASQL_DIR.old"
  if [ -d "$ZETASQL_DIR" ]; then mv "$ZETASQL_DIR" "$ZETASQL_DIR.old"; fi
  mv "$tmp/zetasql" "$ZETASQL_DIR"
  rm -rf "$ZETASQL_DIR.old"
  log "installed in $ZETASQL_DIR"
}

start_once() { # port log: 0 when the server accepts connections, 1 when it died (or shares
  # its port), 2 on timeout
  local port="$1" logfile="$2" pid deadline
  nohup "$SERVER" 127.0.0.1 "$port" </dev/null >"$logfile" 2>&1 &
  pid=$!
  STARTED_PID=$pid
  deadline=$((SECONDS + START_SECONDS))
  until port_accepts "$port"; do
    if ! kill -0 "$pid" 2>/dev/null; then return 1; fi
    if ((SECONDS > deadline)); then
      kill "$pid" 2>/dev/null || true
      return 2
    fi
    sleep 0.2
  done
  # gRPC binds with SO_REUSEPORT: another gRPC server that took the same port in the meantime
  # would share it silently instead of failing our bind. Count the listeners.
  if command -v ss >/dev/null 2>&1 && [ "$(ss -Hltn "sport = :$port" | wc -l)" -gt 1 ]; then
    kill "$pid" 2>/dev/null || true
    echo "port $port is shared with another listener" >>"$logfile"
    return 1
  fi
}

cmd_start() { # env-file
  local env_file="$1" port logfile attempt status
  cmd_install
  for attempt in 1 2 3; do
    port=$(free_port)
    logfile="$ZETASQL_DIR/server-$port.log"
    status=0
    start_once "$port" "$logfile" || status=$?
    if [ "$status" = 0 ]; then
      log "ZetaSQL analyzer on 127.0.0.1:$port (log $logfile)"
      echo "export FILAMENT_ZETASQL_ADDR=127.0.0.1:$port FILAMENT_ZETASQL_PID=$STARTED_PID" >>"$env_file"
      return 0
    fi
    if [ "$status" = 2 ]; then
      log "the analyzer did not accept connections on 127.0.0.1:$port within ${START_SECONDS}s; its log:"
      tail -n 30 "$logfile" >&2
      exit 1
    fi
    # It exited or shares its port: another process took the port between free_port and its bind.
    log "the analyzer exited at start-up (attempt $attempt); its log:"
    tail -n 10 "$logfile" >&2
  done
  exit 1
}

cmd_stop() { # env-file
  local env_file="$1" pid
  [ -f "$env_file" ] || return 0
  pid=$(sed -n 's/.*FILAMENT_ZETASQL_PID=\([0-9][0-9]*\).*/\1/p' "$env_file" | tail -n 1)
  [ -n "$pid" ] || return 0
  # Only our server: the pid may have been reused since the env file was written.
  if { tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null | grep -q "remote_server"; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
  fi
}

case "${1:-}" in
  install) cmd_install ;;
  start) cmd_start "${2:?usage: $0 start <env-file>}" ;;
  stop) cmd_stop "${2:?usage: $0 stop <env-file>}" ;;
  *) echo "usage: $0 install | start <env-file> | stop <env-file>" >&2; exit 2 ;;
esac
