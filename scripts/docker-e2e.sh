#!/usr/bin/env bash
# End-to-end check of the compose deployment, through real containers:
# Synapse + register step + agent + surface + the shared `workspace` volume.
#
# This machine kind has a Docker engine but no registry, so the script first makes the images it
# needs from Debian packages, and caches them (skipped when the tag exists with the same key):
#   * debian:bookworm-slim            debootstrap --variant=minbase bookworm, `docker import`ed
#   * mxbridge-local/synapse:1.163.2  FROM that base: python3 + venv + pip install matrix-synapse
#   * mxbridge-local/rust:1.95-bookworm  FROM that base: Debian's C toolchain + this machine's
#                                     Rust toolchain and CA bundle (stand-in for rust:1.95-bookworm)
#   * agent / surface images          ./Dockerfile itself (BuildKit, --build-arg
#                                     CARGO_PROFILE=image-check); or, with
#                                     MXBRIDGE_E2E_IMAGES=prebuilt, docker/prebuilt.Dockerfile over
#                                     host-built binaries (compose.local.yaml)
# then runs `compose -f compose.yaml -f compose.local.yaml up`, and checks as a person would:
#   register happened; a user (a matrix-sdk client) opens an ENCRYPTED DM with the bot, and every
#   message both ways is checked to be m.room.encrypted on the wire; a file sent as m.file lands in the volume
#   with the exact bytes (sha256 inside the agent AND the surface container); the reply arrives;
#   `note x.txt hello` makes the agent write into the volume and its file comes back to the room
#   (downloaded, compared); both containers read and write each other's files (uid 10001);
#   `restart surface` / `restart agent` lose nothing, and a message sent while the surface (or
#   the agent) is stopped is answered after it comes back.
# Cleans up with `down -v` (trap). Prints timing figures.
#
# No Docker engine (`docker info` fails): prints "DOCKER E2E SKIPPED: no Docker engine", exits 0.
#
# Environment (all optional):
#   MXBRIDGE_E2E_PROJECT     compose project name (default mxbridge-e2e)
#   MXBRIDGE_E2E_IMAGES      dockerfile (default) or prebuilt (see above)
#   MXBRIDGE_E2E_BIN_DIR     prebuilt mode: directory with prebuilt `agent` and `surface` (default: build them with
#                            `cargo build --workspace --all-targets` (the test command's one build,
#                            so nothing is compiled twice) into $CARGO_TARGET_DIR, then use
#                            $CARGO_TARGET_DIR/debug)
#   CARGO_TARGET_DIR         default /root/.cache/mxbridge/target (shared with the other builds)
#   MXBRIDGE_DOCKER_CACHE    scratch/cache folder (default ~/.cache/mxbridge/docker-e2e)
#   MXBRIDGE_E2E_KEEP=1      leave the stack running at the end (no `down -v`)
#   MXBRIDGE_E2E_TIMEOUT     seconds per wait in the Matrix checks (default 120)
#   MXBRIDGE_E2E_COMPOSE     compose command to use (default `docker compose`, else docker-compose)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PROJECT="${MXBRIDGE_E2E_PROJECT:-mxbridge-e2e}"
CACHE="${MXBRIDGE_DOCKER_CACHE:-${HOME:-/root}/.cache/mxbridge/docker-e2e}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/root/.cache/mxbridge/target}"

# The image-making machinery shared with scripts/docker-up.sh: BASE_TAG, SYNAPSE_TAG, RUST_TAG and
# the functions that make them (debootstrap, pip, the Rust stand-in), find_compose, find_buildkit,
# stage_prebuilt, wait_healthy.
# shellcheck source=scripts/lib/docker-images.sh
. "$REPO/scripts/lib/docker-images.sh"
# dockerfile (default): the agent and surface images are built from ./Dockerfile itself, its
# builder stage on a local stand-in for rust:1.95-bookworm (the base image plus this machine's
# Rust toolchain); prebuilt: host-built binaries in docker/prebuilt.Dockerfile (faster, for
# iterating on the checks).
IMAGES="${MXBRIDGE_E2E_IMAGES:-dockerfile}"
case "$IMAGES" in dockerfile | prebuilt) ;; *) echo "MXBRIDGE_E2E_IMAGES: dockerfile or prebuilt" >&2; exit 2 ;; esac
AGENT_TAG="mxbridge-local/agent:$IMAGES"
SURFACE_TAG="mxbridge-local/surface:$IMAGES"

