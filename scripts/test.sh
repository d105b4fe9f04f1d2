#!/usr/bin/env bash
# Install what is missing (idempotent), then lint and run the whole test suite.
#   scripts/test.sh [pytest args...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PRIMUS_OPTUNA_TITAN="${PRIMUS_OPTUNA_TITAN:-1}"  # tests/titan checks the exports with TorchTitan's own code
source scripts/bootstrap.sh
echo "[test] ruff check + format check"
ruff check primus_optuna tests scripts hub
ruff format --check primus_optuna tests scripts hub
if [ -f scripts/services.sh ]; then source scripts/services.sh; fi
echo "[test] pytest"
python -m pytest -q -p no:cacheprovider --durations=15 "$@"
