#!/usr/bin/env bash
# The project's whole test suite, on a machine that has never seen the project:
#   unit and integration tests of every crate, the end-to-end tests against a real Synapse
#   (installed from PyPI into a cached virtualenv), and the Docker Compose check when an engine
#   is present.
# Caches (outside the clone, safe to delete): $MXBRIDGE_CACHE (default ~/.cache/mxbridge) holds
# the cargo target dir and the Synapse virtualenv.
set -euo pipefail
cd "$(dirname "$0")/.."

export MXBRIDGE_CACHE="${MXBRIDGE_CACHE:-$HOME/.cache/mxbridge}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$MXBRIDGE_CACHE/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
mkdir -p "$MXBRIDGE_CACHE"

step() { printf '\n=== %s (%ss)\n' "$*" "$SECONDS"; }

step "tools"
need_apt=()
command -v curl >/dev/null || need_apt+=(curl)
# Video posters: the surface uses ffmpeg when there is one, and the media test expects it.
command -v ffmpeg >/dev/null || need_apt+=(ffmpeg)
command -v python3 >/dev/null || need_apt+=(python3 python3-venv)
# ImageMagick: the bench's smoke run prepares a picture for a model next to `convert -resize`
# (Debian's; a stand-in earlier on the PATH does not count).
/usr/bin/convert -version 2>/dev/null | grep -q 'Version: ImageMagick' || need_apt+=(imagemagick)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi
# promtool for the alert rules' unit tests: only the binary, unpacked from Debian's prometheus
# package into the cache (installing the package would also start a Prometheus server on a
# developer's machine, and pull in 300 MB the tests do not use).
PROMTOOL="$(command -v promtool || echo "$MXBRIDGE_CACHE/promtool/usr/bin/promtool")"
if [ ! -x "$PROMTOOL" ]; then
  fetch_promtool() (
    cd "$(mktemp -d)" && apt-get download -qq prometheus 2>/dev/null &&
      dpkg-deb -x prometheus_*.deb "$MXBRIDGE_CACHE/promtool" && rm -f prometheus_*.deb
  )
  fetch_promtool || { apt-get update -qq && fetch_promtool; }
fi
scripts/synapse.sh install
# PostgreSQL (Debian's server; a cluster of the tests' own is started below): the agent's
# database backend runs the shared store suites and the failover tests against it.
scripts/postgres.sh install
# The official MCP Python SDK: the agent's MCP tests run its servers (agent/tests/it/mcp_server.py).
MCP_VENV="$MXBRIDGE_CACHE/mcp-venv-1.30.0"
if ! "$MCP_VENV/bin/python" -c 'import mcp' 2>/dev/null; then
  python3 -m venv "$MCP_VENV" && "$MCP_VENV/bin/pip" install -q 'mcp==1.30.0'
fi
export MXBRIDGE_MCP_PYTHON="$MCP_VENV/bin/python"
# A real Agent Client Protocol agent for the ACP brain's end-to-end test: Hermes from PyPI, run
# offline against the test's own scripted model (e2e/tests/it/acp.rs).
HERMES_VENV="$MXBRIDGE_CACHE/hermes-venv-0.19.0"
if ! [ -x "$HERMES_VENV/bin/hermes-acp" ] || ! "$HERMES_VENV/bin/python" -c 'import acp' 2>/dev/null; then
  rm -rf "$HERMES_VENV"
  python3 -m venv "$HERMES_VENV" &&
    "$HERMES_VENV/bin/pip" install -q 'hermes-agent[acp,mcp]==0.19.0' 'agent-client-protocol==0.9.0'
