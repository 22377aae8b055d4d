#!/usr/bin/env bash
# The whole suite: formatting, clippy, mypy --strict of the suite's own Python, then unit,
# integration and end-to-end tests against a throwaway Postgres (unless DATABASE_URL is set)
# and a fresh bqemulator on random ports.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ENV_FILE=build/test-services.env

cargo fmt --all -- --check
cargo clippy --locked --all-targets -- -D warnings
# scripts/*.py and examples/*.py, as strictly as the Python client (scripts/mypy.ini).
scripts/client-checks.sh --scripts

scripts/services.sh start "$ENV_FILE" random
trap 'scripts/services.sh stop "$ENV_FILE"' EXIT
# shellcheck disable=SC1090
source "$ENV_FILE"

TOOLS_BIN="$(dirname "$FILAMENT_TOOLS_PYTHON")"
"$FILAMENT_TOOLS_PYTHON" -m openapi_spec_validator openapi/openapi.json
"$TOOLS_BIN/yamllint" --strict -c .yamllint.yaml deploy docker-compose.yml .yamllint.yaml
# Offline schema check of the Kubernetes manifests (CRDs such as PodMonitor are only linted).
"$TOOLS_BIN/kubernetes-validate" --strict --quiet deploy/kubernetes/*.yaml
# The compose fleet's load balancer configuration (its backends resolve only inside compose).
"$(command -v haproxy || echo /usr/sbin/haproxy)" -c -q -f deploy/haproxy/haproxy.cfg
# Google's SQL analyzer proves it can fail and pass before it judges the gateway's statements.
"$FILAMENT_TOOLS_PYTHON" scripts/zetasql_selftest.py | tail -n 1
# The live-BigQuery tests run under `make test-bigquery` only (their skip path runs below).
cargo test --locked --all-targets -- --test-threads "${FILAMENT_TEST_THREADS:-4}" --skip live_bigquery:: || {
  status=$?
  # A crash of the shared emulator (restarted by the suite's watch) is named with the tests
  # it took down, so their failures are not read as their own.
  cat "$FILAMENT_EMULATOR_CRASH_LOG" 2>/dev/null || true
  exit "$status"
}
if [ -s "$FILAMENT_EMULATOR_CRASH_LOG" ]; then
  echo "the shared bqemulator crashed during the suite and was restarted (every test passed):"
  cat "$FILAMENT_EMULATOR_CRASH_LOG"
fi
cat build/conformance/googlesql.txt
FILAMENT_TEST_BIGQUERY_PROJECT="" scripts/test-bigquery.sh

# The extractor's side: the Python client against the real gateway, a generated client, and
# the operators' dashboard and alerts (scripts/client-checks.sh says what each step checks).
scripts/client-checks.sh "$(scripts/cargo-bin.sh debug)"

# Fuzz smoke run of the batch-ingest path on the checked-in seed corpus (bounded time);
# `make fuzz` runs it longer. New inputs go to build/, the checked-in corpus is read-only.
scripts/fuzz.sh "${FILAMENT_FUZZ_SECONDS:-60}"
