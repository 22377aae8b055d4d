#!/usr/bin/env bash
# Serves the release gateway on 127.0.0.1:8080 against a local Postgres (unless DATABASE_URL is
# set) and bqemulator (REST 9050, gRPC 9060 when free). A development token is generated and
# printed unless FILAMENT_API_TOKENS or FILAMENT_PRINCIPALS_FILE is set (the gateway refuses a
# generated token beside them); stop with Ctrl-C, which also stops the services started here.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ENV_FILE=build/run-services.env

scripts/services.sh start "$ENV_FILE" fixed
trap 'scripts/services.sh stop "$ENV_FILE"' EXIT
# shellcheck disable=SC1090
source "$ENV_FILE"
echo "[run] bqemulator REST: http://$BIGQUERY_EMULATOR_HOST (query it with: $FILAMENT_TOOLS_PYTHON examples/query.py)"
GATEWAY_BIN="$(scripts/cargo-bin.sh release)"
generate=(--dev-generate-token)
if [ -n "${FILAMENT_API_TOKENS:-}" ] || [ -n "${FILAMENT_PRINCIPALS_FILE:-}" ]; then generate=(); fi
FILAMENT_LISTEN="${FILAMENT_LISTEN:-127.0.0.1:8080}" "$GATEWAY_BIN" serve "${generate[@]}"