fi
export MXBRIDGE_HERMES_ACP="$HERMES_VENV/bin/hermes-acp"
# The official ACP Python SDK's example agents (only in its source distribution), run by that
# venv's Python, which has the same SDK version: agent/tests/it/acp_sdk.rs.
ACP_SDK_DIR="$MXBRIDGE_CACHE/acp-python-sdk-0.9.0"
if [ ! -f "$ACP_SDK_DIR/examples/echo_agent.py" ]; then
  sdist="$(mktemp -d)"
  "$HERMES_VENV/bin/pip" download -q --no-deps --no-binary :all: -d "$sdist" 'agent-client-protocol==0.9.0'
  mkdir -p "$ACP_SDK_DIR"
  tar xzf "$sdist"/agent_client_protocol-0.9.0.tar.gz -C "$ACP_SDK_DIR" --strip-components=1
  rm -rf "$sdist"
fi
export MXBRIDGE_ACP_PYTHON="$HERMES_VENV/bin/python"
export MXBRIDGE_ACP_SDK_EXAMPLES="$ACP_SDK_DIR/examples"
# Speech for the voice-message test: espeak-ng speaks a sentence, PocketSphinx (a pinned PyPI
# package with its model) transcribes it behind e2e/transcribe_server.py; sets
# MXBRIDGE_SPEECH_PYTHON.
eval "$(scripts/speech.sh install)"

# docs/prometheus-alerts.yml: valid rules, and each alert fires (or stays quiet) on the recorded
# series of docs/prometheus-alerts.test.yml. Needs no build, so it runs first.
step "prometheus alert rules"
"$PROMTOOL" check rules docs/prometheus-alerts.yml
"$PROMTOOL" test rules docs/prometheus-alerts.test.yml

# One feature resolution for every cargo command below: each selects the whole workspace, with
# the surface's latency taps on (the benchmark's smoke run below reads them; the images leave them
# out)
# (`--exclude` or `-p` would unify dependency features differently and rebuild much of the tree).
step "build"
cargo build --workspace --all-targets --locked --features surface/latency

step "lint"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked --features surface/latency -- -D warnings

# One PostgreSQL for every suite below (each test creates a database of its own in it); sets
# MXBRIDGE_TEST_DATABASE_URL and MXBRIDGE_PG_DIR.
PG_DIR="$(mktemp -d /tmp/mxbridge-postgres.XXXXXX)"
PG_PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
cleanup() {
  scripts/postgres.sh stop "$PG_DIR"
  rm -rf "$PG_DIR"
  if [ -n "${SYN_DIR:-}" ]; then scripts/synapse.sh stop "$SYN_DIR"; rm -rf "$SYN_DIR"; fi
}
trap cleanup EXIT
eval "$(scripts/postgres.sh start "$PG_DIR" "$PG_PORT")"

step "unit tests"
cargo test --workspace --lib --bins --locked --features surface/latency

step "integration and end-to-end tests (real Synapse)"
SYN_DIR="$(mktemp -d /tmp/mxbridge-synapse.XXXXXX)"
SYN_PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
eval "$(scripts/synapse.sh start "$SYN_DIR" "$SYN_PORT")"
# Every crate's tests/it; the e2e ones start real agent and surface processes against Synapse.
cargo test --workspace --test it --locked --features surface/latency -- --test-threads 2 --nocapture
# The benchmark's smoke run (tiny sizes, one run): the instrument still measures everything. It
# fails only when a measurement cannot be taken, never for a missed target.
"$CARGO_TARGET_DIR/debug/bench" --smoke --out "$SYN_DIR/bench.json"

step "kubernetes manifests"
# deploy/k8s validated offline against the Kubernetes schemas (kubernetes-validate from PyPI).
scripts/k8s-check.sh

step "docker compose end-to-end"
if [ -n "${MXBRIDGE_SKIP_DOCKER:-}" ]; then
  echo "DOCKER E2E NOT RUN: MXBRIDGE_SKIP_DOCKER is set"
elif [ -x scripts/docker-e2e.sh ]; then
  scripts/docker-e2e.sh
else
  echo "DOCKER E2E NOT RUN: scripts/docker-e2e.sh does not exist yet"
fi

step "all tests passed"
