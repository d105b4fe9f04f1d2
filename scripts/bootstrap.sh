#!/usr/bin/env bash
# Idempotent bootstrap, sourced by scripts/run.sh and scripts/test.sh:
#  - creates .venv if missing (PRIMUS_OPTUNA_VENV overrides the location);
#  - keeps an already-installed torch, otherwise installs ${PRIMUS_OPTUNA_TORCH:-torch==2.13.0}
#    (GPU users: PRIMUS_OPTUNA_TORCH='torch==2.x.y' with their index, or pre-install torch in the venv);
#  - installs the project (editable) with every extra (llm, dashboard, plots, profile, scripts: pandas and
#    plotly) and the dev tools; re-installs only when pyproject.toml changed;
#  - installs TorchTitan 0.3 for the CI check tests/titan from scripts/requirements-titan.txt, without its
#    declared dependencies (they would downgrade the project's) when PRIMUS_OPTUNA_TITAN=1 (scripts/test.sh sets it;
#    1.2 GB, triton; the main job scripts/run.sh does not need it).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PRIMUS_OPTUNA_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"

_pip() {  # pip, quiet, without this machine's local-index warnings; returns pip's own exit status
  local rc=0 log
  log="$(mktemp)"
  "$VENV/bin/python" -m pip install -q "$@" >"$log" 2>&1 || rc=$?
  # drop this machine's local-index warnings and setuptools' informational note on flat-layout editable
  # installs (a "!! ... !!" block naming "Editable installation", plus the source line it prints after it)
  awk '/^ *!!$/ { skip = !skip; next } skip { next }
       /^WARNING: Location/ || /BuildBackendWarning/ || /with strategy, WheelFile/ { next } { print }' \
    "$log" >&2 || true
  rm -f "$log"
  return "$rc"
}

if [ ! -x "$VENV/bin/python" ]; then
  echo "[bootstrap] creating $VENV" >&2
  "$PY" -m venv "$VENV"
  _pip --upgrade pip
fi
stamp="$VENV/.primus-optuna-installed"
titan=0
if [ "${PRIMUS_OPTUNA_TITAN:-0}" != "0" ]; then titan=1; fi
base="$(cat "$ROOT/pyproject.toml" "$ROOT/scripts/requirements-titan.txt" | sha1sum | cut -c1-12)"
want="$base-titan$titan"
have="$(cat "$stamp" 2>/dev/null || true)"
# an install with TorchTitan serves a caller that does not need it
if [ "$have" != "$want" ] && ! { [ "$titan" = 0 ] && [ "$have" = "$base-titan1" ]; }; then
  if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
    spec="${PRIMUS_OPTUNA_TORCH:-torch==2.13.0}"
    echo "[bootstrap] installing $spec" >&2
    _pip "$spec"
  fi
  echo "[bootstrap] installing primus-optuna and its dependencies" >&2
  _pip -e "$ROOT[all,dev]"
  if [ "$titan" = 1 ]; then
    echo "[bootstrap] installing TorchTitan 0.3 for tests/titan (scripts/requirements-titan.txt, --no-deps)" >&2
    _pip --no-deps -r "$ROOT/scripts/requirements-titan.txt"
  fi
  echo "$want" > "$stamp"
fi
export PATH="$VENV/bin:$PATH"
export LITELLM_LOCAL_MODEL_COST_MAP=True
export LITELLM_OFFLINE_MODE=true
