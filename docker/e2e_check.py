#!/usr/bin/env python3
"""Drives a person's side of the docker end-to-end check (scripts/docker-e2e.sh) through the
client-server API of the compose homeserver. Standard library only (urllib).

State (access token, room id, ...) is kept in a JSON file between calls, so the shell script can
interleave Matrix actions with `docker compose exec/stop/start`.

  e2e_check.py --state F setup                  log in as the test user, check the bot exists,
                                                create a DM with the bot, wait until it joined
  e2e_check.py --state F send-file PATH         upload PATH, send it as m.file, wait for the reply
                                                that quotes its sha256; prints the workspace path
  e2e_check.py --state F send TEXT              send a text message; prints its event id
  e2e_check.py --state F wait-text EVENT SUBSTR wait for a bot message after EVENT containing SUBSTR
  e2e_check.py --state F wait-file EVENT NAME OUT
                                                wait for a bot file message named NAME after EVENT,
                                                download it (authenticated media) to OUT
Environment: E2E_HOMESERVER (http://127.0.0.1:PORT), E2E_USER, E2E_PASSWORD, E2E_BOT,
E2E_TIMEOUT (seconds per wait, default 120).
"""
import hashlib
import json
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

HS = os.environ.get("E2E_HOMESERVER", "http://127.0.0.1:8008").rstrip("/")
TIMEOUT = float(os.environ.get("E2E_TIMEOUT", "120"))


def log(msg):
    print(f"[e2e_check {time.strftime('%H:%M:%S', time.gmtime())}] {msg}", file=sys.stderr, flush=True)


def q(s):
    return urllib.parse.quote(s, safe="")


class Client:
    def __init__(self, token=None):
        self.token = token

    def raw(self, method, path, body=None, headers=None, timeout=60):
        req = urllib.request.Request(HS + path, data=body, method=method)
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        if self.token:
            req.add_header("Authorization", "Bearer " + self.token)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, resp.read(), dict(resp.headers)
        except urllib.error.HTTPError as e:
            return e.code, e.read(), dict(e.headers)

    def call(self, method, path, body=None, ok=(200,)):
        data = None if body is None else json.dumps(body).encode()
        for attempt in range(10):
            status, raw, _ = self.raw(method, path, data, {"Content-Type": "application/json"})
            if status == 429:
                time.sleep(min(5.0, json.loads(raw or b"{}").get("retry_after_ms", 1000) / 1000))
                continue
            break
        parsed = json.loads(raw) if raw else {}
        if status not in ok:
            raise SystemExit(f"{method} {path} -> {status} {parsed}")
        return status, parsed


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def save(path, state):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f, indent=2)
    os.replace(tmp, path)


def cmd_setup(state_path):
    user = os.environ["E2E_USER"]
    bot = os.environ["E2E_BOT"]
    c = Client()
    _, login = c.call(
        "POST",
        "/_matrix/client/v3/login",
        {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user},
         "password": os.environ["E2E_PASSWORD"], "initial_device_display_name": "docker-e2e"},
    )
    c.token = login["access_token"]
    log(f"logged in as {login['user_id']}")
    # The register step must have created the bot account.
    status, _ = c.call("GET", f"/_matrix/client/v3/profile/{q(bot)}", ok=(200, 404))
    if status != 200:
        raise SystemExit(f"bot account {bot} does not exist: the register step did not run")
    log(f"bot account {bot} exists")
    _, room = c.call(
        "POST",
        "/_matrix/client/v3/createRoom",
        {"preset": "trusted_private_chat", "is_direct": True, "invite": [bot], "name": "docker e2e"},
    )
    room_id = room["room_id"]
    log(f"created DM {room_id}, waiting for {bot} to join")
    deadline = time.time() + TIMEOUT
    while True:
        _, members = c.call("GET", f"/_matrix/client/v3/rooms/{q(room_id)}/joined_members")
        if bot in members.get("joined", {}):
            break
        if time.time() > deadline:
            raise SystemExit(f"{bot} did not join {room_id} within {TIMEOUT}s (surface not auto-joining?)")
        time.sleep(0.5)
    log(f"{bot} joined")
    save(state_path, {"token": c.token, "user_id": login["user_id"], "room_id": room_id, "bot": bot})


def send_event(c, room_id, content):
    txn = uuid.uuid4().hex
    _, res = c.call("PUT", f"/_matrix/client/v3/rooms/{q(room_id)}/send/m.room.message/{txn}", content)
    return res["event_id"]


