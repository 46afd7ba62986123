"""An ACP agent that misbehaves on purpose (plain JSON-RPC on stdio, no SDK), for
acp_hostile.rs. `acp_hostile.py MODE`; in a working folder whose path contains "good" it
behaves, whatever MODE says (so one agent setting can serve a good chat and a bad one).

Modes:
  mute     never answers `initialize`
  exit     exits at once
  noise    prints lines that are not JSON, forever, and never answers
  flood    answers a prompt with 20000 notifications, then a short answer
  huge     answers a prompt with one 50 MB line
  escape   asks to read /etc/passwd and a file of another chat, and to write outside its folder
  ask      asks permission for an `execute` call, says what it was told
  slow     says "working" and waits for session/cancel, then leaves a file `cancelled`
  good     answers "hello from a good agent"
"""

import ctypes
import json
import os
import sys
import time

# The process's name, which a zombie keeps: the test tells its own leftovers from those of other
# tests' Python children (PR_SET_NAME).
ctypes.CDLL(None).prctl(15, b"acp_hostile", 0, 0, 0)

MODE = "good" if "good" in os.getcwd() else sys.argv[1]
SESSION = "s-1"
next_id = 1000


def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def update(update):
    send({"jsonrpc": "2.0", "method": "session/update",
          "params": {"sessionId": SESSION, "update": update}})


def say(text):
    update({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}})


def request(method, params):
    """Sends a request and waits for its answer (answering nothing else meanwhile)."""
    global next_id
    next_id += 1
    send({"jsonrpc": "2.0", "id": next_id, "method": method, "params": params})
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("id") == next_id and "method" not in msg:
            return msg
    sys.exit(0)


def prompt(cwd):
    if MODE == "flood":
        for i in range(20000):
            update({"sessionUpdate": "agent_thought_chunk",
                    "content": {"type": "text", "text": f"thinking {i}"}})
        say("done after the flood")
    elif MODE == "huge":
        say("x" * (50 * 1024 * 1024))
    elif MODE == "escape":
        other = os.path.join(os.path.dirname(cwd), "another-chat", "secret.txt")
        for path in ["/etc/passwd", other]:
            r = request("fs/read_text_file", {"sessionId": SESSION, "path": path})
            say(f"read {path}: {'refused' if 'error' in r else 'GOT IT'}\n")
        target = os.path.join(os.path.dirname(cwd), "escaped.txt")
        r = request("fs/write_text_file",
                    {"sessionId": SESSION, "path": target, "content": "out"})
        say(f"write {target}: {'refused' if 'error' in r else 'WROTE IT'}\n")
        own = os.path.join(cwd, "mine.txt")
        r = request("fs/write_text_file",
                    {"sessionId": SESSION, "path": own, "content": "in my folder"})
        say(f"write own: {'refused' if 'error' in r else 'ok'}\n")
    elif MODE == "ask":
        update({"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "rm -rf /",
                "kind": "execute", "status": "pending"})
        r = request("session/request_permission", {
            "sessionId": SESSION,
            "toolCall": {"toolCallId": "t1", "title": "rm -rf /", "kind": "execute"},
            "options": [
                {"optionId": "yes", "name": "Allow", "kind": "allow_once"},
                {"optionId": "no", "name": "Reject", "kind": "reject_once"},
            ],
        })
        outcome = r.get("result", {}).get("outcome", {})
        say(f"permission: {outcome.get('outcome')} {outcome.get('optionId')}")
        update({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "failed"})
    elif MODE == "slow":
        say("working")
        for line in sys.stdin:
            if json.loads(line).get("method") == "session/cancel":
                with open(os.path.join(cwd, "cancelled"), "w") as f:
                    f.write("yes")
                return "cancelled"
    else:
        say("hello from a good agent")
    return "end_turn"


def main():
    if MODE == "exit":
        return
    if MODE == "noise":
        while True:
            sys.stdout.write("this is not JSON\n")
            sys.stdout.flush()
            time.sleep(0.01)
    cwd = os.getcwd()
    for line in sys.stdin:
        msg = json.loads(line)
        method, mid = msg.get("method"), msg.get("id")
        if method == "initialize":
            if MODE == "mute":
                continue
            send({"jsonrpc": "2.0", "id": mid, "result": {
                "protocolVersion": 1,
                "agentCapabilities": {"loadSession": False},
                "agentInfo": {"name": "acp-hostile", "version": MODE}}})
        elif method == "session/new":
            cwd = msg["params"]["cwd"]
            send({"jsonrpc": "2.0", "id": mid, "result": {"sessionId": SESSION}})
        elif method == "session/prompt":
            stop = prompt(cwd)
            send({"jsonrpc": "2.0", "id": mid, "result": {"stopReason": stop}})
        elif mid is not None and method is not None:
            send({"jsonrpc": "2.0", "id": mid,
                  "error": {"code": -32601, "message": f"{method} is not supported"}})


main()
