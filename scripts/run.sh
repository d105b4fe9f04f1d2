#!/usr/bin/env bash
# Install what is missing (idempotent), then run the main job: the Optuna study of the flagship study file
# (analytical runner; resumes when run again), then write its audit report. Storage, artifacts and the report
# go under runs/ (git-ignored).
#   scripts/run.sh [extra args for `primus-optuna run`, e.g. --n-trials 60 --llm openai/gpt-4o]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source scripts/bootstrap.sh
STUDY="${PRIMUS_OPTUNA_STUDY:-studies/mixtral-8x22b-mi355x-fp8.yaml}"
mkdir -p runs
STORAGE="${PRIMUS_OPTUNA_STORAGE:-sqlite:///runs/$(basename "$STUDY" .yaml).db}"
primus-optuna run "$STUDY" --storage "$STORAGE" "$@"
# the report goes where `run` said (next to a file storage: runs/<study>-report/); it prints the paths
primus-optuna report --storage "$STORAGE"
echo "primus-optuna is in $ROOT/.venv: 'source $ROOT/.venv/bin/activate' to call it by name in a new shell" >&2