def bot_events_after(c, st, event_id):
    """The bot's m.room.message events after `event_id`, oldest first."""
    _, res = c.call(
        "GET",
        f"/_matrix/client/v3/rooms/{q(st['room_id'])}/messages?dir=b&limit=200",
    )
    chunk = list(reversed(res.get("chunk", [])))
    ids = [e.get("event_id") for e in chunk]
    if event_id not in ids:
        return []
    after = chunk[ids.index(event_id) + 1:]
    return [e for e in after if e.get("sender") == st["bot"] and e.get("type") == "m.room.message"]


def wait_for(c, st, event_id, pred, what):
    start = time.time()
    deadline = start + TIMEOUT
    seen = 0
    while True:
        events = bot_events_after(c, st, event_id)
        for e in events[seen:]:
            log(f"bot: {e['content'].get('msgtype')} {e['content'].get('body', '')[:300]!r}")
        seen = len(events)
        for e in events:
            if pred(e["content"]):
                log(f"matched after {time.time() - start:.1f}s of polling")
                return e
        if time.time() > deadline:
            raise SystemExit(f"timed out after {TIMEOUT}s waiting for {what}")
        time.sleep(0.5)


def cmd_send_file(state_path, path):
    st = load(state_path)
    c = Client(st["token"])
    data = open(path, "rb").read()
    digest = hashlib.sha256(data).hexdigest()
    name = os.path.basename(path)
    status, raw, _ = c.raw(
        "POST",
        f"/_matrix/media/v3/upload?filename={q(name)}",
        data,
        {"Content-Type": "text/plain"},
    )
    if status != 200:
        raise SystemExit(f"upload failed: {status} {raw[:300]!r}")
    mxc = json.loads(raw)["content_uri"]
    event_id = send_event(c, st["room_id"], {
        "msgtype": "m.file", "body": name, "filename": name, "url": mxc,
        "info": {"size": len(data), "mimetype": "text/plain"},
    })
    log(f"sent {name} ({len(data)} bytes, sha256 {digest}) as {event_id}")
    reply = wait_for(c, st, event_id, lambda ct: digest in ct.get("body", ""), f"a reply quoting sha256 {digest}")
    body = reply["content"]["body"]
    m = re.search(r"surfaces/matrix/[^\s`'\"<>()\[\]]+", body)
    if not m:
        raise SystemExit(f"the reply names no workspace path: {body!r}")
    print(json.dumps({"event_id": event_id, "sha256": digest, "path": m.group(0).rstrip(".,;:")}))


def cmd_send(state_path, text):
    st = load(state_path)
    c = Client(st["token"])
    event_id = send_event(c, st["room_id"], {"msgtype": "m.text", "body": text})
    log(f"sent {text!r} as {event_id}")
    print(event_id)


def cmd_wait_text(state_path, event_id, substr):
    st = load(state_path)
    c = Client(st["token"])
    e = wait_for(c, st, event_id, lambda ct: substr in ct.get("body", ""), f"a reply containing {substr!r}")
    print(e["content"]["body"])


def cmd_wait_file(state_path, event_id, name, out):
    st = load(state_path)
    c = Client(st["token"])

    def is_file(ct):
        return ct.get("msgtype") in ("m.file", "m.image", "m.audio", "m.video") and name in (
            ct.get("filename") or ct.get("body") or "")

    e = wait_for(c, st, event_id, is_file, f"a file message named {name!r}")
    mxc = e["content"].get("url")
    if not mxc or not mxc.startswith("mxc://"):
        raise SystemExit(f"file message without a plain mxc url: {e['content']}")
    server, media_id = mxc[len("mxc://"):].split("/", 1)
    status, data, _ = c.raw("GET", f"/_matrix/client/v1/media/download/{q(server)}/{q(media_id)}")
    if status != 200:
        raise SystemExit(f"download of {mxc} failed: {status} {data[:300]!r}")
    with open(out, "wb") as f:
        f.write(data)
    print(json.dumps({"mxc": mxc, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                      "content": e["content"]}))


def main():
    args = sys.argv[1:]
    if len(args) < 3 or args[0] != "--state":
        raise SystemExit(__doc__)
    state, cmd, rest = args[1], args[2], args[3:]
    table = {
        "setup": (cmd_setup, 0),
        "send-file": (cmd_send_file, 1),
        "send": (cmd_send, 1),
        "wait-text": (cmd_wait_text, 2),
        "wait-file": (cmd_wait_file, 3),
    }
    if cmd not in table or len(rest) != table[cmd][1]:
        raise SystemExit(__doc__)
    table[cmd][0](state, *rest)


if __name__ == "__main__":
    main()
