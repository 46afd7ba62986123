"""An independent MCP client (the official Python SDK) for the surface's MCP server.

    mcp_client.py listen URL ROOM COUNT OUT   subscribe to the room, write each notified
                                              message to OUT (JSON lines) until COUNT arrived
    mcp_client.py catchup URL ROOM AFTER COUNT
                                              read_since from the watermark AFTER (pages of 3)
                                              until COUNT messages; print them as JSON
    mcp_client.py send URL ROOM TEXT KEY PATH EVENT
                                              matrix.send twice with one idempotency key,
                                              matrix.send_file PATH, matrix.set_read_marker
                                              EVENT; print the results as JSON
The token comes from MCP_TOKEN. Every step is bounded by a timeout.
"""

import asyncio
import json
import os
import sys
from urllib.parse import unquote

import mcp.types as types
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

DEADLINE = 120.0


def headers():
    return {"Authorization": f"Bearer {os.environ['MCP_TOKEN']}"}


def structured(result):
    if result.isError:
        raise SystemExit(f"tool error: {result.content}")
    return result.structuredContent


async def listen(url, room, count, out):
    uri = f"matrix://room/{room}/last"
    got = []
    done = asyncio.Event()

    async def on_message(message):
        if isinstance(message, types.ServerNotification) and isinstance(
            message.root, types.ResourceUpdatedNotification
        ):
            params = message.root.params
            assert unquote(str(params.uri)) == uri, params.uri
            batch = (params.model_extra or {}).get("messages", [])
            with open(out, "a") as f:
                for m in batch:
                    f.write(json.dumps(m) + "\n")
            got.extend(batch)
            if len(got) >= count:
                done.set()

    async with streamablehttp_client(url, headers=headers()) as (read, write, _):
        async with ClientSession(read, write, message_handler=on_message) as s:
            init = await s.initialize()
            assert init.capabilities.resources.subscribe, init.capabilities
            listed = [unquote(str(r.uri)) for r in (await s.list_resources()).resources]
            assert uri in listed, listed
            tools = [t.name for t in (await s.list_tools()).tools]
            assert "matrix.read_since" in tools, tools
            await s.subscribe_resource(uri)
            print("subscribed", flush=True)
            await asyncio.wait_for(done.wait(), DEADLINE)
            # Nothing more may come for messages already notified (no duplicates).
            await asyncio.sleep(1.0)
    print(json.dumps({"notified": len(got)}), flush=True)


async def catchup(url, room, after, count):
    messages = []
    async with streamablehttp_client(url, headers=headers()) as (read, write, _):
        async with ClientSession(read, write) as s:
            await s.initialize()
            # The parameterized resource answers the same as the tool.
            since = await s.read_resource(f"matrix://room/{room}/since/{after}")
            first_page = json.loads(since.contents[0].text)["messages"]
            watermark = after
            loop = asyncio.get_running_loop()
            deadline = loop.time() + DEADLINE
            while len(messages) < count:
                if loop.time() > deadline:
                    raise SystemExit(f"only {len(messages)} of {count}: {messages}")
                page = structured(
                    await s.call_tool(
                        "matrix.read_since",
                        {"room_id": room, "after_event_id": watermark, "limit": 3},
                    )
                )
                messages.extend(page["messages"])
                if page["upto_event_id"]:
                    watermark = page["upto_event_id"]
                if not page["messages"]:
                    await asyncio.sleep(0.5)
            # And nothing after the last one.
            rest = structured(
                await s.call_tool(
                    "matrix.read_since", {"room_id": room, "after_event_id": watermark}
                )
            )
            bad = await s.call_tool(
                "matrix.read_since", {"room_id": "!nope:localhost", "after_event_id": after}
            )
            last = await s.read_resource(f"matrix://room/{room}/last")
            latest = json.loads(last.contents[0].text)["messages"]
    ids = [m["event_id"] for m in messages]
    assert [m["event_id"] for m in first_page] == ids[: len(first_page)], (first_page, ids)
    print(
        json.dumps(
            {
                "messages": messages,
                "rest": rest["messages"],
                "unknown_room_is_error": bad.isError,
                "last": latest,
            }
        ),
        flush=True,
    )


async def send(url, room, text, key, path, event):
    async with streamablehttp_client(url, headers=headers()) as (read, write, _):
        async with ClientSession(read, write) as s:
            await s.initialize()
            args = {"room_id": room, "text": text, "idempotency_key": key}
            first = structured(await s.call_tool("matrix.send", args))
            again = structured(await s.call_tool("matrix.send", args))
            file = structured(
                await s.call_tool("matrix.send_file", {"room_id": room, "path": path})
            )
            escape = await s.call_tool(
                "matrix.send_file", {"room_id": room, "path": "../../etc/passwd"}
            )
            # A thread root that is no event of this room is refused before anything is posted.
            foreign = await s.call_tool(
                "matrix.send",
                {
                    "room_id": room,
                    "text": "aimed elsewhere",
                    "thread_root": "$notAnEventOfThisRoom0000000000000000000000",
                },
            )
            marker = structured(
                await s.call_tool(
                    "matrix.set_read_marker", {"room_id": room, "event_id": event}
                )
            )
    print(
        json.dumps(
            {
                "first": first,
                "again": again,
                "file": file,
                "escape_refused": escape.isError,
                "foreign_thread_refused": foreign.isError,
                "foreign_thread_error": foreign.content[0].text if foreign.content else "",
                "marker": marker,
            }
        ),
        flush=True,
    )


def main():
    cmd, url, room, *rest = sys.argv[1:]
    if cmd == "listen":
        run = listen(url, room, int(rest[0]), rest[1])
    elif cmd == "catchup":
        run = catchup(url, room, rest[0], int(rest[1]))
    elif cmd == "send":
        run = send(url, room, *rest[:4])
    else:
        raise SystemExit(f"unknown command {cmd}")
    asyncio.run(asyncio.wait_for(run, DEADLINE + 30))


if __name__ == "__main__":
    main()
