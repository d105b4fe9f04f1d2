#!/usr/bin/env bash
# Sourced by scripts/services.sh (tests) and scripts/dashboard_screenshot.sh: makes Debian's `chromium`
# available for the headless-browser dashboard check. Installs it with apt-get when missing and possible;
# otherwise prints why, and tests/record/test_dashboard_browser.py skips with that reason.
if ! command -v chromium >/dev/null 2>&1 && [ "${PRIMUS_OPTUNA_NO_CHROMIUM:-0}" != "1" ]; then
  if command -v apt-get >/dev/null 2>&1; then
    _sudo=""; [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1 && _sudo="sudo -n"
    echo "[services] installing chromium (Debian package)" >&2
    { $_sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $_sudo apt-get install -y -qq chromium >/dev/null; } >&2 2>&1 || true
  fi
  command -v chromium >/dev/null 2>&1 ||
    echo "[services] chromium is not installed and could not be installed; the browser test will be skipped" >&2
fi
