#!/bin/bash
# Usage: mxbridge-healthcheck PORT [PATH]
# A dependency-free HTTP probe for the runtime images (no curl in debian:bookworm-slim):
# exits 0 when GET http://127.0.0.1:PORT/PATH answers with status 200.
set -u
port="${1:?port}"
path="${2:-/healthz}"
exec 3<>"/dev/tcp/127.0.0.1/${port}" || exit 1
printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' "$path" >&3
IFS= read -r -t 5 status <&3 || exit 1
exec 3<&-
case "$status" in
    "HTTP/1."?" 200"*) exit 0 ;;
    *) echo "unhealthy: ${status%$'\r'}" >&2; exit 1 ;;
esac
