# The two commands of the README: `make run` (gateway + local Postgres + bqemulator) and
# `make test` (the whole suite against the same). Everything else is a helper.
SHELL := /bin/bash
.DEFAULT_GOAL := help
ENV_RUN := build/run-services.env
ENV_TEST := build/test-services.env

.PHONY: help run test test-bigquery bench lint fmt openapi fuzz clean

help:
	@echo "make run    build and serve the gateway on 127.0.0.1:8080 against local Postgres and bqemulator"
	@echo "make test   provision the same and run lints, unit, integration and end-to-end tests"
	@echo "make test-bigquery  the live-BigQuery suite (needs FILAMENT_TEST_BIGQUERY_PROJECT and ADC; skips otherwise)"
	@echo "make bench  the ingestion benchmark (null Storage Write sink); writes docs/performance.md"
	@echo "make lint   cargo fmt --check and clippy -D warnings"
	@echo "make openapi  regenerate openapi/openapi.json from the handlers"
	@echo "make fuzz   run the ingest fuzz target for FUZZ_SECONDS (default 600)"

run:
	scripts/system-deps.sh
	cargo build --release --locked
	scripts/run.sh

test:
	scripts/system-deps.sh
	scripts/test.sh

test-bigquery:
	scripts/test-bigquery.sh

bench:
	scripts/system-deps.sh
	scripts/bench.sh

lint:
	cargo fmt --all -- --check
	cargo clippy --locked --all-targets -- -D warnings

openapi:
	cargo run --locked -- openapi > openapi/openapi.json

fuzz:
	scripts/fuzz.sh $${FUZZ_SECONDS:-600}

clean:
	-scripts/services.sh stop $(ENV_RUN)
	-scripts/services.sh stop $(ENV_TEST)
	rm -rf build target

.PHONY: client-wheel
client-wheel:  ## the Python client's wheel (clients/python) into build/dist
	scripts/client-checks.sh --wheel
