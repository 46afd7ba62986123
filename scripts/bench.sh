#!/usr/bin/env bash
# The benchmark: builds the release binaries, starts a throw-away Synapse of its own on a free
# loopback port (uploads up to 8G), runs `bench` with the given flags and prints where the JSON
# report is. Every figure is printed next to a comparator measured in the same run, min/median/max
# over the runs; targets are PASS/MISS and never fail the script.
#
#   scripts/bench.sh                         # 3 runs, 1 GiB each way, 100 messages, 20 rooms
#   scripts/bench.sh --smoke                 # tiny sizes, one run
#   scripts/bench.sh --runs 1 --size-mib 64 --messages 20 --rooms 4 --out /tmp/b.json
#   scripts/bench.sh --runs 3 --only latency,inbound   # a focused experiment: those phases only
#   MXBRIDGE_BENCH_SYNAPSE_CPUS=0 scripts/bench.sh      # Synapse's threads on core 0 only
#   scripts/bench.sh --only perceive                   # a 12-MP photo for a vision model vs ImageMagick
#   scripts/bench.sh --only state                      # agent state: file store vs PostgreSQL
#
# With the defaults it takes about 9 minutes on a 2-core machine (3 runs of 3 minutes: 45 s of
# reply latency, mostly the paced series' pauses, 45 s of throughput, 85 s moving 1 GiB files
# four ways through Synapse), plus the release build (half an hour cold, minutes after a change).
# The disk needs about 10 GiB free (files and media are deleted after each run).
# Caches as in scripts/test.sh: $MXBRIDGE_CACHE (default ~/.cache/mxbridge) holds the cargo
# target dir (override with CARGO_TARGET_DIR) and the Synapse virtualenv.
set -euo pipefail
caller="$PWD"
cd "$(dirname "$0")/.."
repo="$PWD"

export MXBRIDGE_CACHE="${MXBRIDGE_CACHE:-$HOME/.cache/mxbridge}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$MXBRIDGE_CACHE/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
mkdir -p "$MXBRIDGE_CACHE" "$CARGO_TARGET_DIR"
CARGO_TARGET_DIR="$(cd "$CARGO_TARGET_DIR" && pwd)"

# The perceive phase compares with ImageMagick's `convert -resize` (Debian's /usr/bin/convert).
if ! /usr/bin/convert -version 2>/dev/null | grep -q 'Version: ImageMagick'; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq imagemagick
fi

# The surface's latency taps (the legs this benchmark prints) are a feature the images leave out.
cargo build --release --workspace --locked --features surface/latency

SYN_DIR="$(mktemp -d /tmp/mxbridge-bench-synapse.XXXXXX)"
SYN_PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
# PostgreSQL for the agent-state phase (the file store next to PostgreSQL with 1 and 3 agents).
"$repo/scripts/postgres.sh" install
PG_DIR="$(mktemp -d /tmp/mxbridge-bench-postgres.XXXXXX)"
PG_PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
trap '"$repo/scripts/synapse.sh" stop "$SYN_DIR"; rm -rf "$SYN_DIR"; "$repo/scripts/postgres.sh" stop "$PG_DIR"; rm -rf "$PG_DIR"' EXIT
eval "$("$repo/scripts/postgres.sh" start "$PG_DIR" "$PG_PORT")"
export SYNAPSE_MAX_UPLOAD_SIZE="${SYNAPSE_MAX_UPLOAD_SIZE:-8G}"
eval "$(scripts/synapse.sh start "$SYN_DIR" "$SYN_PORT")"
# MXBRIDGE_BENCH_SYNAPSE_CPUS (e.g. `0`): every Synapse thread on these cores only, as a
# GIL-bound Python process is best run; curl and the surface are measured against the same
# Synapse. Off by default, so figures compare with earlier runs.
if [ -n "${MXBRIDGE_BENCH_SYNAPSE_CPUS:-}" ]; then
  taskset -a -p -c "$MXBRIDGE_BENCH_SYNAPSE_CPUS" "$(cat "$SYN_DIR/homeserver.pid")" >/dev/null
  echo "Synapse pinned to cores $MXBRIDGE_BENCH_SYNAPSE_CPUS"
fi

# Where the JSON goes: --out as given (relative to the caller's folder), else bench.json.
out="bench.json"
args=("$@")
for i in "${!args[@]}"; do
  case "${args[$i]}" in
    --out) out="${args[$((i + 1))]:-$out}" ;;
    --out=*) out="${args[$i]#--out=}" ;;
  esac
done

cd "$caller"
"$CARGO_TARGET_DIR/release/bench" "$@"
echo "JSON report: $(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
