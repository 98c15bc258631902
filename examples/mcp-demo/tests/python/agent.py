"""An agent built on the official MCP Python SDK, driven by tests/mcp_python.rs.

    agent.py retry URL ACTOR VERSION   list the tools, call deploy_release, then
                                       execution_status for the execution it got
    agent.py status URL ACTOR EXEC_ID  call execution_status for an execution id
    agent.py production URL ACTOR VERSION
                                       call deploy_release to production (it needs a
                                       person's approval) and print the result
    agent.py keyed URL ACTOR KEY       call deploy_release twice under the key KEY in
                                       `_meta`, then once with a changed version under it
    agent.py concurrent URL ACTOR VERSION
                                       four identical deploy_release calls at once,
                                       without a key
    agent.py repeat URL ACTOR VERSION  deploy_release without a key, wait until the
                                       execution reads delivered, then the identical call

Prints one JSON object on stdout.
"""

import asyncio
import json
import sys

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

EXECUTION = "dev.tower-idempotency/execution"
KEY = "dev.tower-idempotency/idempotency-key"


def dump(result):
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


def deploy(version):
    return {"service": "api", "version": version, "environment": "prod"}


async def delivered(session, execution_id):
    """Polls execution_status until the execution reads delivered (or gives up)."""
    for _ in range(200):
        status = dump(await session.call_tool("execution_status", {"execution_id": execution_id}))
        if status["structuredContent"].get("delivered"):
            return status
        await asyncio.sleep(0.05)
    return status


async def main(mode, url, actor, argument):
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {actor}"})
    async with http:
        async with streamable_http_client(url, http_client=http) as streams:
            read, write = streams[0], streams[1]
            async with ClientSession(read, write) as session:
                await session.initialize()
                out = {}
                if mode == "retry":
                    tools = await session.list_tools()
                    out["tools"] = [tool.name for tool in tools.tools]
                    result = dump(
                        await session.call_tool(
                            "deploy_release",
                            {"service": "api", "version": argument, "environment": "prod"},
                        )
                    )
                    out["result"] = result
                    execution_id = result["_meta"][EXECUTION]["execution_id"]
                    out["status"] = dump(
                        await session.call_tool("execution_status", {"execution_id": execution_id})
                    )
                elif mode == "production":
                    out["result"] = dump(
                        await session.call_tool(
                            "deploy_release",
                            {"service": "api", "version": argument, "environment": "production"},
                        )
                    )
                elif mode == "keyed":
                    meta = {KEY: argument}
                    first = dump(await session.call_tool("deploy_release", deploy("k-1"), meta=meta))
                    again = dump(await session.call_tool("deploy_release", deploy("k-1"), meta=meta))
                    out["results"] = [first, again]
                    try:
                        await session.call_tool("deploy_release", deploy("k-2"), meta=meta)
                        out["mismatch"] = None
                    except MCPError as error:
                        out["mismatch"] = error.error.model_dump(mode="json", exclude_none=True)
                elif mode == "concurrent":
                    calls = [session.call_tool("deploy_release", deploy(argument)) for _ in range(4)]
                    out["results"] = [dump(result) for result in await asyncio.gather(*calls)]
                elif mode == "repeat":
                    first = dump(await session.call_tool("deploy_release", deploy(argument)))
                    execution_id = first["_meta"][EXECUTION]["execution_id"]
                    out["delivered"] = (await delivered(session, execution_id))["structuredContent"]
                    second = dump(await session.call_tool("deploy_release", deploy(argument)))
                    out["results"] = [first, second]
                else:
                    out["status"] = dump(
                        await session.call_tool("execution_status", {"execution_id": argument})
                    )
                print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
