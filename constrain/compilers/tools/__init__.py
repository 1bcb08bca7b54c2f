"""Tool calling: tools from functions, Pydantic models or OpenAI definitions, compiled to the structure of the
calls a model may write, and the calls read back, validated.

::

    structure = compile_tools([get_weather], vocab)                  # free text, or <tool_call> then calls
    content, calls = parse_tool_calls(text, [get_weather])           # calls[0].arguments: the function's kwargs
"""

from constrain.compilers.tools.definitions import Tool, ToolCall, as_tool, as_tools
from constrain.compilers.tools.formats import FORMATS, ToolFormat, tool_format, tool_messages_as_text, tools_prompt
from constrain.compilers.tools.parsing import parse_tool_calls, read_tool_calls
from constrain.compilers.tools.structure import ToolChoice, compile_tools, tools_grammar

__all__ = [
    "FORMATS",
    "Tool",
    "ToolCall",
    "ToolChoice",
    "ToolFormat",
    "as_tool",
    "as_tools",
    "compile_tools",
    "parse_tool_calls",
    "read_tool_calls",
    "tool_format",
    "tool_messages_as_text",
    "tools_grammar",
    "tools_prompt",
]
