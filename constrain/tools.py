"""Tool calling (see :mod:`constrain.compilers.tools`): the names a tool-calling app uses."""

from constrain.compilers.tools import (
    FORMATS,
    Tool,
    ToolCall,
    ToolChoice,
    ToolFormat,
    as_tool,
    as_tools,
    compile_tools,
    parse_tool_calls,
    read_tool_calls,
    tool_format,
    tool_messages_as_text,
    tools_prompt,
)
from constrain.errors import ToolCallError, ToolError

__all__ = [
    "FORMATS",
    "Tool",
    "ToolCall",
    "ToolCallError",
    "ToolChoice",
    "ToolError",
    "ToolFormat",
    "as_tool",
    "as_tools",
    "compile_tools",
    "parse_tool_calls",
    "read_tool_calls",
    "tool_format",
    "tool_messages_as_text",
    "tools_prompt",
]
