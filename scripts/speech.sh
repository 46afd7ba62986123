#!/usr/bin/env bash
# What the voice-note transcription test needs: espeak-ng (to speak a sentence), ffmpeg (to make
# an OGG/Opus voice note and decode uploads) and a cached virtualenv with a pinned PocketSphinx
# (ships its US English model) for e2e/transcribe_server.py. Idempotent and quiet.
#
#   eval "$(scripts/speech.sh install)"   # sets MXBRIDGE_SPEECH_PYTHON to the venv's python
#
# Only the export line goes to stdout; progress goes to stderr.
set -euo pipefail

POCKETSPHINX_VERSION="${POCKETSPHINX_VERSION:-5.1.1}"
CACHE_DIR="${MXBRIDGE_CACHE:-$HOME/.cache/mxbridge}"
VENV="${SPEECH_VENV:-$CACHE_DIR/speech-venv-$POCKETSPHINX_VERSION}"

log() { printf '[speech] %s\n' "$*" >&2; }

install_packages() {
  local missing=()
  command -v espeak-ng >/dev/null 2>&1 || missing+=(espeak-ng)
  command -v ffmpeg >/dev/null 2>&1 || missing+=(ffmpeg)
  # Debian's own python3 creates venvs only with python3-venv (which brings ensurepip).
  python3 -c 'import ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
  [ ${#missing[@]} -eq 0 ] && return
  log "installing ${missing[*]} with apt-get"
  local sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  local out
  out="$(mktemp)"
  if ! { "${sudo[@]}" apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
      "${missing[@]}"; } >"$out" 2>&1; then
    cat "$out" >&2
    rm -f "$out"
    log "apt-get failed"
    return 1
  fi
  rm -f "$out"
}

install_venv() {
  if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "
import sys
from importlib.metadata import version
from pocketsphinx import Decoder
sys.exit(version('pocketsphinx') != '$POCKETSPHINX_VERSION')" 2>/dev/null; then
    log "reusing $VENV (pocketsphinx $POCKETSPHINX_VERSION)"
    return
  fi
  log "installing pocketsphinx $POCKETSPHINX_VERSION into $VENV"
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check \
    "pocketsphinx==$POCKETSPHINX_VERSION" >&2
}

case "${1:-}" in
  install)
    install_packages
    install_venv
    printf 'export MXBRIDGE_SPEECH_PYTHON=%q\n' "$VENV/bin/python"
    ;;
  *)
    echo "usage: $0 install" >&2
    exit 2
    ;;
esac
