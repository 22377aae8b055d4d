#!/usr/bin/env bash
# Prints the path of the gateway binary cargo built for a profile (debug or release), asking
# cargo for its target directory so that CARGO_TARGET_DIR and .cargo/config settings are honoured.
# Usage: scripts/cargo-bin.sh [debug|release]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
profile="${1:-debug}"
target_dir=$(cargo metadata --format-version 1 --no-deps --locked |
  "${PYTHON:-python3}" -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
echo "$target_dir/$profile/filament-bigquery"