T_START=$(date +%s)
TIMINGS=()
phase_start=$T_START
phase() { # phase NAME: closes the running phase under NAME
    local now
    now=$(date +%s)
    TIMINGS+=("$(printf '%-34s %5ds' "$1" $((now - phase_start)))")
    phase_start=$now
}
print_timings() {
    echo "---- docker e2e timings ----"
    local t
    for t in "${TIMINGS[@]}"; do echo "  $t"; done
    echo "  $(printf '%-34s %5ds' total $(($(date +%s) - T_START)))"
}
say() { echo "[docker-e2e $(date -u +%H:%M:%S)] $*"; }
die() { echo "[docker-e2e] FAILED: $*" >&2; exit 1; }

if ! docker info >/dev/null 2>&1; then
    echo "################################################################"
    echo "#  DOCKER E2E SKIPPED: no Docker engine (docker info failed)   #"
    echo "################################################################"
    exit 0
fi

# Compose v2 plugin if present, else docker-compose (1.29, Debian's package);
# MXBRIDGE_E2E_COMPOSE names another one (e.g. a standalone v2 binary).
if ! find_compose "${MXBRIDGE_E2E_COMPOSE:-}"; then
    apt_install docker-compose
    COMPOSE=(docker-compose)
fi
say "engine $(docker version -f '{{.Server.Version}}'), compose: $("${COMPOSE[@]}" version --short 2>/dev/null || echo '?')"

mkdir -p "$CACHE"
ENV_FILE="$CACHE/$PROJECT.env"
WORK="$CACHE/$PROJECT.work"
STATE="$WORK/user"   # the test user's matrix-sdk device (crypto store, session) and its DM
CTX="$REPO/target/docker-prebuilt"
rm -rf "$WORK"
mkdir -p "$WORK" "$CTX/bin"

dc() {
    "${COMPOSE[@]}" --env-file "$ENV_FILE" -p "$PROJECT" \
        -f "$REPO/compose.yaml" -f "$REPO/compose.local.yaml" "$@"
}

# ------------------------------------------------------------------------------------------------
# 1. debian:bookworm-slim from Debian packages (debootstrap), cached by tag + key.
ensure_base_image
phase "base image $BASE_TAG"

# ------------------------------------------------------------------------------------------------
# 2. Synapse image FROM that base: Debian's python3 + a venv with matrix-synapse from PyPI.
ensure_synapse_image
phase "synapse image"

# ------------------------------------------------------------------------------------------------
# 3. The agent and surface images.
#   dockerfile: ./Dockerfile's own stages, with BuildKit (its cache mounts). The builder stage
#   runs FROM a local stand-in for rust:1.95-bookworm: the base image, Debian's C toolchain, this
#   machine's Rust toolchain and its CA bundle (this machine's egress re-signs TLS). Built with
#   CARGO_PROFILE=image-check (dev code, no debug info); the cargo registry and target dir stay
#   in BuildKit's cache, so a rerun recompiles only what changed.
#   prebuilt: host-built binaries (compose.local.yaml: docker/prebuilt.Dockerfile).
# The host build: the Matrix user of the checks (docker_check) and, in prebuilt mode, the binaries.
if [ -n "${MXBRIDGE_E2E_BIN_DIR:-}" ]; then
    BIN_DIR="$MXBRIDGE_E2E_BIN_DIR"
else
    say "cargo build --workspace --all-targets (CARGO_TARGET_DIR=$CARGO_TARGET_DIR)"
    (cd "$REPO" && cargo build -q --workspace --all-targets --locked --features surface/latency) \
        || die "cargo build failed"
    BIN_DIR="$CARGO_TARGET_DIR/debug"
