#!/usr/bin/env bash
# Runs the whole system without Docker: a local Synapse on 127.0.0.1:8008, the agent and the
# surface, sharing ./workspace. State lives in ./.state (delete it to start over).
# Log in from any Matrix client: homeserver http://127.0.0.1:8008, user `alice`, password
# `alice-dev-password`, then start a direct chat with @bot:localhost.
set -euo pipefail
cd "$(dirname "$0")/.."

export MXBRIDGE_CACHE="${MXBRIDGE_CACHE:-$HOME/.cache/mxbridge}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$MXBRIDGE_CACHE/target}"
STATE="$PWD/.state"
HS_PORT="${HS_PORT:-8008}"
mkdir -p "$STATE" workspace

cargo build -p agent -p surface
scripts/synapse.sh start "$STATE/synapse" "$HS_PORT" > "$STATE/synapse.env"
# shellcheck disable=SC1091
. "$STATE/synapse.env"

VENV="${SYNAPSE_VENV:-$MXBRIDGE_CACHE/synapse-venv-${SYNAPSE_VERSION:-1.163.2}}"
register() {
  "$VENV/bin/register_new_matrix_user" -k "$E2E_REGISTRATION_SECRET" -u "$1" -p "$2" --no-admin \
    "$E2E_HOMESERVER_URL" >/dev/null 2>&1 || true  # already registered on later runs
}
register bot bot-dev-password
register alice alice-dev-password

if [ ! -f "$STATE/agent-token" ]; then
  head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$STATE/agent-token"
fi
export AGENT_TOKEN; AGENT_TOKEN="$(cat "$STATE/agent-token")"
export WORKSPACE_ROOT="$PWD/workspace" RUST_LOG="${RUST_LOG:-info,matrix_sdk=warn,matrix_sdk_base=warn,matrix_sdk_crypto=warn,matrix_sdk_crypto::backups=error}"

pids=()
cleanup() {
  kill -TERM "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  scripts/synapse.sh stop "$STATE/synapse"
}
trap cleanup EXIT INT TERM

AGENT_BIND=127.0.0.1:8700 AGENT_STATE_DIR="$STATE/agent" "$CARGO_TARGET_DIR/debug/agent" &
pids+=($!)
MATRIX_HOMESERVER_URL="$E2E_HOMESERVER_URL" MATRIX_USER_ID="@bot:localhost" \
  MATRIX_PASSWORD=bot-dev-password AGENT_URL=ws://127.0.0.1:8700 \
  SURFACE_STATE_DIR="$STATE/surface" SURFACE_HEALTH_BIND=127.0.0.1:8701 \
  "$CARGO_TARGET_DIR/debug/surface" &
pids+=($!)

cat <<MSG

  Running. Log in with any Matrix client:
    homeserver  $E2E_HOMESERVER_URL
    user        alice   password alice-dev-password
  and start a direct chat with @bot:localhost (say "help"). Shared folder: ./workspace
  Ctrl-C stops everything.

MSG
wait -n "${pids[@]}"
