#!/bin/sh
# Files created in the shared /workspace must stay writable for the other container's process
# (same uid anyway; group write covers an operator who adds their own user to group 10001).
umask 002
# Secrets arrive as files (compose: the one-shot `secrets` step fills /run/mxbridge/secrets;
# docker/secrets/init.py): each file NAME becomes NAME_FILE, so the value is never in the
# environment `docker inspect` shows. A NAME or NAME_FILE set explicitly wins.
if [ -d /run/mxbridge/secrets ]; then
    for f in /run/mxbridge/secrets/*; do
        [ -f "$f" ] || continue
        name="${f##*/}"
        case "$name" in *[!A-Z0-9_]* | [!A-Z]*) continue ;; esac
        eval "set_value=\${$name+x} set_file=\${${name}_FILE+x}"
        [ -z "$set_value" ] && [ -z "$set_file" ] && export "${name}_FILE=$f"
    done
fi
exec "$@"