fi
if [ "$IMAGES" = dockerfile ]; then
    find_buildkit || die "no BuildKit-capable docker client (install docker-buildx), or run with MXBRIDGE_E2E_IMAGES=prebuilt"
    ensure_rust_image
    phase "builder image $RUST_TAG"
    old_ids="$(docker image inspect -f '{{.Id}}' "$AGENT_TAG" "$SURFACE_TAG" 2>/dev/null || true)"
    for t in agent surface; do
        tag="mxbridge-local/$t:$IMAGES"
        say "docker build --target $t ./Dockerfile (CARGO_PROFILE=image-check) -> $tag"
        bk_build --build-arg RUST_IMAGE="$RUST_TAG" --build-arg RUNTIME_IMAGE="$BASE_TAG" \
            --build-arg CARGO_PROFILE=image-check --target "$t" -t "$tag" "$REPO" \
            >"$CACHE/dockerfile-$t.log" 2>&1 \
            || { tail -40 "$CACHE/dockerfile-$t.log"; die "building ./Dockerfile --target $t failed"; }
    done
    remove_replaced_images "$old_ids" "$AGENT_TAG" "$SURFACE_TAG"
    say "images from ./Dockerfile: agent $(docker image inspect -f '{{.Size}}' "$AGENT_TAG" | numfmt --to=iec), surface $(docker image inspect -f '{{.Size}}' "$SURFACE_TAG" | numfmt --to=iec)"
    phase "images from ./Dockerfile"
else
    # Debug info is most of a debug binary; the image does not need it.
    stage_prebuilt "$BIN_DIR" "$CTX"
    phase "stage binaries"
fi

# Random per-run secrets and a free loopback port for Synapse.
rand() { python3 -c 'import secrets; print(secrets.token_hex(16))'; }
SYNAPSE_PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
E2E_PASSWORD="pw-$(rand)"
# Secrets both ways compose takes them (docker/secrets/init.py): the agent token and the bot's
# password as files in the secrets directory, the registration secret from the environment.
SECRETS_DIR="$WORK/secrets"
mkdir -p "$SECRETS_DIR"
AGENT_TOKEN_VALUE="e2e-$(rand)" BOT_PASSWORD_VALUE="bot-$(rand)" REG_SECRET_VALUE="e2e-$(rand)"
printf '%s\n' "$AGENT_TOKEN_VALUE" >"$SECRETS_DIR/AGENT_TOKEN"
printf '%s' "$BOT_PASSWORD_VALUE" >"$SECRETS_DIR/MATRIX_BOT_PASSWORD"
cat >"$ENV_FILE" <<EOF
SYNAPSE_SERVER_NAME=localhost
SYNAPSE_HOST_PORT=$SYNAPSE_PORT
SYNAPSE_REGISTRATION_SHARED_SECRET=$REG_SECRET_VALUE
MXBRIDGE_SECRETS_DIR=$SECRETS_DIR
SYNAPSE_LOCAL_IMAGE=$SYNAPSE_TAG
AGENT_LOCAL_IMAGE=$AGENT_TAG
SURFACE_LOCAL_IMAGE=$SURFACE_TAG
MXBRIDGE_PREBUILT_CONTEXT=$CTX
AGENT_BRAIN=builtin
MATRIX_BOT_LOCALPART=bot
MATRIX_TEST_LOCALPART=alice
MATRIX_TEST_PASSWORD=$E2E_PASSWORD
AGENT_RUST_LOG=info
SURFACE_RUST_LOG=info,matrix_sdk=warn,matrix_sdk_base=warn,matrix_sdk_crypto=warn,matrix_sdk_crypto::backups=error
EOF

export DOCKER_BUILDKIT=0 COMPOSE_DOCKER_CLI_BUILD=0 # prebuilt.Dockerfile needs no BuildKit
dc config -q || die "compose config (compose.yaml + compose.local.yaml) does not validate"
"${COMPOSE[@]}" --env-file "$REPO/.env.example" -p "$PROJECT" -f "$REPO/compose.yaml" --profile element config -q \
    || die "compose.yaml with .env.example does not validate"
# The ACP example override (README.md, "Bring your own agent"): valid over compose.yaml. Not
# built here (it installs Hermes from PyPI into the image; the ACP tests run Hermes on the host).
"${COMPOSE[@]}" --env-file "$REPO/.env.example" -p "$PROJECT" -f "$REPO/compose.yaml" -f "$REPO/compose.acp.yaml" config -q \
    || die "compose.acp.yaml over compose.yaml does not validate"
