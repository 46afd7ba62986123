#!/usr/bin/env bash
# Starts the Docker stack (Synapse, register step, agent, surface; Element with --element) on
# whatever this Docker engine has, waits until it is healthy, and prints where to log in.
#
#   scripts/docker-up.sh             # or: scripts/docker-up.sh --element
#
# * Compose v2 plugin + buildx + a reachable registry (the normal path): `docker compose up -d
#   --build`, nothing else.
# * Otherwise (docker-compose 1.29 only, no buildx, no registry) the images are made here, then
#   started with compose.yaml + compose.local.yaml:
#     - Synapse and debian:bookworm-slim: pulled when a registry answers, else made from Debian
#       packages (debootstrap, needs root) and PyPI, as scripts/docker-e2e.sh does (shared code:
#       scripts/lib/docker-images.sh), cached in the engine;
#     - agent and surface: with buildx, from ./Dockerfile; without it, `cargo build --release`
#       on this machine (Debian bookworm or older glibc) packed by docker/prebuilt.Dockerfile
#       with Docker's classic builder (no BuildKit needed).
#   The first run compiles the bridge (about 18 min on 2 cores, see README.md); later runs
#   rebuild only what changed.
# * Creates .env from .env.example when there is none, with random secrets and passwords and its
#   own COMPOSE_PROJECT_NAME.
#
# Options:
#   --element        also start Element Web (needs its image: pulled, or already present)
#   --local          make the images here even when the normal path would work
#   -h, --help
# Environment:
#   MXBRIDGE_IMAGES         auto (default), dockerfile (./Dockerfile, needs BuildKit) or prebuilt
#                           (host cargo + docker/prebuilt.Dockerfile): how agent/surface are made
#                           on the local path
#   MXBRIDGE_CARGO_PROFILE  cargo profile of the prebuilt binaries / the Dockerfile (release)
#   CARGO_TARGET_DIR        host cargo's target dir (default ~/.cache/mxbridge/target)
#   MXBRIDGE_DOCKER_CACHE   logs and caches of the image builds (default ~/.cache/mxbridge/docker)
#   MXBRIDGE_UP_TIMEOUT     seconds to wait for the stack to be healthy (default 300)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
T0=$(date +%s)
say() { echo "[docker-up $(date +%H:%M:%S)] $*"; }
die() { echo "docker-up: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

ELEMENT=0
FORCE_LOCAL=0
for arg in "$@"; do
    case "$arg" in
        --element) ELEMENT=1 ;;
        --local) FORCE_LOCAL=1 ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown argument $arg (see --help)" ;;
    esac
done
IMAGES="${MXBRIDGE_IMAGES:-auto}"
case "$IMAGES" in auto | dockerfile | prebuilt) ;; *) die "MXBRIDGE_IMAGES: auto, dockerfile or prebuilt" ;; esac
CARGO_PROFILE="${MXBRIDGE_CARGO_PROFILE:-release}"
CACHE="${MXBRIDGE_DOCKER_CACHE:-${HOME:-/root}/.cache/mxbridge/docker}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${HOME:-/root}/.cache/mxbridge/target}"
mkdir -p "$CACHE"

# ---- The engine and compose ---------------------------------------------------------------------
command -v docker >/dev/null 2>&1 \
    || die "no docker command: install Docker Engine (https://docs.docker.com/engine/install/), or run without Docker: scripts/dev.sh"
if ! err="$(docker info 2>&1 >/dev/null)"; then
    die "the Docker engine does not answer ($(grep -m1 -i 'error\|cannot\|denied' <<<"$err" || echo 'docker info failed')): start it (sudo systemctl start docker) or join the docker group"
fi
PROJECT=placeholder # for the library until the real name is known
# shellcheck source=scripts/lib/docker-images.sh
. "$REPO/scripts/lib/docker-images.sh"
find_compose "${MXBRIDGE_COMPOSE:-}" \
    || die "no Docker Compose: install the Compose v2 plugin (apt-get install docker-compose-plugin) or docker-compose (apt-get install docker-compose)"
HAVE_BUILDX=0
docker buildx version >/dev/null 2>&1 && HAVE_BUILDX=1

