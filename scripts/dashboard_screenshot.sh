#!/usr/bin/env bash
# Screenshot of optuna-dashboard's trial page on a finished primus-optuna study (issue 7).
#
#   scripts/dashboard_screenshot.sh [OUT.png]      (default docs/img/dashboard-trial.png)
#
# Installs Debian's chromium if missing (apt-get), creates a small finished study with `primus-optuna run`
# (qwen3-30b-a3b on 8 H200, analytical runner, no LLM; falls back to the hand-built test study if `run`
# fails), starts `primus-optuna dashboard` on it, saves a PNG of the best trial's page with headless
# Chromium, then stops the dashboard. Env: PORT (default 8765), TRIALS (default 16), WIDTH/HEIGHT.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$(realpath -m "${1:-$ROOT/docs/img/dashboard-trial.png}")"
PORT="${PORT:-8765}"
TRIALS="${TRIALS:-16}"
WIDTH="${WIDTH:-1600}"
HEIGHT="${HEIGHT:-1300}"
WORK="$(mktemp -d)"
export LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_OFFLINE_MODE=true
[ -f "$ROOT/.venv/bin/activate" ] && source "$ROOT/.venv/bin/activate"

source "$ROOT/scripts/install_chromium.sh"  # the same install path as the CI browser test
command -v chromium >/dev/null 2>&1 || { echo "chromium is required" >&2; exit 1; }

DB="$WORK/study.db"
STORAGE="sqlite:///$DB"
echo "creating a finished study in $DB" >&2
if ! (cd "$WORK" && primus-optuna run "$ROOT/studies/qwen3-30b-a3b-h200-bf16.yaml" --storage "$STORAGE" \
      --n-trials "$TRIALS" --no-llm --no-progress >"$WORK/run.log" 2>&1); then
  echo "primus-optuna run failed (see below); using the hand-built test study instead" >&2
  tail -5 "$WORK/run.log" >&2 || true
  rm -f "$DB"
  (cd "$ROOT" && python - "$STORAGE" <<'EOF'
import sys

import optuna

from primus_optuna.record.dashboard import refresh_study_note
from tests.helpers.recorded_study import make_study

optuna.logging.set_verbosity(optuna.logging.WARNING)
study = make_study(sys.argv[1])
refresh_study_note(study, sys.argv[1])
# hand-built trials never ran, so no hook wrote their notes: write them as the hook would have
from optuna_dashboard._note import save_note_with_version  # noqa: E402

from primus_optuna.record.dashboard import trial_note  # noqa: E402

for t in study.get_trials():
    save_note_with_version(study._storage, study._study_id, t._trial_id, 1, trial_note(t.user_attrs, t.params, t.number))
EOF
  )
fi

primus-optuna dashboard --storage "$STORAGE" --host 127.0.0.1 --port "$PORT" >"$WORK/dashboard.log" 2>&1 &
DASH=$!
cleanup() { kill "$DASH" 2>/dev/null || true; wait "$DASH" 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT

for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$PORT/api/studies" >/dev/null 2>&1 && break
  sleep 0.2
done
SID=$(curl -sf "http://127.0.0.1:$PORT/api/studies" | python -c '
import json, sys
print(json.load(sys.stdin)["study_summaries"][0]["study_id"])')
BEST=$(curl -sf "http://127.0.0.1:$PORT/api/studies/$SID" | python -c '
import json, sys
print((json.load(sys.stdin).get("best_trials") or [{"number": 0}])[0]["number"])')
URL="http://127.0.0.1:$PORT/dashboard/studies/$SID/trials?numbers=$BEST"
echo "screenshot of $URL" >&2

mkdir -p "$(dirname "$OUT")"
# the same flags as tests/record/test_dashboard_browser.py (which dumps the DOM instead of a PNG)
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$WORK/chrome" \
  --window-size="$WIDTH,$HEIGHT" --virtual-time-budget=15000 --screenshot="$OUT" "$URL" \
  >"$WORK/chromium.log" 2>&1 || { cat "$WORK/chromium.log" >&2; exit 1; }
[ -s "$OUT" ] || { echo "no screenshot written" >&2; exit 1; }
echo "wrote $OUT"