# The PostgreSQL overlay (docs/scaling.md): valid over compose.yaml, and its secrets step gives
# the postgres image a password and the agents a URL made from it, the same on a second start
# (not started here: no PostgreSQL image can be pulled on a machine without a registry).
"${COMPOSE[@]}" --env-file "$REPO/.env.example" -p "$PROJECT" -f "$REPO/compose.yaml" -f "$REPO/compose.postgres.yaml" config -q \
    || die "compose.postgres.yaml over compose.yaml does not validate"
pg_secrets="$(mktemp -d)"
mkdir -p "$pg_secrets/in" "$pg_secrets/out/postgres"
for _ in 1 2; do
    env -i PATH="$PATH" MXBRIDGE_SECRETS_IN="$pg_secrets/in" MXBRIDGE_SECRETS_OUT="$pg_secrets/out" \
        python3 "$REPO/docker/secrets/init.py" >/dev/null || die "docker/secrets/init.py failed"
    pw="$(cat "$pg_secrets/out/postgres/POSTGRES_PASSWORD")"
    [ "${#pw}" -ge 32 ] || die "the postgres password was not generated"
    [ "$(cat "$pg_secrets/out/agent/AGENT_DATABASE_URL")" = "postgres://mxbridge:$pw@postgres:5432/mxbridge?sslmode=disable" ] \
        || die "the agents' AGENT_DATABASE_URL is not made from the postgres password"
    [ -z "${first_pw:-}" ] || [ "$first_pw" = "$pw" ] || die "the postgres password changed on a second start"
    first_pw="$pw"
done
rm -rf "$pg_secrets"
dc down -v --remove-orphans >/dev/null 2>&1 || true # leftovers of an interrupted run

FAILED=1
cleanup() {
    local rc=$?
    set +e
    if [ "$FAILED" = 1 ]; then
        say "failure: container states and last log lines (full logs: $CACHE/$PROJECT.logs)"
        dc ps -a 2>/dev/null || dc ps
        dc logs --no-color >"$CACHE/$PROJECT.logs" 2>&1
        for s in synapse-init matrix-register synapse agent surface; do
            echo "----- $s -----"
            grep -a "^$s" "$CACHE/$PROJECT.logs" | tail -n 40 | cut -c1-400
        done
    fi
    if [ "${MXBRIDGE_E2E_KEEP:-0}" = 1 ]; then
        say "MXBRIDGE_E2E_KEEP=1: stack left running (project $PROJECT, synapse on 127.0.0.1:$SYNAPSE_PORT)"
    else
        local t0
        t0=$(date +%s)
        dc down -v --remove-orphans >/dev/null 2>&1
        TIMINGS+=("$(printf '%-34s %5ds' "compose down -v" $(($(date +%s) - t0)))")
    fi
    print_timings
    if [ "$FAILED" = 1 ]; then
        echo "DOCKER E2E: FAILED"
        echo "0 passed, 1 failed"
        exit $((rc == 0 ? 1 : rc))
    fi
}
trap cleanup EXIT

if [ "$IMAGES" = prebuilt ]; then
    say "building runtime images from $CTX"
    old_ids="$(docker image inspect -f '{{.Id}}' "$AGENT_TAG" "$SURFACE_TAG" 2>/dev/null || true)"
    dc build agent surface >"$CACHE/compose-build.log" 2>&1 \
        || { tail -30 "$CACHE/compose-build.log"; die "building the runtime images failed"; }
    # Drop the previous run's images when the binaries changed (repeat runs must not fill the disk).
    remove_replaced_images "$old_ids" "$AGENT_TAG" "$SURFACE_TAG"
    phase "runtime images (prebuilt)"
fi

