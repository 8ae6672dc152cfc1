"""A Responses API request's tools: its function tools in chat shape (``tools_to_internal``), and the
tools and items of hosted tools this gateway cannot serve (``HOSTED_ITEMS``, ``unsupported_tools``),
which are left out of the conversation or, with ``gateway.unsupported_tools = refuse``, refused.

A function tool's ``name`` must be a string, its ``description`` a string or null and its
``parameters`` an object or null (400 otherwise: the chat template renders them).
"""

from __future__ import annotations

from typing import Any

from harnessrl.errors import BadRequest

#: Output items of tools this gateway does not serve; left out of the conversation.
HOSTED_ITEMS = frozenset(
    {
        "web_search_call",
        "file_search_call",
        "computer_call",
        "computer_call_output",
        "code_interpreter_call",
        "image_generation_call",
        "local_shell_call",
        "local_shell_call_output",
        "shell_call",
        "shell_call_output",
        "apply_patch_call",
        "apply_patch_call_output",
        "custom_tool_call",
        "custom_tool_call_output",
        "mcp_call",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
        "tool_search_call",
        "tool_search_output",
        "compaction",
    }
)


def tool_is_function(tool: Any) -> bool:
    return isinstance(tool, dict) and tool.get("type") == "function" and isinstance(tool.get("name"), str)


def _check_function_tool(tool: dict[str, Any], where: str) -> None:
    if not isinstance(tool.get("name"), str):
        raise BadRequest(f"{where}.name must be a string", param=f"{where}.name")
    if tool.get("description") is not None and not isinstance(tool["description"], str):
        raise BadRequest(f"{where}.description must be a string", param=f"{where}.description")
    if tool.get("parameters") is not None and not isinstance(tool["parameters"], dict):
        raise BadRequest(f"{where}.parameters must be an object", param=f"{where}.parameters")


def tools_to_internal(tools: Any) -> list[dict[str, Any]] | None:
    """Function tools in chat shape; every other tool type is left out (``unsupported_tools``)."""
    if not isinstance(tools, list):
        return None
    out = []
    for i, tool in enumerate(tools):
        if isinstance(tool, dict) and tool.get("type") == "function":
            _check_function_tool(tool, f"tools.{i}")
        if not tool_is_function(tool):
            continue
        function: dict[str, Any] = {"name": tool["name"]}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        function["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
        if tool.get("strict") is not None:
            function["strict"] = tool["strict"]
        out.append({"type": "function", "function": function})
    return out or None


def unsupported_tools(body: dict[str, Any]) -> list[str]:
    """Where the request names a tool (or a hosted tool's item) the gateway cannot serve."""
    found = []
    for i, tool in enumerate(body.get("tools") or []):
        if not tool_is_function(tool):
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            found.append(f"tools.{i} ({kind})")
    if isinstance(body.get("input"), list):
        for i, item in enumerate(body["input"]):
            if isinstance(item, dict) and isinstance(item.get("type"), str) and item["type"] in HOSTED_ITEMS:
                found.append(f"input.{i} ({item['type']})")
    return found
