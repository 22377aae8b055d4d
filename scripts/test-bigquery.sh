#!/usr/bin/env bash
# `make test-bigquery`: the live-BigQuery suite (tests/it/conformance/live_bigquery.rs; docs/testing.md says
# what it covers, what it costs and the roles it needs). It runs only when
# FILAMENT_TEST_BIGQUERY_PROJECT names a project and Application Default Credentials are present
# (GOOGLE_APPLICATION_CREDENTIALS, gcloud's application_default_credentials.json, or a metadata
# server); otherwise it says what is missing and exits 0. `make test` runs this skip path.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

skip() {
  echo "make test-bigquery: skipped: $*" >&2
  echo "make test-bigquery: to run it against real BigQuery, see docs/testing.md (\"The live-BigQuery suite\")" >&2
  exit 0
}

[ -n "${FILAMENT_TEST_BIGQUERY_PROJECT:-}" ] ||
  skip "FILAMENT_TEST_BIGQUERY_PROJECT is not set (the Google Cloud project to create the test datasets in)"

adc_file="${CLOUDSDK_CONFIG:-$HOME/.config/gcloud}/application_default_credentials.json"
if [ -n "${GOOGLE_APPLICATION_CREDENTIALS:-}" ]; then
  [ -r "$GOOGLE_APPLICATION_CREDENTIALS" ] ||
    skip "GOOGLE_APPLICATION_CREDENTIALS names $GOOGLE_APPLICATION_CREDENTIALS, which cannot be read"
elif [ ! -r "$adc_file" ] &&
  ! curl -fsS -m 2 -H 'Metadata-Flavor: Google' http://metadata.google.internal/computeMetadata/v1/instance/id >/dev/null 2>&1; then
  skip "no Application Default Credentials (no GOOGLE_APPLICATION_CREDENTIALS, no $adc_file, no metadata server): run gcloud auth application-default login"
fi

ENV_FILE=build/test-bigquery-services.env
scripts/system-deps.sh
scripts/services.sh start "$ENV_FILE" random
trap 'scripts/services.sh stop "$ENV_FILE"' EXIT
# shellcheck disable=SC1090
source "$ENV_FILE"
echo "make test-bigquery: against project $FILAMENT_TEST_BIGQUERY_PROJECT (location ${FILAMENT_TEST_BIGQUERY_LOCATION:-US})" >&2
cargo test --locked --test it live_bigquery:: -- --test-threads 1 --nocapture
