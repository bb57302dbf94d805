"""A request shaped like the ones Claude Code sends to ``POST /v1/messages`` (built from Anthropic's public
API reference and Claude Code's documented tools): system blocks (the per-request billing header, the
identity line and instructions with ``cache_control``), ten client tools with draft-07 JSON Schemas,
a history whose assistant turn called ``Read`` and whose user turn carries the ``tool_result`` and a
``<system-reminder>``, ``metadata.user_id``, ``max_tokens`` 32000, ``temperature`` 1 and ``stream``.
"""

from __future__ import annotations

from typing import Any

SCHEMA = "http://json-schema.org/draft-07/schema#"


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"name": name, "description": description,
            "input_schema": {"type": "object", "properties": properties, "required": required,
                             "additionalProperties": False, "$schema": SCHEMA}}


def _s(description: str) -> dict[str, str]:
    return {"type": "string", "description": description}


TOOLS = [
    _tool("Task", "Launch a new agent to handle complex, multi-step tasks autonomously.",
          {"description": _s("A short (3-5 word) description of the task"), "prompt": _s("The task for the agent"),
           "subagent_type": _s("The type of specialized agent to use")}, ["description", "prompt", "subagent_type"]),
    _tool("Bash", "Executes a given bash command in a persistent shell session with optional timeout.",
          {"command": _s("The command to execute"), "timeout": {"type": "number", "description": "Timeout in ms"},
           "description": _s("Clear, concise description of what this command does")}, ["command"]),
    _tool("Glob", "Fast file pattern matching tool that works with any codebase size.",
          {"pattern": _s("The glob pattern to match files against"), "path": _s("The directory to search in")},
          ["pattern"]),
    _tool("Grep", "A powerful search tool built on ripgrep.",
          {"pattern": _s("The regular expression pattern to search for"), "path": _s("File or directory to search"),
           "output_mode": {"type": "string", "enum": ["content", "files_with_matches", "count"]}}, ["pattern"]),
    _tool("LS", "Lists files and directories in a given path.",
          {"path": _s("The absolute path to the directory to list"),
           "ignore": {"type": "array", "items": {"type": "string"}}}, ["path"]),
    _tool("ExitPlanMode", "Use this tool when you are in plan mode and have finished presenting your plan.",
          {"plan": _s("The plan you came up with")}, ["plan"]),
    _tool("Read", "Reads a file from the local filesystem.",
          {"file_path": _s("The absolute path to the file to read"), "offset": {"type": "number"},
           "limit": {"type": "number"}}, ["file_path"]),
    _tool("Edit", "Performs exact string replacements in files.",
          {"file_path": _s("The absolute path to the file to modify"), "old_string": _s("The text to replace"),
           "new_string": _s("The text to replace it with"), "replace_all": {"type": "boolean", "default": False}},
          ["file_path", "old_string", "new_string"]),
    _tool("MultiEdit", "Makes multiple edits to a single file in one operation.",
          {"file_path": _s("The absolute path to the file to modify"),
           "edits": {"type": "array", "minItems": 1, "items": {"type": "object", "properties": {
               "old_string": {"type": "string"}, "new_string": {"type": "string"}},
               "required": ["old_string", "new_string"], "additionalProperties": False}}},
          ["file_path", "edits"]),
    _tool("Write", "Writes a file to the local filesystem.",
          {"file_path": _s("The absolute path to the file to write"), "content": _s("The content to write")},
          ["file_path", "content"]),
]
EPHEMERAL = {"type": "ephemeral"}
SYSTEM = [
    {"type": "text", "text": "x-anthropic-billing-header: cc_version=1.0.0; cc_entrypoint=cli"},
    {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.", "cache_control": EPHEMERAL},
    {"type": "text", "text": "You are an interactive CLI tool that helps users with software engineering tasks. "
                             "Use the instructions below and the tools available to you to assist the user.\n"
                             "# Tone and style\nYou should be concise, direct, and to the point.",
     "cache_control": EPHEMERAL},
]
MESSAGES = [
    {"role": "user", "content": [
        {"type": "text", "text": "<system-reminder>\nAs you answer the user's questions, you can use the following "
                                 "context: the working directory is /repo.\n</system-reminder>"},
        {"type": "text", "text": "What does main.py print?"}]},
    {"role": "assistant", "content": [
        {"type": "text", "text": "I'll read the file."},
        {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "Read",
         "input": {"file_path": "/repo/main.py"}}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_01A09q90qw90lq917835lq9",
         "content": "     1\tprint('hello world')\n"},
        {"type": "text", "text": "<system-reminder>Do not create files unless asked.</system-reminder>",
         "cache_control": EPHEMERAL}]},
]


def claude_code_request(model: str) -> dict[str, Any]:
    return {"model": model, "max_tokens": 32000, "temperature": 1, "stream": True, "system": SYSTEM,
            "tools": TOOLS, "messages": MESSAGES, "metadata": {"user_id": "user_0123456789abcdef_account__session_1"}}