# Two throwaway containers (agent image, then surface image, then agent again) on a fresh
# volume: the volume inherits /workspace's owner from the image, and each side reads, appends to,
# renames and deletes what the other wrote.
perm_vol="$PROJECT-permcheck"
docker volume rm -f "$perm_vol" >/dev/null 2>&1 || true
docker volume create "$perm_vol" >/dev/null
perm_run() { docker run --rm --network none -v "$perm_vol:/workspace" "$1" sh -euc "$2"; }
# shellcheck disable=SC2016 # the scripts run inside the containers
perm_out="$(
    perm_run "$AGENT_TAG" 'test "$(id -u):$(id -g)" = 10001:10001; test "$(stat -c %u:%g /workspace)" = 10001:10001
        mkdir -p /workspace/chats/c && echo agent > /workspace/chats/c/a.txt; stat -c %a /workspace/chats/c/a.txt' &&
    perm_run "$SURFACE_TAG" 'test "$(id -u):$(id -g)" = 10001:10001
        cat /workspace/chats/c/a.txt; echo surface >> /workspace/chats/c/a.txt; mv /workspace/chats/c/a.txt /workspace/chats/c/b.txt
        mkdir -p /workspace/surfaces/matrix/u/r/inbox && echo inbox > /workspace/surfaces/matrix/u/r/inbox/f.txt' &&
    perm_run "$AGENT_TAG" 'cat /workspace/chats/c/b.txt; echo agent2 >> /workspace/surfaces/matrix/u/r/inbox/f.txt
        cat /workspace/surfaces/matrix/u/r/inbox/f.txt; rm /workspace/surfaces/matrix/u/r/inbox/f.txt /workspace/chats/c/b.txt'
)" || { docker volume rm -f "$perm_vol" >/dev/null; die "cross-container permission check failed: $perm_out"; }
docker volume rm -f "$perm_vol" >/dev/null
perm_out="$(tr '\n' ' ' <<<"$perm_out")"
[ "$perm_out" = "664 agent agent surface inbox agent2 " ] \
    || die "cross-container permission check: unexpected output: $perm_out"
say "ok: throwaway agent/surface containers share a fresh volume as 10001:10001 (files 664, umask 002)"
phase "cross-container permission check"

# ------------------------------------------------------------------------------------------------
# 4. Up, and wait until every long-running service is healthy.
# (wait_healthy: scripts/lib/docker-images.sh)
say "compose up (project $PROJECT, synapse on 127.0.0.1:$SYNAPSE_PORT)"
# `up -d` honours the depends_on conditions (healthy / completed) in Compose v2 and 1.29 alike;
# 1.29 has no --wait, and v2's --wait trips over the one-shot services in some versions, so the
# final wait for the long-running services is done here.
# The images exist (built above): never let compose build (or pull) them again.
dc up -d --no-build || die "compose up failed"
wait_healthy 180 synapse agent surface
reg="$(cid_of matrix-register)"
[ -n "$reg" ] && [ "$(docker inspect -f '{{.State.ExitCode}}' "$reg")" = 0 ] \
    || die "the register step did not complete successfully"
docker logs "$reg" 2>&1 | sed 's/^/  register| /'
phase "compose up to healthy"

# ------------------------------------------------------------------------------------------------
# 5. The checks, as a person in a Matrix client would do them.
export E2E_HOMESERVER="http://127.0.0.1:$SYNAPSE_PORT" E2E_USER=alice E2E_PASSWORD \
    E2E_BOT="@bot:localhost" E2E_TIMEOUT="${MXBRIDGE_E2E_TIMEOUT:-120}"
# The user is a matrix-sdk client in an encrypted DM (e2e/src/bin/docker_check.rs, built by the
# workspace build): the same client as the real-homeserver suite, and what Element users are.
CHECK_BIN="$BIN_DIR/docker_check"
[ -x "$CHECK_BIN" ] || CHECK_BIN="$CARGO_TARGET_DIR/debug/docker_check"
[ -x "$CHECK_BIN" ] || die "no docker_check binary (cargo build --workspace --all-targets builds it)"
chk() { "$CHECK_BIN" --state "$STATE" "$@"; }
json_field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
PASSED=0
ok() { PASSED=$((PASSED + 1)); say "ok: $*"; }

chk setup
ok "register step ran; alice (matrix-sdk, own device) opened an encrypted DM and the bot joined"

