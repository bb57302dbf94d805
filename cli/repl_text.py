"""What the ``infer run`` REPL prints: Ollama's help texts, word for word, and the ``/show`` answers."""

from __future__ import annotations

import dataclasses
import json

import typer

from .chat_session import ChatSession
from .remote_session import RemoteChatSession
from .models import render_show

USAGE = """Available Commands:
  /set            Set session variables
  /show           Show model information
  /load <model>   Load a session or model
  /save <model>   Save your current session
  /clear          Clear session context
  /bye            Exit
  /?, /help       Help for a command
  /? shortcuts    Help for keyboard shortcuts

Use \"\"\" to begin a multi-line message.
"""
USAGE_SET = """Available Commands:
  /set parameter ...     Set a parameter
  /set system <string>   Set system message
  /set history           Enable history
  /set nohistory         Disable history
  /set wordwrap          Enable wordwrap
  /set nowordwrap        Disable wordwrap
  /set format json       Enable JSON mode
  /set noformat          Disable formatting
  /set verbose           Show LLM stats
  /set quiet             Disable LLM stats
"""
USAGE_SHORTCUTS = """Available keyboard shortcuts:
  Ctrl + a            Move to the beginning of the line (Home)
  Ctrl + e            Move to the end of the line (End)
   Alt + b            Move back (left) one word
   Alt + f            Move forward (right) one word
  Ctrl + k            Delete the sentence after the cursor
  Ctrl + u            Delete the sentence before the cursor
  Ctrl + w            Delete the word before the cursor

  Ctrl + l            Clear the screen
  Ctrl + c            Stop the model from responding
  Ctrl + d            Exit infer (/bye)
"""
USAGE_SHOW = """Available Commands:
  /show info         Show details for this model
  /show license      Show model license
  /show modelfile    Show Modelfile for this model
  /show parameters   Show parameters for this model
  /show system       Show system message
  /show template     Show prompt template
"""
USAGE_PARAMETERS = """Available Parameters:
  /set parameter seed <int>             Random number seed
  /set parameter num_predict <int>      Max number of tokens to predict
  /set parameter top_k <int>            Pick from top k num of tokens
  /set parameter top_p <float>          Pick token based on sum of probabilities
  /set parameter min_p <float>          Pick token based on top token probability * min_p
  /set parameter num_ctx <int>          Set the context size
  /set parameter temperature <float>    Set creativity level
  /set parameter repeat_penalty <float> How strongly to penalize repetitions
  /set parameter repeat_last_n <int>    Set how far back to look for repetitions
  /set parameter num_gpu <int>          The number of layers to send to the GPU
  /set parameter stop <string> <string> ...   Set the stop parameters
"""
NO_PARAMETERS = "  No additional parameters were specified for this model."


def show(session: ChatSession | RemoteChatSession, what: str) -> None:
    """``/show info|license|modelfile|parameters|system|template`` for the session's model."""
    d = session.details()
    if what == "info":
        typer.echo(render_show(d), nl=False)
    elif what == "license":
        typer.echo("\n".join(d.licenses) or "No license was specified for this model.")
    elif what == "modelfile":
        merged = dataclasses.replace(d, system=session.system or d.system,
                                     parameters={**d.parameters, **session.options})
        typer.echo(merged.modelfile())
    elif what == "parameters":
        typer.echo(parameters_text(d.parameters, session.options), nl=False)
    elif what == "system":
        system = session.system or d.system
        typer.echo(system + "\n" if system else "No system message was specified for this model.")
    elif what == "template":
        typer.echo(d.chat_template or "No prompt template was specified for this model.")
    else:
        typer.echo(f"Unknown command '/show {what}'. Type /? for help")


def parameters_text(model: dict, user: dict) -> str:
    """Ollama's layout: the model's params (``%-30s %#v``), then the session's (``%-30s %v``)."""
    lines = ["Model defined parameters:"]
    lines += [f"  {key:<30} {json.dumps(item, ensure_ascii=False)}" for key, item in _items(model)] or [NO_PARAMETERS]
    lines.append("")
    if user:
        lines.append("User defined parameters:")
        lines += [f"  {key:<30} {_go_value(value)}" for key, value in user.items()]
        lines.append("")
    return "\n".join(lines) + "\n"


def _items(params: dict):
    for key, value in params.items():
        for item in value if isinstance(value, list) else [value]:
            yield key, item


def _go_value(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        text = repr(value)
        return text.removesuffix(".0")
    if isinstance(value, (list, tuple)):
        return "[" + " ".join(_go_value(v) for v in value) + "]"
    return str(value)
