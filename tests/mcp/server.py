"""An MCP server for agentd's end-to-end tests, on the official Python SDK
(FastMCP, `mcp<2`): a read-only tool, a write tool, a tool that kills
its own server, one that never answers and one whose answer is over
agentd's 16 MiB limit on one MCP message.

    python server.py                 stdio (agentd starts it as a child)
    python server.py http PORT       Streamable HTTP on 127.0.0.1:PORT/mcp

`record` appends to the file named by MCP_TEST_LOG, so a test can count
the writes that really ran; with MCP_TEST_ENV_DUMP set, the server writes
the names of its environment variables there when it starts. Each start writes a line to stderr, which
agentd must send to its log, never into a reply.
"""

import os
import sys

import anyio

from mcp.server.fastmcp import FastMCP
from mcp.types import ToolAnnotations

http = len(sys.argv) > 2 and sys.argv[1] == "http"
server = FastMCP("agentd-test", host="127.0.0.1", port=int(sys.argv[2]) if http else 8000)


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def lookup(key: str) -> str:
    """Look up the value stored under a key (read-only)."""
    return f"the value of {key} is 42"


@server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False))
def record(entry: str) -> str:
    """Append an entry to the journal (a write)."""
    with open(os.environ["MCP_TEST_LOG"], "a", encoding="utf-8") as f:
        f.write(entry + "\n")
    return f"recorded {entry}"


@server.tool()
def crash() -> str:
    """Stop this server at once (tests a crash)."""
    print("mcp-test-server: crashing on purpose", file=sys.stderr, flush=True)
    os._exit(3)


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def hang() -> str:
    """Never answers (tests a hung call)."""
    await anyio.sleep(3600)
    return "too late"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def huge() -> str:
    """Returns 17 MiB of text (tests the limit on one MCP message)."""
    return "x" * (17 * 1024 * 1024)


if __name__ == "__main__":
    print("mcp-test-server: SERVER-STDERR-MARKER started", file=sys.stderr, flush=True)
    # What the server was given to run with: the names of its environment.
    if "MCP_TEST_ENV_DUMP" in os.environ:
        with open(os.environ["MCP_TEST_ENV_DUMP"], "w", encoding="utf-8") as f:
            f.write("\n".join(sorted(os.environ)))
    server.run(transport="streamable-http" if http else "stdio")
