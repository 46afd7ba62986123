#!/usr/bin/env bash
# Throw-away Synapse for the end-to-end tests: installs a pinned Synapse from PyPI into a cached
# virtualenv, writes a loopback-only config with registration by shared secret and test-sized
# rate limits, and starts or stops it.
#
#   scripts/synapse.sh install          # create/reuse the virtualenv
#   scripts/synapse.sh start DIR PORT   # config + data in DIR; prints export lines for the tests
#   scripts/synapse.sh stop DIR
#
# SYNAPSE_EXTRA_CONFIG (YAML lines) is appended to the config: a test's own server's settings.
# SYNAPSE_RC_MESSAGE (a YAML flow mapping, e.g. '{per_second: 0.5, burst_count: 3}') replaces the
# fast message rate limit, for tests that need the homeserver to answer 429.
# SYNAPSE_MAX_UPLOAD_SIZE (e.g. `8G`, default 512M) raises the upload limit, for the benchmark's
# big files.
set -euo pipefail

SYNAPSE_VERSION="${SYNAPSE_VERSION:-1.163.2}"
CACHE_DIR="${MXBRIDGE_CACHE:-$HOME/.cache/mxbridge}"
VENV="${SYNAPSE_VENV:-$CACHE_DIR/synapse-venv-$SYNAPSE_VERSION}"

log() { printf '[synapse] %s\n' "$*" >&2; }

install() {
  if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import synapse, sys; sys.exit(synapse.__version__ != '$SYNAPSE_VERSION')" 2>/dev/null; then
    log "reusing $VENV (Synapse $SYNAPSE_VERSION)"
    return
  fi
  log "installing Synapse $SYNAPSE_VERSION into $VENV"
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "matrix-synapse==$SYNAPSE_VERSION"
}

read_secret() {
  sed -n 's/^registration_shared_secret: "\(.*\)"$/\1/p' "$1/homeserver.yaml"
}

write_config() {
  local dir="$1" port="$2"
  local secret=""
  # Keep the secret and signing key of an existing server (scripts/dev.sh restarts it).
  [ -f "$dir/homeserver.yaml" ] && secret="$(read_secret "$dir")"
  [ -n "$secret" ] || secret="$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
  [ -f "$dir/signing.key" ] || "$VENV/bin/generate_signing_key" -o "$dir/signing.key"
  cat > "$dir/log.yaml" <<YAML
version: 1
formatters:
  precise: {format: '%(asctime)s %(name)s %(levelname)s %(message)s'}
handlers:
  file: {class: logging.FileHandler, filename: $dir/homeserver.log, formatter: precise}
root: {level: WARNING, handlers: [file]}
disable_existing_loggers: false
YAML
  local fast='{per_second: 1000, burst_count: 1000}'
  cat > "$dir/homeserver.yaml" <<YAML
server_name: "localhost"
public_baseurl: "http://127.0.0.1:$port/"
pid_file: "$dir/homeserver.pid"
listeners:
  - port: $port
    bind_addresses: ["127.0.0.1"]
    type: http
    tls: false
    x_forwarded: false
    resources: [{names: [client], compress: false}]
database: {name: sqlite3, args: {database: "$dir/homeserver.db"}}
log_config: "$dir/log.yaml"
media_store_path: "$dir/media"
signing_key_path: "$dir/signing.key"
registration_shared_secret: "$secret"
macaroon_secret_key: "$secret-macaroon"
form_secret: "$secret-form"
report_stats: false
trusted_key_servers: []
suppress_key_server_warning: true
enable_authenticated_media: true
max_upload_size: ${SYNAPSE_MAX_UPLOAD_SIZE:-512M}
url_preview_enabled: false
presence: {enabled: false}
# MSC4140 delayed events: the surface's "I was interrupted" notice (SURFACE_INTERRUPTED_NOTICE).
max_event_delay_duration: 24h
rc_message: ${SYNAPSE_RC_MESSAGE:-$fast}
rc_registration: $fast
rc_login:
  address: $fast
  account: $fast
  failed_attempts: $fast
rc_joins:
  local: $fast
  remote: $fast
rc_joins_per_room: $fast
rc_invites:
  per_room: $fast
  per_user: $fast
  per_issuer: $fast
rc_admin_redaction: $fast
rc_media_create: $fast
rc_3pid_validation: $fast
rc_room_creation: $fast
YAML
  # Extra settings of one test's own server (e.g. short-lived access tokens), appended.
  [ -z "${SYNAPSE_EXTRA_CONFIG:-}" ] || printf '%s\n' "$SYNAPSE_EXTRA_CONFIG" >> "$dir/homeserver.yaml"
}

start() {
  local dir="$1" port="$2"
  install
  mkdir -p "$dir/media"
  dir="$(cd "$dir" && pwd)"
  write_config "$dir" "$port"
  local secret
  secret="$(read_secret "$dir")"
  if curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1; then
    log "port $port is already in use by another server"; exit 1
  fi
  log "starting on 127.0.0.1:$port (data in $dir)"
  "$VENV/bin/python" -m synapse.app.homeserver --config-path "$dir/homeserver.yaml" --daemonize
  local deadline=$((SECONDS + 90))
  until curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1; do
    if [ $SECONDS -gt $deadline ]; then
      log "did not become healthy; last log lines:"; tail -n 40 "$dir/homeserver.log" >&2 || true
      exit 1
    fi
    sleep 0.3
  done
  log "healthy"
  echo "export E2E_HOMESERVER_URL=http://127.0.0.1:$port"
  echo "export E2E_SERVER_NAME=localhost"
  echo "export E2E_REGISTRATION_SECRET=$secret"
  echo "export E2E_SYNAPSE_DIR=$dir"
}

stop() {
  local dir="$1"
  if [ -f "$dir/homeserver.pid" ]; then
    local pid; pid="$(cat "$dir/homeserver.pid")"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
    log "stopped"
  fi
}

case "${1:-}" in
  install) install ;;
  start) start "$2" "$3" ;;
  stop) stop "$2" ;;
  *) echo "usage: $0 install | start DIR PORT | stop DIR" >&2; exit 2 ;;
esac
