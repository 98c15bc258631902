"""An agent built on the official MCP Python SDK, driven by tests/mcp_python.rs.

    agent.py retry URL ACTOR VERSION   list the tools, call deploy_release, then
                                       execution_status for the execution it got
    agent.py status URL ACTOR EXEC_ID  call execution_status for an execution id
    agent.py production URL ACTOR VERSION
                                       call deploy_release to production (it needs a
                                       person's approval) and print the result

Prints one JSON object on stdout.
"""

import asyncio
import json
import sys

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

EXECUTION = "dev.tower-idempotency/execution"


def dump(result):
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


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
                else:
                    out["status"] = dump(
                        await session.call_tool("execution_status", {"execution_id": argument})
                    )
                print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
