#!/usr/bin/env bash
# `make bench`: the ingestion benchmark (benches/ingest.rs), the fairness benchmark and the
# many-tables benchmark (benches/many_tables.rs, against the simulated control plane), against a throwaway Postgres, the
# emulator's REST API and the null Storage Write sink. Prints the figures, writes
# build/bench/result.json and the table in docs/performance.md. FILAMENT_BENCH_BYTES sets the
# Arrow bytes per run (default 1 GiB).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ENV_FILE=build/bench-services.env
PEER_VENV=build/venv-bench

scripts/services.sh start "$ENV_FILE" random
trap 'scripts/services.sh stop "$ENV_FILE"' EXIT
# shellcheck disable=SC1090
source "$ENV_FILE"

# The Python peer: Google's client, pinned, in its own virtualenv (not needed by `make test`).
if [ ! -f "$PEER_VENV/.installed-1" ]; then
  echo "[bench] installing the Python peer's virtualenv into $PEER_VENV" >&2
  rm -rf "$PEER_VENV"
  python3 -m venv "$PEER_VENV"
  "$PEER_VENV/bin/pip" install -q --disable-pip-version-check "pyarrow==26.0.1" "google-cloud-bigquery-storage==2.36.0"
  touch "$PEER_VENV/.installed-1"
fi
export FILAMENT_TOOLS_PYTHON="$PWD/$PEER_VENV/bin/python"

# The previous main, measured beside this build in the same run: its release binary, built
# once in a worktree of its commit with a target dir of its own (FILAMENT_BENCH_PREVIOUS_MAIN
# names another commit; `none` skips it, and many_tables then measures this build with the
# previous main's fixed maxima instead). The default is 400bce7, the main issue 57 (the I/O floor, Postgres
# transactions per resource) compares K=8 and K=64 with.
PREVIOUS_MAIN=${FILAMENT_BENCH_PREVIOUS_MAIN:-400bce7}
if [ "$PREVIOUS_MAIN" != none ]; then
  commit=$(git rev-parse --short "$PREVIOUS_MAIN^{commit}")
  previous_dir="$PWD/build/previous-main/$commit"
  if [ ! -x "$previous_dir/filament-bigquery" ]; then
    echo "[bench] building the previous main ($commit) into $previous_dir" >&2
    rm -rf "$previous_dir/src"
    git worktree prune
    git worktree add --detach --force "$previous_dir/src" "$commit" >&2
    (cd "$previous_dir/src" && CARGO_TARGET_DIR="$previous_dir/target" cargo build --release --locked --bin filament-bigquery)
    cp "$previous_dir/target/release/filament-bigquery" "$previous_dir/filament-bigquery"
  fi
  export FILAMENT_BENCH_PREVIOUS_GATEWAY="$previous_dir/filament-bigquery" FILAMENT_BENCH_PREVIOUS_COMMIT="$commit"
fi

cargo bench --locked --bench ingest
cargo bench --locked --bench fairness
# After ingest: its K=64 throughput is the data term of the many-tables floor.
cargo bench --locked --bench many_tables