# Cross-container permissions on the shared volume: the surface writes, the agent reads and
# appends, the surface reads the result; both run as 10001:10001.
ids="$(dc exec -T surface sh -c 'echo "$(id -u):$(id -g)"; echo from-surface > /workspace/.e2e-perm-probe')"
[ "$(tr -d '\r' <<<"$ids")" = 10001:10001 ] || die "surface runs as $ids, not 10001:10001"
dc exec -T agent sh -c 'cat /workspace/.e2e-perm-probe && echo from-agent >> /workspace/.e2e-perm-probe' >/dev/null \
    || die "the agent cannot read+write a file the surface created"
[ "$(dc exec -T surface cat /workspace/.e2e-perm-probe | tr -d '\r')" = "$(printf 'from-surface\nfrom-agent')" ] \
    || die "the surface does not see the agent's write"
dc exec -T surface rm -f /workspace/.e2e-perm-probe
ok "surface and agent read and write each other's files in the workspace volume"

# Both run confined: a read-only root file system (only the volumes and /tmp are writable), no
# capabilities, no privilege gain, and no setuid or setgid program left in the image.
for s in agent surface; do
    dc exec -T "$s" sh -c 'touch /usr/local/bin/.probe' 2>/dev/null \
        && die "$s: the root file system is writable"
    dc exec -T "$s" sh -c 'touch /tmp/.probe && rm /tmp/.probe' || die "$s: /tmp is not writable"
    caps="$(dc exec -T "$s" sh -c 'grep -E "^Cap(Eff|Prm|Bnd):" /proc/1/status | cut -f2 | sort -u' | tr -d '\r')"
    [ "$caps" = 0000000000000000 ] || die "$s: PID 1 has capabilities: $caps"
    nnp="$(dc exec -T "$s" sh -c 'grep "^NoNewPrivs:" /proc/1/status | cut -f2' | tr -d '\r')"
    [ "$nnp" = 1 ] || die "$s: no_new_privs is not set"
    # (find exits 1 for the directories it may not read; what it prints is the answer)
    setuid="$(dc exec -T "$s" sh -c 'find / -xdev -perm /6000 -type f 2>/dev/null; true' | tr -d '\r')"
    [ -z "$setuid" ] || die "$s: setuid/setgid programs in the image: $setuid"
done
ok "agent and surface run read-only, without capabilities or privilege gain, and without setuid programs"

# Secrets are files: no container but the one-shot `secrets` step has one in its configuration
# (environment, command, labels), and the agent and surface read theirs through NAME_FILE.
for s in synapse-init synapse matrix-register agent surface; do
    cid="$(cid_of "$s")"
    [ -n "$cid" ] || die "no container for $s"
    conf="$(docker inspect "$cid")"
    for v in "$AGENT_TOKEN_VALUE" "$BOT_PASSWORD_VALUE" "$REG_SECRET_VALUE"; do
        case "$conf" in *"$v"*) die "docker inspect of $s shows a secret (${v:0:4}…)" ;; esac
    done
done
for s in agent surface; do
    # (the running program's environment, as the entrypoint made it; `exec` does not run it)
    files="$(dc exec -T "$s" sh -c 'for p in /proc/[0-9]*; do [ "$(cat "$p/comm")" = "$0" ] && tr "\0" "\n" <"$p/environ"; done | grep -E "^[A-Z_]+_FILE=" | cut -d= -f1 | sort | tr "\n" " "' "$s" | tr -d '\r')"
    case "$s:$files" in
        "agent:AGENT_TOKEN_FILE " | "surface:AGENT_TOKEN_FILE MATRIX_PASSWORD_FILE ") ;;
        *) die "$s reads its secrets from: '$files'" ;;
    esac
    dc exec -T "$s" sh -c 'cat /run/mxbridge/secrets/* >/dev/null && ! touch /run/mxbridge/secrets/x 2>/dev/null' \
        || die "$s: its secrets volume is not readable, or is writable"
done
ok "no secret in docker inspect of any long-running service; agent and surface read theirs as files"

# A file sent as m.file reaches the volume with the exact bytes, and the reply arrives.
python3 -c 'import os,sys; open(sys.argv[1],"wb").write(b"docker e2e line one\nline two\n" + os.urandom(16).hex().encode() + b"\n")' "$WORK/report.txt"
sent="$(chk send-file "$WORK/report.txt")"
path="$(json_field "$sent" path)"
want="$(sha256sum "$WORK/report.txt" | cut -d' ' -f1)"
ok "reply quoting sha256 $want arrived; file at $path"
for s in agent surface; do
    got="$(dc exec -T "$s" sha256sum "/workspace/$path" | cut -d' ' -f1)"
    [ "$got" = "$want" ] || die "$s sees sha256 $got for /workspace/$path, want $want"
