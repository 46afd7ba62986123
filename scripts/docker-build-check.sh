#!/usr/bin/env bash
# Checks the mechanics of the multi-stage ./Dockerfile on a machine without a registry:
# BuildKit parses it (cache mounts and all), the builder stage's outputs reach both runtime
# targets, and the resulting images run as 10001:10001 with /workspace owned by them.
#
# The real builder image (rust:1.95-bookworm) cannot be pulled here, so the builder stage runs on
# a local stand-in whose `cargo` only copies host-built binaries into target/release/ (tagged
# mxbridge-local/rust-stub, passed as --build-arg RUST_IMAGE; never tagged rust:*). Compiling
# the workspace inside Docker is what CI with a registry does; here it would cost every other
# build on the machine 15+ minutes of CPU.
#
# Needs: a Docker engine with BuildKit (DOCKER_BUILDKIT=1 with a 20.10+ client, or buildx), the
# local debian:bookworm-slim (scripts/docker-e2e.sh makes it), and host-built binaries:
#   MXBRIDGE_E2E_BIN_DIR (default $CARGO_TARGET_DIR/debug, CARGO_TARGET_DIR default
#   /root/.cache/mxbridge/target).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN_DIR="${MXBRIDGE_E2E_BIN_DIR:-${CARGO_TARGET_DIR:-/root/.cache/mxbridge/target}/debug}"
STUB_TAG="mxbridge-local/rust-stub:1"

if ! docker info >/dev/null 2>&1; then
    echo "DOCKER BUILD CHECK SKIPPED: no Docker engine"
    exit 0
fi
# A client that can drive BuildKit: buildx, or a classic client (< 23) with DOCKER_BUILDKIT=1.
DOCKER=docker
if ! docker buildx version >/dev/null 2>&1; then
    if [ -x /usr/bin/docker ] && [ "$(/usr/bin/docker version -f '{{.Client.Version}}' | cut -d. -f1)" -lt 23 ]; then
        DOCKER=/usr/bin/docker
    else
        echo "DOCKER BUILD CHECK SKIPPED: no BuildKit-capable client (install docker-buildx)"
        exit 0
    fi
fi
docker image inspect debian:bookworm-slim >/dev/null 2>&1 \
    || { echo "no debian:bookworm-slim image: run scripts/docker-e2e.sh first" >&2; exit 1; }

ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/stub-bin"
for b in agent surface; do
    [ -x "$BIN_DIR/$b" ] || { echo "no binary $BIN_DIR/$b" >&2; exit 1; }
    objcopy --strip-debug "$BIN_DIR/$b" "$ctx/stub-bin/$b" 2>/dev/null || cp "$BIN_DIR/$b" "$ctx/stub-bin/$b"
done
cat >"$ctx/cargo" <<'EOF'
#!/bin/sh
# Stand-in for `cargo build --locked --release -p agent -p surface`.
set -eu
echo "rust-stub cargo $*"
mkdir -p target/release
cp /stub-bin/agent /stub-bin/surface target/release/
EOF
cat >"$ctx/Dockerfile" <<'EOF'
FROM debian:bookworm-slim
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends binutils >/dev/null \
 && rm -rf /var/lib/apt/lists/*
COPY stub-bin/ /stub-bin/
COPY cargo /usr/local/cargo/bin/cargo
RUN chmod 0755 /usr/local/cargo/bin/cargo
ENV PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
EOF
DOCKER_BUILDKIT=0 docker build -q -t "$STUB_TAG" "$ctx" >/dev/null 2>&1 \
    || DOCKER_BUILDKIT=0 docker build -t "$STUB_TAG" "$ctx"

t0=$(date +%s)
for target in agent surface; do
    DOCKER_BUILDKIT=1 $DOCKER build --progress=plain --build-arg "RUST_IMAGE=$STUB_TAG" \
        --target "$target" -t "mxbridge-local/$target:dockerfile-check" "$REPO" \
        >"$ctx/build-$target.log" 2>&1 || { tail -40 "$ctx/build-$target.log"; exit 1; }
done
echo "built both targets of ./Dockerfile with BuildKit in $(($(date +%s) - t0))s"

for target in agent surface; do
    img="mxbridge-local/$target:dockerfile-check"
    out="$(docker run --rm "$img" sh -c 'echo "$(id -u):$(id -g) $(stat -c %u:%g:%a /workspace) $(umask)"; command -v '"$target")"
    echo "$target: $out"
    case "$out" in
        "10001:10001 10001:10001:2775 0002"*"/usr/local/bin/$target") ;;
        *) echo "unexpected runtime layout in $img" >&2; exit 1 ;;
    esac
    docker image inspect -f '{{.Config.User}} {{json .Config.Healthcheck.Test}}' "$img"
    docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' "$img"
done
for img in mxbridge-local/agent:dockerfile-check mxbridge-local/surface:dockerfile-check "$STUB_TAG"; do
    docker rmi "$img" >/dev/null 2>&1 || true
done
echo "DOCKERFILE CHECK: PASSED"