# ---- .env ---------------------------------------------------------------------------------------
# setting NAME DEFAULT: the shell's value, else .env's, else DEFAULT (what compose interpolates).
setting() {
    if [ -n "${!1+x}" ]; then
        printf '%s' "${!1}"
        return
    fi
    local v
    v="$(sed -n "s/^[[:space:]]*$1[[:space:]]*=//p" .env 2>/dev/null | tail -n 1)"
    v="${v%\"}" v="${v#\"}" v="${v%\'}" v="${v#\'}"
    printf '%s' "${v:-$2}"
}
# The compose project another clone (another working dir) already runs under NAME, if any.
project_owner() {
    docker ps -a --filter "label=com.docker.compose.project=$1" \
        --format '{{.Label "com.docker.compose.project.working_dir"}}' 2>/dev/null \
        | grep -v -x -F "$REPO" | grep -v '^$' | sed -n 1p || true
}
rand_hex() { head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'; }

if [ ! -f .env ]; then
    [ -f .env.example ] || die "no .env and no .env.example in $REPO"
    name=mxbridge
    if [ -n "$(project_owner "$name")" ]; then
        name="mxbridge-$(basename "$REPO" | tr '[:upper:]' '[:lower:]' | tr -c 'a-z0-9_\n-' '-')-$(printf '%s' "$REPO" | sha256sum | cut -c1-6)"
    fi
    (
        umask 077
        sed -e "s/^COMPOSE_PROJECT_NAME=.*/COMPOSE_PROJECT_NAME=$name/" \
            -e "s/^MATRIX_TEST_PASSWORD=dev-only-.*/MATRIX_TEST_PASSWORD=$(rand_hex)/" \
            .env.example >.env.tmp
        grep -q '^COMPOSE_PROJECT_NAME=' .env.tmp || echo "COMPOSE_PROJECT_NAME=$name" >>.env.tmp
        mv .env.tmp .env
    )
    say "created .env from .env.example (project $name, a random test password; the stack's secrets are generated on the first start, see secrets/README.md)"
fi

PROJECT="$(setting COMPOSE_PROJECT_NAME "")"
if [ -z "$PROJECT" ]; then
    # What compose itself would call it: the directory's name.
    PROJECT="$(basename "$REPO" | tr '[:upper:]' '[:lower:]' | tr -cd 'a-z0-9_-')"
    say "note: .env sets no COMPOSE_PROJECT_NAME; the project is named after the directory ($PROJECT)"
fi
owner="$(project_owner "$PROJECT")"
[ -z "$owner" ] || die "the compose project '$PROJECT' belongs to the clone at $owner: set another COMPOSE_PROJECT_NAME in $REPO/.env"

# ---- Which path ---------------------------------------------------------------------------------
SYNAPSE_IMAGE="$(setting SYNAPSE_IMAGE matrixdotorg/synapse:v1.163.2)"
AGENT_IMAGE="$(setting AGENT_IMAGE mxbridge/agent:latest)"
SURFACE_IMAGE="$(setting SURFACE_IMAGE mxbridge/surface:latest)"
ELEMENT_IMAGE="$(setting ELEMENT_IMAGE vectorim/element-web:v1.11.100)"
why=()
[ "$COMPOSE_V2" = 1 ] || why+=("no Compose v2 plugin")
[ "$HAVE_BUILDX" = 1 ] || why+=("no buildx")
[ "$FORCE_LOCAL" = 0 ] || why+=("--local")
if [ ${#why[@]} = 0 ]; then
    image_available "$SYNAPSE_IMAGE" || why+=("no registry ($SYNAPSE_IMAGE cannot be pulled)")
fi

profiles=()
if [ "$ELEMENT" = 1 ]; then
    if image_available "$ELEMENT_IMAGE"; then
        profiles=(--profile element)
    else
        say "warning: Element Web skipped: its image $ELEMENT_IMAGE is not here and cannot be pulled; use any Matrix client"
        ELEMENT=0
    fi
fi

if [ ${#why[@]} = 0 ]; then
    # ---- The normal path --------------------------------------------------------------------
    FILES=(-f compose.yaml)
    MODE="compose v2 with BuildKit"
    dc() { "${COMPOSE[@]}" -p "$PROJECT" "${FILES[@]}" "$@"; }
    say "docker compose up -d --build (the first build compiles the bridge in release mode: some 20 min on 2 cores)"
    dc "${profiles[@]}" up -d --build || die "docker compose up failed"
else
    # ---- The local path ---------------------------------------------------------------------
    say "making the images here ($(IFS=,; echo "${why[*]}" | sed 's/,/, /g'))"
    FILES=(-f compose.yaml -f compose.local.yaml)
    dc() { "${COMPOSE[@]}" -p "$PROJECT" "${FILES[@]}" "$@"; }
    # Synapse: the configured image if it is here or can be pulled, else made from PyPI.
    if image_available "$SYNAPSE_IMAGE"; then
        export SYNAPSE_LOCAL_IMAGE="$SYNAPSE_IMAGE"
        say "$SYNAPSE_IMAGE: present"
        ensure_base_image pull
    else
        ensure_base_image pull
        ensure_synapse_image
        export SYNAPSE_LOCAL_IMAGE="$SYNAPSE_TAG"
    fi
    if [ "$IMAGES" = auto ]; then
        if [ "$HAVE_BUILDX" = 1 ]; then
            IMAGES=dockerfile
        elif command -v cargo >/dev/null 2>&1; then
            IMAGES=prebuilt
        elif find_buildkit; then
            IMAGES=dockerfile
        else
            die "cannot build the agent and surface images: install docker-buildx (BuildKit, for ./Dockerfile) or Rust (https://rustup.rs, to build on this machine)"
        fi
    fi
    # compose.local.yaml names a build context for agent and surface: ours (never built by compose).
    export MXBRIDGE_PREBUILT_CONTEXT="$REPO/target/docker-up"
    mkdir -p "$MXBRIDGE_PREBUILT_CONTEXT"
    old_ids="$(docker image inspect -f '{{.Id}}' "$AGENT_IMAGE" "$SURFACE_IMAGE" 2>/dev/null || true)"
    if [ "$IMAGES" = dockerfile ]; then
        find_buildkit || die "MXBRIDGE_IMAGES=dockerfile needs BuildKit: install docker-buildx"
        RUST_IMAGE=rust:1.95-bookworm
        if ! image_available "$RUST_IMAGE"; then
            ensure_rust_image
            RUST_IMAGE="$RUST_TAG"
        fi
        MODE="./Dockerfile with BuildKit ($CARGO_PROFILE), builder $RUST_IMAGE"
        for t in agent surface; do
            tag="$AGENT_IMAGE"
            [ "$t" = surface ] && tag="$SURFACE_IMAGE"
            say "docker build --target $t ./Dockerfile -> $tag (log: $CACHE/build-$t.log)"
            bk_build --build-arg RUST_IMAGE="$RUST_IMAGE" --build-arg RUNTIME_IMAGE="$BASE_TAG" \
                --build-arg CARGO_PROFILE="$CARGO_PROFILE" --target "$t" -t "$tag" . \
                >"$CACHE/build-$t.log" 2>&1 \
                || { tail -40 "$CACHE/build-$t.log"; die "building ./Dockerfile --target $t failed (log: $CACHE/build-$t.log)"; }
        done
    else
        command -v cargo >/dev/null 2>&1 \
            || die "MXBRIDGE_IMAGES=prebuilt needs Rust on this machine (https://rustup.rs)"
        # The binaries run in debian:bookworm-slim: they must not need a newer glibc.
        glibc="$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')"
        if [ -n "$glibc" ] && [ "$(printf '%s\n2.36\n' "$glibc" | sort -V | tail -n1)" != 2.36 ]; then
            die "this machine's glibc $glibc is newer than Debian bookworm's 2.36, so binaries built here would not run in the images: install docker-buildx (then ./Dockerfile builds them)"
        fi
        MODE="host cargo ($CARGO_PROFILE) + docker/prebuilt.Dockerfile"
        say "cargo build --locked --profile $CARGO_PROFILE -p agent -p surface (CARGO_TARGET_DIR=$CARGO_TARGET_DIR; the first time about 17 min on 2 cores)"
        cargo build --locked --profile "$CARGO_PROFILE" -p agent -p surface || die "cargo build failed"
        out="$CARGO_TARGET_DIR/$([ "$CARGO_PROFILE" = dev ] && echo debug || echo "$CARGO_PROFILE")"
        stage_prebuilt "$out" "$MXBRIDGE_PREBUILT_CONTEXT"
        for t in agent surface; do
            tag="$AGENT_IMAGE"
            [ "$t" = surface ] && tag="$SURFACE_IMAGE"
            say "docker build (classic builder) --target $t docker/prebuilt.Dockerfile -> $tag"
            DOCKER_BUILDKIT=0 docker build --build-arg RUNTIME_IMAGE="$BASE_TAG" --target "$t" -t "$tag" \
                -f "$MXBRIDGE_PREBUILT_CONTEXT/prebuilt.Dockerfile" "$MXBRIDGE_PREBUILT_CONTEXT" \
                >"$CACHE/build-$t.log" 2>&1 \
                || { tail -40 "$CACHE/build-$t.log"; die "building docker/prebuilt.Dockerfile --target $t failed (log: $CACHE/build-$t.log)"; }
        done
    fi
    export AGENT_LOCAL_IMAGE="$AGENT_IMAGE" SURFACE_LOCAL_IMAGE="$SURFACE_IMAGE"
    say "images: agent $(docker image inspect -f '{{.Size}}' "$AGENT_IMAGE" | numfmt --to=iec), surface $(docker image inspect -f '{{.Size}}' "$SURFACE_IMAGE" | numfmt --to=iec)"
    say "${COMPOSE[*]} up -d --no-build (project $PROJECT)"
    # The images exist: never let compose build (or pull) them again. Both v1 and v2 start each
    # service once what it depends on is healthy / has completed.
    dc "${profiles[@]}" up -d --no-build || die "compose up failed"
    remove_replaced_images "$old_ids" "$AGENT_IMAGE" "$SURFACE_IMAGE"
fi

# ---- Healthy? -----------------------------------------------------------------------------------
on_fail() {
    local rc=$?
    [ "$rc" = 0 ] && return
    echo "---- container states ----" >&2
    dc ps >&2 2>/dev/null || true
    for s in synapse-init synapse matrix-register agent surface; do
        echo "---- last lines of $s ----" >&2
        dc logs --no-color --tail 15 "$s" 2>&1 | cut -c1-300 >&2 || true
    done
    echo "docker-up: the stack is left as it is; stop it with: ${COMPOSE[*]} -p $PROJECT down" >&2
}
trap on_fail EXIT
services=(synapse agent surface)
[ "$ELEMENT" = 1 ] && services+=(element)
say "waiting for ${services[*]} to be healthy"
wait_healthy "${MXBRIDGE_UP_TIMEOUT:-300}" "${services[@]}"
reg="$(cid_of matrix-register)"
[ -n "$reg" ] && [ "$(docker inspect -f '{{.State.ExitCode}}' "$reg")" = 0 ] \
    || die "the register step (matrix-register) did not complete successfully"
trap - EXIT

server="$(setting SYNAPSE_SERVER_NAME localhost)"
test_user="$(setting MATRIX_TEST_LOCALPART alice)"
elapsed=$(($(date +%s) - T0))
compose_cmd="${COMPOSE[*]}"
cat <<EOF

  mxbridge is up (project $PROJECT; images: $MODE; $((elapsed / 60)) min $((elapsed % 60)) s).

    Homeserver   http://localhost:$(setting SYNAPSE_HOST_PORT 8008)   (any Matrix client: Element, Cinny, gomuks...)
EOF
if [ -n "$test_user" ]; then
    echo "    Log in as    @$test_user:$server   password: MATRIX_TEST_PASSWORD in $REPO/.env"
fi
echo "    Talk to      @$(setting MATRIX_BOT_LOCALPART bot):$server   start a direct chat and say \"help\""
if [ "$ELEMENT" = 1 ]; then
    echo "    Element Web  http://localhost:$(setting ELEMENT_HOST_PORT 8080)"
fi
cat <<EOF

    Logs:        $compose_cmd -p $PROJECT logs -f surface agent
    Doctors:     $compose_cmd -p $PROJECT exec surface surface doctor   (and: exec agent agent doctor)
    Stop:        $compose_cmd -p $PROJECT down   (down -v also deletes the accounts, history and workspace)
    Recovery key of the bot (shown once): $compose_cmd -p $PROJECT logs surface | grep -A1 'RECOVERY KEY'

EOF
