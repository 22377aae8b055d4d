#!/usr/bin/env bash
# Runs the `ingest` fuzz target (fuzz/fuzz_targets/ingest.rs) for the given number of seconds
# on the checked-in seed corpus, installing cargo-fuzz when missing. cargo-fuzz passes flags
# that the stable toolchain accepts only with RUSTC_BOOTSTRAP=1; the sanitizer is off because
# the stable toolchain ships no sanitizer runtimes (libFuzzer's own checks still apply:
# crashes, panics, and -rss_limit_mb/-malloc_limit_mb for unbounded allocation).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SECONDS_TO_RUN="${1:-60}"
CARGO_FUZZ_VERSION=0.13.2

if ! cargo fuzz --version 2>/dev/null | grep -q "$CARGO_FUZZ_VERSION"; then
  cargo install cargo-fuzz --locked --version "$CARGO_FUZZ_VERSION"
fi
mkdir -p build/fuzz-corpus/ingest
export RUSTC_BOOTSTRAP=1
cargo fuzz run ingest --sanitizer none --dev -- \
  build/fuzz-corpus/ingest fuzz/corpus/ingest \
  -max_total_time="$SECONDS_TO_RUN" -max_len=65536 -rss_limit_mb=1024 -malloc_limit_mb=256 -print_final_stats=1
