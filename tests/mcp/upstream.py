"""A stand-in for an operator's MCP server, written with the `mcp` package's server side
(stateful Streamable HTTP, as its default): it refuses any request without its own
credential (UPSTREAM_MCP_SECRET), and counts the calls it serves in a file. Arguments: PORT
COUNTER [HOST]."""

import os
import sys

import anyio
import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

SECRET = os.environ.get("UPSTREAM_MCP_SECRET", "upstream-mcp-secret")
port, counter = int(sys.argv[1]), sys.argv[2]
host = sys.argv[3] if len(sys.argv) > 3 else "127.0.0.1"

server = MCPServer("upstream")


@server.tool()
def echo(text: str) -> str:
    """Says the text back."""
    with open(counter, "a") as handle:
        handle.write("echo\n")
    return f"upstream heard: {text}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def peek(seconds: float) -> str:
    """Looks for a while; changes nothing."""
    with open(counter, "a") as handle:
        handle.write("peek\n")
    await anyio.sleep(seconds)
    return "seen"


@server.tool()
async def nap(seconds: float) -> str:
    """Sleeps, then answers."""
    await anyio.sleep(seconds)
    return "rested"


class RequireCredential:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            if headers.get(b"authorization") != f"Bearer {SECRET}".encode():
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"text/plain")]})
                await send({"type": "http.response.body", "body": b"no credential"})
                return
        await self.app(scope, receive, send)


# Reached by its address when it is not on loopback: that Host is allowed.
app = server.streamable_http_app(host=host)
uvicorn.run(RequireCredential(app), host=host, port=port,
            log_level="warning")
