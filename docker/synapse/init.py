#!/usr/bin/env python3
"""One-shot init step for the compose homeserver (runs in the Synapse image, as root).

Writes /data/homeserver.yaml and /data/log.config from environment variables on every start
(so changing .env and re-running `docker compose up` takes effect), generates the signing key
once, and hands /data to the uid Synapse runs as. Standard library only; the config is written
as JSON, which is valid YAML and needs no escaping rules of its own.

Environment:
  SYNAPSE_SERVER_NAME                  default "localhost" (part of every user id: @bot:localhost)
  SYNAPSE_REGISTRATION_SHARED_SECRET   required (or _FILE); used by the register step (admin API)
  SYNAPSE_PUBLIC_BASEURL               default unset. When set, Synapse also announces it in every
                                       login response (well_known), and matrix-sdk clients that
                                       respect that switch to it: it must then be reachable from
                                       inside the compose network too (a real public URL), never
                                       a 127.0.0.1-published port.
  SYNAPSE_MAX_UPLOAD_SIZE              default "100M"
  SYNAPSE_UID / SYNAPSE_GID            default 991 / 991 (owner of /data)
"""
import base64
import json
import os
import secrets
import string
import sys

DATA = os.environ.get("SYNAPSE_DATA_DIR", "/data")


def env(name, default=None):
    value = os.environ.get(name, "").strip()
    path = os.environ.get(name + "_FILE", "")
    if not value and path:
        # compose passes secrets as files (docker/secrets/init.py)
        with open(path, encoding="utf-8") as f:
            value = f.read().strip()
    if value:
        return value
    if default is None:
        sys.exit(f"synapse-init: {name} must be set (see .env.example)")
    return default


def main():
    server_name = env("SYNAPSE_SERVER_NAME", "localhost")
    secret = env("SYNAPSE_REGISTRATION_SHARED_SECRET")
    if len(secret) < 16:
        sys.exit("synapse-init: SYNAPSE_REGISTRATION_SHARED_SECRET must be at least 16 characters")
    uid = int(env("SYNAPSE_UID", "991"))
    gid = int(env("SYNAPSE_GID", "991"))
    os.makedirs(os.path.join(DATA, "media_store"), exist_ok=True)

    generous = {"per_second": 50, "burst_count": 200}
    config = {
        "server_name": server_name,
        "pid_file": os.path.join(DATA, "homeserver.pid"),
        "listeners": [
            {
                "port": 8008,
                "type": "http",
                "tls": False,
                "x_forwarded": True,
                "bind_addresses": ["0.0.0.0"],
                "resources": [{"names": ["client"], "compress": False}],
            }
        ],
        "database": {"name": "sqlite3", "args": {"database": os.path.join(DATA, "homeserver.db")}},
        "log_config": os.path.join(DATA, "log.config"),
        "media_store_path": os.path.join(DATA, "media_store"),
        "max_upload_size": env("SYNAPSE_MAX_UPLOAD_SIZE", "100M"),
        "signing_key_path": os.path.join(DATA, f"{server_name}.signing.key"),
        "registration_shared_secret": secret,
        "enable_registration": False,
        "report_stats": False,
        "trusted_key_servers": [],
        "suppress_key_server_warning": True,
        "federation_domain_whitelist": [],
        # A local dev homeserver with one bot: the bot answers quickly and tests send bursts.
        "rc_message": generous,
        "rc_login": {"address": generous, "account": generous, "failed_attempts": generous},
        "rc_joins": {"local": generous, "remote": generous},
        "rc_invites": {"per_room": generous, "per_user": generous, "per_issuer": generous},
        "rc_media_create": generous,
        # MSC4140 delayed events: the surface's "I was interrupted" notice.
        "max_event_delay_duration": "24h",
    }
    log_config = {
        "version": 1,
        "formatters": {"precise": {"format": "%(asctime)s - %(name)s - %(lineno)d - %(levelname)s - %(request)s - %(message)s"}},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "precise"}},
        "loggers": {"synapse.storage.SQL": {"level": "WARNING"}},
        "root": {"level": env("SYNAPSE_LOG_LEVEL", "INFO"), "handlers": ["console"]},
        "disable_existing_loggers": False,
    }
    public_baseurl = os.environ.get("SYNAPSE_PUBLIC_BASEURL", "").strip()
    if public_baseurl:
        config["public_baseurl"] = public_baseurl
    config_path = os.path.join(DATA, "homeserver.yaml")
    write(config_path, json.dumps(config, indent=2) + "\n", 0o600)
    write(os.path.join(DATA, "log.config"), json.dumps(log_config, indent=2) + "\n", 0o644)

    # The signing key is made once and kept. Written here (format "ed25519 <version> <unpadded
    # base64 seed>", as `--generate-keys` writes it) because importing the whole homeserver just
    # for that costs ~20 s of CPU on a small machine.
    key_path = config["signing_key_path"]
    if not os.path.exists(key_path):
        alphabet = string.ascii_letters + string.digits
        version = "a_" + "".join(secrets.choice(alphabet) for _ in range(4))
        seed = base64.b64encode(secrets.token_bytes(32)).decode().rstrip("=")
        write(key_path, f"ed25519 {version} {seed}\n", 0o600)
        print(f"synapse-init: generated signing key {version}")
    for root, dirs, files in os.walk(DATA):
        for name in [root] + [os.path.join(root, n) for n in dirs + files]:
            os.lchown(name, uid, gid)
    print(f"synapse-init: config for server_name={server_name} written to {config_path}")


def write(path, text, mode):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