done
owner="$(dc exec -T agent stat -c '%u:%g %A' "/workspace/$path" | tr -d '\r')"
ok "agent and surface containers see the exact bytes (sha256 match; owner/mode $owner)"

# The agent writes into the volume; its send_file reaches the room; download and compare.
ev="$(chk send "note x.txt hello")"
got="$(chk wait-file "$ev" x.txt "$WORK/x.txt")"
if [ "$(cat "$WORK/x.txt")" != hello ]; then
    die "x.txt downloaded from the room holds $(od -c "$WORK/x.txt" | sed -n 1,3p), want 'hello'"
fi
agent_copy="$(dc exec -T surface sh -c 'cat /workspace/chats/*/x.txt')"
[ "$agent_copy" = hello ] || die "the surface container does not see chats/*/x.txt with 'hello'"
ok "note x.txt hello: written by the agent into the volume, posted to the room, downloaded back equal"

# Restarts lose nothing.
t_restart=$(date +%s)
say "docker compose restart surface"
dc restart surface >/dev/null 2>&1
wait_healthy 180 surface
say "surface healthy again"
ev="$(chk send "after surface restart $(rand)")"
chk wait-text "$ev" "after surface restart" >/dev/null
ok "restart surface: answered afterwards"

say "docker compose restart agent"
dc restart agent >/dev/null 2>&1
wait_healthy 180 agent surface
say "agent and surface healthy again"
ev="$(chk send "history")"
hist="$(chk wait-text "$ev" "earlier turn(s)")"
hist="${hist%%$'\n'*}" # first line (no `| head`: SIGPIPE would fail the writer under pipefail)
say "history after agent restart: $hist"
# Three turns so far (the file, the note, the message after the surface restart), one attachment.
[[ "$hist" =~ has\ ([0-9]+)\ earlier\ turn.*\ ([0-9]+)\ attachment ]] \
    && [ "${BASH_REMATCH[1]}" -ge 3 ] && [ "${BASH_REMATCH[2]}" -ge 1 ] \
    || die "the agent lost its history across the restart: $hist"
ok "restart agent: the chat's history survived (${BASH_REMATCH[1]} turns, ${BASH_REMATCH[2]} attachments)"
nonce="$(rand)"
ev="$(chk send "after agent restart $nonce")"
chk wait-text "$ev" "$nonce" >/dev/null
ok "restart agent: answered afterwards"

say "docker compose stop surface"
dc stop surface >/dev/null 2>&1
nonce="$(rand)"
ev="$(chk send "sent while the surface was stopped $nonce")"
say "docker compose start surface"
dc start surface >/dev/null 2>&1
wait_healthy 180 surface
say "surface healthy again"
chk wait-text "$ev" "$nonce" >/dev/null
ok "a message sent while the surface was stopped is answered after it starts"

say "docker compose stop agent"
dc stop agent >/dev/null 2>&1
nonce="$(rand)"
ev="$(chk send "sent while the agent was stopped $nonce")"
sleep 3
say "docker compose start agent"
dc start agent >/dev/null 2>&1
wait_healthy 180 agent surface
say "agent and surface healthy again"
chk wait-text "$ev" "$nonce" >/dev/null
ok "a message sent while the agent was stopped is answered after it starts"

# The earlier file is still in the volume after all that, byte for byte.
got="$(dc exec -T agent sha256sum "/workspace/$path" | cut -d' ' -f1)"
[ "$got" = "$want" ] || die "after the restarts the agent sees sha256 $got for $path"
ok "after the restarts the volume still holds the inbound file unchanged"
t_restart=$(($(date +%s) - t_restart))
phase "end-to-end checks"
TIMINGS+=("$(printf '%-34s %5ds' "  of which restarts" "$t_restart")")

FAILED=0
echo "DOCKER E2E: PASSED ($PASSED checks)"
echo "$PASSED passed, 0 failed"
