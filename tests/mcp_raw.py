"""An MCP server written by hand (JSON-RPC lines on stdio) that breaks the protocol where the tests ask it to.

Tools: ``ok`` (answers properly), ``broken`` (its result's ``content`` is not a list of content
blocks), ``unfillable`` (its input schema is not a JSON schema: no model could fill it); with
``--deep``, ``deep``, whose schema is nested 10,000 levels. It speaks a revision before 2026-07-28
(``server/discover`` is unknown to it); with ``--revision R``, only R.
"""

from __future__ import annotations

import json
import sys

TOOLS = [
    {"name": "ok", "inputSchema": {"type": "object", "properties": {}}},
    {"name": "broken", "inputSchema": {"type": "object", "properties": {}}},
    {"name": "unfillable", "inputSchema": {"type": "object", "properties": {"x": {"type": "nosuchtype"}}}},
]


def answer(request: dict) -> dict:
    method, params = request["method"], request.get("params") or {}
    if method == "initialize":  # --revision R: a server that speaks only revision R
        revision = (
            sys.argv[sys.argv.index("--revision") + 1] if "--revision" in sys.argv else params.get("protocolVersion")
        )
        return {"protocolVersion": revision, "capabilities": {"tools": {}},
                "serverInfo": {"name": "raw", "version": "0"}}  # fmt: skip
    if method == "tools/list":
        if "--deep" in sys.argv:  # a schema nested 10,000 deep: a parser's recursion gives out
            return {"tools": [*TOOLS, {"name": "deep", "inputSchema": "DEEP"}]}
        return {"tools": TOOLS}
    if method == "tools/call" and params.get("name") == "broken":
        return {"content": "not a list of content blocks"}
    return {"content": [{"type": "text", "text": "fine"}]}


if __name__ == "__main__":
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("method") == "server/discover":  # a server of an earlier revision knows no such method
            refused = {"code": -32601, "message": "Method not found"}
            sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request["id"], "error": refused}) + "\n")
            sys.stdout.flush()
        elif "id" in request:
            said = json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": answer(request)})
            deep = '{"type": "object", "properties": {"x": ' * 10_000 + "{}" + "}}" * 10_000
            sys.stdout.write(said.replace('"DEEP"', deep) + "\n")
            sys.stdout.flush()
