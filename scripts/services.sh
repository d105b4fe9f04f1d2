#!/usr/bin/env bash
# Sourced by scripts/test.sh: makes a PostgreSQL server available on loopback for the multi-worker tests.
#  - PRIMUS_OPTUNA_PG_URL already set: used as is (your own server).
#  - otherwise: installs Debian's postgresql if missing, starts a throw-away cluster on 127.0.0.1 in a temp dir
#    (as the 'postgres' user when run as root), exports PRIMUS_OPTUNA_PG_URL, and stops it when the caller exits.
# If no server can be had, the PostgreSQL tests are skipped with the reason printed here.
if [ -z "${PRIMUS_OPTUNA_PG_URL:-}" ] && [ "${PRIMUS_OPTUNA_NO_PG:-0}" != "1" ]; then
  _pg_bin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
  if [ -z "$_pg_bin" ] && command -v apt-get >/dev/null 2>&1; then
    echo "[services] installing postgresql (Debian package)" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; } >&2 2>&1 || true
    _pg_bin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
  fi
  if [ -n "$_pg_bin" ]; then
    _pg_dir="$(mktemp -d /tmp/primus-optuna-pg.XXXXXX)"
    _pg_port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
    _as=()
    if [ "$(id -u)" = "0" ]; then chown postgres "$_pg_dir" 2>/dev/null && _as=(runuser -u postgres --); fi
    if "${_as[@]}" "$_pg_bin/initdb" -D "$_pg_dir/data" -U postgres -A trust >"$_pg_dir/initdb.log" 2>&1 &&
      "${_as[@]}" "$_pg_bin/pg_ctl" -D "$_pg_dir/data" -l "$_pg_dir/server.log" -w \
        -o "-c listen_addresses=127.0.0.1 -p $_pg_port -k $_pg_dir -c max_connections=100 -c fsync=off" start >/dev/null &&
      "${_as[@]}" "$_pg_bin/createdb" -h 127.0.0.1 -p "$_pg_port" -U postgres primus_optuna; then
      export PRIMUS_OPTUNA_PG_URL="postgresql+psycopg2://postgres@127.0.0.1:$_pg_port/primus_optuna"
      echo "[services] PostgreSQL on 127.0.0.1:$_pg_port" >&2
      _pg_stop() { "${_as[@]}" "$_pg_bin/pg_ctl" -D "$_pg_dir/data" -m immediate stop >/dev/null 2>&1; rm -rf "$_pg_dir"; }
      trap _pg_stop EXIT
    else
      echo "[services] could not start PostgreSQL (see $_pg_dir); PostgreSQL tests will be skipped" >&2
      cat "$_pg_dir"/*.log >&2 2>/dev/null || true
    fi
  else
    echo "[services] PostgreSQL is not installed and could not be installed; PostgreSQL tests will be skipped" >&2
  fi
fi

# the headless-browser dashboard test needs Debian's chromium
source "$(dirname "${BASH_SOURCE[0]}")/install_chromium.sh"
