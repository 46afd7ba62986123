#!/usr/bin/env python3
"""One-shot: registers the bot account and (optionally) a test user on the compose homeserver.

Uses Synapse's shared-secret registration admin API (/_synapse/admin/v1/register). Idempotent: an
existing user is fine; the password is then checked with a login (a clear error if .env changed
the password after the first start). Standard library only.

Environment:
  SYNAPSE_URL                          default http://synapse:8008
  SYNAPSE_REGISTRATION_SHARED_SECRET   required (or NAME_FILE: a file holding it)
  MATRIX_BOT_LOCALPART / MATRIX_BOT_PASSWORD    the bot account (required password, or _FILE)
  MATRIX_TEST_LOCALPART / MATRIX_TEST_PASSWORD  a person to log in with (skipped when the
                                                 password is empty)
"""
import hashlib
import hmac
import json
import os
import sys
import time
import urllib.error
import urllib.request

BASE = os.environ.get("SYNAPSE_URL", "http://synapse:8008").rstrip("/")


def secret_env(name):
    """NAME, else the contents of the file NAME_FILE (compose passes secrets as files)."""
    value = os.environ.get(name, "")
    path = os.environ.get(name + "_FILE", "")
    if not value and path:
        with open(path, encoding="utf-8") as f:
            value = f.read().rstrip("\r\n")
    return value


def call(method, path, body=None, token=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(BASE + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, {"error": raw.decode(errors="replace")}


def register(secret, localpart, password, admin=False):
    for attempt in range(30):
        status, body = call("GET", "/_synapse/admin/v1/register")
        if status == 200:
            break
        time.sleep(1)
    else:
        sys.exit(f"register: cannot get a nonce: {status} {body}")
    nonce = body["nonce"]
    # HMAC-SHA1 over nonce NUL user NUL password NUL admin|notadmin, as Synapse computes it.
    mac = hmac.new(secret.encode(), digestmod=hashlib.sha1)
    mac.update(b"\x00".join(p.encode() for p in (nonce, localpart, password, "admin" if admin else "notadmin")))
    status, body = call(
        "POST",
        "/_synapse/admin/v1/register",
        {"nonce": nonce, "username": localpart, "password": password, "admin": admin, "mac": mac.hexdigest()},
    )
    if status == 200:
        print(f"register: created {body.get('user_id')}")
        if body.get("access_token"):
            # Registration logs in a device; drop it so the account starts without stray devices.
            call("POST", "/_matrix/client/v3/logout", {}, token=body["access_token"])
    elif body.get("errcode") == "M_USER_IN_USE":
        print(f"register: {localpart} already exists (fine)")
    else:
        sys.exit(f"register: registering {localpart} failed: {status} {body}")
    # Prove the password works, then drop the device this login created.
    status, body = call(
        "POST",
        "/_matrix/client/v3/login",
        {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": localpart}, "password": password,
         "initial_device_display_name": "mxbridge-register check"},
    )
    if status != 200:
        sys.exit(f"register: {localpart} exists but its password does not log in ({status} {body.get('errcode')}); "
                 "was the password changed after the first start? Reset it or remove the synapse volume.")
    call("POST", "/_matrix/client/v3/logout", {}, token=body["access_token"])
    print(f"register: {body['user_id']} logs in")


def main():
    secret = secret_env("SYNAPSE_REGISTRATION_SHARED_SECRET")
    if not secret:
        sys.exit("register: SYNAPSE_REGISTRATION_SHARED_SECRET must be set")
    bot = os.environ.get("MATRIX_BOT_LOCALPART", "bot")
    bot_password = secret_env("MATRIX_BOT_PASSWORD")
    if not bot_password:
        sys.exit("register: MATRIX_BOT_PASSWORD must be set")
    register(secret, bot, bot_password)
    user = os.environ.get("MATRIX_TEST_LOCALPART", "alice")
    password = os.environ.get("MATRIX_TEST_PASSWORD", "")
    if password:
        register(secret, user, password)
    else:
        print("register: MATRIX_TEST_PASSWORD empty, no test user")


if __name__ == "__main__":
    main()
