"""A tiny MCP stdio server for the agent's tests, on the official Python SDK (`mcp`).

Tools: `echo(text)`, `add(a, b)`, `hang(seconds)` (sleeps, for timeouts) and `crash()` (the
process exits in the middle of the call). Over stdio by default; `--http PORT TOKEN` serves
streamable HTTP at `http://127.0.0.1:PORT/mcp` to requests bearing `Authorization: Bearer TOKEN`. Works with
`mcp<2` (FastMCP) and `mcp>=2` (MCPServer). Never print to stdout: it is the protocol.
"""

import asyncio
import os
import sys

try:
    from mcp.server.fastmcp import FastMCP as Server
except ImportError:  # mcp 2.x
    from mcp.server import MCPServer as Server

server = Server("demo")


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    return a + b


@server.tool()
async def hang(seconds: float) -> str:
    """Sleep for the given seconds, then answer."""
    await asyncio.sleep(seconds)
    return "woke up"


@server.tool()
def crash() -> str:
    """Exit the server process at once, without answering."""
    os._exit(1)


def with_bearer(app, token):
    """The ASGI `app`, refusing HTTP requests without the bearer token."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope, receive, send):
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != expected:
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"unauthorized"})
            return
        await app(scope, receive, send)

    return guarded


if __name__ == "__main__":
    if sys.argv[1:2] == ["--http"]:
        import uvicorn

        port, token = int(sys.argv[2]), sys.argv[3]
        app = with_bearer(server.streamable_http_app(), token)
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
    else:
        server.run()
