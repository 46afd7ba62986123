#!/usr/bin/env python3
"""One-shot first step of the compose stack (runs in the Synapse image, as root): puts every
secret into the volumes of the services that need it, as files, so no long-running container
has a secret in its environment (`docker inspect` shows none).

Where a secret comes from, first found wins:
  1. a file in ./secrets/ (MXBRIDGE_SECRETS_DIR), named after the variable: ./secrets/OPENAI_API_KEY
  2. the variable itself, set in .env or the shell (works, but then `docker inspect` of this
     one-shot container shows it: prefer 1 outside a laptop)
  3. for the stack's own secrets (AGENT_TOKEN, MATRIX_BOT_PASSWORD,
     SYNAPSE_REGISTRATION_SHARED_SECRET, and POSTGRES_PASSWORD with compose.postgres.yaml): the
     value written on an earlier start, else a new random one. The others are optional: without
     a source, their file is removed.

With compose.postgres.yaml (its `postgres` volume is mounted at /out/postgres) the agents'
AGENT_DATABASE_URL, unless given, is made from POSTGRES_PASSWORD for the stack's own database.

Each service's volume gets only its own secrets, as files named after the variable it reads
(the image's entrypoint turns /run/mxbridge/secrets/NAME into NAME_FILE), owned by the uid the
service runs as, mode 0400. Standard library only.
"""
import os
import re
import secrets
import sys
import urllib.parse

IN = os.environ.get("MXBRIDGE_SECRETS_IN", "/in")
OUT = os.environ.get("MXBRIDGE_SECRETS_OUT", "/out")
APP_UID = 10001

# variable (in .env / ./secrets) -> {service volume: the name the service reads}, generated?
SECRETS = [
    ("AGENT_TOKEN", {"agent": "AGENT_TOKEN", "surface": "AGENT_TOKEN"}, True),
    ("MATRIX_BOT_PASSWORD", {"surface": "MATRIX_PASSWORD", "synapse": "MATRIX_BOT_PASSWORD"}, True),
    ("SYNAPSE_REGISTRATION_SHARED_SECRET", {"synapse": "SYNAPSE_REGISTRATION_SHARED_SECRET"}, True),
    ("OPENAI_API_KEY", {"agent": "OPENAI_API_KEY"}, False),
    ("TRANSCRIBE_API_KEY", {"agent": "TRANSCRIBE_API_KEY"}, False),
    ("AGENT_MCP_TOKENS", {"agent": "AGENT_MCP_TOKENS"}, False),
    ("AGENT_DATABASE_URL", {"agent": "AGENT_DATABASE_URL"}, False),
    ("MATRIX_RECOVERY_KEY", {"surface": "MATRIX_RECOVERY_KEY"}, False),
    ("SURFACE_MCP_TOKEN", {"surface": "SURFACE_MCP_TOKEN"}, False),
]
# Only with compose.postgres.yaml: the database's password (read by the postgres image as
# POSTGRES_PASSWORD_FILE), before AGENT_DATABASE_URL, which is made from it when not given.
POSTGRES_SECRET = ("POSTGRES_PASSWORD", {"postgres": "POSTGRES_PASSWORD"}, True)
POSTGRES_URL = "postgres://mxbridge:{}@postgres:5432/mxbridge?sslmode=disable"
# Who reads each volume: the app images run as 10001; the Synapse steps read theirs as root.
OWNER = {"agent": APP_UID, "surface": APP_UID, "synapse": 0, "postgres": 999}
NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")


def read(path):
    try:
        with open(path, encoding="utf-8") as f:
            value = f.read()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        sys.exit(f"secrets: cannot read {path}: {e.__class__.__name__}")
    value = value[:-1] if value.endswith("\n") else value
    value = value[:-1] if value.endswith("\r") else value
    return value or None


def write(path, value, uid):
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(value)
    os.chown(tmp, uid, uid)
    os.chmod(tmp, 0o400)
    os.replace(tmp, path)


def main():
    given = set(os.listdir(IN)) if os.path.isdir(IN) else set()
    for name in sorted(given):
        known = any(name == var for var, _, _ in SECRETS)
        if NAME.match(name) and not known:
            print(f"secrets: {IN}/{name} is not a secret this stack reads; ignored", flush=True)
    # The postgres volume is there only with compose.postgres.yaml.
    with_postgres = os.path.isdir(os.path.join(OUT, "postgres"))
    for service, uid in OWNER.items():
        if service == "postgres" and not with_postgres:
            continue
        root = os.path.join(OUT, service)
        os.makedirs(root, exist_ok=True)
        os.chown(root, 0, uid)
        os.chmod(root, 0o750)
    made = {}
    for var, targets, generated in ([POSTGRES_SECRET] if with_postgres else []) + SECRETS:
        value, source = read(os.path.join(IN, var)), "file"
        if value is None:
            value, source = os.environ.get(var, "").strip() or None, "environment"
        if value is None and var == "AGENT_DATABASE_URL" and "POSTGRES_PASSWORD" in made:
            value = POSTGRES_URL.format(urllib.parse.quote(made["POSTGRES_PASSWORD"], safe=""))
            source = "the stack's postgres"
        if value is None and generated:
            earlier = (read(os.path.join(OUT, s, n)) for s, n in targets.items())
            value, source = next((v for v in earlier if v), None), "kept"
            if value is None:
                value, source = secrets.token_hex(32), "generated"
        for service, name in targets.items():
            path = os.path.join(OUT, service, name)
            if value is None:
                if os.path.exists(path):
                    os.remove(path)
            else:
                write(path, value, OWNER[service])
        if value is not None:
            made[var] = value
            print(f"secrets: {var} ({source}) -> {', '.join(sorted(targets))}", flush=True)


if __name__ == "__main__":
    main()
