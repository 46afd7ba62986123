#!/bin/sh
# Files created in the shared /workspace must stay writable for the other container's process
# (same uid anyway; group write covers an operator who adds their own user to group 10001).
umask 002
exec "$@"
