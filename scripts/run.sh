#!/usr/bin/env bash
# Install what is missing (idempotent), then run the main job on the flagship study.
#   scripts/run.sh [extra args for the command]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source scripts/bootstrap.sh
STUDY="${PRIMUS_OPTUNA_STUDY:-studies/mixtral-8x22b-mi355x-fp8.yaml}"
primus-optuna space "$STUDY" "$@"
