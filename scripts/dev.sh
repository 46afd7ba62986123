#!/usr/bin/env bash
# Runs the whole system without Docker: a local Synapse on 127.0.0.1:8008, the agent and the
# surface, sharing ./workspace. State lives in ./.state (delete it to start over).
# Log in from any Matrix client: homeserver http://127.0.0.1:8008, user `alice`, password
# `alice-dev-password`, then start a direct chat with @bot:localhost.
#
# Writes the settings the two processes run with (secrets included, mode 0600) to
#   .state/agent.toml, .state/surface.toml   for `--config` (`agent --config .state/agent.toml doctor`)
#   .state/dev.env                           the same for a shell (`set -a; . .state/dev.env; set +a`)
# and each process's output to .state/logs/<name>.log (also shown here). When one of them dies,
# everything is stopped and it says which one, how it ended, and the last lines of its log.
set -euo pipefail
cd "$(dirname "$0")/.."

export MXBRIDGE_CACHE="${MXBRIDGE_CACHE:-$HOME/.cache/mxbridge}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$MXBRIDGE_CACHE/target}"
STATE="$PWD/.state"
HS_PORT="${HS_PORT:-8008}"
BIN="$CARGO_TARGET_DIR/debug"
mkdir -p "$STATE/logs" workspace

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
  (umask 077; head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$STATE/agent-token")
fi
export AGENT_TOKEN; AGENT_TOKEN="$(cat "$STATE/agent-token")"
export WORKSPACE_ROOT="$PWD/workspace" RUST_LOG="${RUST_LOG:-info,matrix_sdk=warn,matrix_sdk_base=warn,matrix_sdk_crypto=warn,matrix_sdk_crypto::backups=error}"

# What each process gets on top of this environment (and of whatever the caller exported, e.g.
# AGENT_BRAIN=openai OPENAI_BASE_URL=...).
AGENT_ENV=(AGENT_BIND=127.0.0.1:8700 "AGENT_STATE_DIR=$STATE/agent")
SURFACE_ENV=("MATRIX_HOMESERVER_URL=$E2E_HOMESERVER_URL" "MATRIX_USER_ID=@bot:localhost"
  MATRIX_PASSWORD=bot-dev-password AGENT_URL=ws://127.0.0.1:8700
  "SURFACE_STATE_DIR=$STATE/surface" SURFACE_HEALTH_BIND=127.0.0.1:8701)

# ---- The settings as files ---------------------------------------------------------------------
# known_settings BIN: the variable names BIN reads, from its --help ("[env: NAME]" of every flag,
# and the secrets' section, "  NAME  meaning").
known_settings() {
  "$1" --help | sed -n -e 's/.*\[env: \([A-Z][A-Z0-9_]*\)\].*/\1/p' \
    -e 's/^  \([A-Z][A-Z0-9_]*\)  .*/\1/p' | sort -u
}
toml_string() { # a TOML basic string
  local v=$1
  v="${v//\\/\\\\}" v="${v//\"/\\\"}" v="${v//$'\n'/\\n}" v="${v//$'\t'/\\t}"
  printf '"%s"' "$v"
}
# write_settings BIN FILE VAR=VALUE...: the settings BIN knows, as this environment plus the
# assignments sets them, as TOML (the format of `--config`).
write_settings() {
  local bin=$1 file=$2 name
  shift 2
  (
    # shellcheck disable=SC2163 # the arguments are VAR=VALUE assignments
    export "$@"
    umask 077
    {
      echo "# Written by scripts/dev.sh: the settings $(basename "$bin") runs with. $bin --config $file doctor"
      for name in $(known_settings "$bin"); do
        [ -n "${!name+x}" ] && echo "$name = $(toml_string "${!name}")"
      done
    } > "$file.tmp"
    mv "$file.tmp" "$file"
  )
}
# write_env FILE VAR=VALUE...: every setting either binary knows, for a shell to source.
write_env() {
  local file=$1 name
  shift
  (
    # shellcheck disable=SC2163 # the arguments are VAR=VALUE assignments
    export "$@"
    umask 077
    {
      echo "# Written by scripts/dev.sh: the settings of the agent and the surface (set -a; . $file; set +a)"
      for name in $( (known_settings "$BIN/agent"; known_settings "$BIN/surface") | sort -u); do
        [ -n "${!name+x}" ] && printf "%s='%s'\n" "$name" "${!name//\'/\'\\\'\'}"
      done
    } > "$file.tmp"
    mv "$file.tmp" "$file"
  )
}
write_settings "$BIN/agent" "$STATE/agent.toml" "${AGENT_ENV[@]}"
write_settings "$BIN/surface" "$STATE/surface.toml" "${SURFACE_ENV[@]}"
write_env "$STATE/dev.env" "${AGENT_ENV[@]}" "${SURFACE_ENV[@]}"

# ---- Run, and watch ----------------------------------------------------------------------------
names=()
pids=()
cleanup() {
  kill -TERM "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  scripts/synapse.sh stop "$STATE/synapse"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# start NAME VAR=VALUE...: runs $BIN/NAME with the assignments; its output goes to the terminal
# and to .state/logs/NAME.log, without the surface's recovery key banner (a secret never written
# to a log: it is shown here once).
KEY_BANNER='/RECOVERY KEY (shown once)/,/^=====/c\
  [the recovery key banner was shown on the terminal only]'
start() {
  local name=$1 log="$STATE/logs/$1.log"
  shift
  echo "==== $(date -u '+%F %T') start" >> "$log"
  env "$@" "$BIN/$name" > >(tee >(sed -u "$KEY_BANNER" >> "$log")) 2>&1 &
  names+=("$name")
  pids+=($!)
}
start agent "${AGENT_ENV[@]}"
start surface "${SURFACE_ENV[@]}"

cat <<MSG

  Running. Log in with any Matrix client:
    homeserver  $E2E_HOMESERVER_URL
    user        alice   password alice-dev-password
  and start a direct chat with @bot:localhost (say "help"). Shared folder: ./workspace
  Logs: .state/logs/{agent,surface}.log, .state/synapse/homeserver.log
  The doctors, with the settings in use (another terminal):
    $BIN/agent --config .state/agent.toml doctor; $BIN/surface --config .state/surface.toml doctor
  Ctrl-C stops everything.

MSG

# how_it_ended STATUS: "exited with status N" or "killed by SIGNAME".
how_it_ended() {
  if [ "$1" -gt 128 ]; then
    echo "killed by SIG$(kill -l "$(($1 - 128))" 2>/dev/null || echo "$(($1 - 128))")"
  else
    echo "exited with status $1"
  fi
}
died() { # died NAME HOW LOG: report, then stop the rest (the EXIT trap)
  {
    echo
    echo "dev.sh: $1 $2; stopping the others. Last lines of $3:"
    tail -n 20 "$3" | sed 's/^/  | /'
  } >&2
  exit 1
}
syn_pid="$(cat "$STATE/synapse/homeserver.pid" 2>/dev/null || true)"
while sleep 1; do
  for i in "${!pids[@]}"; do
    if ! kill -0 "${pids[$i]}" 2>/dev/null; then
      status=0
      wait "${pids[$i]}" || status=$?
      sleep 0.2 # let tee write the last lines
      died "${names[$i]} (pid ${pids[$i]})" "$(how_it_ended "$status")" "$STATE/logs/${names[$i]}.log"
    fi
  done
  if [ -n "$syn_pid" ] && ! kill -0 "$syn_pid" 2>/dev/null; then
    died "synapse (pid $syn_pid)" "stopped" "$STATE/synapse/homeserver.log"
  fi
done
