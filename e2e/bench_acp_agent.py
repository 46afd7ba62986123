"""The benchmark's ACP agent (plain JSON-RPC on stdio, e2e/src/bench/acp.rs): it answers each
prompt at once with one chunk carrying two clock readings (time.time_ns, the same clock as the
benchmark's): when the prompt arrived, and when the chunk was written. What lies outside those
two readings is the bridge's."""

import json
import sys
import time


def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    msg = json.loads(line)
    method, mid = msg.get("method"), msg.get("id")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": 1,
              "agentCapabilities": {}, "agentInfo": {"name": "bench", "version": "1"}}})
    elif method == "session/new":
        send({"jsonrpc": "2.0", "id": mid, "result": {"sessionId": "bench"}})
    elif method == "session/prompt":
        got = time.time_ns()
        text = json.dumps({"got": got, "sent": time.time_ns()})
        send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "bench",
              "update": {"sessionUpdate": "agent_message_chunk",
                         "content": {"type": "text", "text": text}}}})
        send({"jsonrpc": "2.0", "id": mid, "result": {"stopReason": "end_turn"}})
    elif mid is not None and method is not None:
        send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": method}})
